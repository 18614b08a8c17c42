"""The demo's supervisor: its children stop gracefully on SIGINT even when SIGINT was ignored by their parent."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from neurofed.supervise import SIGINT_HANDLER, Supervisor, command


def test_command_handles_sigint() -> None:
    argv = command("neurofed", "--version")
    assert argv[:2] == [sys.executable, "-c"] and argv[2].startswith(SIGINT_HANDLER) and argv[3:] == ["--version"]


def test_child_of_a_sigint_ignoring_parent_stops_on_sigint(tmp_path: Path) -> None:
    """SIGINT reaches the child's KeyboardInterrupt handler (it writes its results), not SIGTERM's kill."""
    done, ready = tmp_path / "done", tmp_path / "ready"
    code = (f"{SIGINT_HANDLER}import time, pathlib\n"
            f"try:\n    pathlib.Path({str(ready)!r}).touch(); time.sleep(60)\n"
            f"except KeyboardInterrupt:\n    pathlib.Path({str(done)!r}).write_text('ok')\n")

    def wait_ready() -> None:  # the handler is installed (a signal sent earlier would hit a starting interpreter)
        end = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.05)
        ready.unlink()

    sup = Supervisor(tmp_path / "logs", {})
    child = sup.start("sleeper", [sys.executable, "-c", code])
    wait_ready()
    # started the way a shell's background job (`cmd &`) starts it: SIGINT ignored, which children inherit
    # (without SIGINT_HANDLER this child ignores SIGINT and SIGTERM kills it: rc -15, nothing written)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ignoring = sup.start("ignoring", [sys.executable, "-c", code])
    finally:
        signal.signal(signal.SIGINT, old)
    wait_ready()
    assert sup.stop("ignoring", grace=5.0) == 0 and done.read_text() == "ok"
    done.unlink()
    assert sup.stop("sleeper", grace=5.0) == 0 and done.read_text() == "ok"
    assert child.rc == 0 and ignoring.rc == 0
