"""Build an expensive test artefact once per test session, whatever the number of pytest-xdist workers.

The pattern pytest-xdist documents ("Making session-scoped fixtures execute only once"): the first worker to ask
builds the artefact into a folder beside every worker's own temp folder, under a file lock, and writes down the
paths it made; the others wait for the lock and reuse them. Without xdist it is built in this session's temp folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def build_once(tmp_path_factory, name: str, build: Callable[[Path], tuple[Path, ...]]) -> tuple[Path, ...]:
    """``build(folder)``'s paths, built once per session (any worker) and reused by every later call.

    ``build`` must depend on nothing a worker holds alone: every worker gets the first worker's files.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return tuple(build(tmp_path_factory.mktemp(name)))
    root = tmp_path_factory.getbasetemp().parent  # this session's folder, shared by its workers: pytest-N/
    folder, made = root / f"shared-{name}", root / f"shared-{name}.json"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not made.exists():
            folder.mkdir(exist_ok=True)
            paths = tuple(Path(p) for p in build(folder))
            made.write_text(json.dumps([str(p) for p in paths]))
        return tuple(Path(p) for p in json.loads(made.read_text()))
