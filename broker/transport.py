"""MQTT transport: the only module that imports paho.

MQTT v5 where the broker speaks it, 3.1.1 otherwise (amqtt is 3.1.1 only); QoS 1 everywhere;
automatic reconnection with exponential backoff; subscriptions are renewed on every (re)connect;
incoming messages and connection events go to a thread-safe queue that the caller polls with a
timeout (no application logic runs in paho's network thread). Library errors become
:class:`TransportError`.

Supervision: paho's network thread ends for good if a callback raises or the client is disconnected
(for instance after the broker refused a reconnect), and a broker can keep a session open that no
longer delivers (a full in-flight window of QoS-1 messages it never saw acknowledged is not re-sent
within a connection). Either way the caller would poll an empty queue forever. :meth:`MqttTransport.get`
therefore checks, about once a second, that the network thread is alive and, with a ``probe_topic``,
that a probe published after ``probe_s`` seconds of inbound silence comes back within ``probe_s``;
otherwise it logs a warning and re-establishes the session with a fresh client (subscriptions renewed,
a ``connected`` event queued). :meth:`MqttTransport.describe` reports the connection state.

Latency: MQTT's small packets (PUBACKs, short control messages) meet Nagle's algorithm and the peer's
delayed ACK (40 ms on Linux) on every leg: a small write waits for the ACK of the previous small write,
which the peer delays because it has nothing to send back. That cost ~40 ms per hop (~90 ms per
request/response through the broker) on loopback. Every socket we open therefore sets ``TCP_NODELAY``
(our writes go out at once) and, where the OS has it (Linux), re-arms ``TCP_QUICKACK`` after each
packet we read, so the broker's next write is not held back by our delayed ACK when the broker runs
with Nagle on (Mosquitto's default; ``neurofed broker-config`` writes ``set_tcp_nodelay true``).
"""

from __future__ import annotations

import os
import queue
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Literal, Self
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from neurofed.broker import logger
from neurofed.trainer.errors import NeuroFedError

Protocol = Literal["auto", "5", "3.1.1"]
#: What a client that tried a broker once (no ``--wait-for-broker``) adds to "cannot reach broker".
NO_BROKER_HINT = "; is it running? (--wait-for-broker SECONDS waits for it)"


class TransportError(NeuroFedError, ConnectionError):
    """The broker cannot be reached, refused us, or a publish was not acknowledged in time."""


class AuthError(TransportError):
    """The broker refused our credentials or client id."""


