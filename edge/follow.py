"""``edge-client infer --follow``: take signed releases from the broker and swap the decoder between two windows.

A :class:`ReleaseFollower` subscribes to the federation's retained release topic
(:attr:`neurofed.broker.protocol.Topics.release`). Each payload is unpacked (size-capped), verified with the
federation's public key, held to the version rule (strictly newer than the running release), written to the
follower's folder and loaded by the runtime (:class:`neurofed.export.decoder.StandaloneModel`: metadata checked
against the graph), then checked against the running decoder (same channels, classes, rate, window and state
layout). Any failure is ONE warning line and the decoder keeps its model. An accepted release waits in a one-slot
"pending" box; the decode loop calls :meth:`ReleaseFollower.apply` before each window, so the swap happens between
two windows in the loop's own thread (no window is dropped or decoded twice).

**State carried** (:func:`carry_state`): the session's online alignment statistics (``ea_count``, ``ea_cov_sum``:
covariances of preprocessed windows, independent of the model) and its BN context (the last accepted windows, re-run
through the new graph when it keeps model-dependent per-window caches), so the new model continues as if it had
decoded the session from its start. The new model's hash words replace the old ones.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from neurofed_runtime import release as rel

from neurofed.broker.protocol import Topics
from neurofed.trainer.errors import NeuroFedError

logger = logging.getLogger("neurofed.edge")

#: state entries that do not depend on the model (given the same channels and preprocessing)
MODEL_FREE = ("ea_count", "ea_cov_sum")
CONTEXT = ("n_context", "context")


@dataclass
class Pending:
    """An accepted release waiting for the gap between two windows."""

    version: int
    model: Any  # neurofed.export.decoder.StandaloneModel
    path: Path
    t_received: float = 0.0  # time.monotonic() when the payload arrived
    t_ready: float = 0.0     # ... when it was verified and loaded
    rollback_of: int | None = None  # a signed rollback: the earlier release whose model this is


def _layout(model: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {e["name"]: (int(e["offset"]), tuple(int(v) for v in e["shape"])) for e in model.info.state_layout}


def compatible(old: Any, new: Any) -> str | None:
    """Why ``new`` cannot replace ``old`` in a running session (None if it can)."""
    a, b = old.card, new.card
    for what, x, y in (("channels", list(a.ch_names), list(b.ch_names)), ("classes", list(a.classes), list(b.classes)),
                       ("device rate", old.info.rate, new.info.rate), ("unit", old.info.unit, new.info.unit),
                       ("window samples", old.info.window_samples, new.info.window_samples),
                       ("preprocessing", dict(a.preprocess), dict(b.preprocess))):
        if x != y:
            return f"its {what} ({y}) differ from the running model's ({x})"
    la, lb = _layout(old), _layout(new)
    for name in MODEL_FREE + CONTEXT:
        if name in la and name in lb and la[name][1] != lb[name][1]:
            return f"its state entry {name} has shape {lb[name][1]}, the running model's {la[name][1]}"
    return None


def carry_state(old: Any, new: Any, state: np.ndarray, recent: list[np.ndarray] | None = None
                ) -> tuple[np.ndarray, bool]:
    """The new model's state continuing the session: ``(state, context carried)``.

    The alignment statistics are copied. The BN context entries are copied too when the new graph keeps nothing
    model-dependent per context window; otherwise, given the ``recent`` raw windows the context holds (the old
    :class:`~neurofed.edge.infer.StandaloneStep`'s), their covariances are taken out of the statistics and the
    windows are run through the new graph (outputs discarded), which adds them back and builds its own context:
    the result is the state the new model would have had it decoded the session from its start. Without them the
    context restarts empty.
    """
    la, lb = _layout(old), _layout(new)
    out = new.initial_state()
    s = np.asarray(state, np.float64)

    def get(name: str) -> np.ndarray:
        off, shape = la[name]
        return s[off:off + int(np.prod(shape))].reshape(shape)

    def put(name: str, v: np.ndarray) -> None:
        off, shape = lb[name]
        out[off:off + int(np.prod(shape))] = np.asarray(v, np.float64).reshape(-1)

    for name in MODEL_FREE:
        if name in la and name in lb:
            put(name, get(name))
    if not all(n in la and n in lb for n in CONTEXT):
        return out, False
    if not any(n.startswith("context_") for n in lb):
        for name in CONTEXT:
            put(name, get(name))
        return out, True
    n_ctx = int(get("n_context")[0])
    if not recent or n_ctx == 0 or len(recent) < n_ctx or "ea_count" not in la:
        return out, False
    ctx = get("context")[-n_ctx:]
    if "ea_cov_sum" in lb:
        put("ea_cov_sum", get("ea_cov_sum") - sum(x @ x.T / x.shape[1] for x in ctx))
    put("ea_count", get("ea_count") - n_ctx)
    for w in recent[-n_ctx:]:
        _, out = new.run(w, out)
    return np.asarray(out, np.float64), True


class ReleaseFollower:
    """Verify releases arriving on the release topic and hand accepted ones to the decode loop.

    Parameters
    ----------
    pub : path
        The federation's public release key (``neurofed release keygen``).
    folder : path
        Where accepted releases are written (``release-vN.onnx`` + ``.sig``).
    version : int or None
        The running release's version (None: no release yet, any valid one is accepted).
    current : StandaloneModel, optional
        The running model (compatibility is checked against it; None before the first release).
    load : callable
        ``load(path) -> StandaloneModel`` (the runtime's loader with the main package's metadata schema).
    max_bytes : int
        Largest release payload accepted (checked before anything is parsed).
    """

    def __init__(self, pub: str | os.PathLike, folder: str | os.PathLike, load: Callable[[Path], Any],
                 version: int | None = None, current: Any = None,
                 max_bytes: int = rel.DEFAULT_MAX_RELEASE_BYTES) -> None:
        self.pub = rel.load_public(pub)
        self.folder = Path(folder)
        self.load, self.version, self.current, self.max_bytes = load, version, current, max_bytes
        self._pending: Pending | None = None
        self._lock = threading.Lock()
        self.refused: list[str] = []
        self.swaps: list[dict[str, Any]] = []
        self.accepted: list[int] = []  # versions verified and loaded (a later one may supersede one before its swap)
        self._newest_seen = version  # versions accepted into the pending slot (a later one replaces it)

    # -------------------------------------------------------------- receiving (any thread)
    def offer(self, payload: bytes, source: str = "release") -> Pending | None:
        """Check one release payload; the accepted :class:`Pending` or None (refusal logged in one line)."""
        t0 = time.monotonic()
        try:
            data, doc = rel.unpack(payload, self.max_bytes)
            r = rel.verify(data, doc, self.pub, source)
            rel.check_newer(r, self._newest_seen, source)
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"release-v{r.version}.onnx"
            path.write_bytes(r.data)
            rel.sig_path(path).write_text(json.dumps(doc))
            model = self.load(path)
            if not getattr(model.card, "standalone", None):
                raise NeuroFedError(f"{source}: release {r.version} is not a standalone graph")
            if r.model_hash and r.model_hash != model.card.model_hash:
                raise NeuroFedError(f"{source}: release {r.version}'s signed model hash differs from its metadata's")
            why = compatible(self.current, model) if self.current is not None else None
            if why:
                raise NeuroFedError(f"{source}: release {r.version} cannot replace the running model: {why}")
        except (NeuroFedError, OSError) as exc:  # OSError: the release folder cannot be written (full disk, ...)
            line = str(exc).splitlines()[0] if isinstance(exc, NeuroFedError) else f"{source}: cannot keep it ({exc})"
            self.refused.append(line)
            logger.warning("release refused, decoder keeps its model: %s", line)
            return None
        p = Pending(r.version, model, path, t0, time.monotonic(), r.rollback_of)
        with self._lock:
            self._pending, self._newest_seen = p, r.version
            self.accepted.append(r.version)
        logger.info("release %d verified (%s%s); swapping at the next window", r.version, path,
                    f", a rollback to release {r.rollback_of}'s model" if r.rollback_of is not None else "")
        return p

    def take(self) -> Pending | None:
        """The accepted release not yet applied (and clear the slot)."""
        with self._lock:
            p, self._pending = self._pending, None
        return p

    # -------------------------------------------------------------- applying (the decode loop's thread)
    def apply(self, engine: Any) -> bool:
        """Swap ``engine``'s decoder to a pending release, between two windows; True if it swapped."""
        p = self.take()
        if p is None:
            return False
        from neurofed.edge.infer import StandaloneStep  # lazy: infer imports mne and scipy

        step = StandaloneStep(p.model, engine.stream_sfreq)
        old = self.current
        if old is not None:
            state, ctx = carry_state(old, p.model, engine.state, list(getattr(engine.decoder, "recent", ())))
        else:
            state, ctx = step.init_state(), False
        engine.decoder, engine.state, engine.model = step, state, p.model
        engine.meta = p.model.meta
        prev, self.version, self.current = self.version, p.version, p.model
        engine.model_version = p.version
        n_ea = int(state[_layout(p.model)["ea_count"][0]]) if "ea_count" in _layout(p.model) else 0
        self.swaps.append({"version": p.version, "previous": prev, "rollback_of": p.rollback_of,
                           "ea_windows_carried": n_ea,
                           "context_carried": ctx, "verify_load_ms": round((p.t_ready - p.t_received) * 1e3, 2),
                           "received_to_swap_ms": round((time.monotonic() - p.t_received) * 1e3, 2)})
        logger.warning("swapped decoder to release %d (was %s%s): %d EA windows carried, BN context %s", p.version,
                       prev, f"; rollback to release {p.rollback_of}'s model" if p.rollback_of is not None else "",
                       n_ea, "carried" if ctx else "restarted")
        return True


def follow_broker(follower: ReleaseFollower, broker: str, federation: str, stop: threading.Event,
                  ca_certs: str | None = None, client_id: str | None = None) -> threading.Thread:
    """Subscribe to the federation's release topic and feed every payload to ``follower`` in a daemon thread
    (returned, started). The retained release arrives first."""
    from neurofed.broker.transport import MqttTransport  # lazy: paho

    topic = Topics(federation).release
    t = MqttTransport(broker, client_id or f"neurofed-follow-{os.getpid()}", ca_certs=ca_certs,
                      max_queue=16).connect()
    t.subscribe(topic)

    def run() -> None:
        try:
            while not stop.is_set():
                item = t.get(timeout=0.2)
                if item is not None and item.event == "message" and item.topic == topic:
                    try:
                        follower.offer(item.payload, f"{topic}")
                    except Exception:  # never let one payload end the subscription: the decoder keeps its model
                        logger.exception("release on %s could not be checked; decoder keeps its model", topic)
        finally:
            t.close()

    th = threading.Thread(target=run, name="release-follow", daemon=True)
    th.start()
    return th
