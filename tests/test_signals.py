"""signals.install: SIGTERM and SIGHUP raise `Interrupted` (a KeyboardInterrupt) in the main
thread, so Ctrl-C's clean-up runs for them and the CLI exits 130 naming the signal; elsewhere
nothing changes.  Run in child processes: the handlers are process-wide."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import os, signal, sys, threading
from rocforge_build import signals
signals.install()
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C: Python's own
for sig in (signal.SIGTERM, signal.SIGHUP):
    try:
        os.kill(os.getpid(), sig)  # the handler runs before the next line
        print("not raised", sig, file=sys.stderr); sys.exit(1)
    except KeyboardInterrupt as exc:
        assert isinstance(exc, signals.Interrupted) and exc.signum == sig, exc
        print(*signals.exit_code(exc), str(exc))
print(*signals.exit_code(KeyboardInterrupt()))
errors = []
t = threading.Thread(target=lambda: errors.append(signals.install()))
t.start(); t.join()
print("thread", errors)
"""


def test_sigterm_and_sighup_raise_interrupted_and_name_themselves():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["130 SIGTERM SIGTERM", "130 SIGHUP SIGHUP", "130 SIGINT",
                                       "thread [None]"]


def test_env_does_not_import_the_signal_module():
    """`rocforge env` installs the handlers through `_signal`: `signal`'s enums are not built."""
    code = ("import sys; from rocforge_build import signals; signals.install(); "
            "print('signal' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
