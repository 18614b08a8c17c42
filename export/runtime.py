"""onnxruntime sessions for exported NeuroFed models (forward passes without torch)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from neurofed.export.metadata import OnnxModelMeta, meta_from_model
from neurofed.trainer.errors import NeuroFedError


def make_session(model: str | os.PathLike | bytes, threads: int = 1) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads (1 by default: predictable latency)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise NeuroFedError(f"onnxruntime cannot load the model ({exc})") from None


def load_model(path: str | os.PathLike) -> tuple[onnx.ModelProto, OnnxModelMeta]:
    """An exported ``.onnx`` file and its validated NeuroFed metadata, with clear errors."""
    if not Path(path).is_file():
        raise NeuroFedError(f"{path}: ONNX model file not found")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:
        raise NeuroFedError(f"{path}: not a readable ONNX model ({exc})") from None
    return proto, meta_from_model(proto, str(path))


class OnnxModel:
    """An exported model: its metadata and an onnxruntime session.

    Parameters
    ----------
    path : path
        ``.onnx`` file written by ``neurofed export``.
    threads : int
        Intra-op threads of the session.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        self.path = Path(path)
        proto, self.meta = load_model(path)
        if self.meta.standalone:
            raise NeuroFedError(
                f"{path}: a standalone model (raw window + state); run it with "
                "neurofed.export.standalone.StandaloneModel, or export the plain model without --standalone"
            )
        self.session = make_session(proto.SerializeToString(), threads)
        self._in = self.session.get_inputs()[0].name
        self._out = self.session.get_outputs()[0].name

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Logits of one batch ``(n, channels, times)`` (the whole batch shares BN statistics)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        m = self.meta
        if x.ndim != 3 or x.shape[1:] != (m.n_channels, m.n_times):
            raise NeuroFedError(
                f"{self.path.name}: input shape {x.shape} does not fit the model's "
                f"(batch, {m.n_channels}, {m.n_times})"
            )
        return self.session.run([self._out], {self._in: x})[0]

    def logits(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Logits in consecutive batches of ``batch_size`` (default: the model's test batch size)."""
        bs = batch_size or self.meta.test_batch_size
        out = [self.forward(X[i : i + bs]) for i in range(0, len(X), bs)]
        return np.concatenate(out) if out else np.zeros((0, self.meta.n_classes), np.float32)

    def predict(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Class indices (see :meth:`logits`)."""
        return self.logits(X, batch_size).argmax(1)
