"""Listen to everything on the broker (``#``) during the demo, then prove no EEG crossed it.

The audit has three independent checks:

1. **protocol** - every message on the federation's topics decodes as a NeuroFed protocol message
   (schema-validated header, body SHA-256) and carries a body only where the protocol allows one;
2. **weights only** - every tensor in a body has the name, shape and dtype of a model (or strategy
   extra) tensor: ``down.<key>``/``state.<key>``/``<key>`` with ``<key>`` in the model's state dict;
3. **no EEG bytes** - no payload (any topic, raw and decompressed body) contains any run of 5
   consecutive float32 samples of the captured trials (raw, as stored on the devices, and
   preprocessed, as trained on), in channel-major or time-major order. Runs with a zero or a
   repeated value, or fewer than 3 distinct values, are left out of the fingerprint (they also
   occur in weights, e.g. BN scales of exactly 1).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from neurofed.broker.protocol import (
    COORDINATOR_ID,
    SECAGG_DOWN,
    SECAGG_UP,
    ProtocolError,
    Topics,
    decode,
    delta_reference,
    tensors_to_bytes,
    transmitted_body,
)


@dataclass
class Seen:
    topic: str
    payload: bytes
    t: float


class Wiretap:
    """A paho client subscribed to ``#`` that keeps every payload (bounded) and forwards model messages.

    Parameters
    ----------
    url : str
        ``mqtt://host:port``.
    federation : str
        Topics under ``neurofed/<federation>/`` are this run's; others are counted as foreign.
    max_foreign_bytes : int
        Foreign payloads kept for the EEG scan beyond this are counted but dropped.
    """

    def __init__(self, url: str, federation: str, max_foreign_bytes: int = 64 << 20) -> None:
        from neurofed.broker.transport import BrokerURL  # lazy: paho-mqtt (loaded only when used)

        self.url = BrokerURL.parse(url)
        self.topics = Topics(federation)
        self.root = self.topics.root + "/"
        self.ours: list[Seen] = []
        self.foreign: list[Seen] = []
        self.foreign_bytes = 0
        self.foreign_dropped = 0
        self.max_foreign = max_foreign_bytes
        self.models: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self.results: queue.Queue[bytes] = queue.Queue()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._client = None

    def start(self, timeout: float = 15.0) -> Wiretap:
        import paho.mqtt.client as mqtt

        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"neurofed-wiretap-{time.time_ns() % 10**9}",
                        protocol=mqtt.MQTTv311)

        def on_connect(client, userdata, flags, rc, props=None):
            client.subscribe("#", qos=1)
            self._connected.set()

        c.on_connect = on_connect
        c.on_message = self._on_message
        c.connect(self.url.host, self.url.port, keepalive=30)
        c.loop_start()
        self._client = c
        if not self._connected.wait(timeout):
            self.stop()
            raise ConnectionError(f"wiretap: no connection to {self.url.host}:{self.url.port} within {timeout:.0f} s")
        return self

    def _on_message(self, client, userdata, msg) -> None:
        s = Seen(msg.topic, bytes(msg.payload), time.time())
        with self._lock:
            if s.topic.startswith(self.root):
                self.ours.append(s)
                if s.topic == self.topics.model and s.payload:
                    self.models.put((len(self.ours), s.payload))
                elif s.topic == self.topics.result and s.payload:
                    self.results.put(s.payload)
            elif self.foreign_bytes + len(s.payload) <= self.max_foreign:
                self.foreign.append(s)
                self.foreign_bytes += len(s.payload)
            else:
                self.foreign_dropped += 1

    def stop(self) -> None:
        if self._client is not None:
            self._client.loop_stop()
            try:
                self._client.disconnect()
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                logging.getLogger("neurofed").debug("wiretap disconnect: %s", exc)
            self._client = None

    def traffic(self) -> dict:
        """Messages and bytes per message kind on this federation's topics."""
        n: Counter[str] = Counter()
        b: Counter[str] = Counter()
        with self._lock:
            ours = list(self.ours)
        for s in ours:
            try:
                kind, _ = self.topics.parse(s.topic)
            except ProtocolError:
                kind = "probe" if s.topic == self.topics.probe(COORDINATOR_ID) else "unknown"
            n[kind] += 1
            b[kind] += len(s.payload)
        return {"messages": dict(n), "bytes": dict(b), "total_messages": sum(n.values()),
                "total_bytes": sum(b.values()), "largest_payload": max((len(s.payload) for s in ours), default=0),
                "foreign_messages": len(self.foreign) + self.foreign_dropped}


