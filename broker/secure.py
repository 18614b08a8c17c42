"""Locked-down Mosquitto configuration for a federation: passwords, per-client ACL, optional TLS.

ACL (by username = client id):

* the coordinator (user ``coordinator``) reads and writes ``neurofed/<fed>/#``;
* a client may publish only its own ``join/<id>``, ``status/<id>``, ``update/<id>``, ``error/<id>``,
  and read ``task``, ``model``, the coordinator's ``status`` and its own ``error/<id>`` (in a federation
  of device profiles also ``model/<its profile>``, never another profile's model); it cannot
  publish tasks or models, nor anything under another client's id, and it cannot read ``result``
  (per-round participants and loss) nor other clients' topics.

``use_username_as_clientid true``: the MQTT client id is the username, so a client holding valid
credentials cannot connect under another client's id and keep kicking it off (client-id takeover).

Limits (issue 54, :class:`BrokerLimits`): ``max_packet_size`` is the federation's largest legitimate frame
(``neurofed broker-config --config federation.toml``: from its model), and the queue limits fit every client's
messages of a round waiting at once for the coordinator (Mosquitto's default queue dropped joins at 1,000 clients).

Passwords are hashed with ``mosquitto_passwd -U`` (never on a command line); the plain
credentials go to ``credentials.json`` (mode 600) for distribution. Run as root, Mosquitto drops
to user ``mosquitto``, so the password and ACL files are chowned to it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from neurofed.broker.protocol import COORDINATOR_ID, DEFAULT_MAX_BODY_BYTES, Topics, frame_cap
from neurofed.trainer.errors import NeuroFedError


class BrokerConfigError(NeuroFedError):
    """The broker configuration cannot be written (bad ids, missing mosquitto_passwd, TLS files)."""


#: MQTT's framing around a frame: fixed header (<= 5 bytes), the topic (a 2-byte length and at most 65,535 bytes),
#: the packet id and MQTT 5 properties
MQTT_FRAMING_BYTES = (64 << 10) + 256
#: messages one client may send towards the coordinator within a round, all at once in the worst case: join,
#: status (its last will too), update, error, and the four secure-aggregation steps (keys, shares, masked input,
#: reveal)
MESSAGES_PER_CLIENT = 8
#: a message other than an update (join, status, error, a secure-aggregation step): a header and a small body
SMALL_MESSAGE_BYTES = 16 << 10
#: Mosquitto's own default of max_queued_messages: the floor (a small federation keeps it)
MOSQUITTO_QUEUE_DEFAULT = 1000
#: QoS 1 messages Mosquitto sends a client before waiting for its PUBACKs: the transport's own window
#: (neurofed.broker.transport: ``max_inflight_messages_set(100)``)
INFLIGHT = 100
#: The largest signed release (standalone ONNX graph + signature, issue 55) the generated broker carries: a
#: 21-channel standalone EEGNet is ~1.2 MB; decoders refuse envelopes above the runtime's own 32 MiB bound anyway.
MAX_RELEASE_BYTES = 4 << 20


@dataclass(frozen=True)
class BrokerLimits:
    """Mosquitto's per-client limits sized for a federation (issue 54, D2).

    The coordinator is one subscriber receiving every client's messages: when all clients join or upload at
    once, the broker queues them for it, and Mosquitto's default queue (1000 messages per client) dropped
    joins at 1,000 clients ("Outgoing messages are being dropped for client ...-coordinator"). The queue is
    sized so every client's messages of a round fit at once; the packet limit is the federation's largest
    legitimate frame, so the broker refuses anything larger before any client or the coordinator sees it.

    Parameters
    ----------
    clients : int
        Clients of the federation (the queue grows with them).
    max_body : int
        The largest body any message of the federation carries (:func:`neurofed.broker.coordinator.largest_body`;
        :data:`neurofed.broker.protocol.DEFAULT_MAX_BODY_BYTES` when the model is not known).
    """

    clients: int
    max_body: int = DEFAULT_MAX_BODY_BYTES

    @property
    def max_packet_size(self) -> int:
        return max(frame_cap(self.max_body), MAX_RELEASE_BYTES) + MQTT_FRAMING_BYTES

    @property
    def max_queued_messages(self) -> int:
        return max(MOSQUITTO_QUEUE_DEFAULT, MESSAGES_PER_CLIENT * (self.clients + 1))

    @property
    def max_queued_bytes(self) -> int:
        return (self.clients + 1) * (self.max_body + MESSAGES_PER_CLIENT * SMALL_MESSAGE_BYTES)

    def conf_lines(self) -> list[str]:
        """The settings, each after a comment saying why (written into mosquitto.conf)."""
        return [
            f"# sized for {self.clients} clients; largest legitimate body {self.max_body} bytes (the model's "
            "state and the strategy's extras)",
            "# largest legitimate frame (header cap + body + compression overhead) + MQTT framing: the broker "
            "refuses bigger",
            "# packets before they reach anyone (message_size_limit is deprecated in Mosquitto 2: this covers it);",
            f"# at least a signed release ({MAX_RELEASE_BYTES} bytes: the standalone graph the coordinator publishes "
            "on release)",
            f"max_packet_size {self.max_packet_size}",
            f"# every client's messages of one round ({MESSAGES_PER_CLIENT} kinds: join, status, update, error, "
            "4 secure-aggregation steps) can wait at once",
            "# for the coordinator, the one subscriber of them all; the default (1000) dropped joins at 1,000 "
            "clients",
            f"max_queued_messages {self.max_queued_messages}",
            f"# and their bytes: per client its largest update + {MESSAGES_PER_CLIENT} small messages (bounds "
            "the broker's memory for a subscriber that stalls)",
            f"max_queued_bytes {self.max_queued_bytes}",
            "# QoS 1 messages sent to a client before its PUBACKs (the NeuroFed transport's own window): "
            "a burst drains in fewer round trips",
            f"max_inflight_messages {INFLIGHT}",
        ]


@dataclass(frozen=True)
class SecureBrokerSpec:
    federation: str
    clients: list[str]
    port: int = 1883
    bind: str = "127.0.0.1"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    max_body: int = DEFAULT_MAX_BODY_BYTES  # the federation's largest body (neurofed.broker.coordinator.largest_body)
    coordinator: str = COORDINATOR_ID
    extra: list[str] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)  # client id -> device profile (hierarchical federations)

    @property
    def limits(self) -> BrokerLimits:
        """Queue and packet limits sized for these clients and this body cap."""
        return BrokerLimits(len(self.clients), self.max_body)

    def __post_init__(self) -> None:
        t = Topics(self.federation)
        for c in self.clients:
            t.status(c)
            if c == self.coordinator:
                raise BrokerConfigError(f"client id {c!r} is reserved for the coordinator")
        for c, p in self.profiles.items():
            if c not in self.clients:
                raise BrokerConfigError(f"device profile given for {c!r}, which is not a client")
            t.profile_model(p)
        if len(set(self.clients)) != len(self.clients):
            raise BrokerConfigError("duplicate client ids")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise BrokerConfigError("TLS needs both --tls-cert and --tls-key")
        for p in (self.tls_cert, self.tls_key, self.tls_ca):
            if p is not None and not Path(p).exists():
                raise BrokerConfigError(f"TLS file {p} does not exist")


@dataclass(frozen=True)
class BrokerFiles:
    conf: Path
    passwd: Path
    acl: Path
    credentials: Path


def acl_text(spec: SecureBrokerSpec) -> str:
    t = Topics(spec.federation)
    lines = [f"# NeuroFed federation {spec.federation}: generated by `neurofed broker-config`", "",
             f"user {spec.coordinator}", f"topic readwrite {t.all()}", ""]
    for c in spec.clients:
        lines += [f"user {c}", f"topic read {t.task}", f"topic read {t.model}", f"topic read {t.extras}",
                  f"topic read {t.release}",
                  f"topic read {t.status(spec.coordinator)}",
                  f"topic readwrite {t.error(c)}", f"topic write {t.join(c)}", f"topic readwrite {t.status(c)}",
                  f"topic write {t.update(c)}", f"topic write {t.secagg(c)}", f"topic read {t.secagg_down(c)}",
                  f"topic read {t.eval}", f"topic write {t.eval_report(c)}"]
        lines += [f"topic read {t.profile_model(spec.profiles[c])}"] if c in spec.profiles else []
        lines.append("")
    return "\n".join(lines)


def _routing_key(topic: str) -> str:
    """RabbitMQ's MQTT plugin routes an MQTT topic as an AMQP routing key: ``/`` and ``.`` swapped."""
    return topic.translate(str.maketrans({"/": ".", ".": "/"}))


