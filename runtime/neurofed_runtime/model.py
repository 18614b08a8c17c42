"""Exported NeuroFed models in onnxruntime: load, check against the metadata, run.

* :class:`StandaloneModel` (``neurofed export --standalone``): ``probs, state = model.run(window, state)``, one raw
  device window in, class probabilities and the next state out (input guard, band-pass, resampling, online
  Euclidean alignment and the batch-norm context all happen inside the graph);
* :class:`PlainModel` (``neurofed export``): a forward pass over a batch of preprocessed windows. A
  batch-specific-BN model normalises each batch with its own statistics: fed fewer windows than its minimum batch
  it decodes much worse, and :meth:`PlainModel.forward` warns (or, with ``strict``, refuses) in one line.

Every failure to load is one line (:class:`~neurofed_runtime.errors.ModelError`): a missing or unreadable file,
metadata that is missing, invalid, or disagrees with the graph.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from neurofed_runtime.card import (
    HASH_WORDS,
    META_KEY,
    OUTPUTS,
    ModelCard,
    StandaloneInfo,
    check_graph,
    parse_card,
)
from neurofed_runtime.errors import ModelError, NeuroFedError, SmallBatchWarning, WindowRejected, one_line
from neurofed_runtime.guard import GUARD_KINDS
from neurofed_runtime.guard import guard_reason as reason_text


def make_session(model: str | os.PathLike | bytes, threads: int = 1, source: str | None = None
                 ) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads (1 by default: predictable latency)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    where = source or ("model" if isinstance(model, bytes) else str(model))
    try:
        return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"{where}: not a readable ONNX model (onnxruntime: {one_line(exc)})") from None


def open_model(path: str | os.PathLike, threads: int = 1) -> tuple[ort.InferenceSession, ModelCard]:
    """A session of an exported ``.onnx`` file and its card, checked against the graph (one-line errors)."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{path}: ONNX model file not found")
    session = make_session(p, threads)
    props = session.get_modelmeta().custom_metadata_map
    card = parse_card(props.get(META_KEY), str(path))
    check_graph(card, session.get_inputs(), session.get_outputs(), str(path))
    return session, card


def guard_reason(flags: np.ndarray, ch_names: list[str]) -> tuple[str, dict[str, list[str]]]:
    """One line naming the channels a standalone graph's ``guard`` output flags, and the channels by kind."""
    bad = {
        kind: [ch_names[i] for i in np.flatnonzero(row > 0)]
        for kind, row in zip(GUARD_KINDS, np.asarray(flags))
        if (row > 0).any()
    }
    return reason_text(bad), bad


