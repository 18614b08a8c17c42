"""What a ``unit`` test must not do: start a process, open an internet socket, create an LSL outlet/inlet/resolver.

tests/conftest.py wraps every unit test in :func:`watch`; whatever the test (or a thread it started) did of the
above is listed and the test fails, naming it, so a test that needs a process, the network or LSL is marked
``integration`` (tests/tiers.py) instead of slowing the unit tier down. Threads that were already running
not started by the test (a daemon an earlier integration test left behind) are not counted against it.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

_INET = (socket.AF_INET, socket.AF_INET6)


class _Watch:
    def __init__(self) -> None:
        self.hits: list[str] = []


_current: _Watch | None = None
_patched: set[str] = set()


def _ours(w: _Watch) -> bool:
    """Whether the running thread is the test's: the main thread, or one it (or such a thread) started while
    watched. A thread an earlier test left behind (a paho loop, a client on a daemon thread) is not."""
    t = threading.current_thread()
    return t is threading.main_thread() or getattr(t, "_tier_watch", None) is w


def _hit(what: str) -> None:
    w = _current
    if w is None or not _ours(w):
        return
    stack = traceback.extract_stack()[:-3]
    if any(f.name == "__del__" for f in stack):
        return  # a finalizer of an earlier test's object (selenium's Service sends chromedriver a shutdown)
    if len(w.hits) < 20:
        # where: the innermost frames outside this module and the standard library's wrappers
        frames = [f for f in stack if not f.filename.endswith(("tier_guard.py", "subprocess.py",
                                                                                      "socket.py", "process.py"))]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:][::-1])
        w.hits.append(f"{what} [{threading.current_thread().name}: {where}]")


def _thread_start(self, *a, **kw):
    w = _current
    self._tier_watch = w if w is not None and _ours(w) else None
    return _thread_start.orig(self, *a, **kw)


def _wrap(owner, name: str, describe) -> None:
    orig = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if _current is not None:
            what = describe(*args, **kwargs)
            if what:
                _hit(what)
        return orig(*args, **kwargs)

    wrapper.__wrapped__ = orig
    setattr(owner, name, wrapper)


def _cmd(self, args=None, *a, **kw) -> str:
    args = kw.get("args", args)
    shown = args if isinstance(args, str) else " ".join(map(str, list(args or [])[:4]))
    return f"started a process: {shown[:120]}"


def _sock(self, address=None, *a, **kw) -> str | None:
    if self.family in _INET:
        return f"opened an internet socket ({address!r})"
    return None


def _install_base() -> None:
    if "base" in _patched:
        return
    _patched.add("base")
    _thread_start.orig = threading.Thread.start
    threading.Thread.start = _thread_start
    _wrap(subprocess.Popen, "__init__", _cmd)
    _wrap(multiprocessing.process.BaseProcess, "start", lambda self: f"started a process: {self.name}")
    for name in ("connect", "connect_ex", "bind"):
        _wrap(socket.socket, name, _sock)


def _install_lsl() -> None:
    """LSL's classes, once their module is loaded (never load liblsl here: its config is set per test folder)."""
    if "pylsl" not in _patched and "pylsl" in sys.modules:
        _patched.add("pylsl")
        mod = sys.modules["pylsl"]
        for cls in ("StreamOutlet", "StreamInlet", "ContinuousResolver"):
            if hasattr(mod, cls):
                _wrap(getattr(mod, cls), "__init__", lambda *a, _c=cls, **k: f"created an LSL {_c}")
        for fn in ("resolve_streams", "resolve_byprop", "resolve_bypred", "resolve_stream"):
            if hasattr(mod, fn):  # also the names modules took with `from pylsl import ...` before this ran
                orig = getattr(mod, fn)
                _wrap(mod, fn, lambda *a, _f=fn, **k: f"resolved LSL streams ({_f})")
                for m in list(sys.modules.values()):
                    if getattr(m, fn, None) is orig and m is not mod:
                        setattr(m, fn, getattr(mod, fn))
    if "mne_lsl" not in _patched and "mne_lsl.lsl" in sys.modules:
        _patched.add("mne_lsl")
        mod = sys.modules["mne_lsl.lsl"]
        for cls in ("StreamOutlet", "StreamInlet"):
            if hasattr(mod, cls):
                _wrap(getattr(mod, cls), "__init__", lambda *a, _c=cls, **k: f"created an mne-lsl {_c}")


@contextlib.contextmanager
def watch():
    """Collect what the code inside does of the forbidden things; yields the list of findings."""
    global _current
    _install_base()
    _install_lsl()
    w = _Watch()
    _current = w
    try:
        yield w.hits
    finally:
        _current = None
