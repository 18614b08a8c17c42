"""Real-time inference on plain arrays: guard, then one pluggable decoder step (online EA, BN context).

No LSL here: windows come in as arrays (cut by :mod:`neurofed.edge.windowing` from :class:`neurofed.edge.buffer.RingBuffer`,
the same cutting ``edge-client record`` uses), so the whole path is testable offline and the LSL glue
stays thin. The stream's channels and units are matched by :func:`neurofed.edge.stream.match_stream`, shared
with recording: a stream ``edge-client record`` accepts, ``edge-client infer`` accepts.

**The seam.** Everything after the input guard is one call, ``probs, state = decoder.step(window, state)``
(:class:`DecoderStep`): ``window`` is the raw window on the model's channels, in the model's order, in
microvolts at the stream's own rate ``(n_channels, window_samples)``; ``state`` is whatever the decoder
carries between windows. :class:`PythonDecoder` is today's engine behind it:

* **Online Euclidean alignment** (ABAT-style): the reference starts as the identity (or an
  offline reference covariance) for the first ``min_windows`` accepted windows, then becomes
  the running mean of the covariances of the user's windows seen so far (the current included).
  After all of a subject's trials it equals offline per-subject EA.
* **Batch-specific BN context**: the model's BN layers normalise with the statistics of the
  batch they see, so a lone window would be normalised with its own statistics only. The decoder
  keeps the user's last ``B - 1`` accepted windows (B = the model's test batch size, 8) and runs
  the model on ``[context..., new]``, taking the last row: every window is normalised with
  real statistics from the same user, as in the offline protocol (test batch 8).

A standalone ONNX graph ``probs, state = run(window, state)`` plugs in as another :class:`DecoderStep`
(pass it as ``InferenceEngine(..., decoder=...)``); the guard stays in front of it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from neurofed_runtime.model import open_model

from neurofed.edge.guard import GuardConfig, GuardResult, check_window
from neurofed.edge.stream import StreamLayout, match_stream
from neurofed.edge.windowing import Window
from neurofed.export.decoder import WindowRejected
from neurofed.export.runtime import OnnxModel, OnnxModelMeta, read_onnx_meta
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.preprocess import apply_ea, ea_inv_sqrt, n_times_for, preprocess_epochs
from neurofed.trainer.data.profiles import DeviceProfile, match_profile
from neurofed.trainer.errors import DataError, NeuroFedError

logger = logging.getLogger("neurofed.edge")


@runtime_checkable
class DecoderStep(Protocol):
    """One decoding step: raw window and state in, class probabilities and the next state out.

    ``window`` is ``(n_channels, window_samples)`` float64: the model's channels in its order, microvolts,
    at the stream's rate, already passed by the input guard. Implementations must not modify ``state``
    in place (a rejected or failed step leaves the previous state valid).
    """

    def init_state(self) -> Any:
        """The state before the first window."""

    def step(self, window: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        """Decode one window: ``(probabilities (n_classes,), next state)``."""

    def describe(self, state: Any) -> tuple[int, int]:
        """After a step: ``(context windows the step's batch held besides the new one, EA windows seen)``."""


@dataclass(frozen=True)
class PythonState:
    """State of :class:`PythonDecoder` (the same quantities a standalone graph carries).

    Attributes
    ----------
    ea_sum : ndarray (c, c)
        Sum of the accepted windows' covariances ``X X^T / T`` (preprocessed).
    ea_count : int
        Windows in ``ea_sum``.
    context : ndarray (k, c, t)
        The last ``k <= B - 1`` preprocessed windows, oldest first (before EA).
    seen : int
        Windows decoded.
    """

    ea_sum: np.ndarray
    ea_count: int
    context: np.ndarray
    seen: int = 0


class PythonDecoder:
    """Today's decoding engine behind :class:`DecoderStep`: scipy band-pass/resampling, online EA, BN context,
    onnxruntime forward pass.

    Parameters
    ----------
    model : OnnxModel
    sfreq : float
        Rate of the incoming windows (the stream's).
    batch : int
        BN context batch (the new window plus ``batch - 1`` previous ones).
    ea_reference : ndarray (c, c), optional
        Offline EA reference covariance used for the first ``ea_min_windows`` windows (identity if None).
    ea_min_windows : int
        Windows needed before the running mean replaces the reference.
    """

    def __init__(self, model: OnnxModel, sfreq: float, batch: int, ea_reference: np.ndarray | None = None,
                 ea_min_windows: int = 1) -> None:
        m: OnnxModelMeta = model.meta
        self.model, self.meta, self.sfreq = model, m, float(sfreq)
        self.cfg = PreprocessConfig.from_dict({**m.preprocess, "channels": list(m.ch_names)})
        self.batch = max(int(batch), 1)
        self.ea = bool(m.ea)
        c = m.n_channels
        self.ea_reference = None if ea_reference is None else np.asarray(ea_reference, np.float64)
        if self.ea_reference is not None and self.ea_reference.shape != (c, c):
            raise DataError(f"EA reference is {self.ea_reference.shape}, expected ({c}, {c})")
        self.ea_min_windows = max(1, int(ea_min_windows))

    def init_state(self) -> PythonState:
        c = self.meta.n_channels
        return PythonState(np.zeros((c, c)), 0, np.zeros((0, c, self.meta.n_times)), 0)

    def preprocess(self, raw: np.ndarray) -> np.ndarray:
        """Raw window ``(n_channels, window_samples)`` -> band-passed, resampled ``(n_channels, n_times)``."""
        x, _, _ = preprocess_epochs(raw[None], self.sfreq, self.meta.ch_names, self.cfg)
        return x[0]

    def ea_matrix(self, state: PythonState) -> np.ndarray:
        """The alignment matrix ``R^{-1/2}`` a step with this state applies."""
        c = self.meta.n_channels
        if state.ea_count < self.ea_min_windows:
            return np.eye(c) if self.ea_reference is None else ea_inv_sqrt(self.ea_reference)
        return ea_inv_sqrt(state.ea_sum / state.ea_count)

    def step(self, window: np.ndarray, state: PythonState) -> tuple[np.ndarray, PythonState]:
        x = self.preprocess(np.asarray(window, np.float64))
        ea_sum, ea_count = state.ea_sum, state.ea_count
        if self.ea:
            ea_sum, ea_count = ea_sum + x @ x.T / x.shape[1], ea_count + 1
        batch = np.concatenate([state.context, x[None]])
        nxt = PythonState(ea_sum, ea_count, batch[-(self.batch - 1):] if self.batch > 1
                          else state.context, state.seen + 1)
        if self.ea:
            batch = apply_ea(batch, self.ea_matrix(nxt))
        # InferenceEngine said once (a log line) that early windows get a partial BN context
        logits = self.model.forward(batch.astype(np.float32), check_batch=False)[-1].astype(np.float64)
        p = np.exp(logits - logits.max())
        return p / p.sum(), nxt

    def describe(self, state: PythonState) -> tuple[int, int]:
        return min(state.seen - 1, self.batch - 1), state.ea_count


class StandaloneStep:
    """The standalone graph (``neurofed export --standalone``) behind :class:`DecoderStep`: the edge decodes
    with exactly the graph every app runs (guard, band-pass + resampling, online EA, BN context inside it).

    Parameters
    ----------
    model : neurofed.export.decoder.StandaloneModel
    stream_sfreq : float
        The stream's rate; the graph is exported for one device rate (``--rate``) and must match it.

    The engine hands over microvolts (after its unit conversion); a graph taking another unit (a device
    profile's, e.g. ADS1299 counts) gets them back in its unit (``/ unit_to_uv``), and converts them itself.
    """

    def __init__(self, model: Any, stream_sfreq: float) -> None:
        info = model.info
        if abs(float(info.rate) - float(stream_sfreq)) > 1e-6:
            raise NeuroFedError(f"the standalone model was exported for {info.rate:g} Hz but the stream runs at "
                                f"{stream_sfreq:g} Hz: export it again with --rate {stream_sfreq:g}")
        self.model = model
        self.from_uv = None if info.unit_to_uv == 1.0 else 1.0 / float(info.unit_to_uv)
        self.offsets = {e["name"]: int(e["offset"]) for e in info.state_layout}
        #: the last accepted windows (in the graph's unit), as many as the graph keeps as BN context: a new release
        #: rebuilds its own context from them (neurofed.edge.follow.carry_state)
        self.recent: deque[np.ndarray] = deque(maxlen=max(int(info.context_windows), 1))

    #: the graph runs the input guard itself (the default thresholds of neurofed.trainer.data.guard) and raises
    #: ``neurofed.export.decoder.WindowRejected``: the engine need not run the same check in Python first
    guards = True

    def init_state(self) -> np.ndarray:
        return self.model.initial_state()

    def step(self, window: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = window if self.from_uv is None else window * self.from_uv
        probs, nxt = self.model.run(w, state)
        self.recent.append(np.array(w, copy=True))
        return np.asarray(probs, np.float64).reshape(-1), nxt

    def describe(self, state: np.ndarray) -> tuple[int, int]:
        n_ctx, n_ea = int(state[self.offsets["n_context"]]), int(state[self.offsets["ea_count"]])
        k = self.model.info.context_windows
        return (min(n_ea - 1, k) if n_ea else max(n_ctx - 1, 0)), n_ea


@dataclass
class Prediction:
    """One decoded window."""

    label: str
    index: int
    probabilities: list[float]
    t_end: float
    n_context: int
    ea_windows: int
    t_arrival: float = float("nan")
    t_emit: float = float("nan")
    model_version: int | None = None  # the signed release that decoded it (edge-client infer --follow)
    onset: float | None = None  # cue-locked windows: the cue marker's stream time (None: sliding windows)
    cue: str = ""  # ... and the cue's label (the class the session asked for)


@dataclass
class Rejection:
    """A window refused by the input guard."""

    reason: str
    t_end: float
    bad_channels: dict[str, list[str]] = field(default_factory=dict)
    t_arrival: float = float("nan")
    t_emit: float = float("nan")
    model_version: int | None = None  # the signed release running when it was refused (--follow)
    onset: float | None = None  # cue-locked windows: the cue marker's stream time
    cue: str = ""


class InferenceEngine:
    """Decode raw windows from a stream with a given channel list, units and rate.

    Parameters
    ----------
    model : OnnxModel
    stream_ch_names : sequence of str
        Channel labels of the incoming stream (any superset/order of the model's channels; ``Fc5.`` ~ ``FC5``).
    stream_sfreq : float
        Nominal rate of the stream in Hz.
    guard : GuardConfig, optional
        Input-guard thresholds (default: ``GuardConfig()``).
    context : int, optional
        Batch size for BN context (default: model metadata ``test_batch_size``).
    ea_reference : ndarray, optional
        Offline EA reference covariance (c, c) used for the first ``ea_min_windows`` windows.
    stream_units : sequence of str, optional
        The stream's channel units (default: microvolts); converted to microvolts before the guard.
    decoder : DecoderStep, optional
        The compute step after the guard (default: :class:`PythonDecoder`).
    """

    def __init__(
        self,
        model: OnnxModel,
        stream_ch_names: Sequence[str],
        stream_sfreq: float,
        guard: GuardConfig | None = None,
        context: int | None = None,
        ea_reference: np.ndarray | None = None,
        ea_min_windows: int = 1,
        stream_units: Sequence[str] | None = None,
        decoder: DecoderStep | None = None,
    ) -> None:
        self.model, self.meta = model, model.meta
        m: OnnxModelMeta = self.meta
        self.cfg = PreprocessConfig.from_dict({**m.preprocess, "channels": list(m.ch_names)})
        self.stream_ch_names, self.stream_sfreq = list(stream_ch_names), float(stream_sfreq)
        self.guard = guard if guard is not None else GuardConfig()
        # a standalone graph guards the window itself with the default rules: skip the Python copy of the check
        self.graph_guards = guard is None and bool(getattr(decoder, "guards", False))
        self.layout = check_stream(m, self.stream_ch_names, self.stream_sfreq, stream_units)
        self.window_samples = n_times_for(self.stream_sfreq, self.cfg)
        probe = np.zeros((1, m.n_channels, self.window_samples))
        probe[..., ::2] = 1.0
        got = preprocess_epochs(probe, self.stream_sfreq, m.ch_names, self.cfg)[0].shape[-1]
        if got != m.n_times:
            raise NeuroFedError(
                f"a {self.window_samples}-sample window at {self.stream_sfreq} Hz preprocesses to {got} "
                f"samples, but the model expects {m.n_times} ({m.sfreq} Hz x {m.window} s)"
            )
        self.batch = int(context or m.test_batch_size)
        need = int(getattr(model, "min_windows", 1))
        if decoder is None and need > 1:  # the batch-1 trap of a plain batch-specific-BN export, said once
            logger.warning(
                "%s: a plain export of a batch-specific-BN model normalises each window with its batch: %s; "
                "for one-window decoding use the standalone graph (neurofed export --standalone)",
                getattr(model, "path", "model"),
                f"--context {self.batch} is below its minimum batch {need}, so every window is decoded with too "
                "few" if self.batch < need else
                f"the first {need - 1} windows of a session get fewer than the {need} it needs")
        self.decoder: DecoderStep = decoder or PythonDecoder(model, self.stream_sfreq, self.batch, ea_reference,
                                                             ea_min_windows)
        self.state = self.decoder.init_state()
        #: the signed release being run (set by neurofed.edge.follow when following releases), stamped on predictions
        self.model_version: int | None = None

    def process(self, window: np.ndarray, t_end: float, t_arrival: float = float("nan")) -> Prediction | Rejection:
        """Guard and decode one raw window ``(stream channels, window_samples)`` in the stream's units ending at
        stream time ``t_end`` (its last sample arrived at local time ``t_arrival``)."""
        window = np.asarray(window)
        if window.shape != (len(self.stream_ch_names), self.window_samples):
            raise NeuroFedError(
                f"window shape {window.shape}, expected ({len(self.stream_ch_names)}, {self.window_samples})"
            )
        raw = self.layout.select(window.T)
        if self.graph_guards:
            try:
                p, self.state = self.decoder.step(raw, self.state)
            except WindowRejected as exc:
                return Rejection(str(exc), float(t_end), exc.bad_channels, float(t_arrival),
                                 model_version=self.model_version)
        else:
            verdict: GuardResult = check_window(raw, self.meta.ch_names, self.guard)
            if not verdict.ok:
                return Rejection(verdict.reason, float(t_end), verdict.bad_channels, float(t_arrival),
                                 model_version=self.model_version)
            p, self.state = self.decoder.step(raw, self.state)
        p = np.asarray(p, np.float64).reshape(-1)
        k = int(p.argmax())
        n_context, ea_windows = self.decoder.describe(self.state)
        return Prediction(self.meta.classes[k], k, [float(v) for v in p], float(t_end), int(n_context),
                          int(ea_windows), float(t_arrival), model_version=self.model_version)

    def process_window(self, w: Window) -> Prediction | Rejection:
        """:meth:`process` on a window cut by :mod:`neurofed.edge.windowing` (stream layout, sample-major); a
        cue-locked window's result carries the cue (``onset``, ``cue``)."""
        res = self.process(w.data.T, w.t_end, w.t_arrival)
        res.onset, res.cue = w.onset, w.label
        return res


def check_stream(meta: OnnxModelMeta, ch_names: Sequence[str], sfreq: float,
                 units: Sequence[str] | None = None, source: str = "stream") -> StreamLayout:
    """Clear errors when a stream cannot feed the model (missing channels, units, rate); its layout if it can.

    Channels, units and the band-pass limit are checked by :func:`neurofed.edge.stream.match_stream` (the same
    rules as recording); a model without resampling also needs the stream at its own rate. A model for a
    device profile that streams ``counts`` (ADS1299 counts) reads a ``counts`` channel with the profile's gain.
    """

    dev = DeviceProfile.from_dict(meta.profile, "model metadata") if meta.profile else None
    layout = match_stream(sfreq, ch_names, units, list(meta.ch_names), fmax=float(meta.preprocess.get("fmax", 0.0)),
                          source=source, profile=dev)
    if not meta.preprocess.get("resample") and abs(sfreq - meta.sfreq) > 1e-6:
        raise NeuroFedError(
            f"stream rate {sfreq} Hz differs from the model's {meta.sfreq} Hz (no resampling configured)"
        )
    return layout


def model_files(models: Sequence[str | Path]) -> list[Path]:
    """The ``.onnx`` files among ``models`` (files or folders), each loaded and checked against its metadata by the
    runtime (:func:`neurofed_runtime.model.open_model`): a missing, unreadable or inconsistent model is one line,
    before anything waits for a stream."""
    files: list[Path] = []
    for m in map(Path, models):
        if m.is_dir():
            found = sorted(m.glob("*.onnx"))
            if not found:
                raise NeuroFedError(f"{m}: folder holds no .onnx model")
            files += found
        else:
            files.append(m)
    if not files:
        raise NeuroFedError("no model given (--model FILE or FOLDER)")
    for f in files:
        open_model(f)
    return files


def pick_model(models: Sequence[str | Path], ch_names: Sequence[str], sfreq: float) -> Path:
    """The exported model to decode a stream with, among ``models`` (files or folders of ``.onnx`` files).

    One model with no device profile in its metadata decodes any stream that has its channels (as
    before). Otherwise the stream (channel names in order, rate) must match exactly one model's
    device profile (:func:`neurofed.trainer.data.profiles.match_profile`, as an edge client's recorded data
    must to join a federation of profiles); a stream matching none, several models of one profile,
    or a mix of models with and without a profile are each refused with one line.
    """

    files = model_files(models)
    metas = {f: read_onnx_meta(f) for f in files}
    plain = [f for f, m in metas.items() if m.profile is None]
    if len(files) == 1 and plain:
        return files[0]
    if plain:
        raise NeuroFedError(f"several models given, but {', '.join(map(str, plain))} "
                            "name(s) no device profile: cannot tell which stream each one decodes")
    by_profile: dict[str, list[Path]] = {}
    profiles: dict[str, DeviceProfile] = {}
    for f, m in metas.items():
        p = DeviceProfile.from_dict(m.profile, str(f))
        by_profile.setdefault(p.name, []).append(f)
        profiles[p.name] = p
    prof = match_profile(ch_names, sfreq, profiles.values())
    if len(by_profile[prof.name]) > 1:
        raise NeuroFedError(f"stream matches device profile {prof.name}, which several models are for "
                            f"({', '.join(map(str, by_profile[prof.name]))}); give one")
    logger.info("stream matches device profile %s: decoding with %s", prof.name, by_profile[prof.name][0])
    return by_profile[prof.name][0]
