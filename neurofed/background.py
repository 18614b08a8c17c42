"""A function run on a daemon thread whose result (or exception) is collected later: the benches' and tests'
coordinator and edge clients running side by side in one process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from neurofed.trainer.errors import NeuroFedError


class Background(threading.Thread):
    """Run ``fn`` on a daemon thread at once; :meth:`result` waits for it and returns its value or raises its error.

    Parameters
    ----------
    fn : callable
        Called with no arguments on the thread.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by result()
            self.error = exc

    def result(self, timeout: float) -> Any:
        """``fn``'s return value; its exception re-raised; :class:`NeuroFedError` if it is still running after
        ``timeout`` seconds."""
        self.join(timeout)
        if self.is_alive():
            raise NeuroFedError(f"{self.name} did not finish within {timeout:g} s")
        if self.error is not None:
            raise self.error
        return self.value


__all__ = ["Background"]
