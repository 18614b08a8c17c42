"""Real-time inference on plain arrays: windowing, guard, online EA, batch-specific BN context.

No LSL here: samples come in as ``(n_samples, n_channels)`` chunks with timestamps, so the
whole path is testable offline and the LSL glue stays thin.

* **Online Euclidean alignment** (ABAT-style): the reference starts as the identity (or an
  offline reference covariance) for the first ``min_windows`` accepted windows, then becomes
  the running mean of the covariances of the user's windows seen so far (the current included).
  After all of a subject's trials it equals offline per-subject EA.
* **Batch-specific BN context**: the model's BN layers normalise with the statistics of the
  batch they see, so a lone window would be normalised with its own statistics only. The engine
  keeps the user's last ``B - 1`` accepted windows (B = the model's test batch size, 8) and runs
  the model on ``[context..., new]``, taking the last row: every window is normalised with
  real statistics from the same user, as in the offline protocol (test batch 8).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edge.guard import GuardConfig, GuardResult, check_window
from export.metadata import OnnxModelMeta
from export.runtime import OnnxModel
from trainer.data.config import PreprocessConfig
from trainer.data.preprocess import apply_ea, n_times_for, pick_channels, preprocess_epochs
from trainer.errors import DataError, NeuroFedError

logger = logging.getLogger("neurofed.edge")


def inv_sqrt(r: np.ndarray) -> np.ndarray:
    """``R^{-1/2}`` of a covariance, eigenvalues floored at 1e-10 x the largest (as ``ea_matrix``)."""
    w, v = np.linalg.eigh(r)
    if not np.all(np.isfinite(w)) or w.max() <= 0:
        raise DataError("EA covariance is not positive")
    w = np.clip(w, w.max() * 1e-10, None)
    return (v / np.sqrt(w)) @ v.T


class OnlineEA:
    """Running Euclidean alignment from the user's own windows.

    Parameters
    ----------
    n_channels : int
    reference : ndarray (c, c), optional
        Offline reference covariance used until ``min_windows`` windows were seen (identity if None).
    min_windows : int
        Windows needed before the running mean replaces the reference.
    """

    def __init__(self, n_channels: int, reference: np.ndarray | None = None, min_windows: int = 1) -> None:
        self.n_channels = n_channels
        self.reference = None if reference is None else np.asarray(reference, np.float64)
        if self.reference is not None and self.reference.shape != (n_channels, n_channels):
            raise DataError(f"EA reference is {self.reference.shape}, expected ({n_channels}, {n_channels})")
        self.min_windows = max(1, int(min_windows))
        self._sum = np.zeros((n_channels, n_channels))
        self.count = 0

    def update(self, x: np.ndarray) -> None:
        """Add the covariance ``X X^T / T`` of one window ``(c, t)``."""
        x = np.asarray(x, np.float64)
        self._sum += x @ x.T / x.shape[1]
        self.count += 1

    def matrix(self) -> np.ndarray:
        """Current alignment matrix ``R^{-1/2}``."""
        if self.count < self.min_windows:
            return np.eye(self.n_channels) if self.reference is None else inv_sqrt(self.reference)
        return inv_sqrt(self._sum / self.count)


class SampleRing:
    """Fixed-capacity ring of samples ``(n, channels)`` with their timestamps (seconds)."""

    def __init__(self, n_channels: int, capacity: int) -> None:
        self.data = np.zeros((capacity, n_channels), np.float64)
        self.times = np.full(capacity, -np.inf)
        self.capacity, self.n, self._head = capacity, 0, 0

    def push(self, samples: np.ndarray, timestamps: np.ndarray) -> None:
        samples = np.asarray(samples, np.float64).reshape(len(timestamps), -1)
        for s, t in zip(samples[-self.capacity :], np.asarray(timestamps)[-self.capacity :]):
            self.data[self._head], self.times[self._head] = s, t
            self._head = (self._head + 1) % self.capacity
            self.n = min(self.n + 1, self.capacity)

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """Samples and timestamps, oldest first."""
        idx = (np.arange(self.n) + self._head - self.n) % self.capacity
        return self.data[idx], self.times[idx]

    def last(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The latest ``n`` samples as ``(channels, n)`` and their timestamps, or None if fewer."""
        if self.n < n:
            return None
        d, t = self.ordered()
        return d[-n:].T, t[-n:]

    def from_time(self, t0: float, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``n`` samples from the first timestamp >= ``t0``, ``(channels, n)``; None if not all there yet."""
        d, t = self.ordered()
        i = int(np.searchsorted(t, t0))
        if i + n > self.n:
            return None
        return d[i : i + n].T, t[i : i + n]

    def lost(self, t0: float) -> bool:
        """True if samples at ``t0`` were already dropped (ring full and ``t0`` before its oldest sample)."""
        if self.n < self.capacity:
            return False
        _, t = self.ordered()
        return t0 < t[0]


@dataclass
class Prediction:
    """One decoded window."""

    label: str
    index: int
    probabilities: list[float]
    t_end: float
    n_context: int
    ea_windows: int


@dataclass
class Rejection:
    """A window refused by the input guard."""

    reason: str
    t_end: float
    bad_channels: dict[str, list[str]] = field(default_factory=dict)


class InferenceEngine:
    """Decode raw windows from a stream with a given channel list and rate.

    Parameters
    ----------
    model : OnnxModel
    stream_ch_names : sequence of str
        Channel labels of the incoming stream (any superset/order of the model's channels).
    stream_sfreq : float
        Nominal rate of the stream in Hz.
    guard : GuardConfig, optional
        Input-guard thresholds (default: ``GuardConfig()``).
    context : int, optional
        Batch size for BN context (default: model metadata ``test_batch_size``).
    ea_reference : ndarray, optional
        Offline EA reference covariance (c, c) used for the first ``ea_min_windows`` windows.
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
    ) -> None:
        self.model, self.meta = model, model.meta
        m: OnnxModelMeta = self.meta
        self.cfg = PreprocessConfig.from_dict({**m.preprocess, "channels": list(m.ch_names)})
        self.stream_ch_names, self.stream_sfreq = list(stream_ch_names), float(stream_sfreq)
        self.guard = guard if guard is not None else GuardConfig()
        check_stream(m, self.stream_ch_names, self.stream_sfreq)
        self.window_samples = n_times_for(self.stream_sfreq, self.cfg)
        probe = np.zeros((1, len(self.stream_ch_names), self.window_samples))
        probe[..., ::2] = 1.0
        got = preprocess_epochs(probe, self.stream_sfreq, self.stream_ch_names, self.cfg)[0].shape[-1]
        if got != m.n_times:
            raise NeuroFedError(
                f"a {self.window_samples}-sample window at {self.stream_sfreq} Hz preprocesses to {got} "
                f"samples, but the model expects {m.n_times} ({m.sfreq} Hz x {m.window} s)"
            )
        self.batch = int(context or m.test_batch_size)
        self.ea = OnlineEA(m.n_channels, ea_reference, ea_min_windows) if m.ea else None
        self._context: deque[np.ndarray] = deque(maxlen=max(self.batch - 1, 0))

    def preprocess(self, raw: np.ndarray) -> np.ndarray:
        """Raw window on the model's channels ``(n_channels, window_samples)`` -> band-passed, resampled."""
        x, _, _ = preprocess_epochs(raw[None], self.stream_sfreq, self.meta.ch_names, self.cfg)
        return x[0]

    def process(self, window: np.ndarray, t_end: float) -> Prediction | Rejection:
        """Guard, preprocess, align and classify one raw window (microvolts) ending at ``t_end``."""
        window = np.asarray(window, np.float64)
        if window.shape != (len(self.stream_ch_names), self.window_samples):
            raise NeuroFedError(
                f"window shape {window.shape}, expected ({len(self.stream_ch_names)}, {self.window_samples})"
            )
        raw = pick_channels(window, self.stream_ch_names, self.meta.ch_names)
        verdict: GuardResult = check_window(raw, self.meta.ch_names, self.guard)
        if not verdict.ok:
            return Rejection(verdict.reason, t_end, verdict.bad_channels)
        x = self.preprocess(raw)
        if self.ea is not None:
            self.ea.update(x)
        batch = np.stack([*self._context, x])
        if self.ea is not None:
            batch = apply_ea(batch, self.ea.matrix())
        logits = self.model.forward(batch.astype(np.float32))[-1].astype(np.float64)
        self._context.append(x)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        k = int(p.argmax())
        return Prediction(
            self.meta.classes[k],
            k,
            [float(v) for v in p],
            float(t_end),
            len(batch) - 1,
            self.ea.count if self.ea else 0,
        )


def check_stream(meta: OnnxModelMeta, ch_names: Sequence[str], sfreq: float) -> None:
    """Clear errors when a stream cannot feed the model (missing channels, wrong rate)."""
    have = {c.lower() for c in ch_names}
    missing = [c for c in meta.ch_names if c.lower() not in have]
    if missing:
        raise NeuroFedError(f"stream lacks the model's channels {missing} (stream has {list(ch_names)})")
    if sfreq <= 0:
        raise NeuroFedError("stream has an irregular/zero nominal rate; the model needs a fixed rate")
    fmax = float(meta.preprocess.get("fmax", 0.0))
    if fmax >= sfreq / 2:
        raise NeuroFedError(f"stream rate {sfreq} Hz is too low for the model's band-pass up to {fmax} Hz")
    if not meta.preprocess.get("resample") and abs(sfreq - meta.sfreq) > 1e-6:
        raise NeuroFedError(
            f"stream rate {sfreq} Hz differs from the model's {meta.sfreq} Hz (no resampling configured)"
        )


class SlidingWindower:
    """Emit windows ending every ``step`` seconds of stream time (several per poll if behind).

    Window ends sit on the stream's sample grid: the first ends at the ``n_samples``-th sample
    seen, each next one at the first sample within half a sample period of ``previous + step``.
    """

    def __init__(self, n_samples: int, step_s: float, sfreq: float) -> None:
        if step_s <= 0:
            raise ValueError("sliding step must be > 0 s")
        self.n, self.step, self.half = n_samples, step_s, 0.5 / sfreq
        self._next: float | None = None

    def poll(self, ring: SampleRing) -> list[tuple[np.ndarray, float]]:
        if ring.n < self.n:
            return []
        d, t = ring.ordered()
        if self._next is None:
            self._next = float(t[self.n - 1]) if ring.n < ring.capacity else float(t[-1])
        out = []
        while self._next - self.half <= t[-1]:
            i = int(np.searchsorted(t, self._next - self.half))
            if i < self.n - 1:  # its start was already dropped from the ring: skip ahead
                logger.warning("sliding window ending at %.3f s no longer buffered; skipped", self._next)
            else:
                out.append((d[i - self.n + 1 : i + 1].T, float(t[i])))
            self._next += self.step
        return out


class CueWindower:
    """Cut ``[cue + tmin, cue + tmax)`` once all its samples have arrived (cue-locked trials).

    The window starts at the first sample within half a sample period of ``cue + tmin``, as
    offline epoching rounds the cue to the nearest sample.
    """

    def __init__(self, n_samples: int, tmin: float, sfreq: float) -> None:
        self.n, self.tmin, self.half = n_samples, tmin, 0.5 / sfreq
        self.pending: list[tuple[float, str]] = []

    def add_cue(self, t: float, label: str = "") -> None:
        self.pending.append((t, label))

    def poll(self, ring: SampleRing) -> list[tuple[np.ndarray, float]]:
        out, keep = [], []
        for t, lab in self.pending:
            if ring.lost(t + self.tmin):
                logger.warning("cue at %.3f s: its window start is no longer buffered; skipped", t)
                continue
            got = ring.from_time(t + self.tmin - self.half, self.n)
            if got is None:
                keep.append((t, lab))
            else:
                out.append((got[0], float(got[1][-1])))
        self.pending = keep
        return out
