"""Coordinator checkpoints: the full server state after every round, one atomic safetensors file.

Tensors are :meth:`neurofed.trainer.fl.server.ServerState.to_tensors`; everything else (round, registry,
per-round metrics, config fingerprint) is JSON under the safetensors metadata key
``neurofed_server``. The file is written to a temporary name and renamed (atomic on POSIX).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open
from safetensors.torch import load_file

from neurofed.trainer.atomic import save_safetensors
from neurofed.trainer.checkpoint import save_checkpoint
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.server import ServerState

if TYPE_CHECKING:
    from torch import Tensor

    from neurofed.broker.protocol import ModelSpec

CHECKPOINT_NAME = "server_state.safetensors"
META_KEY = "neurofed_server"


class CheckpointError(NeuroFedError):
    """A coordinator checkpoint is missing, unreadable, or belongs to another configuration."""


def save_server_checkpoint(out_dir: str | os.PathLike, server: ServerState, info: dict[str, Any]) -> Path:
    """Atomically write ``out_dir/server_state.safetensors``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CHECKPOINT_NAME
    meta = json.dumps({"round": server.round, **info})
    return save_safetensors(path, server.to_tensors(), {META_KEY: meta})


def load_server_checkpoint(out_dir: str | os.PathLike) -> tuple[ServerState, dict[str, Any]] | None:
    """``(ServerState, info)`` from ``out_dir``, or None when there is no checkpoint yet."""
    path = Path(out_dir) / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(META_KEY)
        flat = load_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from None
    if raw is None:
        raise CheckpointError(f"{path}: not a NeuroFed coordinator checkpoint (no {META_KEY} metadata)")
    info = json.loads(raw)
    return ServerState.from_tensors(flat, int(info["round"])), info


def save_final_model(path: str | os.PathLike, state: dict[str, Tensor], spec: ModelSpec, test_batch_size: int,
                     extra: dict[str, Any]) -> Path:
    """The federation's final global model as a :func:`neurofed.trainer.checkpoint.save_checkpoint` file."""
    return save_checkpoint(path, state, spec.to_meta(test_batch_size, extra))