def _one_of(topics: list[str]) -> str:
    """An anchored regex matching exactly these MQTT topics' routing keys."""
    return "^(" + "|".join(re.escape(_routing_key(t)) for t in topics) + ")$"


def rabbitmq_password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + SHA-256(salt + password)), 4 random salt bytes."""
    salt = secrets.token_bytes(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def rabbitmq_definitions(spec: SecureBrokerSpec, passwords: dict[str, str], vhost: str = "/") -> dict:
    """RabbitMQ definitions (``rabbitmqctl import_definitions FILE``) giving RabbitMQ's MQTT plugin the ACL of
    :func:`acl_text` (issue 54); passwords only as salted hashes, never on a command line.

    One RabbitMQ user per Mosquitto user (the coordinator, each client), with the same topics: topic permissions on
    ``amq.topic`` (the plugin's exchange) whose write / read regexes match exactly the topics the Mosquitto ACL
    lets that user publish / subscribe to (routing keys: ``/`` and ``.`` swapped), and resource permissions on
    ``amq.topic`` and the user's own subscription queues only (``mqtt-subscription-<fed>-<id>qos0|1``: the MQTT
    client id the coordinator and ``edge-client join`` use). Differences from Mosquitto: RabbitMQ 3.10 closes the
    connection of a refused SUBSCRIBE or PUBLISH (Mosquitto grants it and delivers nothing), and it has no
    ``use_username_as_clientid``: a client holding valid credentials can take over (disconnect) another client's
    session by its client id, though not read or publish its topics.
    """
    t = Topics(spec.federation)
    users: dict[str, tuple[str, str]] = {}
    everything = "^" + re.escape(_routing_key(t.all()[:-2])) + r"\..+$"  # neurofed/<fed>/...
    users[spec.coordinator] = (everything, everything)
    for c in spec.clients:
        read = [t.task, t.model, t.extras, t.release, t.eval, t.status(spec.coordinator), t.error(c),
                t.secagg_down(c)]
        read += [t.profile_model(spec.profiles[c])] if c in spec.profiles else []
        users[c] = (_one_of([t.join(c), t.status(c), t.update(c), t.error(c), t.secagg(c), t.eval_report(c)]),
                    _one_of(read))
    defs: dict[str, list] = {"users": [], "permissions": [], "topic_permissions": []}
    for u, (write, read) in users.items():
        queues = rf"mqtt-subscription-{re.escape(spec.federation)}-{re.escape(u)}qos[01]"
        defs["users"].append({"name": u, "password_hash": rabbitmq_password_hash(passwords[u]),
                              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""})
        defs["permissions"].append({"user": u, "vhost": vhost, "configure": f"^{queues}$",
                                    "write": rf"^(amq\.topic|{queues})$", "read": rf"^(amq\.topic|{queues})$"})
        defs["topic_permissions"].append({"user": u, "vhost": vhost, "exchange": "amq.topic", "write": write,
                                          "read": read})
    return defs


def conf_text(spec: SecureBrokerSpec, passwd: Path, acl: Path) -> str:
    lines = ["# generated by `neurofed broker-config`", "per_listener_settings false", "allow_anonymous false",
             f"password_file {passwd.resolve()}", f"acl_file {acl.resolve()}", "persistence false",
             "set_tcp_nodelay true",  # no Nagle: small MQTT packets (PUBACKs, secagg steps) go out at once
             *spec.limits.conf_lines(),
             f"listener {spec.port} {spec.bind}",
             "use_username_as_clientid true"]  # a listener option: before any `listener` line it opens port 1883
    if spec.tls_cert is not None:
        lines += [f"certfile {Path(spec.tls_cert).resolve()}", f"keyfile {Path(spec.tls_key).resolve()}",  # type: ignore[arg-type]
                  "tls_version tlsv1.2"]
        if spec.tls_ca is not None:
            lines.append(f"cafile {Path(spec.tls_ca).resolve()}")
    return "\n".join(lines + list(spec.extra)) + "\n"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cleartext_warning(bind: str, tls: bool, auth: bool) -> str | None:
    """A warning when a listener outside loopback carries credentials / weights without TLS (None if fine)."""
    if tls or bind in LOOPBACK or bind.startswith("127."):
        return None
    what = "passwords, model weights and client metadata travel in clear" if auth else (
        "no authentication and no TLS: anyone who can reach it can read and publish every federation message")
    return f"broker listener on {bind} without TLS: {what}; use --tls-cert/--tls-key (or bind 127.0.0.1)"


def write_broker_config(spec: SecureBrokerSpec, out_dir: str | os.PathLike,
                        passwords: dict[str, str] | None = None) -> BrokerFiles:
    """Write mosquitto.conf, passwd (hashed), acl and credentials.json into ``out_dir``."""
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        raise BrokerConfigError("mosquitto_passwd not found; install mosquitto (apt-get install mosquitto)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    given = dict(passwords or {})
    creds = {u: given.get(u) or secrets.token_urlsafe(24) for u in [spec.coordinator, *spec.clients]}
    for u, pw in creds.items():
        if ":" in u or "\n" in pw:
            raise BrokerConfigError(f"invalid credentials for {u!r}")
    passwd, acl, conf, cred = out / "passwd", out / "acl", out / "mosquitto.conf", out / "credentials.json"
    passwd.write_text("".join(f"{u}:{pw}\n" for u, pw in creds.items()))
    os.chmod(passwd, 0o600)
    r = subprocess.run([tool, "-U", str(passwd)], check=False, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise BrokerConfigError(f"mosquitto_passwd failed: {r.stderr.strip() or r.stdout.strip()}")
    acl.write_text(acl_text(spec))
    os.chmod(acl, 0o600)
    conf.write_text(conf_text(spec, passwd, acl))
    fd = os.open(cred, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(creds, f, indent=1)
    if os.geteuid() == 0:
        try:
            pw_ent = pwd.getpwnam("mosquitto")
            for p in (passwd, acl):
                os.chown(p, pw_ent.pw_uid, pw_ent.pw_gid)
        except KeyError:
            pass
    return BrokerFiles(conf, passwd, acl, cred)
