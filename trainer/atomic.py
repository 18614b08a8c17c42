"""The one atomic file writer: temporary file in the target's folder, fsync, rename, fsync the folder.

Every durable artefact (model checkpoints, coordinator and edge state, the trial store, caches) is written
through :func:`atomic_write`, so a crash or ``kill -9`` at any moment leaves either the old file or the
new one, never a torn one, and the rename itself survives a power cut (the folder entry is fsync'ed).
It lives in trainer/, the lowest package, so broker/, edge/ and export/ can all use it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder so a rename inside it is durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Create ``path`` atomically: ``write(tmp)`` fills a temporary file next to it, which is then fsync'ed,
    renamed over ``path`` and made durable by fsync'ing the folder.

    Parameters
    ----------
    path : path
        Target file (its folder is created).
    write : callable
        Writes the complete content to the path it is given.

    Returns
    -------
    Path
        ``path``. On any failure the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, payload: bytes) -> Path:
    """:func:`atomic_write` of a byte string."""
    return atomic_write(path, lambda p: p.write_bytes(payload))


def save_safetensors(path: str | os.PathLike, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
                     ) -> Path:
    """Write torch tensors (contiguous CPU copies) and string metadata to a safetensors file, atomically.

    The one safetensors writer of the project (checkpoints of the model, the coordinator and the edge client).
    """
    from safetensors.torch import save_file

    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return atomic_write(path, lambda p: save_file(flat, str(p), metadata=dict(metadata) if metadata else None))
