"""Cut raw trials out of a live EEG stream at cue markers (pure logic on arrays; no pylsl here).

:class:`TrialCutter` validates the stream with :func:`neurofed.edge.stream.match_stream` (rate, units, channels: the
same rules ``edge-client infer`` applies; a stream in raw ``counts`` is read with the gain of the device profile
it matches, :func:`neurofed.edge.stream.stream_profile`), and cuts each cue's ``[tmin, tmax)`` window with
:class:`neurofed.edge.windowing.CueWindower` once all its samples are in the :class:`~neurofed.edge.buffer.RingBuffer` (the
decoder's windower and buffer too). Trials keep the raw microvolts so preprocessing can change later;
:func:`preprocess_trials` applies exactly trainer's ``preprocess_epochs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from neurofed.edge import logger
from neurofed.edge.buffer import RingBuffer
from neurofed.edge.stream import StreamLayout, match_stream, stream_profile
from neurofed.edge.windowing import CueWindower
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.preprocess import n_times_for, preprocess_epochs
from neurofed.trainer.data.profiles import DeviceProfile
from neurofed.trainer.errors import DataError


@dataclass
class RawTrial:
    """One cue's raw epoch.

    Attributes
    ----------
    data : ndarray, float32, shape (n_channels, n_times)
        Microvolts, channels in :attr:`ch_names` order.
    label : str
    onset : float
        Cue marker timestamp (LSL clock, after clock correction).
    sfreq : float
    ch_names : list of str
    first_index : int
        Absolute index of the epoch's first sample in the stream (as received).
    """

    data: np.ndarray
    label: str
    onset: float
    sfreq: float
    ch_names: list[str]
    first_index: int = 0


@dataclass(frozen=True)
class CaptureConfig:
    """What to capture.

    Parameters
    ----------
    preprocess : PreprocessConfig
        Its ``tmin``/``tmax`` define the window; its channels must be present in the stream.
    classes : tuple of str
        Marker strings that start a trial (others, e.g. ``rest``, are ignored).
    channels : tuple of str or None
        Raw channels to keep, in this order (default: every stream channel except ``Samples``).
    expected_sfreq : float or None
        Refuse a stream whose nominal rate differs.
    marker_timeout : float
        Seconds a marker may wait for its data before it is dropped.
    marker_map : dict or None
        Renames incoming markers first (e.g. ``{"T1": "left_fist", "T2": "right_fist"}``).
    marker_lag_samples : int
        Samples added to each cue position (mne-lsl's PlayerLSL stamps annotations one sample early: 1).
    """

    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    classes: tuple[str, ...] = ("left_fist", "right_fist")
    channels: tuple[str, ...] | None = None
    expected_sfreq: float | None = None
    marker_timeout: float = 10.0
    marker_map: dict[str, str] | None = None
    marker_lag_samples: int = 0


def check_stream(sfreq: float, ch_names: Sequence[str], units: Sequence[str], cfg: CaptureConfig,
                 source: str = "stream") -> tuple[list[int], list[str], np.ndarray]:
    """Validate a stream against ``cfg`` (:func:`neurofed.edge.stream.match_stream`, shared with decoding).

    Returns
    -------
    idx : list of int
        Stream indices of the channels to keep, in the wanted order (matched by label).
    names : list of str
        Their labels (the wanted spelling).
    scale : ndarray
        Per kept channel, the factor to microvolts.

    Raises
    ------
    DataError
        Irregular or unexpected rate, missing channels (all listed), unknown units.
    """
    lay, _ = capture_layout(sfreq, ch_names, units, cfg, source)
    return lay.idx, lay.names, lay.scale


def capture_layout(sfreq: float, ch_names: Sequence[str], units: Sequence[str], cfg: CaptureConfig,
                   source: str = "stream") -> tuple[StreamLayout, DeviceProfile | None]:
    """The stream's layout for capture and the device profile whose gain reads its ``counts`` channels (if any).

    Raises
    ------
    DataError
        As :func:`check_stream`; a ``counts`` stream matching no device profile in counts (one line).
    """
    prof = stream_profile(sfreq, ch_names, units, source=source)
    lay = match_stream(sfreq, ch_names, units, cfg.channels, cfg.preprocess.channels or (), cfg.preprocess.fmax,
                       cfg.expected_sfreq, source, profile=prof)
    return lay, prof


class TrialCutter:
    """Pending cue markers -> raw trials, as the samples arrive (windows from :class:`neurofed.edge.windowing.CueWindower`).

    Parameters
    ----------
    sfreq : float
        Stream nominal rate.
    ch_names, units : sequence of str
        Stream channel labels and units (from its XML description).
    cfg : CaptureConfig

    Attributes
    ----------
    profile : DeviceProfile or None
        The device profile whose gain turned the stream's raw ``counts`` into microvolts (None: the stream
        declares a physical unit).
    """

    def __init__(self, sfreq: float, ch_names: Sequence[str], units: Sequence[str], cfg: CaptureConfig,
                 source: str = "stream") -> None:
        self.cfg, self.sfreq, self.source = cfg, float(sfreq), source
        self.layout, self.profile = capture_layout(sfreq, ch_names, units, cfg, source)
        self.idx, self.ch_names, self.scale = self.layout.idx, self.layout.names, self.layout.scale
        self.n_times = n_times_for(self.sfreq, cfg.preprocess)
        self.windower = CueWindower(self.n_times, self.sfreq, cfg.preprocess.tmin, cfg.marker_timeout,
                                    cfg.marker_lag_samples, source)
        self.offset = round(cfg.preprocess.tmin * self.sfreq)
        self.skipped = self.windower.skipped  # reasons of trials not captured (shared list)

    @property
    def pending(self) -> list[tuple[float, str, float]]:
        """Cues still waiting for their data: (marker ts, label, time received)."""
        return self.windower.pending

    def add_marker(self, ts: float, label: str, now: float) -> None:
        if self.cfg.marker_map:
            label = self.cfg.marker_map.get(label, label)
        if label in self.cfg.classes:
            self.windower.add_cue(ts, label, now)

    def poll(self, buf: RingBuffer, now: float) -> list[RawTrial]:
        """Trials whose whole window is buffered (the rest stay pending until ``marker_timeout``)."""
        out = []
        for w in self.windower.poll(buf, now):
            x = np.ascontiguousarray(self.layout.select(w.data), dtype=np.float32)
            what = f"{w.label} cue at {w.onset:.3f}"
            if not np.all(np.isfinite(x)):
                self.windower._skip(f"{what}: NaN/inf samples in the window; skipped")
                continue
            if float(np.abs(x).max()) < 0.01:
                self.windower._skip(f"{what}: amplitudes below 0.01 µV (flat, or probably in volts "
                                    "though labelled microvolts); skipped")
                continue
            out.append(RawTrial(x, w.label, float(w.onset), self.sfreq, list(self.ch_names), w.first_index))
        return out


def preprocess_trials(trials: Sequence[RawTrial], cfg: PreprocessConfig) -> tuple[np.ndarray, float, list[str]]:
    """Stack raw trials and run trainer's ``preprocess_epochs`` on them (no EA)."""
    if not trials:
        raise DataError("no trials to preprocess")
    names, sfreq = trials[0].ch_names, trials[0].sfreq
    for t in trials[1:]:
        if t.ch_names != names or t.sfreq != sfreq:
            raise DataError("trials differ in channels or sampling rate; cannot stack them")
    x = np.stack([t.data for t in trials])
    return preprocess_epochs(x, sfreq, names, cfg)


