"""The one windower of the edge: cue-locked and sliding windows cut from :class:`neurofed.edge.buffer.RingBuffer`.

Recording (``edge-client record``: raw trials into the store) and decoding (``edge-client infer``) cut
their windows here, so a recorded trial and a decoded window of the same cue are the same samples.

* :class:`CueWindower`: ``[cue + tmin, cue + tmax)``. The cue is placed on the sample nearest to its
  marker time (within half a sample period, as offline epoching rounds the cue to the nearest sample);
  the window starts ``round(tmin * sfreq)`` (+ a marker lag) samples later and is cut once all its
  samples are buffered. A marker whose data never comes is dropped after ``marker_timeout`` seconds.
* :class:`SlidingWindower`: a window ending every ``step`` seconds of stream time, on the sample grid.

Both skip (with a logged reason kept in ``skipped``) a window whose samples were lost (a timestamp gap
of more than 1.5 sample periods inside it) or already dropped from the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neurofed.edge import logger
from neurofed.edge.buffer import RingBuffer
from neurofed.trainer.errors import DataError


@dataclass
class Window:
    """Samples of one window, in the stream's layout.

    Attributes
    ----------
    data : ndarray, shape (n_times, stream_channels)
        A copy, the stream's dtype and units.
    first_index : int
        Absolute index of its first sample in the stream (as received).
    t_end : float
        Stream timestamp of its last sample (source clock after clock correction).
    t_arrival : float
        Local LSL time its last sample arrived (NaN if the buffer was fed without arrival times).
    label : str
        The cue's label (``""`` for sliding windows).
    onset : float or None
        The cue's marker time (None for sliding windows).
    """

    data: np.ndarray
    first_index: int
    t_end: float
    t_arrival: float
    label: str = ""
    onset: float | None = None


class _Cutter:
    """Shared cutting: gap check and bookkeeping of skipped windows."""

    def __init__(self, n_samples: int, sfreq: float, source: str) -> None:
        if n_samples < 1 or sfreq <= 0:
            raise DataError(f"a window needs >= 1 sample and a positive rate, got {n_samples}, {sfreq}")
        self.n, self.sfreq, self.source = int(n_samples), float(sfreq), source
        self.period = 1.0 / self.sfreq
        self.skipped: list[str] = []  # reasons of windows not cut

    def _skip(self, reason: str) -> None:
        logger.warning("%s: %s", self.source, reason)
        self.skipped.append(reason)

    def _cut(self, buf: RingBuffer, start: int, what: str, label: str = "", onset: float | None = None
             ) -> Window | None:
        data, tss = buf.get(start, start + self.n)
        gaps = np.diff(tss) > 1.5 * self.period
        if gaps.any():
            lost = round((tss[-1] - tss[0]) * self.sfreq) + 1 - self.n
            self._skip(f"{what}: about {lost} samples lost inside the window; skipped")
            return None
        return Window(data, start, float(tss[-1]), buf.arrival_of(start + self.n - 1), label, onset)


class CueWindower(_Cutter):
    """Pending cue markers -> windows ``[cue + tmin, cue + tmax)``, as the samples arrive.

    Parameters
    ----------
    n_samples : int
        Window length in stream samples.
    sfreq : float
        Stream nominal rate.
    tmin : float
        Window start relative to the cue (s).
    marker_timeout : float
        Seconds (of the caller's ``now`` clock) a marker may wait for its data before it is dropped.
    lag_samples : int
        Samples added to each cue position (mne-lsl's PlayerLSL stamps annotations one sample early: 1).
    source : str
        Stream name for the log.
    """

    def __init__(self, n_samples: int, sfreq: float, tmin: float = 0.0, marker_timeout: float = 10.0,
                 lag_samples: int = 0, source: str = "stream") -> None:
        super().__init__(n_samples, sfreq, source)
        self.offset = round(tmin * self.sfreq) + int(lag_samples)
        self.marker_timeout = float(marker_timeout)
        self.pending: list[tuple[float, str, float]] = []  # (marker ts, label, time received)

    def add_cue(self, ts: float, label: str = "", now: float = 0.0) -> None:
        """Announce a cue at stream time ``ts`` (received at ``now``)."""
        self.pending.append((float(ts), label, now))

    def poll(self, buf: RingBuffer, now: float = 0.0) -> list[Window]:
        """Windows whose samples are all buffered (the rest stay pending until ``marker_timeout``)."""
        out, keep = [], []
        for ts, label, t_recv in self.pending:
            what = f"{label or 'cue'} at {ts:.3f}"
            try:
                cue = buf.locate(ts, tol=0.5 * self.period)
            except DataError as exc:
                self._skip(f"{what}: {exc}; window skipped")
                continue
            start = None if cue is None else cue + self.offset
            if start is None or start + self.n > buf.total:
                if now - t_recv > self.marker_timeout:
                    self._skip(f"{what}: no EEG data for it after {self.marker_timeout:g} s "
                               "(markers without data?); dropped")
                else:
                    keep.append((ts, label, t_recv))
                continue
            if start < buf.first:
                self._skip(f"{what}: window starts before the buffered data; skipped")
                continue
            w = self._cut(buf, start, what, label, ts)
            if w is not None:
                out.append(w)
        self.pending = keep
        return out


class SlidingWindower(_Cutter):
    """A window ending every ``step_s`` seconds of stream time (several per poll if behind).

    Window ends sit on the stream's sample grid: the first ends at the ``n_samples``-th sample buffered
    (or at the newest one if the buffer already wrapped), each next one at the first sample within half a
    sample period of ``previous + step``.
    """

    def __init__(self, n_samples: int, step_s: float, sfreq: float, source: str = "stream") -> None:
        if step_s <= 0:
            raise DataError("sliding step must be > 0 s")
        super().__init__(n_samples, sfreq, source)
        self.step, self.half = float(step_s), 0.5 * self.period
        self._next: float | None = None

    def poll(self, buf: RingBuffer, now: float = 0.0) -> list[Window]:
        """Every window whose end has arrived since the last poll."""
        if len(buf) < self.n:
            return []
        t = buf.timestamps()
        if self._next is None:
            self._next = float(t[self.n - 1]) if buf.total < buf.capacity else float(t[-1])
        out = []
        while self._next - self.half <= t[-1]:
            i = int(np.searchsorted(t, self._next - self.half))
            if i < self.n - 1:  # its start was already dropped from the buffer: skip ahead
                self._skip(f"sliding window ending at {self._next:.3f} s no longer buffered; skipped")
            else:
                w = self._cut(buf, buf.first + i - self.n + 1, f"sliding window ending at {t[i]:.3f} s")
                if w is not None:
                    out.append(w)
            self._next += self.step
        return out
