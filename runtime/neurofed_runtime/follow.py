"""Follow signed releases: verify each one and swap a running decoder to it between two windows.

A federation's coordinator publishes every release it signs **retained** on ``neurofed/<federation>/release``
(:func:`release_topic`; the payload is a :mod:`neurofed_runtime.release` envelope). A :class:`ReleaseFollower`
checks each payload (size cap, Ed25519 signature with the federation's public key, strictly newer version, the
graph's metadata against the signed model hash, the same channels, classes, rate, unit, window and state layout as
the running model) and keeps an accepted one in a one-slot pending box. Any failure is ONE warning line and the
decoder keeps its model. The decoder applies the pending release before its next window, in its own thread, so no
window is dropped or decoded twice:

* :class:`neurofed_runtime.Decoder` does it itself once :meth:`~neurofed_runtime.Decoder.follow` is called;
* ``edge-client infer --follow`` (the main package) through :meth:`ReleaseFollower.apply`'s counterpart there.

**State carried** (:func:`carry_state`): the session's online alignment statistics (``ea_count``, ``ea_cov_sum``:
covariances of preprocessed windows, independent of the model) and its BN context (the last accepted windows, re-run
through the new graph when it keeps model-dependent per-window caches), so the new model continues as if it had
decoded the session from its start.

Over MQTT, :func:`subscribe` feeds a follower from a broker (paho-mqtt, the ``follow`` extra)::

    follower = ReleaseFollower("release.pub", "releases-in")
    dec = Decoder.load("model.onnx", ch_names=labels, sfreq=160.0).follow(follower, version=1)
    subscribe(follower, "mqtt://127.0.0.1:1883", "clinic-a", stop)    # a daemon thread
    for res in dec.stream(chunk): ...                                   # res.version: the release that decoded it
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
from urllib.parse import urlparse

import numpy as np

from neurofed_runtime import release as rel
from neurofed_runtime.errors import NeuroFedError

logger = logging.getLogger("neurofed_runtime")

#: state entries that do not depend on the model (given the same channels and preprocessing)
MODEL_FREE = ("ea_count", "ea_cov_sum")
CONTEXT = ("n_context", "context")


def release_topic(federation: str) -> str:
    """The retained release topic of a federation (the coordinator's ``Topics(federation).release``)."""
    return f"neurofed/{federation}/release"


@dataclass
class Pending:
    """An accepted release waiting for the gap between two windows."""

    version: int
    model: Any  # a StandaloneModel
    path: Path
    t_received: float = 0.0  # time.monotonic() when the payload arrived
    t_ready: float = 0.0     # ... when it was verified and loaded
    rollback_of: int | None = None  # a signed rollback: the earlier release whose model this is


def layout(model: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    """``{state entry: (offset, shape)}`` of a standalone model's state vector."""
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
    la, lb = layout(old), layout(new)
    for name in MODEL_FREE + CONTEXT:
        if name in la and name in lb and la[name][1] != lb[name][1]:
            return f"its state entry {name} has shape {lb[name][1]}, the running model's {la[name][1]}"
    return None


def carry_state(old: Any, new: Any, state: np.ndarray, recent: list[np.ndarray] | None = None
                ) -> tuple[np.ndarray, bool]:
    """The new model's state continuing the session: ``(state, context carried)``.

    The alignment statistics are copied. The BN context entries are copied too when the new graph keeps nothing
    model-dependent per context window; otherwise, given the ``recent`` windows the context holds (in the graph's
    channels and unit, as the old model ran them), their covariances are taken out of the statistics and the windows
    are run through the new graph (outputs discarded), which adds them back and builds its own context: the result
    is the state the new model would have had it decoded the session from its start. Without them the context
    restarts empty.
    """
    la, lb = layout(old), layout(new)
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


def _load_runtime(path: Path) -> Any:
    from neurofed_runtime.model import StandaloneModel

    return StandaloneModel(path)


class ReleaseFollower:
    """Verify releases arriving on the release topic and hand accepted ones to the decode loop.

    Parameters
    ----------
    pub : path
        The federation's public release key (``neurofed release keygen``).
    folder : path
        Where accepted releases are written (``release-vN.onnx`` + ``.sig``).
    load : callable, optional
        ``load(path) -> model`` (default: this runtime's :class:`~neurofed_runtime.model.StandaloneModel`).
    version : int or None
        The running release's version (None: no release yet, any valid one is accepted).
    current : neurofed_runtime.model.StandaloneModel, optional
        The running model (compatibility is checked against it; None before the first release).
    max_bytes : int
        Largest release payload accepted (checked before anything is parsed).
    """

    def __init__(self, pub: str | os.PathLike, folder: str | os.PathLike, load: Callable[[Path], Any] | None = None,
                 version: int | None = None, current: Any = None,
                 max_bytes: int = rel.DEFAULT_MAX_RELEASE_BYTES) -> None:
        self.pub = rel.load_public(pub)
        self.folder = Path(folder)
        self.load = load or _load_runtime
        self.version, self.current, self.max_bytes = version, current, max_bytes
        self._pending: Pending | None = None
        self._lock = threading.Lock()
        self.refused: list[str] = []
        self.swaps: list[dict[str, Any]] = []
        self.accepted: list[int] = []  # versions verified and loaded (a later one may supersede one before its swap)
        self._newest_seen = version  # versions accepted into the pending slot (a later one replaces it)

    def running(self, model: Any, version: int | None) -> None:
        """The decoder runs ``model`` as release ``version`` (None: not a release): releases are checked against it
        and must be newer."""
        with self._lock:
            self.current, self.version = model, version
            if version is not None and (self._newest_seen is None or version > self._newest_seen):
                self._newest_seen = version

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
    def swapped(self, p: Pending, state: np.ndarray, context_carried: bool) -> dict[str, Any]:
        """Record that the decode loop now runs ``p`` (its new ``state``): the follower's running version and
        model move on, the swap is logged in one line and appended to :attr:`swaps` (returned)."""
        prev, self.version, self.current = self.version, p.version, p.model
        lay = layout(p.model)
        n_ea = int(state[lay["ea_count"][0]]) if "ea_count" in lay else 0
        rec = {"version": p.version, "previous": prev, "rollback_of": p.rollback_of, "ea_windows_carried": n_ea,
               "context_carried": context_carried, "verify_load_ms": round((p.t_ready - p.t_received) * 1e3, 2),
               "received_to_swap_ms": round((time.monotonic() - p.t_received) * 1e3, 2)}
        self.swaps.append(rec)
        logger.warning("swapped decoder to release %d (was %s%s): %d EA windows carried, BN context %s", p.version,
                       prev, f"; rollback to release {p.rollback_of}'s model" if p.rollback_of is not None else "",
                       n_ea, "carried" if context_carried else "restarted")
        return rec


def subscribe(follower: ReleaseFollower, broker: str, federation: str, stop: threading.Event,
              ca_certs: str | None = None, client_id: str | None = None, timeout: float = 10.0,
              username: str | None = None, password: str | None = None) -> threading.Thread:
    """Subscribe to the federation's release topic and feed every payload to ``follower`` (paho-mqtt's network
    loop, a daemon thread; the retained release arrives first). Returns once subscribed; ``stop`` ends it.

    Parameters
    ----------
    broker : str
        ``mqtt://host:port`` or ``mqtts://host:port`` (TLS with ``ca_certs``).

    Raises
    ------
    NeuroFedError
        paho-mqtt is not installed, the URL is not an MQTT URL, or the broker is not reachable within ``timeout``.
    """
    try:
        import paho.mqtt.client as mqtt
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise NeuroFedError("following releases over MQTT needs paho-mqtt: pip install 'neurofed-runtime[follow]'"
                            ) from None
    u = urlparse(broker)
    if u.scheme not in ("mqtt", "mqtts") or not u.hostname:
        raise NeuroFedError(f"broker {broker!r} is not an mqtt:// or mqtts:// URL")
    topic = release_topic(federation)
    subscribed = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"neurofed-rt-follow-{os.getpid()}")
    if username:
        c.username_pw_set(username, password)
    if u.scheme == "mqtts":
        c.tls_set(ca_certs=ca_certs)

    def on_connect(client, userdata, flags, reason, props) -> None:
        if not reason.is_failure:
            client.subscribe(topic, qos=1)  # on every (re)connect: the retained release comes again

    def on_subscribe(client, userdata, mid, reasons, props) -> None:
        subscribed.set()

    def on_message(client, userdata, msg) -> None:
        if msg.topic == topic and msg.payload:
            try:
                follower.offer(bytes(msg.payload), topic)
            except Exception:  # noqa: BLE001 - one payload never ends the subscription: the decoder keeps its model
                logger.exception("release on %s could not be checked; decoder keeps its model", topic)

    c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
    try:
        c.connect(u.hostname, u.port or (8883 if u.scheme == "mqtts" else 1883))
    except OSError as exc:
        raise NeuroFedError(f"cannot reach the MQTT broker at {broker} ({exc})") from None
    c.loop_start()
    if not subscribed.wait(timeout):
        c.loop_stop()
        c.disconnect()
        raise NeuroFedError(f"no subscription to {topic} at {broker} within {timeout:g} s (is the broker up?)")

    def wait() -> None:
        stop.wait()
        c.disconnect()
        c.loop_stop()

    th = threading.Thread(target=wait, name="release-follow", daemon=True)
    th.start()
    return th


__all__ = ["CONTEXT", "MODEL_FREE", "Pending", "ReleaseFollower", "carry_state", "compatible", "layout",
           "release_topic", "subscribe"]
