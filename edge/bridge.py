"""Live bridge: a LSL EEG stream (and its cue markers) forwarded to browser and Node apps over a WebSocket.

The apps decode; the bridge only reads, cuts and forwards. It opens the stream with the edge's inlet
(:mod:`neurofed.edge.lsl_io`), checks its rate, channels and units against the standalone model with the rules
``edge-client record``/``infer`` use (:func:`neurofed.edge.stream.match_stream`), buffers it in the edge's ring
buffer and cuts windows with the edge's windowers (:mod:`neurofed.edge.windowing`): cue-locked windows are the very
samples ``edge-client infer`` decodes. Every connected client gets, as JSON text messages
(protocol ``neurofed-live/1``):

* ``hello``: the stream (name, source_id, rate, the model's channels in order, the unit the windows are in),
  the mode (``cue`` or ``sliding``), window length and step, the cue labels that open a window;
* ``eeg``: the new samples of the model's channels (microvolts, float32 little-endian, base64, sample-major),
  for the scrolling display, about every :data:`EEG_EVERY` s;
* ``cue``: a marker (stream time, label, whether it opens a window);
* ``window``: one window to decode: ``seq``, stream time of its last sample ``t_end``, the wall-clock time its
  last sample arrived here ``arrival_unix`` (the start of the latency an app reports), the cue label (``""`` in
  sliding mode) and the samples (channels x samples, float32 little-endian, base64) in the model's unit;
* ``status``: one line for the user (``level`` info, warning or error): a silent stream, its return, a window
  skipped because samples were lost, a message of the client's that was refused.

A client may send back ``{"type": "prediction", "seq", "pred", "probs", "latency_ms"}`` (the apps do); anything
else (not JSON, not an object, an unknown type, binary, over :data:`MAX_MESSAGE` bytes) is logged in one line and
answered with a ``status`` warning (an oversized message closes that client's connection, code 1009): no client
can stop the bridge. A stream that goes silent (unplugged headset, lost network) is reported once after
``stall_s`` seconds, its return once; the inlet recovers the stream by itself (same source_id).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.lsl_io import (
    Inlet,
    StreamError,
    check_marker_stream,
    check_unique,
    find_stream,
    local_clock,
)
from neurofed.edge.stream import StreamLayout, match_stream
from neurofed.edge.windowing import CueWindower, SlidingWindower, Window
from neurofed.trainer.data.profiles import DeviceProfile
from neurofed.trainer.errors import NeuroFedError

logger = logging.getLogger("neurofed.edge")

PROTOCOL = "neurofed-live/1"
#: Largest message a client may send (its predictions are ~200 bytes); bigger ones close its connection.
MAX_MESSAGE = 64 * 1024
#: Bytes queued to one client beyond which messages to it are dropped (a stuck client; ~150 windows).
MAX_BACKLOG = 8 * 1024 * 1024
#: Seconds between ``eeg`` display messages.
EEG_EVERY = 0.05
#: Seconds of stream the ring buffer holds beyond one window (late cue markers still find their data).
BUFFER_SECONDS = 30.0
#: Longest the reader blocks on the EEG inlet when no sample is waiting (it wakes on the first sample).
POLL_SECONDS = 0.002
#: Garbage messages of one client logged in full (the rest are counted).
LOG_GARBAGE = 5


@dataclass(frozen=True)
class LiveSpec:
    """What the bridge needs of a standalone model: its channels, classes, input rate and unit, windows.

    Build it with :meth:`from_meta` from the model's NeuroFed metadata (``model.json`` or the ``.onnx``'s).
    """

    ch_names: list[str]
    classes: list[str]
    rate: float
    unit: str
    unit_to_uv: float
    window_samples: int
    step_s: float
    tmin: float
    fmax: float | None
    model_hash: str
    profile: dict[str, Any] | None = None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | Any) -> LiveSpec:
        """From a standalone export's metadata (a mapping such as ``model.json``, or a pydantic model)."""
        m = meta if isinstance(meta, Mapping) else meta.model_dump()
        sa = m.get("standalone")
        if not sa:
            raise NeuroFedError("the live apps need a standalone model: export it with `neurofed export --standalone`")
        fmax = (m.get("preprocess") or {}).get("fmax")
        return cls(list(m["ch_names"]), list(m["classes"]), float(sa["rate"]), str(sa["unit"]),
                   float(sa["unit_to_uv"]), int(sa["window_samples"]), float(sa["step_s"]),
                   float((m.get("window") or (0.0, 0.0))[0]), None if fmax is None else float(fmax),
                   str(m.get("model_hash", "")), m.get("profile"))