@dataclass
class CaptureStats:
    """What a capture run saw."""

    trials: int = 0
    samples: int = 0
    skipped: list[str] = field(default_factory=list)
    outages: int = 0


class LiveCapture:
    """Capture trials from a live EEG stream and its marker stream.

    Parameters
    ----------
    name, source_id : str, optional
        EEG stream to resolve (type ``EEG`` when only a source id is given).
    marker_name : str, optional
        Marker stream (default ``{name}-markers``).
    cfg : CaptureConfig
    resolve_timeout : float
        Seconds to find each stream.
    processing : str
        Inlet processing (``clocksync`` default; ``dejitter`` smooths jittery timestamps).
    buffer_seconds : float
        Ring buffer length.
    gap_warn : float
        A jump of more than this many seconds between consecutive timestamps counts as an outage.
    reconnect_after : float
        Seconds of silence after which, besides liblsl's own recovery (``recover=True``), the streams are
        re-resolved by source_id and fresh inlets opened (retried every second) -- only when the outlet was
        re-created (a new uid): a sender that is merely stalled (a loaded host) keeps its inlets, since swapping
        them would lose what arrives in the old ones while the new ones connect. On a swap the old inlets are
        drained first, and samples the buffer already holds and repeated markers are dropped.
    """

    def __init__(self, name: str | None = None, source_id: str | None = None, marker_name: str | None = None,
                 cfg: CaptureConfig | None = None, resolve_timeout: float = 5.0, processing: str = "clocksync",
                 buffer_seconds: float = 60.0, gap_warn: float = 0.5, reconnect_after: float = 4.0) -> None:
        from neurofed.edge.lsl_io import (  # the only pylsl user
            Inlet,
            StreamError,
            check_marker_stream,
            check_unique,
            find_stream,
            local_clock,
        )

        self._clock = local_clock
        self.cfg = cfg or CaptureConfig()
        self._processing = processing
        e_type = None if name else "EEG"
        self.eeg = Inlet(find_stream(name=name, stype=e_type, source_id=source_id, timeout=resolve_timeout,
                                     unique=False), processing)
        meta = self.eeg.meta
        if meta.is_string:
            raise DataError(f"stream {meta.name!r} carries strings, not EEG samples")
        m_name = marker_name or f"{meta.name}-markers"  # mne-lsl players: f"{name}-annotations"
        self.markers = Inlet(find_stream(name=m_name, timeout=resolve_timeout, unique=False), processing)
        try:  # both inlets are open (and buffering): now refuse ambiguous names
            check_unique([(name, e_type, source_id), (m_name, None, None)])
        except StreamError:
            self.close()
            raise
        check_marker_stream(self.markers.meta)
        self.reconnect_after = reconnect_after
        self._next_reconnect = 0.0
        try:  # a stream the capture cannot read (units, channels, rate): close the inlets before the error
            self.cutter = TrialCutter(meta.sfreq, meta.ch_names, meta.units, self.cfg, source=meta.name)
        except DataError:
            self.close()
            raise
        capacity = max(int(buffer_seconds * meta.sfreq), 4 * self.cutter.n_times + abs(self.cutter.offset))
        dtype = np.float64 if np.dtype(self.eeg.dtype) == np.float64 else np.float32
        self.buf = RingBuffer(meta.n_channels, capacity, dtype)
        self.stats = CaptureStats()
        self.gap_warn = gap_warn
        self._last_data: float | None = None
        self._seen_markers: dict[tuple[float, str], None] = {}  # recent markers, oldest first
        self._overlap_until = 0.0  # after swapping inlets: drop samples not newer than the buffer's newest
        self._silent = False

    def step(self, now: float) -> list[RawTrial]:
        """Pull what has arrived (never blocks) and return newly completed trials."""
        self._ingest(self.eeg, self.markers, now)
        trials = self.cutter.poll(self.buf, now)
        self.stats.trials += len(trials)
        self.stats.skipped = self.cutter.skipped
        return trials

    def _ingest(self, eeg, markers, now: float) -> None:
        """Move what ``eeg``/``markers`` hold into the ring buffer and the cutter. A marker seen before (same time,
        same label) is dropped, and for 10 s after an inlet swap so are samples not newer than the buffer's
        newest (two inlets of one source overlap while they are swapped)."""
        data, ts = eeg.pull()
        if len(ts) and now < self._overlap_until and self.buf.last_ts is not None and ts[0] <= self.buf.last_ts:
            keep = ts > self.buf.last_ts
            data, ts = data[keep], ts[keep]
        if len(ts):
            prev = self.buf.last_ts
            steps = np.diff(ts) if prev is None else np.diff(np.concatenate([[prev], ts]))
            if len(steps) and steps.max() > self.gap_warn:
                logger.warning("%s: %.2f s of data missing (disconnect or lost packets)",
                               self.eeg.meta.name, steps.max())
                if not self._silent:  # not already counted as a silence
                    self.stats.outages += 1
            if self._silent:
                logger.info("%s: %s after %.1f s", self.eeg.meta.name,
                            "stream is back" if self.stats.samples else "first samples", now - (self._last_data or now))
                self._silent = False
            self.buf.append(data, ts, self._clock())
            self.stats.samples += len(ts)
            self._last_data = now
        for t, label in markers.pull_markers():
            if (t, label) in self._seen_markers:  # the same marker again (through a second inlet)
                continue
            self._seen_markers[(t, label)] = None
            if len(self._seen_markers) > 1000:
                del self._seen_markers[next(iter(self._seen_markers))]
            self.cutter.add_marker(t, label, now)

    def _reconnect(self, now: float) -> None:
        """Open fresh inlets if the same source is visible again (fallback to liblsl's recovery)."""
        from neurofed.edge.lsl_io import (  # lazy: pylsl (loaded only when used)
            Inlet,
            StreamError,
            find_stream,
        )

        self._next_reconnect = now + 1.0
        old_e, old_m = self.eeg.meta, self.markers.meta
        try:
            e_info = find_stream(source_id=old_e.source_id, name=old_e.name, timeout=0.2, unique=False)
            if e_info.uid() == old_e.uid:  # the same outlet, only silent (a stalled sender): the open inlets
                return  # will get its next samples; fresh inlets would miss what arrives while they connect
            eeg = Inlet(e_info, self._processing)
            mrk = Inlet(find_stream(source_id=old_m.source_id, name=old_m.name, timeout=0.5, unique=False),
                        self._processing)
        except StreamError:
            return
        if eeg.meta.ch_names != old_e.ch_names or eeg.meta.sfreq != old_e.sfreq:
            raise DataError(f"{old_e.name}: came back with other channels or rate; restart the capture")
        logger.info("%s: re-opened the streams after %.1f s of silence", old_e.name, now - (self._last_data or now))
        self._overlap_until = now + 10.0
        self._ingest(self.eeg, self.markers, now)  # what the old inlets still hold (liblsl may have recovered them)
        self.eeg.close()
        self.markers.close()
        self.eeg, self.markers = eeg, mrk

    def run(self, on_trial, max_trials: int | None = None, duration: float | None = None,
            poll_interval: float = 0.005, stall_warn: float = 2.0, idle_timeout: float | None = None) -> CaptureStats:
        """Capture until ``max_trials``, ``duration`` (s) or ``idle_timeout`` (s without data) is reached.

        ``on_trial(trial)`` is called for each trial. Sleeps ``poll_interval`` whenever nothing arrived.
        """
        import time

        t0 = time.monotonic()
        self._last_data = t0
        while True:
            now = time.monotonic()
            got = self.step(now)
            for tr in got:
                on_trial(tr)
            if max_trials is not None and self.stats.trials >= max_trials:
                break
            if duration is not None and now - t0 >= duration:
                break
            silent_for = now - (self._last_data or now)
            if silent_for > stall_warn and not self._silent:
                self._silent = True
                if self.stats.samples:  # a stream that stopped; before its first sample it has not started yet
                    logger.warning("%s: no EEG for %.1f s (stream vanished?); waiting for it to come back",
                                   self.eeg.meta.name, silent_for)
                    self.stats.outages += 1
                else:
                    logger.info("%s: no EEG yet after %.1f s; waiting for the stream to start",
                                self.eeg.meta.name, silent_for)
            if self.reconnect_after and silent_for > self.reconnect_after and now >= self._next_reconnect:
                self._reconnect(now)
            if idle_timeout is not None and silent_for > idle_timeout:
                logger.info("%s: no EEG for %.1f s; stopping", self.eeg.meta.name, silent_for)
                break
            if not got:
                time.sleep(poll_interval)
        return self.stats

    def close(self) -> None:
        self.eeg.close()
        self.markers.close()
