"""Replay a :class:`~neurofed.firmware_sim.recording.Recording` as LSL EEG + marker streams, like headset firmware.

Timing: sample ``i`` carries timestamp ``t0 + clock_offset + i / sfreq`` (the nominal rate, whatever the
playback speed), and a chunk whose newest sample is ``i`` is pushed when the wall clock reaches
``start + i / (sfreq * speed)``; every target is computed from the start, so sleep overshoot never
accumulates (drift-corrected scheduling, as mne-lsl's ``PlayerLSL``). Each cue marker is pushed after
the chunk holding its sample, stamped with that sample's timestamp.

Faults for tests: timestamp jitter, dropped chunks, outages (outlets destroyed then re-created with the
same ``source_id`` so inlets with ``recover=True`` reconnect), stalls (the sender freezes with its outlets
open, as a starved process does, then pushes its backlog at once).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from neurofed.firmware_sim import logger, lsl_out
from neurofed.firmware_sim.recording import Recording
from neurofed.trainer.errors import NeuroFedError


@dataclass(frozen=True)
class PlayerConfig:
    """How one simulated headset streams.

    Parameters
    ----------
    name : str
        EEG stream name; the marker stream is ``{name}-markers``.
    source_id : str
        Unique id (default: random); kept across outages so inlets can recover.
    chunk_size : int
        Samples per push.
    speed : float
        Playback speed (1 = real time, 10 = ten times faster).
    loop : bool
        Restart at the end (sample indices and timestamps keep increasing).
    clock_offset : float
        Seconds added to every timestamp (a headset whose clock is off).
    jitter : float
        Std (s) of Gaussian noise added to each chunk's timestamps.
    drop_prob : float
        Probability that a chunk is lost (never pushed).
    outages : tuple of (float, float)
        (start, duration) in stream seconds during which the headset disappears.
    stalls : tuple of (float, float)
        (start in stream seconds, duration in wall seconds): the headset freezes, outlets open, then catches up.
    counter : bool
        Prepend a ``Samples`` channel holding the sample index.
    markers : bool
        Also publish the marker stream.
    wait_consumers : float
        Seconds to wait for an inlet on each stream before the first push, and after an outage for
        inlets to re-attach (0 = don't wait).
    max_samples : int or None
        Stop after this many samples (across loops).
    linger : float
        Seconds the outlets stay open after the last push (so inlets receive the tail).
    lead_in : float
        Seconds to wait after the consumers attached (first start only) before the first sample, so a
        consumer that opens several streams is ready for all of them.
    go_file : str or None
        After the lead-in, also wait (at most ``wait_consumers`` seconds, or 60 s if that is 0) until
        this file exists: a launcher creates it once every consumer is ready.
    unit : str
        Unit written in the channel description (change it only to simulate a misconfigured headset).
    seed : int
        Seed of jitter and drops.
    """

    name: str
    source_id: str = field(default_factory=lambda: f"neurofed-sim-{uuid.uuid4().hex[:12]}")
    chunk_size: int = 16
    speed: float = 1.0
    loop: bool = False
    clock_offset: float = 0.0
    jitter: float = 0.0
    drop_prob: float = 0.0
    outages: tuple[tuple[float, float], ...] = ()
    stalls: tuple[tuple[float, float], ...] = ()
    counter: bool = False
    markers: bool = True
    wait_consumers: float = 0.0
    max_samples: int | None = None
    linger: float = 1.0
    lead_in: float = 0.0
    go_file: str | None = None
    unit: str = "microvolts"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise NeuroFedError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if not self.speed > 0:
            raise NeuroFedError(f"speed must be > 0, got {self.speed}")
        if not 0 <= self.drop_prob < 1:
            raise NeuroFedError(f"drop_prob must be in [0, 1), got {self.drop_prob}")
        if self.lead_in < 0 or self.wait_consumers < 0:
            raise NeuroFedError(f"lead_in and wait_consumers must be >= 0, got {self.lead_in}, {self.wait_consumers}")
        if self.jitter < 0:
            raise NeuroFedError(f"jitter must be >= 0, got {self.jitter}")
        for kind, spans in (("outage", self.outages), ("stall", self.stalls)):
            for at, dur in spans:
                if at < 0 or dur <= 0:
                    raise NeuroFedError(f"{kind} ({at}, {dur}) needs start >= 0 and duration > 0")

    @property
    def marker_name(self) -> str:
        return f"{self.name}-markers"

    @property
    def marker_source_id(self) -> str:
        return f"{self.source_id}-markers"


class HeadsetPlayer(threading.Thread):
    """One simulated headset in a background thread; errors are re-raised by :meth:`join`."""

    def __init__(self, recording: Recording, cfg: PlayerConfig) -> None:
        super().__init__(name=f"headset-{cfg.name}", daemon=True)
        self.rec = recording.with_counter() if cfg.counter else recording
        self.cfg = cfg
        self._stop_evt = threading.Event()
        self.ready = threading.Event()  # set once outlets exist (and consumers, if waited for)
        self.done = threading.Event()  # set once the last sample was pushed (before lingering)
        self.error: BaseException | None = None
        self.n_pushed = 0  # samples pushed
        self.n_dropped = 0  # samples lost (drops + outages)
        self.markers_sent: list[tuple[float, str, int]] = []  # (timestamp, label, sample index)
        self.t0: float | None = None  # timestamp of sample 0
        self._eeg = None
        self._mrk = None

    # --- outlets ---
    def _open(self) -> None:
        c = self.cfg
        self._eeg = lsl_out.eeg_outlet(c.name, c.source_id, self.rec.ch_names, self.rec.sfreq, unit=c.unit,
                                        source=self.rec.source)
        classes = sorted({label for _, label in self.rec.markers})
        self._mrk = lsl_out.marker_outlet(c.marker_name, c.marker_source_id, classes) if c.markers else None

    def _close(self) -> None:
        self._eeg = None  # dropping the last reference destroys the outlet
        self._mrk = None

    def _wait_consumers(self) -> None:
        for outlet in (self._eeg, self._mrk):
            if outlet is not None and not lsl_out.wait_for_consumers(outlet, self.cfg.wait_consumers):
                logger.warning("headset %s: no inlet after %g s; streaming anyway", self.cfg.name,
                               self.cfg.wait_consumers)

    def _wait_go(self) -> None:
        """Lead-in, then the go file (first start only; see :class:`PlayerConfig`)."""
        c = self.cfg
        if c.lead_in > 0:
            self._stop_evt.wait(c.lead_in)
        if c.go_file is None:
            return
        go = Path(c.go_file)
        end = time.monotonic() + (c.wait_consumers or 60.0)
        while not go.exists() and time.monotonic() < end and not self._stop_evt.is_set():
            self._stop_evt.wait(0.05)
        if not go.exists():
            logger.warning("headset %s: go file %s not created in time; streaming anyway", c.name, go)

    def stop(self) -> None:
        """Ask the thread to finish after the current chunk."""
        self._stop_evt.set()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error

    def _in_outage(self, t_stream: float) -> bool:
        return any(at <= t_stream < at + dur for at, dur in self.cfg.outages)

    # --- main loop ---
    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - surfaced by join()
            logger.error("headset %s failed: %s", self.cfg.name, exc)
            self.error = exc
        finally:
            self._close()
            self.ready.set()
            self.done.set()

    def _run(self) -> None:
        c, rec = self.cfg, self.rec
        rng = np.random.default_rng(c.seed)
        self._open()
        if c.wait_consumers > 0:
            self._wait_consumers()
        self._wait_go()
        self.ready.set()
        n, sfreq = rec.n_samples, rec.sfreq
        counter_col = 0 if rec.ch_names[0] == "Samples" else None
        markers = sorted(rec.markers)
        stalls = sorted(c.stalls)
        total = c.max_samples if c.max_samples is not None else (None if c.loop else n)
        self.t0 = lsl_out.local_clock() + c.clock_offset
        wall0 = time.perf_counter()
        pos = 0  # absolute sample index (keeps increasing across loops)
        mk = 0  # next marker within the current loop
        down = False
        logger.info("headset %s: streaming %d ch @ %g Hz (x%g) from %s", c.name, rec.n_channels, sfreq, c.speed,
                    rec.source)
        while not self._stop_evt.is_set() and (total is None or pos < total):
            loop_i, a = divmod(pos, n)
            b = min(a + c.chunk_size, n)
            if total is not None:
                b = min(b, a + (total - pos))
            end = pos + (b - a)
            delay = wall0 + (end - 1) / (sfreq * c.speed) - time.perf_counter()  # newest sample's capture time
            if delay > 0:
                self._stop_evt.wait(delay)
            t_stream = pos / sfreq
            while stalls and t_stream >= stalls[0][0]:  # frozen sender: nothing pushed, outlets stay open
                logger.info("headset %s: stalled at %.2f s for %g s", c.name, t_stream, stalls[0][1])
                self._stop_evt.wait(stalls.pop(0)[1])
            if self._in_outage(t_stream):
                if not down:
                    logger.info("headset %s: outage at %.2f s", c.name, t_stream)
                    self._close()
                    down = True
            elif down:
                logger.info("headset %s: back at %.2f s", c.name, t_stream)
                self._open()
                down = False
                if c.wait_consumers > 0:  # let recovering inlets re-attach (pushes then catch up)
                    self._wait_consumers()
            chunk = rec.data[a:b]
            if counter_col is not None:
                chunk = chunk.copy()
                chunk[:, 0] = np.arange(pos, end, dtype=np.float32)
            ts_last = self.t0 + (end - 1) / sfreq
            if c.jitter:
                ts_last += float(rng.normal(0.0, c.jitter))
            if down or (c.drop_prob and rng.random() < c.drop_prob):
                self.n_dropped += b - a
            else:
                self._eeg.push_chunk(chunk, ts_last)
                self.n_pushed += b - a
            while mk < len(markers) and markers[mk][0] < b:
                s, label = markers[mk]
                mk += 1
                if s < a:
                    continue
                ts = self.t0 + (loop_i * n + s) / sfreq
                if self._mrk is not None and not down:
                    self._mrk.push_sample([label], ts)
                    self.markers_sent.append((ts, label, loop_i * n + s))
            pos = end
            if b == n:
                mk = 0
        self.done.set()
        if c.linger > 0:
            self._stop_evt.wait(c.linger)
        logger.info("headset %s: done (%d samples pushed, %d lost)", c.name, self.n_pushed, self.n_dropped)


#: The line each headset prints when it ends (``headset-sim``'s log); :func:`markers_sent` reads it back.
SUMMARY_RE = re.compile(r"^(\S+): (\d+) samples pushed, (\d+) lost, (\d+) markers$", re.MULTILINE)


def summary_line(p: HeadsetPlayer) -> str:
    """``NAME: N samples pushed, N lost, N markers`` (parsed by :data:`SUMMARY_RE`)."""
    return f"{p.cfg.name}: {p.n_pushed} samples pushed, {p.n_dropped} lost, {len(p.markers_sent)} markers"


def markers_sent(log_text: str) -> dict[str, int]:
    """Stream name -> cue markers sent, from the summary lines of a headset-sim log."""
    return {m[1]: int(m[4]) for m in SUMMARY_RE.finditer(log_text)}


def run_to_end(players: list[HeadsetPlayer], deadline: float | None = None) -> None:
    """Wait until every player has finished (or ``deadline`` on the monotonic clock, or Ctrl-C),
    stop and join them, print one summary line each; raise one NeuroFedError naming any failure."""
    try:
        while any(p.is_alive() for p in players):
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        logger.info("interrupted")
    for p in players:
        p.stop()
    errors = []
    for p in players:
        try:
            p.join(timeout=5)
        except NeuroFedError as exc:
            errors.append(str(exc))
        print(summary_line(p), flush=True)
    if errors:
        raise NeuroFedError("; ".join(errors))


def play_many(items: list[tuple[Recording, PlayerConfig]]) -> list[HeadsetPlayer]:
    """Start several headsets (one thread each) and return them running."""
    players = [HeadsetPlayer(r, c) for r, c in items]
    for p in players:
        p.start()
    return players