@dataclass
class BridgeConfig:
    """Where the bridge reads and serves.

    Parameters
    ----------
    stream : str
        EEG LSL stream name.
    source_id : str, optional
        Picks one of several streams with that name.
    markers : str, optional
        Cue marker stream (default ``STREAM-markers``; cue mode only).
    mode : str
        ``cue`` (windows locked to cue markers) or ``sliding`` (a window every ``step`` s).
    step : float, optional
        Sliding step in s (default: the model's ``step_s``).
    host, port : str, int
        WebSocket address.
    stall_s : float
        Seconds without samples before the stream is reported silent.
    timeout : float
        Seconds to find the streams.
    """

    stream: str
    source_id: str | None = None
    markers: str | None = None
    mode: str = "cue"
    step: float | None = None
    host: str = "127.0.0.1"
    port: int = 8766
    stall_s: float = 2.0
    timeout: float = 5.0


@dataclass
class BridgeStats:
    """Counters of a bridge session (read them while it runs or after :meth:`LiveBridge.stop`)."""

    samples: int = 0
    windows: int = 0
    skipped: int = 0
    cues: int = 0
    clients: int = 0
    garbage: int = 0
    predictions: int = 0
    latency_ms: list[float] = field(default_factory=list)
    stalls: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.latency_ms)
        return {
            "samples": self.samples, "windows": self.windows, "skipped": self.skipped, "cues": self.cues,
            "clients": self.clients, "garbage_messages": self.garbage, "predictions_reported": self.predictions,
            "stalls": self.stalls,
            "latency_ms_p50": float(np.median(lat)) if len(lat) else None,
            "latency_ms_p99": float(np.percentile(lat, 99)) if len(lat) else None,
        }


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode("ascii")


