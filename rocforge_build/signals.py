"""Signals: SIGTERM (and SIGHUP) end rocforge the way Ctrl-C does, and a few renames that must
happen together are never cut in the middle.

`install()` (the CLI calls it) makes SIGTERM and SIGHUP raise `Interrupted`, a KeyboardInterrupt:
every `finally` and `except BaseException` that cleans up after Ctrl-C (staging dirs, the build's
child processes) runs for them too, and the CLI exits 130 as for Ctrl-C.  `deferred()`
holds SIGINT/SIGTERM/SIGHUP back while its block runs and delivers them after it.

`install()` runs in every command, `rocforge env` at each shell start-up too, so it calls the
C module behind `signal` (`_signal`: the same functions, numbers for names): importing `signal`
builds its enums of signal names, which only a message naming a signal needs
(docs/measurements/env.md).
"""

from __future__ import annotations

try:
    import _signal as _sig
except ImportError:  # an interpreter whose `signal` has no C module of that name
    import signal as _sig  # pragma: no cover

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at every start-up
if TYPE_CHECKING:
    from collections.abc import Iterator

HANDLED = (_sig.SIGINT, _sig.SIGTERM, _sig.SIGHUP)


def _name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


class Interrupted(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, handled like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(_name(signum))
        self.signum = signum


def _raise(signum, _frame) -> None:
    raise Interrupted(signum)


def install() -> None:
    """SIGTERM and SIGHUP raise `Interrupted` (main thread only; elsewhere nothing changes).
    `signal.signal` refuses any other thread with ValueError before changing anything, which
    tells the main thread without importing threading (every command, `rocforge env` too)."""
    try:
        for signum in (_sig.SIGTERM, _sig.SIGHUP):
            _sig.signal(signum, _raise)
    except ValueError:  # "signal only works in main thread of the main interpreter"
        pass


def exit_code(exc: KeyboardInterrupt) -> tuple[int, str]:
    """(exit status, signal name) for an interrupt: 130 (Ctrl-C's) for each of them, since they
    are handled alike; the message names the signal."""
    return 130, _name(getattr(exc, "signum", _sig.SIGINT))


def deferred():
    """Run the block with SIGINT/SIGTERM/SIGHUP held back; the first one that arrived is
    delivered (to the handler in place before) once the block is done.  (contextlib is imported
    here, not at start-up: only the commands that swap directories or stop children use it.)"""
    import contextlib

    return contextlib.contextmanager(_deferred)()


def _deferred() -> Iterator[None]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    before = {s: signal.getsignal(s) for s in HANDLED}
    for s in HANDLED:
        signal.signal(s, lambda signum, _frame: arrived.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if arrived:
            signal.raise_signal(arrived[0])
