"""Child processes of ``neurofed demo``: one log file each, own process group, bounded waits, sure cleanup.

Every child runs in its own session (``start_new_session``), so a Ctrl-C on the terminal reaches
only the demo, which then stops each child's whole group: SIGINT, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neurofed.trainer.errors import NeuroFedError

#: How each console command of the project is started (independent of PATH).
ENTRY_POINTS = {
    "neurofed": "neurofed.cli",
    "edge-client": "neurofed.edge.cli",
    "headset-sim": "neurofed.firmware_sim.cli",
}


class DemoError(NeuroFedError):
    """The demo cannot go on; the message names the step (and the log to read)."""


#: Prefix of every child's code: Ctrl-C (SIGINT) raises KeyboardInterrupt even when the parent was started with
#: SIGINT ignored (a shell's background job, ``cmd &``, ignores it and children inherit that); without it the
#: supervisor's graceful stop would be ignored and the child killed by SIGTERM before writing its results.
SIGINT_HANDLER = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "


def command(tool: str, *args: str) -> list[str]:
    """``[python, -c, ...]`` running the project's console script ``tool`` with ``args`` (SIGINT handled)."""
    mod = ENTRY_POINTS[tool]
    code = f"{SIGINT_HANDLER}import sys; sys.argv[0] = {tool!r}; from {mod} import main; main()"
    return [sys.executable, "-c", code, *args]


@dataclass
class Child:
    """One running child process."""

    name: str
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def rc(self) -> int | None:
        return self.proc.poll()

    def tail(self, n: int = 12) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + ln for ln in lines[-n:])


class Supervisor:
    """Starts, waits for and stops the demo's child processes.

    Parameters
    ----------
    log_dir : path
        ``<name>.log`` per child (stdout and stderr).
    env : dict
        Environment of every child (e.g. ``LSLAPICFG``).
    """

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.children: dict[str, Child] = {}

    def start(self, name: str, argv: Sequence[str], cwd: Path | None = None) -> Child:
        if name in self.children and self.children[name].rc is None:
            raise DemoError(f"child {name!r} is already running")
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as fh:
            fh.write(f"$ {' '.join(argv[3:]) if argv[:2] == [sys.executable, '-c'] else ' '.join(argv)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, cwd=cwd, start_new_session=True)
        child = Child(name, proc, log)
        self.children[name] = child
        return child

    def wait(self, names: Sequence[str], timeout: float, what: str, check: bool = True) -> dict[str, int]:
        """Wait for all ``names`` to exit within ``timeout`` s; a timeout (or, with ``check``, a failure) raises."""
        end = time.monotonic() + timeout
        pending = list(names)
        while pending:
            pending = [n for n in pending if self.children[n].rc is None]
            if not pending:
                break
            if time.monotonic() > end:
                c = self.children[pending[0]]
                raise DemoError(f"{what}: {', '.join(pending)} still running after {timeout:.0f} s "
                                f"(log {c.log}):\n{c.tail()}")
            time.sleep(0.1)
        rcs = {n: int(self.children[n].rc) for n in names}  # type: ignore[arg-type]
        if check:
            bad = [n for n, rc in rcs.items() if rc != 0]
            if bad:
                c = self.children[bad[0]]
                raise DemoError(f"{what}: {', '.join(bad)} failed (exit {rcs[bad[0]]}; log {c.log}):\n{c.tail()}")
        return rcs

    def check_alive(self, names: Sequence[str], what: str) -> None:
        """Raise if one of ``names`` exited with an error already."""
        for n in names:
            c = self.children[n]
            if c.rc not in (None, 0):
                raise DemoError(f"{what}: {n} exited with {c.rc} (log {c.log}):\n{c.tail()}")

    def stop(self, name: str, grace: float = 5.0) -> int | None:
        """SIGINT the child's group, then SIGTERM, then SIGKILL; returns its exit code."""
        c = self.children.get(name)
        if c is None:
            return None
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            if c.rc is not None:
                break
            try:
                os.killpg(c.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                c.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        # the group may hold grandchildren even after the leader exited
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return c.rc

    def stop_all(self) -> None:
        for name in list(self.children)[::-1]:
            self.stop(name, grace=3.0)
