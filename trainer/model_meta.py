"""A model's description (:class:`ModelMeta`): what to build and how to feed it, without torch.

Checkpoints (:mod:`neurofed.trainer.checkpoint`) store it, exported ONNX models carry it as their model card
(:mod:`neurofed.export.runtime`) and the wire describes the federation's model with its fields
(``neurofed.broker.protocol.ModelSpec``). It imports no torch, so the runtime reads a model card without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, get_type_hints

from neurofed.trainer.errors import NeuroFedError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["FORMAT_VERSION", "MODEL_FIELDS", "ModelMeta", "meta_fields"]

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
        :class:`neurofed.trainer.data.PreprocessConfig` as a dict.
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
        from neurofed.trainer.models import build_model  # lazy: torch (model_meta stays torch-free)
        from neurofed.trainer.models.ensemble import ENSEMBLE, SoftmaxEnsemble  # lazy: torch

        if self.model == ENSEMBLE:  # the members' own descriptions (combine_checkpoints)
            return SoftmaxEnsemble([ModelMeta(**m).build() for m in self.extra.get("members", [])])
        return build_model(self.model, self.n_channels, self.n_classes, self.n_times, self.sfreq, self.bn_mode,
                           ch_names=self.ch_names, **dict(self.extra.get("model_kwargs", {})))


#: The fields of :class:`ModelMeta` that describe the model itself (what to build and how to feed
#: it), as opposed to provenance (test batch size, training data hashes, extras, format version).
#: The federation's wire description of its model (``neurofed.broker.protocol.ModelSpec``) is exactly these
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


def training_subjects(meta: Any, trained_on: Sequence[str] | None = None) -> tuple[set[str] | None, str | None]:
    """The subjects (``SNNN``) the model was trained on, and where that was learnt (``meta``: any model
    description with ``data_hashes``, a checkpoint's :class:`ModelMeta` or an export's metadata).

    ``trained_on`` (given by the caller, e.g. the demo, whose coordinator never sees client data)
    wins; else the file names of the model's ``data_hashes`` (``S001R04.edf`` -> ``S001``), which
    ``neurofed simulate`` records; else ``(None, None)``: unknown.
    """
    if trained_on is not None:
        return {subject_id(s) for s in trained_on}, "given (--trained-on)"
    if meta.data_hashes:
        return {name[:4] for name in meta.data_hashes}, "model metadata (data_hashes)"
    return None, None


def subject_id(s: str | int) -> str:
    """``3``, ``"3"``, ``"S3"`` or ``"S003"`` -> ``"S003"``."""
    t = str(s).strip().upper().removeprefix("S")
    if not t.isdigit():
        raise NeuroFedError(f"{s!r} is not a subject number (e.g. 3 or S003)")
    return f"S{int(t):03d}"
