"""A clock a test moves (serve/front.py's `clock`): `now` seconds, stepped by `advance`, which wakes
every schedule waiting on it; `settled()` says when a schedule has looked at the clock since the
last step and gone back to waiting (it decided what that time means), so a test asserts what did
not happen without sleeping through a timing window."""

from __future__ import annotations

import threading
import time


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now
        self._lock = threading.Condition()
        self._waiting: dict[int, threading.Condition] = {}
        self._step = 0  # advances so far
        self._looked = -1  # the step the last wait began at

    def __call__(self) -> float:
        return self.now

    def wait(self, condition: threading.Condition, seconds: float) -> None:
        """The schedule's wait (`condition` held): until `advance` or the schedule's own notify.
        Five real seconds at most: a look more is harmless, the time has not moved."""
        with self._lock:
            self._waiting[id(condition)] = condition
            self._looked = self._step
            self._lock.notify_all()
        condition.wait(5.0)

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on while no schedule is between reading it and waiting (each
        waiter's condition held), then wake them."""
        with self._lock:
            waiting = sorted(self._waiting.values(), key=id)
        for c in waiting:
            c.acquire()
        try:
            with self._lock:
                self.now += seconds
                self._step += 1
            for c in waiting:
                c.notify_all()
        finally:
            for c in reversed(waiting):
                c.release()

    def settled(self, seconds: float = 15.0) -> bool:
        """Whether a schedule began a wait after the last `advance` within `seconds` (real)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while self._looked != self._step:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True
