"""The federation coordinator: registry, rounds over MQTT, aggregation via neurofed.trainer.fl, checkpoints.

All learning maths is :mod:`neurofed.trainer.fl.server` (``select_clients``, ``downlink``, ``server_update``);
this module only moves messages, enforces deadlines, validates, and persists.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from neurofed.broker import logger
from neurofed.broker.async_round import AsyncRound
from neurofed.broker.checkpoint import (
    CheckpointError,
    load_server_checkpoint,
    save_final_model,
    save_server_checkpoint,
)
from neurofed.broker.config import FederationConfig
from neurofed.broker.protocol import (
    COORDINATOR_ID,
    ErrorMsg,
    EvalMsg,
    ExtrasMsg,
    ModelMsg,
    ProtocolError,
    ResultMsg,
    StatusMsg,
    TaskMsg,
    Topics,
    body_cap,
    decode,
    delta_reference,
    encode,
    new_id,
    pack,
    peek,
    state_sha256,
)
from neurofed.broker.registry import Registry
from neurofed.broker.release_gate import ReleaseGate
from neurofed.broker.releases import ReleaseStore
from neurofed.broker.rounds import RoundState, SeenIds
from neurofed.broker.secagg_round import SecAggRound, check_compatible, secagg_spec
from neurofed.broker.transport import Incoming, MqttTransport, TransportError
from neurofed.broker.validation import (
    ClientBudget,
    Rejected,
    UpdateRules,
    check_envelope,
    check_join,
    tensor_specs,
)
from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.api import GROUP_MARK
from neurofed.trainer.fl.init import init_server_state
from neurofed.trainer.fl.server import (
    RoundAggregator,
    ServerState,
    clipped_in_round,
    downlink,
    select_clients,
    server_extras_for_clients,
)
from neurofed.trainer.models import build_model


class FederationError(NeuroFedError):
    """The federation cannot go on (not enough clients, rounds failing repeatedly)."""


#: clients ask for the retained model / extras again (status ``idle``) when their broker node did not deliver it (a
#: clustered broker keeps a retained message on the node it was published through): re-published at most this often
REPUBLISH_MIN_S = 1.0
#: rejections never answered on ``error/<id>``: the message is malformed, forged or a replay, so the
#: client the topic names is probably not its author (a forger must not make us pester an innocent client)
NO_REPLY_CODES = frozenset({"bad_message", "wrong_kind", "wrong_federation", "spoofed_sender", "replay", "duplicate"})


def initial_model(cfg: FederationConfig) -> torch.nn.Module:
    """The initial global model, drawn exactly as :func:`neurofed.trainer.fl.init.init_model` draws it."""
    models = initial_models(cfg)
    return models[min(models)]


def initial_models(cfg: FederationConfig) -> dict[str, torch.nn.Module]:
    """One initial model per device profile (``{"": model}`` without profiles), each drawn from the seed as
    :func:`neurofed.trainer.fl.init.init_group_models` draws it (architecture: that profile's channels)."""
    names = [p.name for p in cfg.device_profiles()] if cfg.federation.profiles else [""]
    kwargs = cfg.strategy().model_kwargs(cfg.model.name)
    out = {}
    for name in names:
        spec = cfg.model_spec(name or None)
        torch.manual_seed(cfg.federation.seed)
        out[name] = build_model(spec.model, spec.n_channels, spec.n_classes, spec.n_times, spec.sfreq, spec.bn_mode,
                                ch_names=spec.ch_names, **kwargs)
    return out


def _progress(n: int, total: int) -> bool:
    """Log the n-th of ``total`` events (a join, an update)? Each one in a small federation, else every 10 % and
    the first and last few: a line per client cost ~1 ms of the coordinator's time per update at 1,000 clients."""
    return total <= 50 or n <= 5 or n >= total or n % max(1, total // 10) == 0


def update_body_cap(state: dict[str, torch.Tensor], strategy: Any, models: dict[str, torch.nn.Module]) -> int:
    """The largest body a client may send (issue 54): an update carries the full state (every profile's modules)
    and every profile's upload extras; a masked secure-aggregation vector is at most the state's size."""
    return body_cap(state, *(strategy.upload_specs(models[p]) for p in sorted(models)))


def largest_body(cfg: FederationConfig) -> int:
    """The largest body any message of this federation legitimately carries, either way: a client's update
    (:func:`update_body_cap`) plus the server's strategy extras from set-up (FedBM's head and generator), all in
    one bound. A model message carries at most the state, a task the strategy's downlink extras (set-up extras,
    or server tensors shaped like the clients' upload extras, e.g. SCAFFOLD's ``c``). Sizes the broker's
    limits (``neurofed broker-config --config``)."""
    models = initial_models(cfg)
    strategy = cfg.strategy()
    extras: dict[str, torch.Tensor] = {}
    for p in sorted(models):
        extras = strategy.setup(models[p]) or extras
    state = init_server_state(models, strategy.group_prefixes)
    return update_body_cap(state, strategy, models) + body_cap(extras)


class Coordinator:
    """Runs one federation to completion (or resumes it).

    Parameters
    ----------
    cfg : FederationConfig
    broker_url : str
    out_dir : path, optional
        Checkpoints, metrics.json and the final model (default ``cfg.output.dir``).
    resume : bool
        Continue from ``out_dir``'s checkpoint (refused if the configuration differs).
    exporter : callable, optional
        ``(checkpoint path, output .onnx path) -> None``: writes a release's standalone ONNX graph (the CLI passes
        :func:`neurofed.export.standalone.export_standalone`; the services do not import each other). Needed to
        publish signed releases (``release.key``).
    """

    def __init__(self, cfg: FederationConfig, broker_url: str, out_dir: str | Path | None = None,
                 resume: bool = False, exporter: Callable[[Path, Path], Any] | None = None,
                 **transport_kw: Any) -> None:
        self.cfg, self.fed = cfg, cfg.federation
        self.topics = Topics(self.fed.name)
        self.spec = cfg.model_spec()
        self.strategy, self.local = cfg.strategy(), cfg.local_config()
        self.out = Path(out_dir or cfg.output.dir)
        # hierarchical federations (issue 19): one architecture per device profile; the server state holds the
        # shared module once and each profile's own module as `@<profile>/<key>` (neurofed.trainer.fl.api.group_key)
        self.models = initial_models(cfg)
        self.model = self.models[min(self.models)]
        self.profile_specs = {p: cfg.model_spec(p) for p in self.models if p}
        setup_extras: dict[str, torch.Tensor] = {}
        for p in sorted(self.models):  # e.g. FedBM's frozen head (also on resume: it edits the models), as the runner
            setup_extras = self.strategy.setup(self.models[p]) or setup_extras
        self.server = ServerState(init_server_state(self.models, self.strategy.group_prefixes), extras=setup_extras)
        self.registry = Registry()
        self.metrics: list[dict[str, Any]] = []
        self.rejections: Counter[str] = Counter()
        self.seen = SeenIds()
        self.bodies = SeenIds()  # body hash -> (round, sender) of accepted updates (replay under a fresh header)
        self.run_id = new_id()  # this run; every coordinator message carries it (a resumed run keeps its id)
        self.resume_online: int | None = None
        self._replied: set[tuple[str, int | None]] = set()
        self._update_refs: dict[str, bytes] = {}  # device profile ("" = none) -> reference of delta-coded updates
        self.current: RoundState | None = None
        self.asyncs: AsyncRound | None = None  # federation.mode = async: the buffered server (broker/async_round.py)
        r = cfg.release  # federated validation and releases (broker/release_gate.py)
        self.gate = ReleaseGate(r.dir or self.out / "releases", r.min_clients, r.margin, r.wait_s) if r.every else None
        self.exporter = exporter
        if r.key and r.every and exporter is None:
            raise NeuroFedError("release.key is set but this coordinator has no ONNX exporter to publish releases "
                                "with (run it through `neurofed coordinator`)")
        self.releases: list[dict[str, Any]] = []  # this run's gate decisions
        # a release's ONNX export, signature and publication run on one worker thread (in order), off the loop
        self._release_pool: ThreadPoolExecutor | None = None
        self._release_jobs: list[Future] = []
        self._release_lock = threading.Lock()
        self._candidate_waiting = False  # a candidate came due while another was being validated
        self._window_t0 = time.monotonic()
        self._window_rejected = 0
        self.handled = 0
        self.connects = 0
        self._task_payload: bytes | None = None
        self._model_payload: bytes | None = None
        self._profile_payloads: dict[str, bytes] = {}  # retained topic -> payload of each profile's model
        self._extras_payload: bytes | None = None  # retained cached extras (Strategy.cached_prefixes)
        self._extras_sha = ""
        self._asked, self._republished_at = False, float("-inf")  # a client asked for the retained state again
        self.max_bytes = int(cfg.validation.max_message_mb * (1 << 20))
        self.fingerprint = cfg.model_dump_json()
        if self.fed.secure_aggregation:
            check_compatible(cfg, self.strategy, self.model)
        if resume:
            self._resume()
        # issue 54: a header declaring a body larger than a client may send is refused before the body costs
        # memory (neurofed.broker.protocol.decode)
        self.max_body = update_body_cap(self.server.global_state, self.strategy, self.models)
        # issue 54: per-client message and byte budgets per round, charged before anything is decoded
        v = cfg.validation
        mb = v.max_client_mb
        self.budget = ClientBudget(v.max_client_messages,
                                   4 * self.max_body + (1 << 20) if mb is None else int(mb * (1 << 20)))
        will = (self.topics.status(COORDINATOR_ID), self._status("offline"))
        # a probe on a topic of its own lets the transport notice a session that stopped delivering (and
        # re-establish it) instead of this coordinator waiting out its join timeout on an empty queue
        transport_kw.setdefault("probe_topic", self.topics.probe(COORDINATOR_ID))
        self.transport = MqttTransport(broker_url, f"{self.fed.name}-{COORDINATOR_ID}", will=will, **transport_kw)

    # ------------------------------------------------------------------ persistence
    def _resume(self) -> None:
        got = load_server_checkpoint(self.out)
        if got is None:
            logger.info("no checkpoint in %s: starting from round 0", self.out)
            return
        server, info = got
        if info.get("fingerprint") != self.fingerprint:
            raise CheckpointError(f"{self.out}: checkpoint was made with a different federation config; refusing to resume")
        self.server, self.metrics = server, info.get("metrics", [])
        self.run_id = info.get("run_id") or self.run_id
        self.registry = Registry.from_json(info.get("registry", []))
        self.resume_online = sum(1 for row in info.get("registry", []) if row.get("online")
                                 and not (row.get("capabilities") or {}).get("evaluate"))  # training clients
        logger.info("resumed %s (run %s) at round %d with %d known clients, %d online at the checkpoint",
                    self.fed.name, self.run_id[:8], server.round, len(self.registry), self.resume_online)

    def _checkpoint(self) -> None:
        info = {"fingerprint": self.fingerprint, "run_id": self.run_id, "registry": self.registry.to_json(),
                "metrics": self.metrics}
        save_server_checkpoint(self.out, self.server, info)
        atomic_write_bytes(self.out / "metrics.json", json.dumps(
            {"federation": self.fed.name, "rounds": self.metrics, "rejections": dict(self.rejections)},
            indent=1).encode())

    # ------------------------------------------------------------------ messages out
    def _status(self, state: str) -> bytes:
        return encode(StatusMsg(federation=self.fed.name, sender=COORDINATOR_ID, state=state,  # type: ignore[arg-type]
                                run_id=self.run_id))

    def _publish_model(self, final: bool = False) -> None:
        msg = ModelMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=self.server.round, final=final, meta=self.spec,
                       run_id=self.run_id)
        if not self.profile_specs:
            self._model_payload = encode(msg, self.server.global_state, compress=self.fed.compress)
            self._pub(self.topics.model, self._model_payload, retain=True)
            return
        # hierarchical: `model` announces the run and the profiles with the shared module only; each profile's
        # model (shared + its own module, nothing of another profile's) is retained on `model/<profile>`
        shared = {k: v for k, v in self.server.global_state.items() if not k.startswith(GROUP_MARK)}
        self._model_payload = encode(msg, shared, compress=self.fed.compress)
        self._pub(self.topics.model, self._model_payload, retain=True)
        for p, spec in self.profile_specs.items():
            pmsg = msg.model_copy(update={"meta": spec})
            payload = encode(pmsg, self.strategy.client_view(self.server.global_state, p), compress=self.fed.compress)
            self._profile_payloads[self.topics.profile_model(p)] = payload
            self._pub(self.topics.profile_model(p), payload, retain=True)

    def _pub(self, topic: str, payload: bytes, retain: bool = False, wait: float | None = 10.0) -> None:
        """Publish; while the broker is away paho queues it (and retained state is re-sent on reconnect)."""
        try:
            self.transport.publish(topic, payload, retain=retain, wait=wait)
        except TransportError as exc:
            logger.warning("%s (queued; will be re-sent after reconnecting)", exc)

    def _on_connected(self) -> None:
        """(Re)announce after every (re)connect: the broker may have restarted without retained messages."""
        self.connects += 1
        if self.connects > 1:
            logger.info("reconnected to the broker (#%d): re-publishing status, model, open task and current release",
                        self.connects - 1)
        self._pub(self.topics.status(COORDINATOR_ID), self._status("online"), retain=True, wait=None)
        self._republish(task=True)

    def _republish(self, task: bool) -> None:
        """Publish the retained model(s), extras (and with ``task`` the open task) again."""
        if self._model_payload is not None:
            self._pub(self.topics.model, self._model_payload, retain=True, wait=None)
        for topic, payload in self._profile_payloads.items():
            self._pub(topic, payload, retain=True, wait=None)
        if self._extras_payload is not None:
            self._pub(self.topics.extras, self._extras_payload, retain=True, wait=None)
        if task and self._task_payload is not None:
            self._pub(self.topics.task, self._task_payload, retain=True, wait=None)
        with self._release_lock:  # not between the worker's keeping a release and publishing it
            if (payload := self._current_release()) is not None:
                self._pub(self.topics.release, payload, retain=True, wait=None)

    def _current_release(self) -> bytes | None:
        """The release topic's retained payload: the newest signed release in the gate's store (a rollback
        published there since included), or None when this coordinator publishes none or has none yet. Called under
        :attr:`_release_lock`, so the worker thread is not half-way through adding one; a graph without its
        signature (left by a crash) is passed over."""
        if self.gate is None or not self.cfg.release.key or self.exporter is None:
            return None
        from neurofed_runtime import release as rel  # lazy: cryptography

        store = ReleaseStore(self.gate.folder)
        for v in reversed(store.versions()):
            try:
                return rel.pack(store.path(v).read_bytes(), rel.read_sig(rel.sig_path(store.path(v))))
            except (OSError, ValueError) as exc:
                logger.warning("release %d in %s is not complete (%s): not re-published", v, store.folder, exc)
        return None

    def _republish_if_asked(self) -> None:
        """Clients asked for the retained model / extras again (status ``idle``: their node of a clustered broker
        never had the retained copy): publish them again, at most every REPUBLISH_MIN_S seconds however many ask.
        Not the task: every joined client is subscribed to it when it is published, and a repeated task would
        make its selected clients re-key a secure-aggregation round."""
        if self._asked and time.monotonic() - self._republished_at >= REPUBLISH_MIN_S:
            self._asked, self._republished_at = False, time.monotonic()
            logger.info("a client did not get the retained model/extras from its broker node: publishing them again")
            self._republish(task=False)

    # ------------------------------------------------------------------ messages in
    def _reject(self, sender: str, code: str, detail: str) -> None:
        self.rejections[code] += 1
        if self.current is not None:  # every rejected message while a round is open counts for that round
            self.current.reject(sender, code, detail)
        if self.asyncs is not None:
            self._window_rejected += 1
        if sender in self.registry:
            self.registry.clients[sender].rejected += 1
        n = self.rejections[code]
        if n <= 20:
            logger.warning("rejected message from %s: %s (%s)", sender[:64], code, detail[:200])
        elif n % 1000 == 0:  # flooding: summarise instead of logging each one
            logger.warning("rejected %d %s messages so far (latest from %s: %s)", n, code, sender[:64], detail[:200])

    def _check_header(self, kind: str, cid: str | None, msg) -> None:
        """The envelope (sender, federation) and, for messages of a run, the run id; :class:`Rejected` otherwise."""
        check_envelope(kind, cid, msg, self.fed.name)
        if kind in ("join", "update", "secagg") and msg.run_id != self.run_id:
            raise Rejected("wrong_run", f"message for run {msg.run_id[:8] or '-'}, this is run {self.run_id[:8]}")

    def handle(self, item: Incoming) -> None:
        """Process one incoming item; invalid input is logged and dropped, never raised."""
        if item.event == "connected":
            self._on_connected()
            return
        if item.event != "message":
            return
        self.handled += 1
        try:
            kind, cid = self.topics.parse(item.topic)
        except ProtocolError as exc:
            self._reject("?", "bad_topic", str(exc))
            return
        if kind in ("task", "model", "result", "extras", "eval", "release") or cid == COORDINATOR_ID or not item.payload:
            return
        was_cut = (cid or "?") in self.budget.cut
        try:
            self.budget.charge(cid or "?", len(item.payload))
        except Rejected as exc:
            self._over_budget(cid or "?", exc, was_cut)
            return
        msg = None
        try:
            ref = None
            if kind == "update" and self.current is not None:
                info = self.registry.clients.get(cid or "")
                ref = self._update_refs.get(info.profile if info is not None else "", b"")
            elif kind == "update":  # async (the base version's reference), or no round open: read the header first
                msg = peek(item.payload, self.max_bytes)  # a delta-coded body needs its reference to decode
                self._check_header(kind, cid, msg)
                if self.asyncs is None:  # the run ended, or has not begun
                    raise Rejected("late", f"update from round/version {msg.round} while no round is open "
                                   f"(the server is at {self.server.round})")
                if msg.sender not in self.registry:
                    raise Rejected("not_joined", f"{msg.sender} has not joined this run")
                ref = self.asyncs.reference(msg, self.seen)  # stale: refused here
            msg, tensors = decode(item.payload, self.max_bytes, reference=ref, max_body=self.max_body)
            if kind == "error" and msg.sender == COORDINATOR_ID:
                return  # our own reply to a client, echoed by an MQTT 3.1.1 broker (v5 subscribes no-local)
            self._check_header(kind, cid, msg)
            if kind == "join":
                check_join(msg, self.spec, self.profile_specs)
                new = msg.sender not in self.registry
                if not new and self.registry.clients[msg.sender].profile != msg.profile:
                    raise Rejected("profile_changed", f"joined as device profile "
                                   f"{self.registry.clients[msg.sender].profile!r}, now {msg.profile!r}")
                self.registry.join(msg)
                if new and _progress(len(self.registry), self.fed.min_clients):
                    logger.info("client %s joined (%d trials%s); %d known", msg.sender, msg.n_trials,
                                f", profile {msg.profile}" if msg.profile else "", len(self.registry))
            elif kind == "status":
                self.registry.set_online(msg.sender, msg.state != "offline")
                self._asked = self._asked or msg.state == "idle"
                if self.current is not None and msg.state == "offline":
                    self.current.offline.add(msg.sender)
                elif self.current is not None:
                    self.current.offline.discard(msg.sender)
            elif kind == "error":
                logger.warning("client %s reports %s: %s", msg.sender, msg.code, msg.message[:200])
            elif kind == "eval_report":
                if self.gate is None:
                    raise Rejected("late", "this federation does not validate candidates")
                self.gate.offer(msg, self.registry)
            elif kind == "update" and self.asyncs is not None:
                v = self.asyncs.offer(msg, tensors, self.seen, self.bodies)
                self.registry.clients[msg.sender].rounds_done += v.code == "accepted"
                if v.aggregated:
                    self._async_aggregated()
            elif kind == "update":
                self.current.offer(msg, tensors, len(item.payload), self.seen, self.bodies)
                if _progress(len(self.current.updates), len(self.current.selected)):
                    logger.info("round %d: update from %s (%d/%d)", self.current.index, msg.sender,
                                len(self.current.updates), len(self.current.selected))
            elif kind == "secagg":
                if not isinstance(self.current, SecAggRound):
                    raise Rejected("late", f"{msg.kind} while no secure aggregation round is open")
                self.current.offer_secagg(msg, tensors, len(item.payload), self.seen)
        except ProtocolError as exc:
            self._reject(cid or "?", "bad_message", str(exc))
        except Rejected as exc:
            self._reject(cid or "?", exc.code, exc.detail)
            if cid and msg is not None and exc.code not in NO_REPLY_CODES:
                self._tell(cid, exc, msg.msg_id)
        except Exception as exc:  # noqa: BLE001 - a malformed message must never stop the federation
            self._reject(cid or "?", "internal", f"{type(exc).__name__}: {exc}")

    def _over_budget(self, cid: str, exc: Rejected, was_cut: bool) -> None:
        """A message over its client's budget (:class:`ClientBudget`): the one that crossed it is a rejection of
        the round and cuts the client off (not waited for); later ones are only counted (a flood costs no list)."""
        if was_cut:
            self.rejections[exc.code] += 1
            return
        self._reject(cid, exc.code, exc.detail)
        if self.current is not None:
            self.current.cut_off.add(cid)
        logger.warning("client %s cut off for the rest of round %s: %s", cid[:64],
                       self.current.index if self.current is not None else "(joining)", exc.detail)

    def _tell(self, cid: str, exc: Rejected, reply_to: str) -> None:
        """Tell a client why its message was rejected: once per client and round, naming the message.

        The reply carries the rejected ``msg_id``: a client ignores replies about messages it never
        sent (someone forged them under its id), and a client that already delivered this round's
        update gets no further replies (later messages under its id are most likely forged).
        """
        rnd = self.current.index if self.current else self.asyncs.version if self.asyncs else None
        if (cid, rnd) in self._replied or (self.current is not None and cid in self.current.updates):
            return
        self._replied.add((cid, rnd))
        msg = ErrorMsg(federation=self.fed.name, sender=COORDINATOR_ID, code=exc.code[:32], message=exc.detail[:1000],
                       round=rnd, reply_to=reply_to, run_id=self.run_id)
        try:
            self.transport.publish(self.topics.error(cid), encode(msg), wait=None)
        except (TransportError, ProtocolError):
            pass

    def pump(self, until, timeout: float, stop: threading.Event | None = None) -> bool:
        """Handle incoming items until ``until()`` is true (True) or ``timeout`` seconds pass (False)."""
        end = time.monotonic() + timeout
        while not until():
            if stop is not None and stop.is_set():
                raise FederationError("stopped")
            left = end - time.monotonic()
            if left <= 0:
                return False
            item = self.transport.get(min(left, 0.2))
            if item is not None:
                self.handle(item)
            self._republish_if_asked()
            if self.gate is not None and self.gate.due():
                self._decide_release()
            if self._release_jobs:
                self._reap_releases()
        return True

    def _publish_cached_extras(self, cached: dict[str, torch.Tensor], r: int) -> int:
        """Publish the strategy's cached extras (retained) if their content changed; returns the bytes sent."""
        if not cached or (h := state_sha256(cached)) == self._extras_sha:
            return 0
        self._extras_sha = h
        self._extras_payload = encode(ExtrasMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=r,
                                                run_id=self.run_id), cached, compress=self.fed.compress)
        self._pub(self.topics.extras, self._extras_payload, retain=True)
        return len(self._extras_payload)

    # ------------------------------------------------------------------ rounds
    def _open_round(self) -> RoundState:
        r = self.server.round
        # validating clients (edge-client join --evaluate) never train: they only evaluate asynchronous candidates
        trainers = [c for c in self.registry.candidates() if self.registry.trains(self.registry.clients[c])]
        chosen = select_clients(trainers, self.fed.fraction, r, self.fed.seed)
        down = downlink(self.server.global_state, self.strategy, self.model) if not self.profile_specs else {}
        extras = server_extras_for_clients(self.server, self.strategy)
        profiles = {c: p for c, p in self.registry.profiles().items() if c in chosen} if self.profile_specs else {}
        views = {p: self.strategy.client_view(self.server.global_state, p) for p in self.profile_specs}
        cached = {k: v for k, v in extras.items() if k.startswith(self.strategy.cached_prefixes)}
        extras = {k: v for k, v in extras.items() if k not in cached}
        new_extras = self._publish_cached_extras(cached, r)
        sent = {**extras, **(cached if new_extras else {})}  # on the wire this round
        task = TaskMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=r, rounds_total=self.fed.rounds,
                       task_id=new_id(), selected=chosen, deadline_s=self.fed.round_deadline_s, seed=self.fed.seed,
                       strategy=self.fed.strategy, strategy_overrides=dict(self.fed.strategy_overrides),
                       local=self.local.to_dict(), compress=self.fed.compress, run_id=self.run_id,
                       model_sha256=state_sha256(self.server.global_state), profiles=profiles,
                       profile_models={p: state_sha256(v) for p, v in views.items()},
                       secagg=secagg_spec(self.cfg, {c: i.n_trials for c, i in self.registry.clients.items()}, chosen)
                       if self.fed.secure_aggregation else None,
                       extras_sha256=self._extras_sha if cached else "")
        rules = UpdateRules(
            round=r, task_id=task.task_id, base_sha256=state_sha256(down), selected=frozenset(chosen),
            state_specs=tensor_specs(self.server.global_state), extra_specs=self.strategy.upload_specs(self.model),
            global_state=self.server.global_state,
            n_trials={c: i.n_trials for c, i in self.registry.clients.items()},
            norm_bound=self.cfg.validation.norm_bound, norm_action=self.cfg.validation.norm_action,
            max_update_ratio=self.cfg.validation.max_update_ratio,
        )
        if self.profile_specs:  # each client's update is checked against its own profile's model
            rules.client_profiles = profiles
            rules.by_profile = {p: replace(
                rules, profile=p, base_sha256=state_sha256(downlink(v, self.strategy, self.models[p], p)),
                state_specs=tensor_specs(v), extra_specs=self.strategy.upload_specs(self.models[p]), global_state=v)
                for p, v in views.items()}
        # the weights are not in the task: a selected client fetches the retained `model` (the task names its
        # hash) and derives the downlink itself, so only the selected clients download weights this round
        self._task_payload = encode(task, pack({"extra": extras}) if extras else None, compress=self.fed.compress)
        self._replied.clear()
        self.budget.reset()
        # updates are delta-coded against the model their client holds (its profile's view)
        self._update_refs = {p: delta_reference(v) for p, v in views.items()} or {
            "": delta_reference(self.server.global_state)}
        rs = RoundState(r, task.task_id, chosen, rules, self.fed.round_deadline_s,
                        aggregator=RoundAggregator(self.server, self.strategy, max(len(self.registry), 1),
                                                   self.fed.rounds),
                        stream=self.fed.aggregation == "streaming")
        if self.fed.secure_aggregation:  # clients upload masked updates; this learns only their sum
            rs = SecAggRound.from_round(rs, federation=self.fed.name, run_id=self.run_id, spec=task.secagg,
                                        collect_s=self.fed.round_deadline_s, phase_s=self.cfg.secagg.phase_s,
                                        graph_seed=int(task.task_id[:15], 16),
                                        send=lambda t, p: self._pub(t, p, wait=None))
        rs.bytes_down = (len(self._task_payload) + len(self._model_payload or b"")
                         + sum(map(len, self._profile_payloads.values())) + new_extras)
        for k, v in sent.items():  # raw tensor bytes per component (`fedbm_gen`: the generator), before zlib
            key = k.split(".", 1)[0]
            rs.bytes_extras[key] = rs.bytes_extras.get(key, 0) + v.numel() * v.element_size()
        self.current = rs
        self._pub(self.topics.task, self._task_payload, retain=True)
        logger.info("[ROUND %d/%d] task %s to %s", r + 1, self.fed.rounds, task.task_id[:8], ", ".join(chosen))
        return rs

    def run_round(self, stop: threading.Event | None = None) -> dict[str, Any]:
        """Open, collect (deadline, retries), aggregate, checkpoint, publish; returns the round metrics."""
        t0 = time.monotonic()
        rejected = 0  # over every attempt of this round
        for attempt in range(self.fed.max_round_retries + 1):
            rs = self._open_round()
            self.pump(lambda rs=rs: rs.complete(self.fed.min_updates), rs.deadline_s + 1.0, stop)
            rejected += len(rs.rejected)
            if len(rs.updates) >= self.fed.min_updates:
                break
            logger.warning("round %d: %d update(s) by the deadline (< min_updates %d); retry %d",
                           rs.index, len(rs.updates), self.fed.min_updates, attempt + 1)
        else:
            raise FederationError(f"round {rs.index}: fewer than {self.fed.min_updates} updates after "
                                  f"{self.fed.max_round_retries + 1} attempts")
        t_last = max(rs.arrival.values())
        self.current = None
        updates = rs.ordered()
        before, self.server = self.server, rs.aggregate()
        for cid, _ in updates:
            self.registry.clients[cid].rounds_done += 1
        loss = [u.metrics.get("loss") for _, u in updates if "loss" in u.metrics]
        m = {"round": self.server.round, "selected": rs.selected, "participants": [c for c, _ in updates],
             "stragglers": rs.missing(), "rejected": rejected, "cut_off": sorted(rs.cut_off), "bytes_down": rs.bytes_down,
             "bytes_up": rs.bytes_up, "bytes_extras": rs.bytes_extras, "seconds": time.monotonic() - t0,
             "loss": float(sum(loss) / len(loss)) if loss else None}
        if (clipped := clipped_in_round(before, self.server)) is not None:
            m["clipped"] = clipped  # updates the adaptive norm clip scaled down (robust aggregation)
        if isinstance(rs, SecAggRound):
            m["secagg"] = rs.report()
        if self.server.round % self.cfg.output.checkpoint_every == 0 or self.server.round == self.fed.rounds:
            self._checkpoint_with(m)
        else:
            self.metrics.append(m)
        final = self.server.round >= self.fed.rounds
        self._publish_model(final)
        m["publish_latency_s"] = time.monotonic() - t_last
        private = self.fed.private_metadata  # who took part and their loss stay in metrics.json
        res = ResultMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=self.server.round,
                        participants=[] if private else m["participants"], rejected=m["rejected"],
                        bytes_down=m["bytes_down"], bytes_up=m["bytes_up"], seconds=m["seconds"],
                        loss=None if private else m["loss"], final=final,
                        model_sha256=state_sha256(self.server.global_state), run_id=self.run_id)
        self._pub(self.topics.result, encode(res), retain=True)
        logger.info("[ROUND %d/%d] %d updates, %d rejected, loss %s, %.2f s", self.server.round, self.fed.rounds,
                    len(updates), m["rejected"], "-" if m["loss"] is None else f"{m['loss']:.4f}", m["seconds"])
        return m

    # ------------------------------------------------------------------ asynchronous federation (mode = async)
    def run_async(self, stop: threading.Event | None = None, log_every: float = 60.0) -> None:
        """Serve a buffered asynchronous federation until ``rounds`` model versions are made.

        One retained task (``mode = "async"``) says how to train; every joined client fetches the retained model
        whenever it is online, trains, and sends an update tagged with the version it trained from
        (:class:`AsyncRound`, :class:`neurofed.trainer.fl.fedbuff.BufferedServer`). Every ``buffer_k`` accepted
        updates make a new version (published retained, checkpointed); an update more than ``max_staleness``
        versions old is refused ``stale`` and the client told."""
        a = self.cfg.async_
        self.asyncs = AsyncRound(self.server, self.strategy, self.model, new_id(), a.buffer_k, a.max_staleness,
                                 a.server_lr, self.registry,
                                 dict(norm_bound=self.cfg.validation.norm_bound,
                                      norm_action=self.cfg.validation.norm_action,
                                      max_update_ratio=self.cfg.validation.max_update_ratio))
        task = TaskMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=self.server.round,
                       rounds_total=self.fed.rounds, task_id=self.asyncs.task_id, selected=[],
                       deadline_s=self.fed.round_deadline_s, seed=self.fed.seed, strategy=self.fed.strategy,
                       strategy_overrides=dict(self.fed.strategy_overrides), local=self.local.to_dict(),
                       compress=self.fed.compress, run_id=self.run_id, mode="async")
        self._task_payload = encode(task)
        self._replied.clear()
        self.budget.reset()
        self._window_t0, self._window_rejected = time.monotonic(), 0
        self._pub(self.topics.task, self._task_payload, retain=True)
        logger.info("[ASYNC] version %d of %d: K=%d, max staleness %d, server lr %g; any joined client may train",
                    self.server.round, self.fed.rounds, a.buffer_k, a.max_staleness, a.server_lr)
        try:
            while self.asyncs.version < self.fed.rounds:
                if not self.pump(lambda: self.asyncs is None or self.asyncs.version >= self.fed.rounds, log_every,
                                 stop):
                    logger.info("[ASYNC] version %d: %d update(s) buffered of %d; %d client(s) online",
                                self.asyncs.version, len(self.asyncs.buf.buffer), a.buffer_k,
                                self.registry.n_online())
        finally:
            self.asyncs = None  # later updates are refused 'late'
        if self.gate is not None:  # the last version is a candidate too: wait for the open decision(s)
            for _ in range(2):
                if self.gate.open is None and (not self.gate.history
                                               or self.gate.history[-1]["version"] < self.server.round):
                    self._ask_evaluation()
                if self.gate.open is not None:
                    self.pump(lambda: self.gate.open is None, self.cfg.release.wait_s + 1.0, stop)
                    if self.gate.open is not None:
                        self._decide_release()
            self._reap_releases(wait=True)  # every release exported, signed and published before the run ends

    def _async_aggregated(self) -> None:
        """A new version: record the window, checkpoint, publish the model (and result), open the next window."""
        assert self.asyncs is not None
        self.server = self.asyncs.buf.server
        m = self.asyncs.window()
        m.update(round=self.server.round, seconds=time.monotonic() - self._window_t0,
                 rejected=self._window_rejected)
        if self.server.round % self.cfg.output.checkpoint_every == 0 or self.server.round >= self.fed.rounds:
            self._checkpoint_with(m)
        else:
            self.metrics.append(m)
        final = self.server.round >= self.fed.rounds
        self._publish_model(final)
        used = [r[0] for r in m["submissions"] if r[2] == "accepted"]
        private = self.fed.private_metadata
        res = ResultMsg(federation=self.fed.name, sender=COORDINATOR_ID, round=self.server.round,
                        participants=[] if private else sorted(set(used)), rejected=m["rejected"], bytes_down=0,
                        bytes_up=0, seconds=m["seconds"], loss=None if private else m["loss"], final=final,
                        model_sha256=state_sha256(self.server.global_state), run_id=self.run_id)
        self._pub(self.topics.result, encode(res), retain=True, wait=None)
        logger.info("[ASYNC] version %d/%d: %d updates (mean staleness %s), loss %s, %.2f s", self.server.round,
                    self.fed.rounds, m["used"], "-" if m["mean_staleness"] is None else f"{m['mean_staleness']:.2f}",
                    "-" if m["loss"] is None else f"{m['loss']:.4f}", m["seconds"])
        if self.gate is not None and (final or self.server.round % self.cfg.release.every == 0):
            if self.gate.open is not None and self.gate.due():
                self._decide_release()
            if self.gate.open is None:
                self._ask_evaluation()
            else:  # the previous candidate is still being validated: the newest version is asked about next
                self._candidate_waiting = True
                logger.info("[RELEASE] version %d waits: version %d is still being validated", self.server.round,
                            self.gate.open.version)
        self._replied.clear()  # one reply per client and window, as per round
        self.budget.reset()  # the budgets' window is one aggregation
        self._window_t0, self._window_rejected = time.monotonic(), 0

    # ------------------------------------------------------------------ federated validation and releases
    def _ask_evaluation(self) -> None:
        """Ask the validating clients (joined with ``evaluate``) to evaluate the current version as a candidate."""
        assert self.gate is not None
        evaluators = sum(1 for c in self.registry.candidates()
                         if self.registry.clients[c].capabilities.get("evaluate"))  # once per candidate
        body = self.gate.ask(new_id(), self.server.round,
                             self.strategy.released_state(self.server.global_state, self.server.extras), evaluators)
        ev = self.gate.open
        assert ev is not None
        msg = EvalMsg(federation=self.fed.name, sender=COORDINATOR_ID, eval_id=ev.eval_id, version=ev.version,
                      release=ev.release, batch_size=self.cfg.model.test_batch_size,
                      deadline_s=self.cfg.release.wait_s, run_id=self.run_id)
        self._pub(self.topics.eval, encode(msg, body, compress=self.fed.compress), retain=True, wait=None)
        logger.info("[RELEASE] version %d is a candidate: asked %d validating client(s) (release %s beside it)",
                    ev.version, evaluators, ev.release or "none")

    def _decide_release(self) -> dict[str, Any]:
        """Decide the open evaluation; a release is recorded, and with ``release.key`` exported, signed and
        published retained on the release topic by the release worker thread (:meth:`_publish_release`), so the
        loop goes on handling messages during the export."""
        gate = self.gate
        assert gate is not None and gate.open is not None and gate.candidate_state is not None
        ok, why = gate.passes()
        version, state = gate.open.version, gate.candidate_state
        number, extra, job = None, {}, None
        if ok:
            store = ReleaseStore(gate.folder)
            number = gate.next_number((store.latest() or 0) + 1)
            ckpt = gate.state_path(number)
            kwargs = self.strategy.model_kwargs(self.spec.model)
            save_final_model(ckpt, state, self.spec, self.cfg.model.test_batch_size,
                             {"federation": self.fed.name, "rounds": version, "seed": self.fed.seed,
                              "transport": "mqtt", "release": number, **({"model_kwargs": kwargs} if kwargs else {})})
            if self.cfg.release.key and self.exporter is not None:
                extra["signed"] = None  # filled in once the worker has signed and published it
                job = (number, ckpt, store)
        rec = self.gate.decide(number, self.fed.private_metadata, save=lambda p, s: None, **extra)
        if job is not None:
            if self._release_pool is None:
                self._release_pool = ThreadPoolExecutor(1, thread_name_prefix="release-export")
            self._release_jobs.append(self._release_pool.submit(self._publish_release, *job, rec))
        self.releases.append(rec)
        self._pub(self.topics.eval, b"", retain=True, wait=None)  # the request is closed
        logger.info("[RELEASE] candidate version %d: %s (%s)", version,
                    f"release {rec['release']}" if rec["released"] else "not released", why)
        if self._candidate_waiting and self.asyncs is not None and self.server.round > version:
            self._ask_evaluation()  # a candidate came due meanwhile: the newest version is the next candidate
        self._candidate_waiting = False
        return rec

    def _publish_release(self, number: int, ckpt: Path, store: ReleaseStore, rec: dict[str, Any]) -> None:
        """(The release worker thread.) Export the release's standalone graph, sign it as release ``number``
        (parent: the store's latest, i.e. the release decoders run now) with the federation's key, keep it in the
        store, publish it retained (what ``edge-client infer --follow`` reads) and note the signature in the
        gate's record ``rec``. Jobs run one at a time, in the order of the decisions."""
        from neurofed_runtime import release as rel  # lazy: cryptography

        assert self.gate is not None and self.exporter is not None
        onnx_path = ckpt.with_name(f"v{number:04d}.export.onnx")
        self.exporter(ckpt, onnx_path)
        data = onnx_path.read_bytes()
        onnx_path.unlink()
        # parent: the release decoders run now (the gate's last, or a rollback published into the store since)
        doc = rel.sign(data, rel.load_private(self.cfg.release.key), number, store.latest())
        payload = rel.pack(data, doc)
        with self._release_lock:  # kept and published as one step (a reconnect re-publishes the store's newest)
            store.add(data, doc)
            self._pub(self.topics.release, payload, retain=True)
        logger.info("[RELEASE] release %d signed and published retained on %s (%d bytes)", number,
                    self.topics.release, len(payload))
        self.gate.note(rec, signed={k: doc["header"][k] for k in ("version", "parent", "sha256", "size")})

    def _reap_releases(self, wait: bool = False) -> None:
        """Collect finished release jobs (all of them with ``wait``); a failed export raises here, in the loop."""
        jobs, self._release_jobs = self._release_jobs, []
        for i, job in enumerate(jobs):
            if not wait and not job.done():
                self._release_jobs = jobs[i:]
                return
            job.result()

    def _checkpoint_with(self, m: dict[str, Any]) -> None:
        self.metrics.append(m)
        self._checkpoint()

    def run(self, stop: threading.Event | None = None) -> ServerState:
        """Connect, wait for ``min_clients``, run the remaining rounds, save the final model."""
        self.transport.connect()
        try:
            kinds = ("join", "status", "update", "error") + (("secagg",) if self.fed.secure_aggregation else ()) + (
                ("eval_report",) if self.gate is not None else ())
            for k in kinds:
                self.transport.subscribe(self.topics.any_client(k), no_local=k == "error")
            # a previous run under this federation name may have left a retained task / result (e.g. it
            # crashed): clear them before announcing this run's model (clients also ignore other runs' ids)
            self.clear_retained(model=False)
            self._publish_model(final=self.server.round >= self.fed.rounds)
            logger.info("run %s of federation %s: model published (round %d)", self.run_id[:8], self.fed.name,
                        self.server.round)
            self.wait_for_clients(stop)
            if self.fed.mode == "async":
                self.run_async(stop)
            while self.server.round < self.fed.rounds:
                self.run_round(stop)
            self.save_final()
            self._pub(self.topics.status(COORDINATOR_ID), self._status("done"), retain=True)
            self.clear_retained()
        finally:
            if self._release_pool is not None:  # on an error: an export under way finishes, queued ones are dropped
                self._release_pool.shutdown(wait=True, cancel_futures=True)
                self._release_pool = None
            self.transport.close()
        return self.server

    def clear_retained(self, model: bool = True) -> None:
        """Remove this federation's retained task, result (and model) from the broker (empty retained payloads).

        The coordinator's retained ``status`` stays: ``done`` with this run's id tells a client that
        reconnects after the end that its run finished. The final model is in ``global_model.safetensors``.
        """
        topics = [self.topics.task, self.topics.result, self.topics.extras, self.topics.eval] + (
            [self.topics.model] if model else [])
        if model:
            topics += [self.topics.profile_model(p) for p in self.profile_specs]
            self._profile_payloads = {}
        for t in topics:
            self._pub(t, b"", retain=True)
        self._task_payload = self._extras_payload = None
        self._extras_sha = ""
        if model:
            self._model_payload = None

    def clients_needed(self) -> int:
        """``min_clients``, or on a resumed run no more than were online at its last checkpoint."""
        need = self.fed.min_clients
        if self.resume_online is not None and self.server.round > 0:
            need = max(1, self.fed.min_updates, min(need, self.resume_online))
        return need

    def wait_for_clients(self, stop: threading.Event | None = None, log_every: float = 15.0) -> None:
        """Pump messages until enough training clients are online, saying what it waits for (and every
        ``log_every`` s). Validating clients (``evaluate``) do not count: they never train."""
        need = self.clients_needed()
        why = "" if need == self.fed.min_clients else (f" (resumed run: {self.resume_online} were online at the "
                                                       f"checkpoint; min_clients {self.fed.min_clients})")
        end = time.monotonic() + self.fed.join_timeout_s
        while self.registry.n_training_online() < need:
            have = [c for c in self.registry.candidates() if self.registry.trains(self.registry.clients[c])]
            left = end - time.monotonic()
            if left <= 0:
                raise FederationError(f"only {len(have)} of {need} training clients joined within "
                                      f"{self.fed.join_timeout_s:.0f} s")
            online = set(self.registry.candidates())
            known = [c for c in self.registry.ids() if c not in online]
            logger.info("waiting for %d training client(s) to join%s: %d online (%d validating)%s; %.0f s left", need,
                        why, len(have), len(online) - len(have),
                        f", known but offline: {', '.join(known[:20])}" if known else "", left)
            self.pump(lambda: self.registry.n_training_online() >= need, min(left, log_every), stop)

    def save_final(self) -> Path:
        extra: dict[str, Any] = {"federation": self.fed.name, "rounds": self.server.round, "seed": self.fed.seed,
                                 "transport": "mqtt"}
        if kwargs := self.strategy.model_kwargs(self.spec.model):  # how to rebuild it (e.g. local_bn_mode)
            extra["model_kwargs"] = kwargs
        if self.profile_specs:  # the whole server state: shared module + `@<profile>/` modules (export splits it)
            extra["device_profiles"] = list(self.spec.profiles)
        final = self.strategy.released_state(self.server.global_state, self.server.extras)  # e.g. the weight average
        path = save_final_model(self.out / "global_model.safetensors", final, self.spec,
                                self.cfg.model.test_batch_size, extra)
        logger.info("final global model saved to %s", path)
        for p, spec in self.profile_specs.items():  # one deployable checkpoint per device profile
            pp = save_final_model(self.out / f"global_model.{p}.safetensors",
                                  self.strategy.client_view(final, p), spec,
                                  self.cfg.model.test_batch_size,
                                  {"federation": self.fed.name, "rounds": self.server.round, "seed": self.fed.seed,
                                   "transport": "mqtt", "profile": p, "device": spec.profiles[0],
                                   **({"model_kwargs": kwargs} if kwargs else {})})
            logger.info("device profile %s: model saved to %s", p, pp)
        return path