# ----------------------------------------------------------------------------- the audit
def _windows(a: np.ndarray, stride: int = 2) -> np.ndarray:
    """uint64 fingerprints of runs of 4 consecutive float32 along the last axis, starting every ``stride``
    samples (so any leaked run of ``3 + stride`` samples contains one); degenerate runs dropped."""
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, a.shape[-1])
    if a.shape[1] < 4:
        return np.empty(0, np.uint64)
    w = np.lib.stride_tricks.sliding_window_view(a, 4, axis=1)[:, ::stride].reshape(-1, 4)
    w0, w1, w2, w3 = w[:, 0], w[:, 1], w[:, 2], w[:, 3]
    ok = (w0 != w1) & (w1 != w2) & (w2 != w3) & ~((w0 == w2) & (w1 == w3))  # >= 3 distinct values
    ok &= (w0 != 0) & (w1 != 0) & (w2 != 0) & (w3 != 0)
    return _hash(np.ascontiguousarray(w[ok]).view(np.uint32))


_K1, _K2, _K3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)


def _mix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(31))
    h = h * _K3
    return h ^ (h >> np.uint64(29))


def _hash(u: np.ndarray) -> np.ndarray:
    """64-bit mix of four uint32 (rows of ``u``); no linear relation between inputs survives."""
    u = u.astype(np.uint64)
    with np.errstate(over="ignore"):
        a = _mix(((u[:, 0] << np.uint64(32)) | u[:, 1]) * _K1)
        b = _mix(((u[:, 2] << np.uint64(32)) | u[:, 3]) * _K2)
        return _mix(a + b * _K1)


class EegFingerprint:
    """Sorted fingerprints of 4-sample runs of EEG trials (each trial ``(channels, times)``)."""

    def __init__(self, trials: Iterable[np.ndarray]) -> None:
        parts = []
        self.n_values = 0
        for x in trials:
            x = np.asarray(x, np.float32)
            self.n_values += x.size
            parts.append(_windows(x))                         # channel-major (time runs)
            parts.append(_windows(np.swapaxes(x, -1, -2)))  # time-major (LSL chunk order)
        self.keys = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)

    @staticmethod
    def windows(data: bytes) -> np.ndarray:
        """Hashes of every 4-float run of ``data``, at every byte alignment (what :meth:`hits` looks up)."""
        parts = []
        for off in range(4):
            n = (len(data) - off) // 4
            if n >= 4:
                parts.append(_hash(np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint32, n, off), 4)))
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)

    def found(self, h: np.ndarray) -> np.ndarray:
        """Which of the hashes ``h`` are EEG fingerprints (boolean mask in ``h``'s order).

        The needles are sorted first: numpy's binary search then starts each lookup from the previous
        one's position, so one call over a whole wire capture walks the 59 M keys nearly linearly
        instead of paying ~26 cache misses per needle (the demo's audit: ~50 s -> a few seconds).
        """
        if not len(self.keys) or not len(h):
            return np.zeros(len(h), bool)
        order = np.argsort(h, kind="stable")
        hs = h[order]
        idx = np.searchsorted(self.keys, hs)
        idx[idx == len(self.keys)] = 0
        out = np.empty(len(h), bool)
        out[order] = self.keys[idx] == hs
        return out

    def hits(self, data: bytes) -> int:
        """How many 4-float runs of ``data`` (at every byte alignment) are EEG fingerprints."""
        if len(data) < 16:
            return 0
        return int(np.count_nonzero(self.found(self.windows(data))))


@dataclass
class Audit:
    messages: int = 0
    decoded: int = 0
    bad_protocol: list[str] = field(default_factory=list)
    bad_tensors: list[str] = field(default_factory=list)
    eeg_hits: list[str] = field(default_factory=list)
    tensor_values_max: int = 0
    fingerprints: int = 0
    foreign_scanned: int = 0

    @property
    def ok(self) -> bool:
        return self.decoded == self.messages and not (self.bad_protocol or self.bad_tensors or self.eeg_hits)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "messages": self.messages, "decoded_as_protocol": self.decoded,
                "bad_protocol": self.bad_protocol[:20], "bad_tensors": self.bad_tensors[:20],
                "eeg_hits": self.eeg_hits[:20], "largest_tensor_body_values": self.tensor_values_max,
                "eeg_fingerprints": self.fingerprints, "foreign_messages_scanned": self.foreign_scanned}


