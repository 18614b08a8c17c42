"""An in-memory MQTT broker and a transport double for unit tests: the real protocol code over no network.

:class:`MemoryTransport` has the interface of :class:`neurofed.broker.transport.MqttTransport` that the
coordinator (broker/coordinator.py) and the edge client (edge/federation.py) use: ``connect``, ``subscribe``
(with ``no_local``), ``unsubscribe``, ``publish`` (QoS 1, ``retain``, ``wait``), ``get`` (a queue of
:class:`~neurofed.broker.transport.Incoming` messages and ``connected`` events), ``check``, ``describe``,
``traffic``, ``close``, the last will and the counters. :class:`MemoryBroker` routes between them as Mosquitto
does for this protocol: MQTT topic filters (``+``, ``#``), retained messages (an empty retained payload clears
one; a new subscription receives the retained messages it matches), per-publisher order, no-local
subscriptions, a client id taking over an older session, and the will published (retained) when a client
vanishes without DISCONNECT (:meth:`MemoryTransport.kill`).

Everything above the transport is the real code: message encoding and decoding, topics, validation, the
coordinator's rounds and aggregation, the edge client's training and state. Use :func:`memory_broker`
(a fixture in tests/broker/conftest.py): it swaps the transport class that the coordinator and the edge
client construct, so ``Coordinator(cfg, broker.url)`` and ``EdgeClient(broker.url, ...)`` run unchanged.
Integration tests never use this: they run a real Mosquitto.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from paho.mqtt.client import topic_matches_sub

from neurofed.broker.transport import Inbox, Incoming, TransportError

_ids = itertools.count(1)


# MQTT topic-filter matching (``+`` one level, ``#`` the rest, ``$`` topics never match a wildcard): paho's.
topic_matches = topic_matches_sub


class _URL:
    """Stands in for :class:`neurofed.broker.transport.BrokerURL` (only ``redacted`` is read)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def redacted(self) -> str:
        return self.url


class MemoryBroker:
    """Routes messages between the :class:`MemoryTransport` clients of one test."""

    registry: dict[str, MemoryBroker] = {}

    def __init__(self) -> None:
        # a URL no real client could reach (port 1): a transport that was not swapped fails loudly
        self.url = f"mqtt://memory-broker-{next(_ids)}.invalid:1"
        self.lock = threading.RLock()
        self.clients: dict[str, MemoryTransport] = {}
        self.retained: dict[str, bytes] = {}
        self.log: list[tuple[str, str, int, bool]] = []  # (client id, topic, payload bytes, retain) of every publish
        self.connects: list[str] = []
        #: which clients (by client id) a new subscription hands the retained messages to: all on Mosquitto; a
        #: clustered broker with a node-local retained store (RabbitMQ 3.10) only those on the publisher's node
        self.retained_to: Callable[[str], bool] = lambda client_id: True
        MemoryBroker.registry[self.url] = self

    def close(self) -> None:
        MemoryBroker.registry.pop(self.url, None)

    # called by MemoryTransport, under self.lock
    def _connect(self, client: MemoryTransport) -> None:
        with self.lock:
            old = self.clients.get(client.client_id)
            if old is not None and old is not client:  # session takeover: the old connection is dropped
                old._dropped()
            self.clients[client.client_id] = client
            self.connects.append(client.client_id)

    def _disconnect(self, client: MemoryTransport, graceful: bool) -> None:
        with self.lock:
            if self.clients.get(client.client_id) is client:
                del self.clients[client.client_id]
                if not graceful and client.will is not None:
                    self._route(client.client_id, client.will[0], client.will[1], retain=True)

    def _deliver_retained(self, client: MemoryTransport, topic_filter: str) -> None:
        with self.lock:
            if not self.retained_to(client.client_id):
                return
            for topic, payload in sorted(self.retained.items()):
                if topic_matches(topic_filter, topic):
                    client._deliver(Incoming("message", topic, payload, True))

    def _route(self, sender: str, topic: str, payload: bytes, retain: bool) -> None:
        with self.lock:
            self.log.append((sender, topic, len(payload), retain))
            if retain:
                if payload:
                    self.retained[topic] = payload
                else:
                    self.retained.pop(topic, None)
            for c in list(self.clients.values()):
                matching = [f for f in c.subscriptions if topic_matches(f, topic)]
                if c.probe_topic is not None and topic_matches(c.probe_topic, topic):
                    matching.append(c.probe_topic)
                if not matching:
                    continue
                if c.client_id == sender and all(f in c.no_local for f in matching):
                    continue  # MQTT 5 no-local: our own publishes on such a filter are not echoed
                c._deliver(Incoming("message", topic, payload, False))