class LiveBridge:
    """Read a LSL EEG stream, cut windows, forward everything to WebSocket clients (see the module docstring).

    ``open()`` finds and checks the streams (one-line :class:`NeuroFedError` if they cannot feed the model),
    ``start()`` binds the WebSocket port and starts forwarding, ``stop()`` ends both.
    """

    def __init__(self, spec: LiveSpec, cfg: BridgeConfig) -> None:
        if cfg.mode not in ("cue", "sliding"):
            raise NeuroFedError(f"mode {cfg.mode!r}: use cue or sliding")
        self.spec, self.cfg = spec, cfg
        self.stats = BridgeStats()
        self.eeg: Inlet | None = None
        self.markers: Inlet | None = None
        self.layout: StreamLayout | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: set[ServerConnection] = set()
        self._lagging: set[ServerConnection] = set()
        self._threads: list[threading.Thread] = []
        self._start_error: str | None = None
        self._lock = threading.Lock()
        self._last_status: dict[str, Any] | None = None
        self.hello: dict[str, Any] = {}

    # ---- streams ---------------------------------------------------------------------------------------------

    def open(self) -> LiveBridge:
        """Find the EEG (and, in cue mode, marker) stream and check it fits the model."""
        cfg, spec = self.cfg, self.spec
        self.eeg = Inlet(find_stream(name=cfg.stream, source_id=cfg.source_id, timeout=cfg.timeout, unique=False))
        meta = self.eeg.meta
        try:
            prof = DeviceProfile.from_dict(spec.profile, "model metadata") if spec.profile else None
            self.layout = match_stream(meta.sfreq, meta.ch_names, meta.units, spec.ch_names, fmax=spec.fmax,
                                       expected_sfreq=spec.rate, source=f"stream {cfg.stream!r}", profile=prof)
            queries: list[tuple[str | None, str | None, str | None]] = [(cfg.stream, None, cfg.source_id)]
            if cfg.mode == "cue":
                name = cfg.markers or f"{cfg.stream}-markers"
                self.markers = Inlet(find_stream(name=name, timeout=cfg.timeout, unique=False))
                check_marker_stream(self.markers.meta)
                queries.append((name, None, None))
            check_unique(queries)  # the inlets are open (and buffering): now refuse ambiguous names
        except Exception:
            self.close_inlets()
            raise
        step = cfg.step if cfg.step is not None else spec.step_s
        self.hello = {
            "type": "hello", "protocol": PROTOCOL,
            "stream": {"name": meta.name, "source_id": meta.source_id, "rate": meta.sfreq, "ch_names": spec.ch_names,
                       "unit": spec.unit, "n_channels": len(spec.ch_names), "eeg_unit": "uV"},
            "mode": cfg.mode, "window_samples": spec.window_samples, "step_s": step,
            "cues": spec.classes if cfg.mode == "cue" else [], "classes": spec.classes, "model_hash": spec.model_hash,
        }
        return self

    def close_inlets(self) -> None:
        for inlet in (self.eeg, self.markers):
            if inlet is not None:
                inlet.close()
        self.eeg = self.markers = None

    # ---- WebSocket side --------------------------------------------------------------------------------------

    def start(self) -> LiveBridge:
        """Bind ``host:port`` and start forwarding (call :meth:`open` first)."""
        if self.eeg is None:
            self.open()
        t = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True, name="neurofed-bridge-ws")
        t.start()
        self._threads.append(t)
        if not self._ready.wait(10):
            self.stop()
            raise NeuroFedError("the WebSocket server did not start within 10 s")
        if self._start_error is not None:
            self.stop()
            raise NeuroFedError(self._start_error)
        r = threading.Thread(target=self._read, daemon=True, name="neurofed-bridge-lsl")
        r.start()
        self._threads.append(r)
        logger.info("bridge: %s (%d ch @ %g Hz, %s mode) on ws://%s:%d", self.cfg.stream, len(self.spec.ch_names),
                    self.spec.rate, self.cfg.mode, self.cfg.host, self.port)
        return self

    @property
    def port(self) -> int:
        return self.cfg.port

    @property
    def url(self) -> str:
        return f"ws://{self.cfg.host}:{self.cfg.port}"

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            server = await serve(self._handler, self.cfg.host, self.cfg.port, max_size=MAX_MESSAGE,
                                 ping_interval=20, ping_timeout=20, logger=logging.getLogger("neurofed.edge.ws"))
        except OSError as exc:
            self._start_error = (f"cannot serve the bridge on {self.cfg.host}:{self.cfg.port}: "
                                 f"{exc.strerror or exc} (port busy? choose another with --ws-port)")
            self._ready.set()
            return
        if self.cfg.port == 0:
            self.cfg.port = int(next(iter(server.sockets)).getsockname()[1])
        self._ready.set()
        async with server:
            while not self._stop.is_set():
                await asyncio.sleep(0.05)

    async def _handler(self, ws: ServerConnection) -> None:
        peer = "{}:{}".format(*ws.remote_address[:2]) if ws.remote_address else "client"
        self.stats.clients += 1
        garbage = 0
        logger.info("bridge: client %s connected", peer)
        try:
            await ws.send(json.dumps(self.hello))
            if self._last_status is not None:
                await ws.send(json.dumps(self._last_status))
            self._clients.add(ws)
            async for msg in ws:
                problem = self._client_message(msg)
                if problem is not None:
                    garbage += 1
                    self.stats.garbage += 1
                    if garbage <= LOG_GARBAGE:
                        logger.warning("bridge: client %s sent %s; ignored", peer, problem)
                    await ws.send(json.dumps({"type": "status", "level": "warning",
                                              "message": f"bridge ignored your message: {problem}"}))
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1009 or exc.sent is not None and exc.sent.code == 1009:
                self.stats.garbage += 1
                logger.warning("bridge: client %s sent a message over %d bytes; its connection was closed",
                               peer, MAX_MESSAGE)
        finally:
            self._clients.discard(ws)
            self._lagging.discard(ws)
            logger.info("bridge: client %s left%s", peer, f" ({garbage} bad messages)" if garbage else "")

    def _client_message(self, msg: str | bytes) -> str | None:
        """Record a client's prediction report; the problem in a few words if it is not one."""
        if isinstance(msg, bytes):
            return f"a binary message ({len(msg)} bytes)"
        try:
            doc = json.loads(msg)
        except ValueError:
            return f"text that is not JSON ({msg[:40]!r})"
        if not isinstance(doc, dict) or doc.get("type") != "prediction":
            kind = doc.get("type") if isinstance(doc, dict) else type(doc).__name__
            return f"an unknown message ({kind!r}; clients send only type 'prediction')"
        lat, seq = doc.get("latency_ms"), doc.get("seq")
        if not isinstance(seq, int) or not isinstance(lat, (int, float)) or not np.isfinite(lat):
            return "a prediction without an integer seq and a finite latency_ms"
        with self._lock:
            self.stats.predictions += 1
            self.stats.latency_ms.append(float(lat))
        return None

    def _send(self, doc: dict[str, Any]) -> None:
        """Queue ``doc`` to every client (thread-safe, never blocks the reader)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        text = json.dumps(doc)
        try:
            loop.call_soon_threadsafe(self._broadcast, text)
        except RuntimeError:  # the loop is closing
            pass

    def _broadcast(self, text: str) -> None:
        """Send to every client that keeps up (runs in the event loop); one stuck client cannot fill memory."""
        ready = set()
        for ws in self._clients:
            transport = getattr(ws, "transport", None)
            backlog = transport.get_write_buffer_size() if transport is not None else 0
            if backlog > MAX_BACKLOG:
                if ws not in self._lagging:
                    self._lagging.add(ws)
                    logger.warning("bridge: a client is %d MB behind; dropping its messages until it catches up",
                                   backlog >> 20)
                continue
            self._lagging.discard(ws)
            ready.add(ws)
        broadcast(ready, text)

    def status(self, level: str, message: str) -> None:
        """Log ``message`` and show it on every page."""
        getattr(logger, "error" if level == "error" else "warning" if level == "warning" else "info")(
            "bridge: %s", message)
        doc = {"type": "status", "level": level, "message": message}
        self._last_status = doc if level != "info" else None
        if level == "error":
            self.stats.errors.append(message)
        self._send(doc)

    # ---- LSL side --------------------------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            self._read_loop()
        except StreamError as exc:
            self.status("error", f"{exc}; restart the bridge once the headset is back")
        except Exception as exc:  # a bug must not take the WebSocket side down silently
            logger.exception("bridge: reader stopped")
            self.status("error", f"the bridge stopped reading the stream ({type(exc).__name__}: {exc})")

    def _read_loop(self) -> None:
        spec, cfg = self.spec, self.cfg
        assert self.eeg is not None and self.layout is not None
        eeg, mk, layout = self.eeg, self.markers, self.layout
        n_stream = eeg.meta.n_channels
        buf = RingBuffer(n_stream, int((BUFFER_SECONDS + abs(spec.tmin)) * spec.rate) + spec.window_samples,
                         np.float64)
        if cfg.mode == "cue":
            windower: CueWindower | SlidingWindower = CueWindower(
                spec.window_samples, spec.rate, spec.tmin,
                marker_timeout=spec.window_samples / spec.rate + BUFFER_SECONDS, source=cfg.stream)
        else:
            windower = SlidingWindower(spec.window_samples, float(self.hello["step_s"]), spec.rate, source=cfg.stream)
        wanted = {c.lower() for c in self.hello["cues"]}
        from_uv = 1.0 / spec.unit_to_uv
        pending: list[np.ndarray] = []
        pending_t: list[float] = []
        next_eeg = time.monotonic() + EEG_EVERY
        last_data = time.monotonic()
        silent = started = False
        seen_skips = 0
        while not self._stop.is_set():
            data, ts = eeg.pull(wait=POLL_SECONDS)
            now = local_clock()
            unix_offset = time.time() - now
            mono = time.monotonic()
            if mk is not None:
                for t, label in mk.pull_markers():
                    opens = label.lower() in wanted
                    if opens:
                        windower.add_cue(t, label, now)
                    self.stats.cues += 1
                    self._send({"type": "cue", "t": t, "label": label, "opens": opens})
            if len(ts):
                buf.append(data.astype(np.float64, copy=False), ts, now)
                self.stats.samples += len(ts)
                pending.append(layout.select(data).T)
                pending_t.extend((float(ts[0]), float(ts[-1])))
                last_data = mono
                if silent:
                    silent = False
                    self.status("info", f"stream {cfg.stream!r} is back" if started else
                                f"stream {cfg.stream!r} started")
                started = True
            elif not silent and mono - last_data > cfg.stall_s:
                silent = True
                if started:
                    self.stats.stalls += 1
                    self.status("warning", f"no samples from stream {cfg.stream!r} for {cfg.stall_s:g} s "
                                           "(headset disconnected?); waiting for it to come back")
                else:
                    self.status("info", f"waiting for the first samples of stream {cfg.stream!r}")
            if pending and mono >= next_eeg:
                chunk = np.concatenate(pending)
                self._send({"type": "eeg", "t0": pending_t[0], "t1": pending_t[-1], "n": len(chunk),
                            "data": _b64(chunk)})
                pending, pending_t = [], []
                next_eeg = mono + EEG_EVERY
            for w in windower.poll(buf, now):
                self._send_window(w, layout, from_uv, unix_offset)
            if len(windower.skipped) > seen_skips:
                for reason in windower.skipped[seen_skips:]:
                    self.stats.skipped += 1
                    self._send({"type": "status", "level": "warning", "message": f"window skipped: {reason}"})
                seen_skips = len(windower.skipped)

    def _send_window(self, w: Window, layout: StreamLayout, from_uv: float, unix_offset: float) -> None:
        x = layout.select(w.data)  # (channels, samples), microvolts, float64
        if from_uv != 1.0:
            x = x * from_uv
        seq = self.stats.windows
        self.stats.windows += 1
        self._send({"type": "window", "seq": seq, "t_end": w.t_end, "arrival_unix": w.t_arrival + unix_offset,
                    "label": w.label, "onset": w.onset, "shape": list(x.shape), "data": _b64(x)})

    # ---- lifetime --------------------------------------------------------------------------------------------

    def stop(self) -> dict[str, Any]:
        """Stop reading and serving; the session's :meth:`BridgeStats.summary`."""
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._threads = []
        self.close_inlets()
        return self.stats.summary()

    def __enter__(self) -> LiveBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