def audit(tap: Wiretap, model_specs: dict[str, tuple[tuple[int, ...], str]], fp: EegFingerprint) -> Audit:
    """Run the three checks over everything ``tap`` saw (see the module docstring).

    ``model_specs``: state-dict key -> (shape, dtype name) of the federation's model.
    """
    res = Audit(fingerprints=len(fp.keys))
    with tap._lock:
        ours, foreign = list(tap.ours), list(tap.foreign)
    prefixes = {"task": ("down.", "extra."), "update": ("state.", "extra."), "model": ("",)}
    scan: list[tuple[str, int, np.ndarray]] = []  # (topic, message number, hashes of a blob's 4-float runs)
    ref = None  # updates are delta-coded against the global model they trained from (the last one published)
    probe = tap.topics.probe(COORDINATOR_ID)
    for s in ours:
        if not s.payload or s.topic == probe:  # cleared retained / liveness probe
            continue
        res.messages += 1
        try:
            kind, _ = tap.topics.parse(s.topic)
            msg, tensors = decode(s.payload, reference=ref if kind == "update" else None)
            if kind == "model" and tensors:
                ref = delta_reference(tensors)
            if msg.kind not in {"secagg": SECAGG_UP, "secagg_down": SECAGG_DOWN}.get(kind, (kind,)):
                raise ProtocolError(f"a {msg.kind} message on a {kind} topic")
        except ProtocolError as exc:
            res.bad_protocol.append(f"{s.topic}: {exc}")
            continue
        res.decoded += 1
        n_values = 0
        n_masked = sum(int(np.prod(v[0])) for v in model_specs.values() if v[1].startswith("torch.float")) + 2
        for name, t in (tensors or {}).items():
            if kind == "secagg":  # secure aggregation: the masked fixed-point update, nothing else
                if name != "masked" or t.dtype != torch.int32 or tuple(t.shape) != (n_masked,):
                    res.bad_tensors.append(f"{s.topic}: tensor {name} {tuple(t.shape)} {t.dtype}")
                n_values += t.numel()
                continue
            key = next((name[len(p):] for p in prefixes.get(kind, ()) if name.startswith(p)), None)
            ok_key = key is not None and (key in model_specs or name.startswith("extra."))
            spec = model_specs.get(key or "")
            if not ok_key or (spec is not None and (tuple(t.shape) != spec[0] or str(t.dtype) != spec[1])):
                res.bad_tensors.append(f"{s.topic}: tensor {name} {tuple(t.shape)} {t.dtype}")
            if name.startswith("extra.") and t.numel() > max((int(np.prod(v[0])) for v in model_specs.values()), default=0):
                res.bad_tensors.append(f"{s.topic}: extra tensor {name} larger than any model tensor")
            n_values += t.numel()
        res.tensor_values_max = max(res.tensor_values_max, n_values)
        for blob in (s.payload, transmitted_body(s.payload), tensors_to_bytes(tensors) if tensors else b""):
            scan.append((f"{s.topic}", res.messages, fp.windows(blob)))
    for s in foreign:
        res.foreign_scanned += 1
        scan.append((f"(foreign) {s.topic}", -res.foreign_scanned, fp.windows(s.payload)))
    # one lookup over everything (sorted needles; see EegFingerprint.found), then hits per message
    if scan:
        owner = np.repeat(np.arange(len(scan)), [len(h) for *_, h in scan])
        per_blob = np.bincount(owner[fp.found(np.concatenate([h for *_, h in scan]))], minlength=len(scan))
        per_msg: dict[tuple[str, int], int] = {}  # a message counts once: its first blob with hits (as before)
        for (topic, n_msg, _), n in zip(scan, per_blob, strict=True):
            if n and (topic, n_msg) not in per_msg:
                per_msg[(topic, n_msg)] = int(n)
        res.eeg_hits += [f"{topic}: {n} EEG sample runs" for (topic, _), n in per_msg.items()]
    return res
