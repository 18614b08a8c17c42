"""On-disk cache of preprocessed arrays: one .npz per key, written atomically (no partial files)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from neurofed.trainer.atomic import atomic_write

CACHE_ENV = "NEUROFED_CACHE"


def cache_dir() -> Path:
    """``$NEUROFED_CACHE`` or ``~/.cache/neurofed``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "neurofed")


def make_key(**parts: Any) -> str:
    """Hash of every part (JSON, sorted keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def load(key: str) -> dict[str, np.ndarray] | None:
    """Arrays stored under ``key``, or None (a damaged entry is removed and counts as a miss)."""
    path = cache_dir() / f"{key}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:  # damaged cache entry: drop it, recompute
        path.unlink(missing_ok=True)
        return None


def save(key: str, arrays: dict[str, np.ndarray]) -> Path:
    """Write atomically (:func:`neurofed.trainer.atomic.atomic_write`)."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez(f, **arrays)

    return atomic_write(cache_dir() / f"{key}.npz", write)