@dataclass(frozen=True)
class BrokerURL:
    """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS, default port 8883)."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise TransportError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = parts.scheme in ("mqtts", "ssl")
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError:
            raise TransportError(f"broker URL {url!r}: bad port") from None
        if not parts.hostname:
            raise TransportError(f"broker URL {url!r}: no host")
        user = unquote(parts.username) if parts.username else os.environ.get("NEUROFED_MQTT_USERNAME")
        pw = unquote(parts.password) if parts.password else os.environ.get("NEUROFED_MQTT_PASSWORD")
        return cls(parts.hostname, port, tls, user, pw)

    def redacted(self) -> str:
        who = f"{self.username}:***@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{who}{self.host}:{self.port}"

    def probe(self, timeout: float = 3.0) -> None:
        """Raise :class:`TransportError` at once if nothing accepts a TCP connection at host:port.

        A cheap check a command runs before its heavy imports (torch), so a dead broker is reported in
        about a second rather than after the start-up cost; the MQTT handshake itself is :meth:`MqttTransport.connect`'s.
        """
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout):
                pass
        except OSError as exc:
            raise TransportError(f"cannot reach broker {self.redacted()}: {exc}") from None


@dataclass
class Incoming:
    """One item from the transport queue: a message, or a ``connected``/``disconnected`` event."""

    event: Literal["message", "connected", "disconnected"]
    topic: str = ""
    payload: bytes = b""
    retain: bool = False


class Inbox:
    """A transport's session bookkeeping: the incoming queue, subscriptions and traffic counters.

    Shared by :class:`MqttTransport` and the tests' in-memory double, so both count and hand out messages
    the same way; a subclass supplies :meth:`check` (its session supervision).
    """

    def __init__(self, client_id: str, max_queue: int) -> None:
        self.client_id = client_id
        self.queue: queue.Queue[Incoming] = queue.Queue(max_queue)
        self.subscriptions: list[str] = []
        self.no_local: set[str] = set()
        self.mqtt_version: str | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        self.msgs_in = 0
        self.msgs_out = 0
        self._traffic: dict[str, list[int]] = {}  # topic -> [messages, payload bytes], both directions
        self._connected = threading.Event()
        self._lock = threading.Lock()

    def check(self) -> None:
        """Supervise the session (the subclass's); called by :meth:`get`."""

    def _count(self, topic: str, n: int) -> None:
        with self._lock:
            row = self._traffic.setdefault(topic, [0, 0])
            row[0] += 1
            row[1] += n

    def traffic(self) -> dict[str, tuple[int, int]]:
        """``topic -> (messages, payload bytes)`` published and received so far (a copy)."""
        with self._lock:
            return {t: (m, b) for t, (m, b) in self._traffic.items()}

    def get(self, timeout: float = 0.1) -> Incoming | None:
        """Next incoming item, or None after ``timeout`` seconds (also runs :meth:`check`)."""
        self.check()
        try:
            return self.queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None


class MqttTransport(Inbox):
    """A paho client with a message queue.

    Parameters
    ----------
    url : str or BrokerURL
    client_id : str
    will : (topic, payload), optional
        Last will, published retained by the broker if we vanish without DISCONNECT.
    keepalive : int
        Seconds; a vanished peer is detected after about 1.5 x keepalive.
    protocol : {"auto", "5", "3.1.1"}
    ca_certs, certfile, keyfile : str, optional
        TLS files (``mqtts://``); the system CA store when ``ca_certs`` is None.
    max_queue : int
        Incoming messages kept before the oldest are dropped (logged).
    probe_topic : str, optional
        A topic we may publish and subscribe to and nobody else uses: after ``probe_s`` seconds without
        an incoming message a small probe is published there (not counted in :meth:`traffic`); if it does
        not come back within ``probe_s`` seconds the session is re-established (see the module docstring).
    probe_s : float
    """

    def __init__(self, url: str | BrokerURL, client_id: str, *, will: tuple[str, bytes] | None = None,
                 keepalive: int = 10, protocol: Protocol = "auto", ca_certs: str | None = None,
                 certfile: str | None = None, keyfile: str | None = None, max_queue: int = 100_000,
                 reconnect_max_s: int = 8, probe_topic: str | None = None, probe_s: float = 20.0) -> None:
        super().__init__(client_id, max_queue)
        self.url = url if isinstance(url, BrokerURL) else BrokerURL.parse(url)
        self.will = will
        self.keepalive = keepalive
        self.protocol = protocol
        self.tls_files = (ca_certs, certfile, keyfile)
        self.reconnect_max_s = reconnect_max_s
        self._client: mqtt.Client | None = None
        self._refusal: str | None = None
        self._live: mqtt.Client | None = None  # the client whose callbacks count (a retired one's are ignored)
        self._v5 = True
        self.probe_topic = probe_topic
        self.probe_s = probe_s
        self.restarts = 0  # sessions re-established by the supervision (not paho's own reconnects)
        self.sessions = 0  # CONNACKs accepted (paho's reconnects and the supervision's restarts included)
        self._last_in = time.monotonic()  # last incoming message (any topic, probes included)
        self._probe: tuple[bytes, float] | None = None  # (payload, sent at) of the probe in flight
        self._next_check = 0.0
        self._restart_after = 0.0

    # ------------------------------------------------------------------ connection
    def _make(self, v5: bool) -> mqtt.Client:
        proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        kw = {} if v5 else {"clean_session": True}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=proto, **kw)
        c.max_queued_messages_set(0)
        c.max_inflight_messages_set(100)
        c.reconnect_delay_set(1, self.reconnect_max_s)
        if self.url.username:
            c.username_pw_set(self.url.username, self.url.password)
        if self.url.tls:
            ca, cert, key = self.tls_files
            try:
                c.tls_set(ca_certs=ca, certfile=cert, keyfile=key, cert_reqs=ssl.CERT_REQUIRED)
            except (OSError, ValueError, ssl.SSLError) as exc:
                raise TransportError(f"TLS setup failed: {exc}") from None
        if self.will:
            c.will_set(self.will[0], self.will[1], qos=1, retain=True)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_socket_open = _no_delay
        c.on_publish = self._on_puback
        self._live = c
        return c

    def connect(self, timeout: float = 10.0) -> Self:
        """Connect (MQTT v5 first under ``auto``), start the network thread, wait for CONNACK."""
        versions = {"auto": [True, False], "5": [True], "3.1.1": [False]}[self.protocol]
        last = "no attempt"
        for v5 in versions:
            self._refusal = None
            self._connected.clear()
            c = self._make(v5)
            try:
                c.connect(self.url.host, self.url.port, keepalive=self.keepalive)
            except (OSError, ssl.SSLError) as exc:
                raise TransportError(f"cannot reach broker {self.url.redacted()}: {exc}") from None
            c.loop_start()
            # the whole timeout for v5 too: a 3.1.1-only broker refuses a v5 CONNECT (or closes the connection)
            # at once, while a CONNACK that is merely slow (a loaded machine) must not make us open a second
            # session under the same client id over 3.1.1 (the broker then publishes our will on the takeover)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self._connected.is_set() and self._refusal is None:
                time.sleep(0.01)
            if self._connected.is_set():
                self._client, self._v5 = c, v5
                self._last_in = time.monotonic()
                self.mqtt_version = "5" if v5 else "3.1.1"
                logger.debug("%s connected to %s over MQTT %s", self.client_id, self.url.redacted(), self.mqtt_version)
                return self
            refusal, self._live = self._refusal, None  # the abandoned client's callbacks no longer count
            c.loop_stop()
            c.disconnect()
            self._connected.clear()  # in case its CONNACK came in just now
            last = refusal or "no CONNACK in time"
            if refusal and _is_auth_refusal(refusal):
                raise AuthError(f"broker {self.url.redacted()} refused client {self.client_id!r}: {refusal}")
        raise TransportError(f"broker {self.url.redacted()} did not accept client {self.client_id!r}: {last}")

    def _on_connect(self, client, userdata, flags, reason_code, properties=None) -> None:  # paho thread
        if client is not self._live:  # a client we gave up on (connect() fallback, supervision restart)
            return
        if reason_code.is_failure if isinstance(reason_code, ReasonCode) else reason_code != 0:
            self._refusal = str(reason_code)
            client.disconnect()
            return
        self.sessions += 1
        if self.sessions > 1:
            logger.info("%s reconnected to %s (session %d); %d subscription(s) renewed", self.client_id,
                        self.url.redacted(), self.sessions, len(self.subscriptions))
        for topic in list(self.subscriptions):
            self._sub(client, topic)
        if self.probe_topic is not None:
            client.subscribe(self.probe_topic, qos=1)
        self._probe, self._last_in = None, time.monotonic()
        self._connected.set()
        self._put(Incoming("connected"))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None) -> None:
        if client is not self._live:
            return
        if self._client is None and self._refusal is None and not self._connected.is_set():  # in connect()
            self._refusal = f"connection closed before CONNACK ({reason_code})"
        if self._connected.is_set():
            self._connected.clear()
            self._put(Incoming("disconnected"))
            logger.info("%s lost the broker (%s); reconnecting with backoff", self.client_id, reason_code)

    def _on_puback(self, client, *args) -> None:  # paho thread: a QoS 1 publish of ours was acknowledged
        _ack_now(client.socket())

    def _on_message(self, client, userdata, msg) -> None:
        _ack_now(client.socket())
        if client is not self._live:
            return
        self._last_in = time.monotonic()
        if msg.topic == self.probe_topic:
            probe = self._probe
            if probe is not None and msg.payload == probe[0]:
                self._probe = None
            return
        self.bytes_in += len(msg.payload)
        self.msgs_in += 1
        self._count(msg.topic, len(msg.payload))
        self._put(Incoming("message", msg.topic, bytes(msg.payload), bool(msg.retain)))

    def _put(self, item: Incoming) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            logger.warning("%s: incoming queue full, dropping a message on %s", self.client_id, item.topic)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    # ------------------------------------------------------------------ pub/sub
    def _sub(self, client: mqtt.Client, topic: str) -> tuple[int, int | None]:
        if topic in self.no_local and client.protocol == mqtt.MQTTv5:
            return client.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True))
        return client.subscribe(topic, qos=1)

    def subscribe(self, topic: str, no_local: bool = False) -> None:
        """Subscribe at QoS 1 now and after every reconnect.

        ``no_local``: the broker does not echo our own publishes on this filter (MQTT 5 only; under
        3.1.1 the caller must drop its own messages itself).
        """
        with self._lock:
            if topic not in self.subscriptions:
                self.subscriptions.append(topic)
            if no_local:
                self.no_local.add(topic)
        c = self._require()
        if self.connected:
            rc, _ = self._sub(c, topic)
            if rc != mqtt.MQTT_ERR_SUCCESS and rc != mqtt.MQTT_ERR_NO_CONN:
                raise TransportError(f"subscribe to {topic!r} failed: {mqtt.error_string(rc)}")

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic`` (now and after reconnects)."""
        with self._lock:
            if topic in self.subscriptions:
                self.subscriptions.remove(topic)
        c = self._require()
        if self.connected:
            c.unsubscribe(topic)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, wait: float | None = 10.0) -> bool:
        """Publish at QoS 1; with ``wait``, block until the broker acknowledged (or raise)."""
        c = self._require()
        try:
            info = c.publish(topic, payload, qos=1, retain=retain)
        except (ValueError, OSError) as exc:
            raise TransportError(f"publish to {topic!r} failed: {exc}") from None
        self.bytes_out += len(payload)
        self.msgs_out += 1
        self._count(topic, len(payload))
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            raise TransportError(f"publish to {topic!r} failed: {mqtt.error_string(info.rc)}")
        if info.rc == mqtt.MQTT_ERR_NO_CONN:
            # paho queued it (QoS 1) and sends it after reconnecting, but its MQTTMessageInfo keeps
            # rc=NO_CONN and then raises RuntimeError from is_published()/wait_for_publish() even
            # once the broker acknowledged it: record the queuing and track the ack normally
            info.rc = mqtt.MQTT_ERR_SUCCESS
        if wait is None:
            return False
        deadline = time.monotonic() + wait
        while not info.is_published() and time.monotonic() < deadline:
            info.wait_for_publish(0.05) if self.connected else time.sleep(0.05)
        if not info.is_published():
            raise TransportError(f"publish to {topic!r} not acknowledged within {wait:.1f} s (queued; "
                                 "sent after reconnecting)")
        return True

    # ------------------------------------------------------------------ supervision
    def check(self) -> None:
        """Re-establish the session if it can no longer deliver (caller's thread; at most once a second).

        A network thread that stopped (paho leaves it for good after a callback raised or a refused
        reconnect) is replaced at once; with a ``probe_topic``, a session that delivered nothing for
        ``probe_s`` seconds is probed and replaced if the probe does not come back within ``probe_s``.
        """
        c, now = self._client, time.monotonic()
        if c is None or now < self._next_check:
            return
        self._next_check = now + 1.0
        if not _loop_alive(c):
            if now >= self._restart_after:
                self._restart(f"its network thread stopped (paho state {_paho_state(c)})")
            return
        if self.probe_topic is None or not self.connected:
            self._probe = None
            return
        probe = self._probe
        if probe is not None:
            if now - probe[1] > self.probe_s:
                self._restart(f"the broker delivered nothing for {now - self._last_in:.0f} s and a probe on "
                              f"{self.probe_topic} did not come back within {self.probe_s:.0f} s")
            return
        if now - self._last_in > self.probe_s:
            self._probe = (f"probe {now:.3f}".encode(), now)
            try:
                c.publish(self.probe_topic, self._probe[0], qos=1)
            except (ValueError, OSError) as exc:
                logger.debug("%s: probe not sent: %s", self.client_id, exc)

    def _restart(self, why: str) -> None:
        """Retire the current paho client (in a helper thread: it may be stuck) and connect a fresh one."""
        old = self._client
        self.restarts += 1
        self._restart_after = time.monotonic() + self.reconnect_max_s
        logger.warning("%s: %s; re-establishing the MQTT session (restart #%d; state %s)", self.client_id, why,
                       self.restarts, self.describe())
        self._live, self._probe = None, None
        if self._connected.is_set():
            self._connected.clear()
            self._put(Incoming("disconnected"))
        if old is not None:
            retire = threading.Thread(target=_retire, args=(old,), daemon=True, name=f"retire-{self.client_id}")
            retire.start()
            retire.join(2.0)  # its DISCONNECT first, so the broker does not publish our will on the takeover
        c = self._make(self._v5)
        self._client = c
        self._last_in = time.monotonic()
        try:
            c.connect_async(self.url.host, self.url.port, keepalive=self.keepalive)
            c.loop_start()  # connects (retrying) in its thread; _on_connect renews the subscriptions
        except (OSError, ValueError) as exc:
            logger.warning("%s: restarting the MQTT client failed: %s", self.client_id, exc)

    def describe(self) -> dict[str, object]:
        """The connection state, for diagnostics (a stalled intake, a failing test)."""
        c = self._client
        d: dict[str, object] = {"client_id": self.client_id, "connected": self.connected, "mqtt": self.mqtt_version,
                                "queued": self.queue.qsize(), "msgs_in": self.msgs_in, "msgs_out": self.msgs_out,
                                "last_in_s_ago": round(time.monotonic() - self._last_in, 1),
                                "probe_in_flight": self._probe is not None, "restarts": self.restarts,
                                "sessions": self.sessions}
        if c is not None:
            d.update({"loop_alive": _loop_alive(c), "paho_state": _paho_state(c), "socket": c.socket() is not None,
                      "out_in_flight": getattr(c, "_inflight_messages", "?"),
                      "out_queued": len(getattr(c, "_out_messages", ())), "out_packets": len(getattr(c, "_out_packet", ()))})
        return d

    def close(self, timeout: float = 2.0) -> None:
        """Disconnect cleanly (the last will is not sent) and stop the network thread."""
        c, self._client = self._client, None
        if c is None:
            return
        self._probe, self._live = None, None  # our own disconnect: its callback is not "lost the broker"
        try:
            c.disconnect()
        finally:
            c.loop_stop()
        self._connected.clear()

    def _require(self) -> mqtt.Client:
        if self._client is None:
            raise TransportError(f"{self.client_id}: transport is not connected (call connect() first)")
        return self._client

    def __enter__(self) -> Self:
        return self if self._client is not None else self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _loop_alive(c: mqtt.Client) -> bool:
    """Whether ``c``'s network thread (``loop_start``) is running; paho has no public accessor for it."""
    t = getattr(c, "_thread", None)
    return t is not None and t.is_alive()


def _paho_state(c: mqtt.Client) -> str:
    st = getattr(c, "_state", None)
    return getattr(st, "name", str(st))


def _retire(c: mqtt.Client) -> None:
    """Disconnect a client we replace (its callbacks are already ignored) and stop its thread."""
    try:
        c.disconnect()
        c.loop_stop()
    except Exception as exc:  # noqa: BLE001 - best effort on a client we no longer use
        logger.debug("retiring an MQTT client: %s", exc)


def _no_delay(client, userdata, sock) -> None:
    """paho's socket-open hook: send our small packets at once (no Nagle; see the module docstring)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # not a TCP socket (a unix socket or a websocket wrapper)
        pass
    _ack_now(sock)


def _ack_now(sock) -> None:
    """ACK what we read without the delayed-ACK timer (Linux ``TCP_QUICKACK``, which the kernel clears again)."""
    if _QUICKACK is not None and sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except (OSError, AttributeError):
            pass


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _is_auth_refusal(reason: str) -> bool:
    r = reason.lower()
    return any(s in r for s in ("not authori", "bad user", "password", "identifier", "banned"))


def connect_with_backoff(make: callable, attempts: int = 0, first: float = 0.5, cap: float = 8.0,
                         stop: threading.Event | None = None, timeout: float | None = None) -> MqttTransport:
    """Call ``make().connect()`` until it works, doubling the wait up to ``cap``.

    Gives up (re-raising the last error) after ``attempts`` tries (0 = no limit) or ``timeout``
    seconds. Authentication refusals are not retried.
    """
    delay, n = first, 0
    end = time.monotonic() + timeout if timeout is not None else None
    while True:
        n += 1
        try:
            return make().connect()
        except AuthError:
            raise
        except TransportError as exc:
            if (attempts and n >= attempts) or (end is not None and time.monotonic() + delay > end):
                raise
            logger.info("broker not reachable (%s); retrying in %.1f s", exc, delay)
            if stop is not None and stop.wait(delay):
                raise TransportError("stopped while waiting for the broker") from None
            if stop is None:
                time.sleep(delay)
            delay = min(delay * 2, cap)
