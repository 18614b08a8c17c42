"""Model checkpoints as safetensors with JSON metadata (no pickle anywhere).

A checkpoint holds the model's full state dict and, under the safetensors metadata key
``neurofed``, a JSON document describing how to rebuild and feed the model (architecture,
signal shape, channel order, classes, preprocessing, strategy, data hashes).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from trainer.atomic import save_safetensors
from trainer.errors import NeuroFedError

FORMAT_VERSION = 1


@dataclass
class ModelMeta:
    """Everything needed to rebuild a model and feed it correctly.

    Attributes
    ----------
    model : str
        Architecture name (``eegnet``, ``shallow``, ``deep``).
    n_channels, n_classes, n_times : int
    sfreq : float
        Sampling rate the model expects (after preprocessing).
    bn_mode : str
    ch_names : list of str
        Channel labels in input order.
    classes : list of str
        Class names in logit order.
    preprocess : dict
        :class:`trainer.data.PreprocessConfig` as a dict.
    strategy : str
    test_batch_size : int
        Batch size for batch-specific BN at inference.
    data_hashes : dict
        Training file name -> SHA-256.
    extra : dict
        Anything else (round, seed, metrics).
    """

    model: str
    n_channels: int
    n_classes: int
    n_times: int
    sfreq: float
    bn_mode: str
    ch_names: list[str]
    classes: list[str]
    preprocess: dict[str, Any] = field(default_factory=dict)
    strategy: str = ""
    test_batch_size: int = 8
    data_hashes: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def build(self) -> nn.Module:
        """A fresh model of this architecture and shape (``extra["model_kwargs"]``: e.g. fleeg_eegnet's
        ``local_bn_mode``)."""
        from trainer.models import build_model

        return build_model(self.model, self.n_channels, self.n_classes, self.n_times, self.sfreq, self.bn_mode,
                           **dict(self.extra.get("model_kwargs", {})))


def save_checkpoint(path: str | os.PathLike, state: dict[str, torch.Tensor], meta: ModelMeta) -> Path:
    """Write ``state`` and ``meta`` atomically to a ``.safetensors`` file."""
    return save_safetensors(path, state, {"neurofed": json.dumps(asdict(meta))})


def read_meta(path: str | os.PathLike) -> ModelMeta:
    """Metadata of a checkpoint, without loading tensors."""
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("neurofed")
    except Exception as exc:
        raise NeuroFedError(f"{path}: not a readable safetensors checkpoint ({exc})") from None
    if raw is None:
        raise NeuroFedError(f"{path}: safetensors file has no 'neurofed' metadata; not a NeuroFed checkpoint")
    d = json.loads(raw)
    return ModelMeta(**d)


def load_checkpoint(path: str | os.PathLike) -> tuple[nn.Module, ModelMeta]:
    """Rebuild the model of a checkpoint and load its weights (strict)."""
    from trainer.models.heads import install_concept_head_for

    meta = read_meta(path)
    model = meta.build()
    state = load_file(str(path))
    install_concept_head_for(model, state)  # a FedBM model: projection + frozen concept classifier
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise NeuroFedError(f"{path}: weights do not fit a {meta.model} model ({exc})") from None
    return model, meta
