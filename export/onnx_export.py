"""Export a NeuroFed checkpoint to ONNX and verify it against torch on real held-out trials.

Batch-specific BN (``track_running_stats=False``) must keep its semantics: the dynamo exporter
(opset 18, dynamic batch axis) writes it as ReduceMean-computed batch statistics feeding an
inference-mode BatchNormalization. Verification asserts that no training-mode
BatchNormalization is left (onnxruntime bugs #16867, #26584, #29790), runs ``onnx.checker``,
and compares onnxruntime with torch for batch sizes 1, 4 and 8.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from neurofed.export.metadata import INPUT_NAME, OUTPUT_NAME, OnnxModelMeta, build_meta, embed_meta
from neurofed.export.runtime import make_session
from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.checkpoint import (
    ModelMeta,
    device_of,
    is_hierarchical,
    load_checkpoint,
    load_profile_models,
)
from neurofed.trainer.data import PreprocessConfig, list_subjects, load_eegmmidb_subject
from neurofed.trainer.data.eegmmidb import TASKS
from neurofed.trainer.data.profiles import load_profile_subject
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.models.classical import graph_form

logger = logging.getLogger("neurofed.export")

OPSET = 18
VERIFY_BATCHES: tuple[int, ...] = (1, 4, 8)
ATOL = 1e-4


@dataclass
class VerifyReport:
    """Outcome of an ONNX-vs-torch check."""

    subjects: list[str]
    held_out: bool
    n_trials: int
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    class_mismatches: dict[str, int] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the dynamo exporter's warnings and info logs (e.g. "torchvision is not installed")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("torch.onnx", "onnx_ir", "onnxscript"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        yield


def to_onnx(model: nn.Module, n_channels: int, n_times: int, batch: int = 8) -> onnx.ModelProto:
    """Export ``model`` (eval mode) with the dynamo exporter, opset 18, dynamic batch axis."""
    model = graph_form(model).eval()
    x = torch.randn(batch, n_channels, n_times, generator=torch.Generator().manual_seed(0))
    with quiet_exporter():
        try:
            prog = torch.onnx.export(
                model,
                (x,),
                dynamo=True,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                verbose=False,
            )
        except Exception as exc:
            raise NeuroFedError(f"ONNX export of {type(model).__name__} failed: {exc}") from None
    return prog.model_proto


def check_graph(proto: onnx.ModelProto, bn_mode: str) -> list[str]:
    """Static checks: onnx.checker, dynamic batch axis, no training-mode BatchNormalization.

    Returns the names of the checks that passed; raises :class:`NeuroFedError` otherwise.
    """
    done: list[str] = []
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    if dim0.HasField("dim_value"):
        raise NeuroFedError(
            f"exported input has a fixed batch size {dim0.dim_value}, not a dynamic batch axis"
        )
    done.append(f"dynamic batch axis ({dim0.dim_param})")
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization":
            for a in node.attribute:
                if a.name == "training_mode" and onnx.helper.get_attribute_value(a) == 1:
                    raise NeuroFedError(
                        f"node {node.name!r} is a training-mode BatchNormalization "
                        "(onnxruntime mishandles it); "
                        "batch-specific BN must export as ReduceMean statistics + inference-mode BN"
                    )
    done.append("no training-mode BatchNormalization")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:
        raise NeuroFedError(f"onnx.checker rejected the exported model: {exc}") from None
    done.append("onnx.checker")
    if bn_mode == "batch_specific":
        ops = {n.op_type for n in proto.graph.node}
        if "ReduceMean" not in ops:
            raise NeuroFedError("batch-specific BN model exported without ReduceMean batch statistics")
        done.append("batch statistics computed in-graph (ReduceMean)")
    return done


def compare(
    model: nn.Module,
    proto_bytes: bytes,
    X: np.ndarray,
    batches: Sequence[int] = VERIFY_BATCHES,
    atol: float = ATOL,
) -> tuple[dict[str, float], dict[str, int]]:
    """Max abs logit difference and class mismatches of onnxruntime vs torch per batch size.

    Trials are fed in consecutive chunks of each batch size (the same chunks on both sides).
    """
    sess = make_session(proto_bytes, threads=1)
    model.eval()
    diffs, mism = {}, {}
    for b in batches:
        worst, bad = 0.0, 0
        for i in range(0, len(X), b):
            xb = np.ascontiguousarray(X[i : i + b], dtype=np.float32)
            with torch.no_grad():
                ref = model(torch.from_numpy(xb)).numpy()
            got = sess.run(None, {INPUT_NAME: xb})[0]
            worst = max(worst, float(np.abs(ref - got).max()))
            bad += int((ref.argmax(1) != got.argmax(1)).sum())
        diffs[str(b)], mism[str(b)] = worst, bad
    return diffs, mism


def verify_against_torch(model: nn.Module, proto_bytes: bytes, X: np.ndarray, report: VerifyReport) -> None:
    """Fill ``report`` with the ORT-vs-torch comparison; raise :class:`NeuroFedError` naming any mismatch."""
    report.n_trials = len(X)
    report.max_abs_diff, report.class_mismatches = compare(model, proto_bytes, X)
    for b, d in report.max_abs_diff.items():
        if not d <= ATOL:
            raise NeuroFedError(
                f"onnxruntime and torch logits differ by {d:.3g} (> {ATOL}) at batch size {b} "
                f"on {report.n_trials} real trials of {report.subjects}"
            )
        if report.class_mismatches[b]:
            raise NeuroFedError(
                f"onnxruntime and torch predict different classes for "
                f"{report.class_mismatches[b]} trials at batch size {b}"
            )
    report.checks.append(
        f"onnxruntime == torch (|dlogit| <= {ATOL}, same classes) at batch {list(VERIFY_BATCHES)}"
    )


def held_out_data(
    meta,
    data_dir: str | os.PathLike | None = None,
    subjects: Sequence[int] | None = None,
    n_subjects: int = 1,
) -> tuple[np.ndarray, np.ndarray, list[str], bool]:
    """Real EEGMMIDB trials preprocessed like the checkpoint, from subjects it was not trained on.

    Returns ``(X, y, subject_ids, held_out)``; ``held_out`` is False only when every subject of
    the data folder is among the training files (then the last subjects are used, and said so).
    """

    task = next((t for t, (_, cls) in TASKS.items() if list(cls) == list(meta.classes)), None)
    if task is None:
        raise NeuroFedError(
            f"no EEGMMIDB task has the classes {list(meta.classes)}; cannot verify on real data "
            "(pass --no-verify to skip)"
        )
    cfg = PreprocessConfig.from_dict(meta.preprocess) if meta.preprocess else PreprocessConfig()
    held_out = True
    if subjects is None:
        trained = {name[:4] for name in meta.data_hashes}
        avail = list_subjects(data_dir, task)
        free = [s for s in avail if f"S{s:03d}" not in trained]
        if not free:
            held_out, free = False, avail[::-1]
            logger.warning(
                "every subject in the data folder was used for training; verifying on trained subjects"
            )
        subjects = free[:n_subjects]

    device = device_of(meta) if isinstance(meta, ModelMeta) else None
    xs, ys, ids = [], [], []
    for s in subjects:
        if device is not None:  # a device profile's model: the subject recorded through that device

            sd = load_profile_subject(s, device, cfg, data_dir, task=task)
        else:
            sd = load_eegmmidb_subject(s, cfg, data_dir, task=task)
        if sd.X.shape[1:] != (meta.n_channels, meta.n_times):
            raise NeuroFedError(
                f"S{s:03d} preprocessed to shape {sd.X.shape[1:]}, but the model expects "
                f"({meta.n_channels}, {meta.n_times})"
            )
        xs.append(sd.X), ys.append(sd.y), ids.append(sd.subject)
    return np.concatenate(xs), np.concatenate(ys), ids, held_out


def export_model(
    model: nn.Module,
    ckpt_meta,
    out: str | os.PathLike,
    X: np.ndarray | None = None,
    subjects: list[str] | None = None,
    held_out: bool = True,
) -> tuple[OnnxModelMeta, VerifyReport]:
    """Export, embed metadata, check and (if ``X`` is given) verify against torch; then write ``out``.

    Raises :class:`NeuroFedError` naming the failed check; nothing is written in that case.
    """
    model.eval()
    proto = to_onnx(model, ckpt_meta.n_channels, ckpt_meta.n_times)
    meta = build_meta(ckpt_meta, model.state_dict())
    embed_meta(proto, meta)
    report = VerifyReport(subjects=subjects or [], held_out=held_out, n_trials=0 if X is None else len(X))
    report.checks = check_graph(proto, ckpt_meta.bn_mode)
    data = proto.SerializeToString()
    if X is not None:
        verify_against_torch(model, data, X, report)
        # record what was checked in the model itself (metadata does not change the computation)
        meta = meta.model_copy(
            update={
                "verification": {
                    "opset": OPSET,
                    "subjects": report.subjects,
                    "held_out": report.held_out,
                    "n_trials": report.n_trials,
                    "max_abs_logit_diff": report.max_abs_diff,
                }
            }
        )
        embed_meta(proto, meta)
        data = proto.SerializeToString()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)
    return meta, report


def export_checkpoint(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    verify: bool = True,
    subjects: Sequence[int] | None = None,
) -> tuple[OnnxModelMeta, VerifyReport]:
    """``neurofed export``: checkpoint -> verified ONNX file with metadata (one model; see :func:`export_profiles`)."""

    if not Path(ckpt).is_file():
        raise NeuroFedError(f"{ckpt}: checkpoint file not found")
    model, cmeta = load_checkpoint(ckpt)
    X = ids = None
    held = True
    if verify:
        X, _, ids, held = held_out_data(cmeta, data_dir, subjects)
    return export_model(model, cmeta, out, X, ids, held)


def profile_output(out: str | os.PathLike, profile: str) -> Path:
    """Where a device profile's model of a hierarchical checkpoint goes: ``model.onnx`` -> ``model.<profile>.onnx``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.{profile}{out.suffix or '.onnx'}")


