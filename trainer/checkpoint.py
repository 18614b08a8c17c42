"""Model checkpoints as safetensors with JSON metadata (no pickle anywhere).

A checkpoint holds the model's full state dict and, under the safetensors metadata key
``neurofed``, a JSON document describing how to rebuild and feed the model (architecture,
signal shape, channel order, classes, preprocessing, strategy, data hashes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from neurofed.trainer.atomic import save_safetensors
from neurofed.trainer.data.profiles import DeviceProfile, get_profile
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.api import GROUP_MARK, group_view, groups_of
from neurofed.trainer.model_meta import (  # re-exported (torch-free)
    FORMAT_VERSION,
    MODEL_FIELDS,
    ModelMeta,
    meta_fields,
)
from neurofed.trainer.models.ensemble import ENSEMBLE, SoftmaxEnsemble
from neurofed.trainer.models.heads import install_concept_head_for


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

    meta = read_meta(path)
    try:
        model = meta.build()
    except (TypeError, ValueError) as exc:
        raise NeuroFedError(f"{path}: cannot rebuild its {meta.model} model ({exc})") from None
    state = load_file(str(path))
    if isinstance(model, SoftmaxEnsemble):  # each member may be a FedBM model
        for i, member in enumerate(model.members):
            pre = f"members.{i}."
            install_concept_head_for(member, {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)})
    else:
        install_concept_head_for(model, state)  # a FedBM model: projection + frozen concept classifier
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise NeuroFedError(f"{path}: weights do not fit a {meta.model} model ({exc})") from None
    return model, meta


# ---------------------------------------------------------------------------- ensembles (issue 21)
#: what every member of an ensemble must share: the input it reads, the classes it emits, its test batch
#: and the device it is for (``extra["device"]``/``extra["profile"]``)
ENSEMBLE_SHARED: tuple[str, ...] = ("n_channels", "ch_names", "n_times", "sfreq", "classes", "preprocess",
                                    "test_batch_size")


def combine_checkpoints(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> ModelMeta:
    """Write one checkpoint holding the softmax-mean ensemble of ``paths``' models
    (:class:`neurofed.trainer.models.ensemble.SoftmaxEnsemble`); everything that reads a checkpoint (export, ``--standalone``,
    attacks, evaluation) then takes the ensemble like any model.

    The members' descriptions go to ``extra["members"]`` (their training data hashes to the ensemble's union); its
    ``bn_mode`` is ``batch_specific`` when any member's is (its output then depends on the test batch).

    Raises
    ------
    NeuroFedError
        Fewer than two checkpoints, an unreadable one, a member that is itself an ensemble or a per-device-profile
        (fleeg) server state, or members that differ in what :data:`ENSEMBLE_SHARED` names or in their device.
    """

    if len(paths) < 2:
        raise NeuroFedError(f"an ensemble needs at least two checkpoints, got {len(paths)}")
    metas: list[ModelMeta] = []
    state: dict[str, torch.Tensor] = {}
    for i, p in enumerate(paths):
        if not Path(p).is_file():
            raise NeuroFedError(f"{p}: checkpoint file not found")
        with safe_open(str(p), framework="pt") as f:
            if is_hierarchical(f.keys()):
                raise NeuroFedError(f"{p}: a per-device-profile (fleeg) server state; combine the models of one "
                                    "device profile instead")
        model, meta = load_checkpoint(p)
        if meta.model == ENSEMBLE:
            raise NeuroFedError(f"{p}: already an ensemble; combine its base checkpoints instead (equal weights)")
        for name in ENSEMBLE_SHARED if metas else ():
            if getattr(meta, name) != getattr(metas[0], name):
                raise NeuroFedError(f"{p}: its {name} ({getattr(meta, name)!r}) differs from {paths[0]}'s "
                                    f"({getattr(metas[0], name)!r}); ensemble members must read the same input "
                                    "the same way")
        if metas and device_of(meta) != device_of(metas[0]):
            raise NeuroFedError(f"{p}: made for a different device profile than {paths[0]}")
        metas.append(meta)
        state.update({f"members.{i}.{k}": v for k, v in model.state_dict().items()})
    first = metas[0]
    device = {k: first.extra[k] for k in ("device", "profile") if k in first.extra}
    meta = ModelMeta(
        model=ENSEMBLE, n_channels=first.n_channels, n_classes=first.n_classes, n_times=first.n_times,
        sfreq=first.sfreq,
        bn_mode="batch_specific" if any(m.bn_mode == "batch_specific" for m in metas) else "standard",
        ch_names=list(first.ch_names), classes=list(first.classes), preprocess=dict(first.preprocess),
        strategy="ensemble(" + "+".join(m.strategy or m.model for m in metas) + ")",
        test_batch_size=first.test_batch_size,
        data_hashes={k: v for m in metas for k, v in m.data_hashes.items()},
        extra={**device, "members": [{**asdict(m), "data_hashes": {}} for m in metas],
               "rule": "log of the mean of the members' softmax outputs", "member_files": [Path(p).name for p in paths]},
    )
    save_checkpoint(out, state, meta)
    return meta


# ---------------------------------------------------------------------------- device profiles (issue 19)
def device_of(meta: ModelMeta):
    """The device profile a model is for (:class:`neurofed.trainer.data.profiles.DeviceProfile`), or None.

    From ``extra["device"]`` (the profile's definition, written by the coordinator and by a split
    hierarchical checkpoint), else ``extra["profile"]`` as a shipped profile's name.
    """

    dev, name = meta.extra.get("device"), meta.extra.get("profile")
    if dev:
        return DeviceProfile.from_dict(dev, "checkpoint metadata")
    return get_profile(name) if name else None


def is_hierarchical(keys) -> bool:
    """Whether state-dict keys include per-profile modules (``@<profile>/<key>``, :func:`neurofed.trainer.fl.api.group_key`)."""

    return any(k.startswith(GROUP_MARK) for k in keys)


def load_profile_models(path: str | os.PathLike) -> dict[str, tuple[nn.Module, ModelMeta]]:
    """Every deployable model of a checkpoint, by device profile (``""``: a model for no particular device).

    A hierarchical checkpoint (the server state of a ``fleeg`` federation: the shared module plus
    ``@<profile>/`` modules, ``extra["device_profiles"]`` their definitions) gives one model per
    profile: the shared module and that profile's own (:func:`neurofed.trainer.fl.api.group_view`), with the
    profile's channels and its definition in ``extra["device"]``. Any other checkpoint gives itself,
    under its ``extra["profile"]`` if it has one.
    """
    from dataclasses import replace

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


__all__ = ["FORMAT_VERSION", "MODEL_FIELDS", "ModelMeta", "combine_checkpoints", "device_of", "is_hierarchical",
           "load_checkpoint", "load_profile_models", "meta_fields", "read_meta", "save_checkpoint"]
