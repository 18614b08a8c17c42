"""``edge-client infer --follow``: take signed releases from the broker and swap the decoder between two windows.

The checks, the pending slot and the carried state are the runtime's (:mod:`neurofed_runtime.follow`: one
implementation for this decoder and for :class:`neurofed_runtime.Decoder`). A :class:`ReleaseFollower`
subscribes to the federation's retained release topic (:attr:`neurofed.broker.protocol.Topics.release`). Each payload
is unpacked (size-capped), verified with the federation's public key, held to the version rule (strictly newer than
the running release), written to the follower's folder and loaded by the runtime
(:class:`neurofed.export.decoder.StandaloneModel`: metadata checked against the graph), then checked against the
running decoder (same channels, classes, rate, window and state layout). Any failure is ONE warning line and the
decoder keeps its model. An accepted release waits in a one-slot "pending" box; the decode loop calls
:meth:`ReleaseFollower.apply` before each window, so the swap happens between two windows in the loop's own thread
(no window is dropped or decoded twice).

**State carried** (:func:`carry_state`): the session's online alignment statistics (``ea_count``, ``ea_cov_sum``:
covariances of preprocessed windows, independent of the model) and its BN context (the last accepted windows, re-run
through the new graph when it keeps model-dependent per-window caches), so the new model continues as if it had
decoded the session from its start. The new model's hash words replace the old ones.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from neurofed_runtime import follow as _rt
from neurofed_runtime.follow import CONTEXT, MODEL_FREE, Pending, carry_state, compatible

from neurofed.broker.protocol import Topics

logger = logging.getLogger("neurofed.edge")

__all__ = ["CONTEXT", "MODEL_FREE", "Pending", "ReleaseFollower", "carry_state", "compatible", "follow_broker"]


class ReleaseFollower(_rt.ReleaseFollower):
    """:class:`neurofed_runtime.follow.ReleaseFollower` that swaps an :class:`~neurofed.edge.infer.InferenceEngine`
    (``load``: :class:`neurofed.export.decoder.StandaloneModel`, the main package's metadata schema)."""

    # -------------------------------------------------------------- applying (the decode loop's thread)
    def apply(self, engine: Any) -> bool:
        """Swap ``engine``'s decoder to a pending release, between two windows; True if it swapped."""
        p = self.take()
        if p is None:
            return False
        from neurofed.edge.infer import StandaloneStep  # lazy: infer imports mne and scipy

        step = StandaloneStep(p.model, engine.stream_sfreq)
        if self.current is not None:
            state, ctx = carry_state(self.current, p.model, engine.state, list(getattr(engine.decoder, "recent", ())))
        else:
            state, ctx = step.init_state(), False
        engine.decoder, engine.state, engine.model = step, state, p.model
        engine.meta = p.model.meta
        engine.model_version = p.version
        self.swapped(p, state, ctx)
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