class MemoryTransport(Inbox):
    """Same interface as :class:`neurofed.broker.transport.MqttTransport`, over a :class:`MemoryBroker`.

    Constructed exactly like the real one (``url`` names the broker: :attr:`MemoryBroker.url`); TLS, keepalive,
    protocol and reconnect settings are accepted and have nothing to do.
    """

    def __init__(self, url: Any, client_id: str, *, will: tuple[str, bytes] | None = None, keepalive: int = 10,
                 protocol: str = "auto", ca_certs: str | None = None, certfile: str | None = None,
                 keyfile: str | None = None, max_queue: int = 100_000, reconnect_max_s: int = 8,
                 probe_topic: str | None = None, probe_s: float = 20.0) -> None:
        super().__init__(client_id, max_queue)
        self.url = _URL(str(url))
        self.will = will
        self.keepalive, self.protocol = keepalive, protocol
        self._broker: MemoryBroker | None = None
        self.probe_topic, self.probe_s = probe_topic, probe_s
        self.restarts = 0
        self.sessions = 0

    # ------------------------------------------------------------------ connection
    def connect(self, timeout: float = 10.0) -> Self:
        broker = MemoryBroker.registry.get(self.url.url)
        if broker is None:
            raise TransportError(f"cannot reach broker {self.url.url}: no MemoryBroker there")
        self._broker = broker
        broker._connect(self)
        self.mqtt_version = "5"
        self.sessions += 1
        self._connected.set()
        with broker.lock:
            for f in list(self.subscriptions):  # renewed on a reconnect, as the real transport does
                broker._deliver_retained(self, f)
        self._put(Incoming("connected"))
        return self

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def _dropped(self) -> None:  # the broker dropped us (another session took our id)
        if self._connected.is_set():
            self._connected.clear()
            self._put(Incoming("disconnected"))

    def kill(self) -> None:
        """Vanish without DISCONNECT (a killed process): the broker publishes our will."""
        if self._broker is not None:
            self._broker._disconnect(self, graceful=False)
        self._connected.clear()
        self._broker = None

    def close(self, timeout: float = 2.0) -> None:
        """Disconnect cleanly (no will)."""
        if self._broker is not None:
            self._broker._disconnect(self, graceful=True)
        self._connected.clear()
        self._broker = None

    def _require(self) -> MemoryBroker:
        if self._broker is None:
            raise TransportError(f"{self.client_id}: transport is not connected (call connect() first)")
        return self._broker

    def __enter__(self) -> Self:
        return self if self._broker is not None else self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pub/sub
    def subscribe(self, topic: str, no_local: bool = False) -> None:
        broker = self._require()
        with broker.lock:
            new = topic not in self.subscriptions
            if new:
                self.subscriptions.append(topic)
            if no_local:
                self.no_local.add(topic)
            if new and self.connected:
                broker._deliver_retained(self, topic)

    def unsubscribe(self, topic: str) -> None:
        broker = self._require()
        with broker.lock:
            if topic in self.subscriptions:
                self.subscriptions.remove(topic)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, wait: float | None = 10.0) -> bool:
        broker = self._require()
        payload = bytes(payload)
        self.bytes_out += len(payload)
        self.msgs_out += 1
        self._count(topic, len(payload))
        broker._route(self.client_id, topic, payload, retain)
        return wait is not None

    def _deliver(self, item: Incoming) -> None:
        if item.topic == self.probe_topic:
            return  # probes are the transport's own business
        self.bytes_in += len(item.payload)
        self.msgs_in += 1
        self._count(item.topic, len(item.payload))
        self._put(item)

    def _put(self, item: Incoming) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            pass

    def check(self) -> None:
        """Nothing to supervise: an in-memory session cannot stall."""

    def describe(self) -> dict[str, object]:
        return {"client_id": self.client_id, "connected": self.connected, "mqtt": self.mqtt_version,
                "queued": self.queue.qsize(), "msgs_in": self.msgs_in, "msgs_out": self.msgs_out,
                "restarts": self.restarts, "sessions": self.sessions, "broker": "memory"}




def wait_for(cond, timeout: float, what: str = "condition", poll: float = 0.01) -> None:
    """Poll ``cond()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