class StandaloneModel:
    """A standalone ``.onnx`` decoder in onnxruntime: ``probs, state = model.run(window, state)``.

    Parameters
    ----------
    path : path
        File written by ``neurofed export --standalone``.
    threads : int
        Intra-op threads of the onnxruntime session.

    Attributes
    ----------
    meta : ModelCard
        The model card (channels, classes, preprocessing, training data hashes, ...).
    info : StandaloneInfo
        The graph's device rate and unit, window length, state layout and guard thresholds.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        self.path = Path(path)
        self.session, self.card = open_model(path, threads)
        if not self.card.standalone:
            raise ModelError(f"{path}: not a standalone export (it takes preprocessed batches); use "
                             "`neurofed export --standalone` for window-by-window decoding")
        self.meta = self.card
        self.info = StandaloneInfo.from_dict(self.card.standalone, str(path))
        if len(self.info.hash_words) != HASH_WORDS:
            raise ModelError(f"{path}: invalid standalone metadata ({len(self.info.hash_words)} hash words)")

    def initial_state(self) -> np.ndarray:
        """The state before a session's first window (zeros with the model hash)."""
        s = np.zeros(self.info.state_size, np.float64)
        s[:HASH_WORDS] = self.info.hash_words
        return s

    def check(self, window: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Validated float32 window and float64 state, or a :class:`NeuroFedError` naming the problem."""
        info = self.info
        w = np.asarray(window)
        want = (self.card.n_channels, info.window_samples)
        if w.shape != want:
            raise NeuroFedError(
                f"window shape {w.shape}, expected {want}: {want[0]} channels ({', '.join(self.card.ch_names)}) "
                f"x {want[1]} samples ({info.window_samples / info.rate:g} s at {info.rate:g} Hz, {info.unit})"
            )
        s = np.asarray(state, np.float64)
        if s.shape != (info.state_size,):
            raise NeuroFedError(f"state shape {s.shape}, expected ({info.state_size},) for this model")
        if not np.array_equal(s[:HASH_WORDS], info.hash_words):
            raise NeuroFedError(
                "state belongs to another model (hash words "
                f"{[int(v) if np.isfinite(v) else v for v in s[:HASH_WORDS]]}, this model {info.hash_words}); "
                "start from model.initial_state()"
            )
        return np.ascontiguousarray(w, np.float32), np.ascontiguousarray(s)

    def run(self, window: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode one raw window: ``(probs, next_state)``; :class:`WindowRejected` if the guard refuses it."""
        w, s = self.check(window, state)
        probs, nxt, flags = self.session.run(list(OUTPUTS), {"window": w, "state": s})
        if flags.any():
            reason, bad = guard_reason(flags, list(self.card.ch_names))
            raise WindowRejected(reason, bad)
        return probs, nxt


class PlainModel:
    """A plain exported model (``neurofed export``): logits of batches of preprocessed windows.

    Parameters
    ----------
    path : path
        ``.onnx`` file written by ``neurofed export``.
    threads : int
        Intra-op threads of the session.
    strict : bool
        Refuse (instead of warn about) a batch smaller than the model's minimum (:attr:`min_windows`).
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1, strict: bool = False) -> None:
        self.path = Path(path)
        self.session, self.card = open_model(path, threads)
        if self.card.standalone:
            raise ModelError(
                f"{path}: a standalone model (raw window + state); run it with "
                "neurofed_runtime.StandaloneModel, or export the plain model without --standalone"
            )
        self.meta = self.card
        self.strict = strict
        self._in = self.session.get_inputs()[0].name
        self._out = self.session.get_outputs()[0].name
        self._warned = False

    @property
    def min_windows(self) -> int:
        """Fewest windows one forward pass should hold (the batch-specific BN's minimum batch; 1 otherwise)."""
        return self.card.min_windows

    def small_batch(self, n: int) -> None:
        """Warn once (``strict``: refuse) when a forward pass gets fewer windows than :attr:`min_windows`."""
        if n >= self.min_windows:
            return
        msg = (f"{self.path.name}: {n} window(s) in one batch, but this plain export normalises each batch with "
               f"its own statistics (batch-specific BN) and needs >= {self.min_windows}; decode windows one at a "
               "time with the standalone graph (`neurofed export --standalone`)")
        if self.strict:
            raise NeuroFedError(msg)
        if not self._warned:
            self._warned = True
            warnings.warn(msg, SmallBatchWarning, stacklevel=3)

    def forward(self, x: np.ndarray, check_batch: bool = True) -> np.ndarray:
        """Logits of one batch ``(n, channels, times)`` (the whole batch shares BN statistics); ``check_batch``:
        warn (``strict``: refuse) below the minimum batch (a caller that said so itself passes False)."""
        x = self._checked(x)
        if check_batch:
            self.small_batch(len(x))
        return self.session.run([self._out], {self._in: x})[0]

    def _checked(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        m = self.card
        if x.ndim != 3 or x.shape[1:] != (m.n_channels, m.n_times):
            raise NeuroFedError(
                f"{self.path.name}: input shape {x.shape} does not fit the model's "
                f"(batch, {m.n_channels}, {m.n_times})"
            )
        return x

    def logits(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Logits in consecutive batches of ``batch_size`` (default: the model's test batch size), as the
        offline protocol batches a test set; warns (``strict``: refuses) when ``X`` holds fewer windows than the
        model's minimum batch."""
        bs = batch_size or self.card.test_batch_size
        if len(X):
            self.small_batch(min(len(X), bs))
        out = [self.session.run([self._out], {self._in: self._checked(X[i : i + bs])})[0]
               for i in range(0, len(X), bs)]
        return np.concatenate(out) if out else np.zeros((0, self.card.n_classes), np.float32)

    def predict(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Class indices (see :meth:`logits`)."""
        return self.logits(X, batch_size).argmax(1)


def load(path: str | os.PathLike, threads: int = 1) -> StandaloneModel | PlainModel:
    """The model in ``path``, standalone or plain by its metadata."""
    _, card = open_model(path, threads)
    return StandaloneModel(path, threads) if card.standalone else PlainModel(path, threads)


__all__ = ["PlainModel", "StandaloneModel", "guard_reason", "load", "make_session", "open_model"]
