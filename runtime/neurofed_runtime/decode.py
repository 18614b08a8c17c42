"""Decode with a standalone model: a window, a sliding stream, or an ``mne.Epochs`` object.

:class:`Decoder` binds a :class:`~neurofed_runtime.model.StandaloneModel` to a stream's channel layout (labels,
units, rate: :func:`~neurofed_runtime.channels.match_stream`, from an LSL description, an ``mne.Info`` or plain
lists) and carries the model's state from window to window::

    dec = Decoder.load("model.onnx", ch_names=labels, sfreq=160.0, units="microvolts")
    for chunk in chunks:                      # (samples, stream channels), in the stream's units
        for res in dec.stream(chunk):
            print(res.label, res.probs)       # or a WindowRejected with .bad_channels

The stream's channels are picked and put in the model's order, converted to the unit the graph takes, and the
graph does the rest (input guard, band-pass, resampling, online alignment, batch-norm context).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neurofed_runtime.channels import StreamChannels, is_counts, lsl_channels, match_stream, mne_channels
from neurofed_runtime.errors import DataError, WindowRejected
from neurofed_runtime.model import StandaloneModel


@dataclass(frozen=True)
class Result:
    """One decoded window: the class probabilities, the winning index, its class name and, for a decoder that
    follows releases (:meth:`Decoder.follow`), the release version that decoded it."""

    probs: np.ndarray
    index: int
    label: str
    version: int | None = None


class Decoder:
    """A standalone model reading one stream's layout, with its state carried between windows.

    Parameters
    ----------
    model : neurofed_runtime.model.StandaloneModel or path
    ch_names : sequence of str, optional
        The stream's channel labels (any superset and order of the model's; ``Fc5.`` ~ ``FC5``). Default: the
        model's own channels, in its order.
    sfreq : float, optional
        The stream's nominal rate (default: the rate the graph was exported for; another rate is refused).
    units : str or sequence of str, optional
        The stream's channel units (one for all, or one per channel; default: the graph's own unit).
    step_s : float, optional
        Seconds between sliding windows in :meth:`stream` (default: the model's ``step_s``).
    source : str
        Stream name for the error messages.
    """

    def __init__(self, model: StandaloneModel | str | os.PathLike, ch_names: Sequence[str] | None = None,
                 sfreq: float | None = None, units: str | Sequence[str] | None = None,
                 step_s: float | None = None, source: str = "stream", threads: int = 1) -> None:
        self.model = model if isinstance(model, StandaloneModel) else StandaloneModel(model, threads)
        info, card = self.model.info, self.model.card
        names = list(card.ch_names) if ch_names is None else list(ch_names)
        rate = float(info.rate if sfreq is None else sfreq)
        if units is None:
            units = info.unit
        unit_list = [units] * len(names) if isinstance(units, str) else list(units)
        if len(unit_list) != len(names):
            raise DataError(f"{source}: {len(unit_list)} units for {len(names)} channels")
        if abs(rate - float(info.rate)) > 1e-6:
            raise DataError(f"{source}: runs at {rate:g} Hz but the model was exported for {info.rate:g} Hz; "
                            f"export it again with `neurofed export --standalone --rate {rate:g}`")
        # raw counts are read with the gain the graph was exported for (its device profile's)
        counts_uv = float(info.unit_to_uv) if is_counts(info.unit) else None
        self.layout = match_stream(rate, names, unit_list, wanted=list(card.ch_names), source=source,
                                   counts_uv=counts_uv)
        self.from_uv = None if float(info.unit_to_uv) == 1.0 else 1.0 / float(info.unit_to_uv)
        self.n_stream = len(names)
        self.step = max(1, int(round((info.step_s if step_s is None else step_s) * rate)))
        self.window_samples = info.window_samples
        self.classes = list(card.classes)
        self.source = source
        self.follower: Any = None  # a neurofed_runtime.follow.ReleaseFollower once follow() was called
        self.version: int | None = None
        self.reset()

    def follow(self, follower: Any, version: int | None = None) -> Decoder:
        """Swap to every release ``follower`` (:class:`neurofed_runtime.follow.ReleaseFollower`) accepts, between
        two windows: before each window a pending release replaces the model, and the session's alignment
        statistics and BN context are carried over (:func:`~neurofed_runtime.follow.carry_state`). ``version`` is
        the running model's release (None: not a release). Returns the decoder."""
        follower.running(self.model, version)
        self.follower, self.version = follower, version
        return self

    @classmethod
    def load(cls, path: str | os.PathLike, **kwargs: Any) -> Decoder:
        """A decoder of the standalone model in ``path`` (keyword arguments: :class:`Decoder`'s)."""
        return cls(path, **kwargs)

    @classmethod
    def from_lsl(cls, model: StandaloneModel | str | os.PathLike, info: Any, **kwargs: Any) -> Decoder:
        """A decoder for an LSL stream, from its ``pylsl.StreamInfo`` with the full description
        (``inlet.info()``): channel labels and units from ``desc/channels``, the nominal rate."""
        ch: StreamChannels = lsl_channels(info)
        return cls(model, ch.ch_names, ch.sfreq, ch.units, source=ch.name, **kwargs)

    @classmethod
    def from_mne(cls, model: StandaloneModel | str | os.PathLike, info: Any, **kwargs: Any) -> Decoder:
        """A decoder for data described by an ``mne.Info`` (volts, its channel names and rate)."""
        ch = mne_channels(info)
        return cls(model, ch.ch_names, ch.sfreq, ch.units, source=kwargs.pop("source", "mne data"), **kwargs)

    def reset(self) -> None:
        """Start a new session: the model's initial state, an empty sliding buffer."""
        self.state = self.model.initial_state()
        #: the last accepted windows (graph channels and unit), as many as the graph keeps as BN context: a new
        #: release rebuilds its own context from them
        self._recent: deque[np.ndarray] = deque(maxlen=max(int(self.model.info.context_windows), 1))
        self._buf = np.zeros((0, len(self.layout.idx)), np.float64)
        self._due = self.window_samples  # samples until the next sliding window is complete

    def to_model(self, samples: np.ndarray) -> np.ndarray:
        """Stream-layout samples ``(n, stream channels)`` -> the model's channels in the graph's unit ``(c, n)``."""
        x = self.layout.select(samples)  # microvolts
        return x if self.from_uv is None else x * self.from_uv

    def decode(self, window: np.ndarray) -> Result:
        """Decode one window ``(stream channels, window samples)`` in the stream's units and advance the state.

        Raises
        ------
        WindowRejected
            The input guard refused it (the state is unchanged).
        """
        w = np.asarray(window)
        if w.shape != (self.n_stream, self.window_samples):
            raise DataError(f"{self.source}: window shape {w.shape}, expected ({self.n_stream}, {self.window_samples})")
        return self._run(self.to_model(w.T))

    def _swap_if_pending(self) -> None:
        """Apply the follower's pending release (between two windows: the last one is out, the next not yet in)."""
        from neurofed_runtime.follow import carry_state

        p = self.follower.take()
        if p is None:
            return
        state, ctx = carry_state(self.model, p.model, self.state, list(self._recent))
        self.model, self.state, self.version = p.model, state, p.version
        self.follower.swapped(p, state, ctx)

    def _run(self, x: np.ndarray) -> Result:
        if self.follower is not None:
            self._swap_if_pending()
        probs, self.state = self.model.run(x, self.state)
        self._recent.append(np.array(x, copy=True))
        p = np.asarray(probs, np.float64).reshape(-1)
        k = int(np.argmax(p))
        return Result(p, k, self.classes[k], self.version)

    def stream(self, chunk: np.ndarray) -> Iterator[Result | WindowRejected]:
        """Feed a chunk ``(samples, stream channels)`` of a continuous stream; yields one result per sliding
        window completed (every ``step`` samples once a whole window has arrived). A rejected window is yielded
        as its :class:`WindowRejected` (the state is unchanged) and decoding goes on."""
        c = np.asarray(chunk)
        if c.ndim != 2 or c.shape[1] != self.n_stream:
            raise DataError(f"{self.source}: chunk shape {c.shape}, expected (samples, {self.n_stream})")
        x = self.to_model(c).T  # (n, model channels)
        pos = 0
        while pos < len(x):
            take = min(self._due, len(x) - pos)
            self._buf = np.concatenate([self._buf, x[pos : pos + take]])[-self.window_samples :]
            pos += take
            self._due -= take
            if self._due == 0:  # a whole window, then one every `step` samples
                self._due = self.step
                try:
                    yield self._run(self._buf.T)
                except WindowRejected as exc:
                    yield exc

    def decode_epochs(self, epochs: Any) -> tuple[np.ndarray, list[str]]:
        """Decode an ``mne.Epochs`` (or an array ``(n, stream channels, window samples)`` in the stream's units)
        in order, one session: ``(probabilities (n, classes) with NaN rows for rejected epochs, reasons)``."""
        if hasattr(epochs, "get_data"):
            if len(epochs.ch_names) != self.n_stream:
                raise DataError(f"{self.source}: the epochs have {len(epochs.ch_names)} channels, this decoder reads "
                                f"{self.n_stream}; build it with Decoder.from_mne(model, epochs.info)")
            data = epochs.get_data(copy=False)
        else:
            data = np.asarray(epochs)
        if data.ndim != 3 or data.shape[-1] != self.window_samples:
            info = self.model.info
            raise DataError(f"{self.source}: epochs of {data.shape[-1] if data.ndim == 3 else '?'} samples; the model "
                            f"takes {self.window_samples} ({self.window_samples / info.rate:g} s at {info.rate:g} Hz: "
                            f"tmax = tmin + {(self.window_samples - 1) / info.rate:g})")
        out = np.full((len(data), len(self.classes)), np.nan)
        reasons = [""] * len(data)
        for i, ep in enumerate(data):
            try:
                out[i] = self.decode(ep).probs
            except WindowRejected as exc:
                reasons[i] = str(exc)
        return out, reasons


__all__ = ["Decoder", "Result"]