def export_profiles(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    verify: bool = True,
    subjects: Sequence[int] | None = None,
) -> dict[str, tuple[Path, OnnxModelMeta, VerifyReport]]:
    """Export every deployable model of a checkpoint (:func:`neurofed.trainer.checkpoint.load_profile_models`).

    A hierarchical (``fleeg``) checkpoint gives one ONNX model per device profile (shared module + that
    profile's own, its profile in the metadata), written to :func:`profile_output`, each verified against
    torch on real held-out trials recorded through its device; any other checkpoint gives ``out``.
    """
    from safetensors import safe_open

    if not Path(ckpt).is_file():
        raise NeuroFedError(f"{ckpt}: checkpoint file not found")
    models = load_profile_models(ckpt)
    with safe_open(str(ckpt), framework="pt") as f:
        split = is_hierarchical(f.keys())
    done = {}
    for p, (model, cmeta) in models.items():
        X = ids = None
        held = True
        if verify:
            X, _, ids, held = held_out_data(cmeta, data_dir, subjects)
        path = profile_output(out, p) if split else Path(out)
        meta, rep = export_model(model, cmeta, path, X, ids, held)
        done[p] = (path, meta, rep)
    return done


def report_dict(meta: OnnxModelMeta, report: VerifyReport) -> dict:
    """JSON-ready summary of an export."""
    return {"model": meta.model, "bn_mode": meta.bn_mode, "model_hash": meta.model_hash, **asdict(report)}
