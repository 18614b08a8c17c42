"""The one ring buffer of the edge: timestamped multichannel samples, addressed by absolute sample index.

Recording (:mod:`neurofed.edge.capture`) and decoding (:mod:`neurofed.edge.infer`) both buffer the stream here and cut
their windows with :mod:`neurofed.edge.windowing`. Appends and reads are vectorised (slice copies, no per-sample
Python loop). Besides each sample's stream timestamp (source clock, after clock correction) the buffer
keeps its local arrival time (LSL clock when the chunk was pulled), so latency is measured against
arrival whatever the stream's timestamps say (e.g. a recording replayed faster than real time).
"""

from __future__ import annotations

import numpy as np

from neurofed.trainer.errors import DataError


class RingBuffer:
    """Fixed-capacity circular buffer; sample ``k`` (counted since creation) lives at ``k % capacity``.

    Parameters
    ----------
    n_channels : int
    capacity : int
        Samples kept (older ones are overwritten).
    """

    def __init__(self, n_channels: int, capacity: int, dtype: type = np.float32) -> None:
        if capacity < 1 or n_channels < 1:
            raise DataError(f"ring buffer needs capacity and channels >= 1, got {capacity}, {n_channels}")
        self.capacity = int(capacity)
        self.n_channels = int(n_channels)
        self.data = np.zeros((self.capacity, self.n_channels), dtype=dtype)
        self.ts = np.zeros(self.capacity, dtype=np.float64)
        self.arrival = np.full(self.capacity, np.nan)
        self.total = 0  # samples ever appended = absolute index of the next sample

    @property
    def first(self) -> int:
        """Absolute index of the oldest sample still held."""
        return max(0, self.total - self.capacity)

    def __len__(self) -> int:
        return self.total - self.first

    def append(self, data: np.ndarray, ts: np.ndarray, arrival: float | None = None) -> None:
        """Add ``data`` (n, channels) with timestamps (n,) that arrived at local time ``arrival``."""
        n = len(ts)
        if n == 0:
            return
        if data.shape != (n, self.n_channels):
            raise DataError(f"chunk shape {data.shape} does not match ({n}, {self.n_channels})")
        if n > self.capacity:  # only the newest samples fit
            self.total += n - self.capacity
            data, ts, n = data[-self.capacity:], ts[-self.capacity:], self.capacity
        i = self.total % self.capacity
        k = min(n, self.capacity - i)
        self.data[i:i + k] = data[:k]
        self.ts[i:i + k] = ts[:k]
        self.arrival[i:i + k] = np.nan if arrival is None else arrival
        if k < n:
            self.data[: n - k] = data[k:]
            self.ts[: n - k] = ts[k:]
            self.arrival[: n - k] = np.nan if arrival is None else arrival
        self.total += n

    def _positions(self, start: int, stop: int) -> np.ndarray:
        if start < self.first or stop > self.total or start > stop:
            raise DataError(f"samples [{start}, {stop}) are not in the buffer (holds [{self.first}, {self.total}))")
        return np.arange(start, stop) % self.capacity

    def get(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of samples ``[start, stop)`` (absolute indices) and their timestamps."""
        if start < self.first or stop > self.total or start > stop:
            self._positions(start, stop)  # raises the error
        return self._span(self.data, start, stop), self._span(self.ts, start, stop)

    def _span(self, arr: np.ndarray, start: int, stop: int) -> np.ndarray:
        """A copy of ``arr``'s rows for absolute samples ``[start, stop)`` (held): one slice, or two across the
        wrap point (no index array, no gather: this runs for every decoded window)."""
        i, n = start % self.capacity, stop - start
        if i + n <= self.capacity:
            return arr[i:i + n].copy()
        return np.concatenate([arr[i:], arr[: n - (self.capacity - i)]])

    def arrival_of(self, index: int) -> float:
        """Local arrival time of sample ``index`` (NaN if it was appended without one)."""
        self._positions(index, index + 1)
        return float(self.arrival[index % self.capacity])

    def timestamps(self) -> np.ndarray:
        """Timestamps of all held samples, oldest first."""
        return self._span(self.ts, self.first, self.total)

    @property
    def last_ts(self) -> float | None:
        return float(self.ts[(self.total - 1) % self.capacity]) if self.total else None

    def locate(self, t: float, tol: float) -> int | None:
        """Absolute index of the sample nearest to time ``t``.

        Returns None while ``t`` lies beyond the newest sample (data not arrived yet).

        Raises
        ------
        DataError
            If ``t`` is older than the buffer, or no sample lies within ``tol`` seconds of it (lost data).
        """
        if not self.total or t > self.last_ts + tol:
            return None
        ts = self.timestamps()
        if t < ts[0] - tol:
            raise DataError(f"time {t:.3f} is older than the buffered data (from {ts[0]:.3f})")
        j = int(np.searchsorted(ts, t))
        cands = [c for c in (j - 1, j) if 0 <= c < len(ts)]
        best = min(cands, key=lambda c: abs(ts[c] - t))
        if abs(ts[best] - t) > tol:
            raise DataError(f"no sample within {tol * 1e3:.1f} ms of time {t:.3f} (data lost around it)")
        return self.first + best
