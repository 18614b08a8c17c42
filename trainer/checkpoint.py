"""Model checkpoints as safetensors with JSON metadata (no pickle anywhere).

A checkpoint holds the model's full state dict and, under the safetensors metadata key
``neurofed``, a JSON document describing how to rebuild and feed the model (architecture,
signal shape, channel order, classes, preprocessing, strategy, data hashes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

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
                           ch_names=self.ch_names, **dict(self.extra.get("model_kwargs", {})))


#: The fields of :class:`ModelMeta` that describe the model itself (what to build and how to feed
#: it), as opposed to provenance (test batch size, training data hashes, extras, format version).
#: The federation's wire description of its model (``broker.protocol.ModelSpec``) is exactly these
#: fields, with ModelMeta's types and defaults; the wire only adds bounds.
MODEL_FIELDS: tuple[str, ...] = (
    "model", "n_channels", "n_classes", "n_times", "sfreq", "bn_mode", "ch_names", "classes", "preprocess", "strategy",
)


def meta_fields(names: Sequence[str] | None = None) -> dict[str, tuple[Any, Any]]:
    """``{name: (type hint, default)}`` of :class:`ModelMeta`'s fields (all, or ``names`` in that order).

    The default is ``...`` for required fields (pydantic's marker) and a fresh value for
    ``default_factory`` fields, so validated models of the same description (the ONNX model card,
    the wire ``ModelSpec``) are built from this one definition rather than copied field by field.
    """
    hints = get_type_hints(ModelMeta)
    by_name = {f.name: f for f in fields(ModelMeta)}
    unknown = [n for n in (names or ()) if n not in by_name]
    if unknown:
        raise NeuroFedError(f"ModelMeta has no fields {unknown}")
    out: dict[str, tuple[Any, Any]] = {}
    for name in names if names is not None else list(by_name):
        f = by_name[name]
        if f.default is not MISSING:
            default: Any = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = ...
        out[name] = (hints[name], default)
    return out


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


# ---------------------------------------------------------------------------- device profiles (issue 19)
def device_of(meta: ModelMeta):
    """The device profile a model is for (:class:`trainer.data.profiles.DeviceProfile`), or None.

    From ``extra["device"]`` (the profile's definition, written by the coordinator and by a split
    hierarchical checkpoint), else ``extra["profile"]`` as a shipped profile's name.
    """
    from trainer.data.profiles import DeviceProfile, get_profile

    dev, name = meta.extra.get("device"), meta.extra.get("profile")
    if dev:
        return DeviceProfile.from_dict(dev, "checkpoint metadata")
    return get_profile(name) if name else None


def is_hierarchical(keys) -> bool:
    """Whether state-dict keys include per-profile modules (``@<profile>/<key>``, :func:`trainer.fl.api.group_key`)."""
    from trainer.fl.api import GROUP_MARK

    return any(k.startswith(GROUP_MARK) for k in keys)


def load_profile_models(path: str | os.PathLike) -> dict[str, tuple[nn.Module, ModelMeta]]:
    """Every deployable model of a checkpoint, by device profile (``""``: a model for no particular device).

    A hierarchical checkpoint (the server state of a ``fleeg`` federation: the shared module plus
    ``@<profile>/`` modules, ``extra["device_profiles"]`` their definitions) gives one model per
    profile: the shared module and that profile's own (:func:`trainer.fl.api.group_view`), with the
    profile's channels and its definition in ``extra["device"]``. Any other checkpoint gives itself,
    under its ``extra["profile"]`` if it has one.
    """
    from dataclasses import replace

    from trainer.data.profiles import DeviceProfile
    from trainer.fl.api import group_view, groups_of

    meta = read_meta(path)
    state = load_file(str(path))
    if not is_hierarchical(state):
        model, meta = load_checkpoint(path)
        return {str(meta.extra.get("profile", "")): (model, meta)}
    defs = {d.get("name"): d for d in meta.extra.get("device_profiles", [])}
    out: dict[str, tuple[nn.Module, ModelMeta]] = {}
    for g in groups_of(state):
        if g not in defs:
            raise NeuroFedError(f"{path}: holds a module of device profile {g!r} but not its definition "
                                "(extra.device_profiles)")
        dev = DeviceProfile.from_dict(defs[g], f"{path} ({g})")
        extra = {k: v for k, v in meta.extra.items() if k != "device_profiles"}
        pm = replace(meta, n_channels=dev.n_channels, ch_names=list(dev.channels),
                     extra={**extra, "profile": g, "device": dev.to_dict()})
        model = pm.build()
        try:
            model.load_state_dict(group_view(state, g), strict=True)
        except RuntimeError as exc:
            raise NeuroFedError(f"{path}: profile {g}'s weights do not fit a {pm.model} model ({exc})") from None
        out[g] = (model, pm)
    return out
