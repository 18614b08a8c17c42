"""The headset-side federation client: join, wait for tasks, train locally, upload weights (never EEG).

Learning is :func:`neurofed.trainer.fl.client.client_update`; this module moves messages and keeps the
client's state on disk between rounds (one safetensors file, written atomically), so a restarted
client resumes where it was, and a round the coordinator re-issues (after its own restart or a
broker outage) is answered from the cached update instead of training twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from neurofed.broker.protocol import (
    COORDINATOR_ID,
    DEFAULT_MAX_BODY_BYTES,
    SECAGG_DOWN,
    ErrorMsg,
    EvalMsg,
    EvalReportMsg,
    JoinMsg,
    ModelMsg,
    ModelSpec,
    ProtocolError,
    StatusMsg,
    TaskMsg,
    Topics,
    UpdateMsg,
    body_cap,
    decode,
    delta_reference,
    encode,
    pack,
    state_sha256,
    unpack,
)
from neurofed.broker.transport import (
    NO_BROKER_HINT,
    AuthError,
    Incoming,
    MqttTransport,
    TransportError,
    connect_with_backoff,
)
from neurofed.edge import logger
from neurofed.edge.secagg_client import SecAggSession
from neurofed.trainer.atomic import save_safetensors
from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.data.profiles import DeviceProfile, ProfileError, match_profile
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.api import Strategy
from neurofed.trainer.fl.client import ClientState, ClientUpdate, client_update, init_client_state
from neurofed.trainer.fl.fedbuff import async_seed, window_bounds
from neurofed.trainer.fl.init import client_seed
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.secagg import SecAggError
from neurofed.trainer.fl.server import downlink
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model

DataLoader = Callable[[ModelSpec], SubjectData]
#: ``() -> (channel names, sampling rate in Hz)`` of the client's device (its recording / stream, before preprocessing)
Montage = Callable[[], tuple[Sequence[str], float]]
#: a task's body (strategy extras) is at most this many copies of the model we hold (issue 54; SCAFFOLD: one)
TASK_BODY_MODEL_COPIES = 4
#: seconds we wait for a retained model / extras after subscribing before we ask the coordinator to publish it again
#: (status ``idle``), doubling up to RETAINED_ASK_MAX_S while none comes: a clustered broker (RabbitMQ) keeps a
#: retained message on the node it was published through only, so a client on another node never gets it
RETAINED_GRACE_S = 1.0
RETAINED_ASK_MAX_S = 30.0


@dataclass
class EdgeState:
    """What a client keeps on disk for one federation."""

    init: dict[str, Tensor] = field(default_factory=dict)  # global model when it joined (seeds its local BN)
    current: ClientState | None = None                      # after the last completed round
    previous: ClientState | None = None                     # before it (to redo that round from another base)
    last_round: int = -1
    last_base: str = ""
    update: ClientUpdate | None = None                      # the last upload, to resend on a re-issued round
    run_id: str = ""                                        # the coordinator run this state belongs to

    def save(self, path: Path) -> None:
        flat: dict[str, Tensor] = {f"init.{k}": v for k, v in self.init.items()}
        for name, st in (("cur", self.current), ("prev", self.previous)):
            if st is not None:
                flat.update({f"{name}.{k}": v for k, v in st.to_tensors().items()})
        meta: dict[str, Any] = {"last_round": self.last_round, "last_base": self.last_base, "run_id": self.run_id,
                                "has_cur": self.current is not None, "has_prev": self.previous is not None}
        if self.update is not None:
            flat.update({f"upd.{k}": v for k, v in pack({"state": self.update.state, "extra": self.update.extras}).items()})
            meta.update(n_samples=self.update.n_samples, metrics=self.update.metrics)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_safetensors(path, {k: v.clone() for k, v in flat.items()}, {"neurofed_edge": json.dumps(meta)})

    @classmethod
    def load(cls, path: Path) -> EdgeState:
        if not path.exists():
            return cls()
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {})["neurofed_edge"])
            flat = load_file(str(path))
        except Exception as exc:
            raise NeuroFedError(f"{path}: unreadable client state ({exc}); delete it to rejoin from scratch") from None
        groups: dict[str, dict[str, Tensor]] = {"init": {}, "cur": {}, "prev": {}, "upd": {}}
        for k, v in flat.items():
            g, _, rest = k.partition(".")
            groups[g][rest] = v
        st = cls(init=groups["init"], last_round=int(meta["last_round"]), last_base=meta["last_base"],
                 run_id=str(meta.get("run_id", "")))
        st.current = ClientState.from_tensors(groups["cur"]) if meta["has_cur"] else None
        st.previous = ClientState.from_tensors(groups["prev"]) if meta["has_prev"] else None
        if groups["upd"]:
            u = unpack(groups["upd"], ("state", "extra"))
            st.update = ClientUpdate(u["state"], int(meta["n_samples"]), u["extra"], dict(meta.get("metrics", {})))
        return st


class EdgeClient:
    """One client process of a federation.

    Parameters
    ----------
    broker_url, federation, client_id : str
    load_data : callable
        ``ModelSpec -> SubjectData``: the client's own trials, preprocessed as the federation says.
    state_dir : path
        Where ``<federation>__<client_id>.safetensors`` lives.
    join_timeout : float
        Seconds to wait for a running federation (the coordinator's model) before giving up.
    wait_for_broker : float
        Seconds to keep retrying an unreachable broker (0: fail at once with one clear error).
    montage : callable, optional
        The device's channels and rate: in a federation of several device profiles (issue 19) the
        client is the profile they match (:func:`neurofed.trainer.data.profiles.match_profile`), announces it
        when joining and fetches only that profile's model (``model/<profile>``).
    window : int
        Asynchronous federations (``federation.mode = "async"``): train on the newest ``window`` trials of the
        store (0: all), as :func:`neurofed.trainer.fl.fedbuff.window_bounds`.
    reload_data : bool
        Asynchronous federations: load the trials again before each training or evaluation (a store that grows
        while the federation runs); a changed count is announced with a new join.
    evaluate : bool
        A validating client (``edge-client join --evaluate``): it never trains; it evaluates each candidate model
        the coordinator asks about (and the current release) on its own trials and reports balanced accuracy and
        trial counts, never trials (the release gate, docs/howto/long-lived-federation.md).
    """

    def __init__(self, broker_url: str, federation: str, client_id: str, load_data: DataLoader,
                 state_dir: str | Path, join_timeout: float = 120.0, wait_for_broker: float = 0.0,
                 montage: Montage | None = None, window: int = 0, reload_data: bool = False, evaluate: bool = False,
                 **transport_kw: Any) -> None:
        self.topics = Topics(federation)
        self.topics.status(client_id)  # validates the id
        if client_id == COORDINATOR_ID:
            raise NeuroFedError(f"client id {COORDINATOR_ID!r} is reserved")
        self.url, self.fed, self.cid = broker_url, federation, client_id
        self.load_data, self.join_timeout, self.transport_kw = load_data, join_timeout, transport_kw
        self.path = Path(state_dir) / f"{federation}__{client_id}.safetensors"
        self.state = EdgeState.load(self.path)
        self.data: SubjectData | None = None
        self.spec: ModelSpec | None = None
        self.pending: tuple[TaskMsg, dict[str, Tensor]] | None = None
        self.rounds_trained = 0
        self.finished = False
        self.transport: MqttTransport | None = None
        self.wait_for_broker = wait_for_broker
        self.run_id: str | None = None          # the coordinator run this client takes part in
        self.finished_run: str | None = None    # a run that had already ended when we saw its model
        self.global_state: dict[str, Tensor] = {}
        self.global_hash = ""                   # SHA-256 of the global model we hold (= ModelMsg body hash)
        self.cached: dict[str, Tensor] = {}     # the strategy's cached extras (retained `extras`, e.g. a generator)
        self.cached_hash = ""                   # their SHA-256 (= ExtrasMsg body hash; a task names the one it needs)
        self.sent: deque[str] = deque(maxlen=1024)  # our recent msg_ids: replies about others' messages are forged
        self.montage = montage
        self.profile: str | None = None        # our device profile in a hierarchical federation
        self.secagg: SecAggSession | None = None  # the open secure-aggregation round (edge/secagg_client.py)
        self._asked_at = 0.0  # when we last subscribed to / asked for a retained model or extras
        self._ask_after = RETAINED_GRACE_S  # how long we wait for it before asking (again)
        if window < 0:
            raise NeuroFedError(f"--window must be >= 0, got {window}")
        self.window, self.reload_data, self.evaluate = window, reload_data, evaluate
        self.evaluated: deque[str] = deque(maxlen=16)  # evaluation requests we answered
        self.evaluations = 0
        self._pending_eval: tuple[EvalMsg, dict[str, Tensor]] | None = None
        self.async_task: TaskMsg | None = None  # the retained task of an asynchronous run
        self.fetching = False  # async: we asked for the current model to train from it
        self.version = -1  # the version (ModelMsg.round) of the global model we hold
        self._repeat = (-1, 0)  # async: (version, trainings from it so far): the seed of the next (async_seed)

    # ------------------------------------------------------------------ plumbing
    def _status(self, state: str, rnd: int | None = None) -> bytes:
        return encode(StatusMsg(federation=self.fed, sender=self.cid, state=state, round=rnd,  # type: ignore[arg-type]
                                run_id=self.run_id or ""))

    def _pub(self, topic: str, payload: bytes, retain: bool = False, wait: float | None = 30.0) -> None:
        assert self.transport is not None
        try:
            self.transport.publish(topic, payload, retain=retain, wait=wait)
        except TransportError as exc:  # paho keeps QoS-1 messages queued and resends after reconnecting
            logger.warning("%s: %s (will retry after reconnect)", self.cid, exc)

    def _send(self, topic: str, msg: Any, tensors: dict[str, Tensor] | None = None, compress: bool = False,
              wait: float | None = 30.0, reference: bytes | None = None) -> None:
        """Encode and publish one of our messages, remembering its id (to recognise replies about it)."""
        self.sent.append(msg.msg_id)
        self._pub(topic, encode(msg, tensors, compress=compress, reference=reference), wait=wait)

    def _model_topic(self) -> str:
        """The retained model we train from: our device profile's in a hierarchical federation, else ``model``."""
        return self.topics.profile_model(self.profile) if self.profile else self.topics.model

    def _want_model(self, want: bool, topic: str | None = None) -> None:
        """Subscribe to the retained model we train from (or to ``topic``, e.g. ``extras``) only while we need it
        (saves a model download per round)."""
        assert self.transport is not None
        if topic is None:
            topic = self._model_topic()
            for t in [t for t in self.transport.subscriptions if t.startswith(self.topics.model) and t != topic]:
                self.transport.unsubscribe(t)  # the federation-wide `model` once we know our profile, or vice versa
        if want and topic not in self.transport.subscriptions:
            self.transport.subscribe(topic)
            self._asked_at, self._ask_after = time.monotonic(), RETAINED_GRACE_S
        elif not want and topic in self.transport.subscriptions:
            self.transport.unsubscribe(topic)

    def _new_run_seen(self) -> None:
        """Another run is going on: learn about it from the federation-wide ``model`` (its profiles may differ)."""
        self.profile = None
        self._want_model(True)

    def _task_model(self, task: TaskMsg) -> str:
        """Hash of the retained model ``task`` trains from (our profile's in a hierarchical federation)."""
        return task.profile_models.get(self.profile, "") if self.profile else task.model_sha256

    def _match_profile(self, meta: ModelSpec) -> str:
        """Which of the federation's device profiles our device is; one clear error (also told to the
        coordinator) if none."""
        try:
            if self.montage is None:
                raise ProfileError("this client cannot tell its device's channels and rate, so it cannot join a "
                                   "federation of device profiles")
            ch, sfreq = self.montage()
            prof = match_profile(ch, sfreq, [DeviceProfile.from_dict(d) for d in meta.profiles])
        except ProfileError as exc:  # tell the coordinator too (waiting for delivery: we are about to leave)
            self._send(self.topics.error(self.cid), ErrorMsg(federation=self.fed, sender=self.cid, code="unknown_profile",
                                                             message=str(exc)[:1000]), wait=5.0)
            raise
        logger.info("%s: device matches profile %s", self.cid, prof.name)
        return prof.name

    def _waiting_for_retained(self) -> bool:
        """Whether we are subscribed to a retained model or extras that has not come (we unsubscribe once it has)."""
        assert self.transport is not None
        return any(t == self.topics.extras or t.startswith(self.topics.model) for t in self.transport.subscriptions)

    def _ask_again(self) -> None:
        """Ask the coordinator to publish its retained model / extras again (status ``idle``) when the broker did
        not deliver the retained copy within ``_ask_after`` seconds of our subscribing (or of our last ask): a
        clustered broker delivers retained messages to clients of the node they were published through only.
        The coordinator coalesces such asks; a broker that delivers retained messages (Mosquitto) never sees one."""
        now = time.monotonic()
        if now - self._asked_at < self._ask_after or not self._waiting_for_retained():
            return
        self._asked_at, self._ask_after = now, min(2 * self._ask_after, RETAINED_ASK_MAX_S)
        logger.debug("%s: no retained model/extras yet; asking the coordinator to publish them again", self.cid)
        self._pub(self.topics.status(self.cid), self._status("idle"), retain=True, wait=None)

    def _announce(self) -> None:
        self._asked_at, self._ask_after = time.monotonic(), RETAINED_GRACE_S
        self._pub(self.topics.status(self.cid), self._status("online"), retain=True, wait=None)
        if self.data is not None:
            d = self.data
            join = JoinMsg(federation=self.fed, sender=self.cid, n_trials=int(d.X.shape[0]), n_channels=int(d.X.shape[1]),
                           n_times=int(d.X.shape[2]), sfreq=float(d.sfreq), classes=list(d.classes),
                           capabilities={"torch": torch.__version__, "threads": torch.get_num_threads(),
                                         **({"evaluate": True} if self.evaluate else {})},
                           run_id=self.run_id or "", profile=self.profile or "")
            self._send(self.topics.join(self.cid), join, wait=None)

    def _error(self, code: str, message: str, rnd: int | None = None) -> None:
        self._send(self.topics.error(self.cid), ErrorMsg(federation=self.fed, sender=self.cid, code=code,
                                                         message=message[:1000], round=rnd, run_id=self.run_id or ""),
                   wait=None)

    # ------------------------------------------------------------------ handlers
    def _finished_elsewhere(self, msg: ModelMsg) -> bool:
        """A final model of a run that is not ours: it had ended before we came."""
        if msg.final and msg.run_id != self.run_id:
            if self.finished_run != msg.run_id:
                self.finished_run = msg.run_id
                logger.info("%s: run %s of %s had already finished; waiting for a new run", self.cid,
                            msg.run_id[:8] or "-", self.fed)
            return True
        return False

    def _on_federation_model(self, msg: ModelMsg) -> None:
        """The federation-wide ``model`` of a hierarchical federation: find our profile, then fetch its model."""
        if self._finished_elsewhere(msg):
            return
        if self.profile is None or msg.run_id != self.run_id:
            self.profile = self._match_profile(msg.meta)
        self._want_model(True)

    def _on_model(self, msg: ModelMsg, tensors: dict[str, Tensor]) -> None:
        if self._finished_elsewhere(msg):
            return
        joining = msg.run_id != self.run_id or self.data is None
        if msg.run_id != self.run_id:
            if self.run_id is not None:
                logger.info("%s: the coordinator started a new run %s (was %s)", self.cid, msg.run_id[:8], self.run_id[:8])
            self.run_id = msg.run_id
            self.cached, self.cached_hash = {}, ""
            if self.state.run_id != msg.run_id:  # state of another run must not seed this one
                self.state = EdgeState(run_id=msg.run_id)
        self.spec = msg.meta
        if self.data is None:
            data = self.load_data(msg.meta)
            want = (msg.meta.n_channels, msg.meta.n_times)
            if tuple(data.X.shape[1:]) != want or list(data.classes) != list(msg.meta.classes):
                raise NeuroFedError(f"local data {data.X.shape[1:]} {list(data.classes)} does not fit the federation's "
                                    f"model {want} {msg.meta.classes}")
            self.data = data
            logger.info("%s: %d local trials ready; joining %s (run %s)", self.cid, data.X.shape[0], self.fed,
                        self.run_id[:8])
        if not self.state.init:
            self.state.init = {k: v.clone() for k, v in tensors.items()}
            self.state.save(self.path)
        self.global_state, self.global_hash, self.version = tensors, msg.body_sha256, msg.round
        if msg.final:
            self.fetching = False  # the run's last version: nothing more to train for
        if joining:  # not on every model fetch: a join per round would cost bytes for nothing
            self._announce()
        if self.pending is not None and self.pending[0].run_id != self.run_id:
            self.pending = None  # a task of another run
        if self.pending is None or self._task_model(self.pending[0]) == self.global_hash:
            self._want_model(False)

    # ------------------------------------------------------------------ asynchronous federations
    def _on_async_task(self, task: TaskMsg) -> None:
        """The retained task of an asynchronous run: from now on, fetch the current model, train, upload, repeat."""
        if self.run_id is not None and task.run_id != self.run_id:
            self._new_run_seen()  # another run: its model tells us what to do (the task is retained for it)
        self.async_task = task
        if self.evaluate:
            return  # a validating client never trains
        logger.info("%s: asynchronous run %s: training whenever a model version is fetched", self.cid,
                    task.run_id[:8])
        self._fetch()

    def _fetch(self) -> None:
        """Ask for the current model (the retained ``model``; it comes on subscribing)."""
        self.fetching = True
        self._want_model(True)

    def _async_train(self, task: TaskMsg) -> None:
        """One asynchronous contribution: train from the model version we hold on the newest ``window`` trials of
        our store, upload the update tagged with that version, fetch the current model again."""
        self.fetching = False
        assert self.spec is not None and self.data is not None
        self._refresh_data()
        lo, hi = window_bounds(len(self.data.y), self.window)
        if hi - lo < 2:
            raise NeuroFedError(f"{hi - lo} trial(s) in the window: need at least 2 to train")
        version = self.version
        k = self._repeat[1] if self._repeat[0] == version else 0
        self._repeat = (version, k + 1)
        strategy = get_strategy(task.strategy, **task.strategy_overrides)
        model = self._build_model(strategy)
        down = downlink(self.global_state, strategy, model)
        base = state_sha256(down)
        st = self.state
        start = st.current if st.current is not None else init_client_state(st.init, model, strategy)
        t0 = time.monotonic()
        upd, new_state = client_update(model, down, start, self.data.X[lo:hi], self.data.y[lo:hi], strategy,
                                       LocalConfig(**task.local).bound(self.data.ch_names, self.data.classes),
                                       async_seed(task.seed, version, self.cid, k))
        logger.info("%s: trained from version %d on %d trials in %.2f s (loss %.4f)", self.cid, version, hi - lo,
                    time.monotonic() - t0, upd.metrics.get("loss", float("nan")))
        self.state = EdgeState(init=st.init, current=new_state, previous=start, last_round=version, last_base=base,
                               update=upd, run_id=st.run_id)
        self.state.save(self.path)
        self.rounds_trained += 1
        msg = UpdateMsg(federation=self.fed, sender=self.cid, round=version, task_id=task.task_id,
                        n_samples=upd.n_samples, base_sha256=base, run_id=task.run_id,
                        metrics={k: float(v) for k, v in upd.metrics.items()})
        self._send(self.topics.update(self.cid), msg, pack({"state": upd.state, "extra": upd.extras}),
                   compress=task.compress, reference=delta_reference(self.global_state))
        self._fetch()

    def _refresh_data(self) -> None:
        """With a store (``reload_data``): read it again, and when it grew, join again with the new count (the
        coordinator bounds an update's ``n_samples`` and a report's ``n_trials`` by it)."""
        if self.reload_data and self.spec is not None and self.data is not None:
            data = self.load_data(self.spec)
            if len(data.y) != len(self.data.y):
                self.data = data
                self._announce()

    def _on_eval(self, msg: EvalMsg, tensors: dict[str, Tensor]) -> None:
        """Evaluate a candidate (and the current release) on our trials; report BCA and counts only."""
        if not self.evaluate or msg.run_id != self.run_id or msg.eval_id in self.evaluated:
            return
        if self.data is None or self.spec is None:
            self._pending_eval = (msg, tensors)  # not joined yet: answered once our model (and data) is here
            return
        from neurofed.trainer.evaluate import bca, predict  # lazy: scikit-learn (validating clients only)

        self.evaluated.append(msg.eval_id)
        self._refresh_data()  # a validating host's store grows between sessions too
        groups = unpack(tensors, ("cand", "rel"))
        task = self.async_task
        strategy = get_strategy(task.strategy, **task.strategy_overrides) if task else get_strategy(self.spec.strategy)
        X, y = self.data.X, self.data.y

        def score(state: dict[str, Tensor]) -> float:
            model = self._build_model(strategy)
            model.load_state_dict(state)
            return bca(y, predict(model, X, msg.batch_size))

        cand = score(groups["cand"])
        rel = score(groups["rel"]) if groups["rel"] else None
        counts = [int(c) for c in torch.bincount(torch.as_tensor(y, dtype=torch.long),
                                                 minlength=len(self.spec.classes))]
        self.evaluations += 1
        logger.info("%s: version %d scores BCA %.4f on %d trials%s", self.cid, msg.version, cand, len(y),
                    "" if rel is None else f" (release {msg.release}: {rel:.4f})")
        self._send(self.topics.eval_report(self.cid), EvalReportMsg(
            federation=self.fed, sender=self.cid, eval_id=msg.eval_id, version=msg.version, n_trials=len(y),
            class_counts=counts, bca=cand, bca_release=rel, run_id=self.run_id or ""), wait=None)

    def _on_task(self, task: TaskMsg, tensors: dict[str, Tensor] | None) -> None:
        if task.mode == "async":
            self._async_train(task)
            return
        if self.run_id is None:  # no model yet (the retained task can arrive first): the model decides
            if self.cid in task.selected:
                self.pending = (task, tensors or {})
            return
        if task.run_id != self.run_id:  # another run is going on: fetch its model to learn about it
            self._new_run_seen()
            return
        if self.cid not in task.selected:
            return
        if task.profiles.get(self.cid, "") != (self.profile or ""):
            raise NeuroFedError(f"the task names device profile {task.profiles.get(self.cid, '')!r} for us, but our "
                                f"device is {self.profile or 'none'!r}")
        if self.data is None or not self.state.init or self.spec is None or self._task_model(task) != self.global_hash:
            self.pending = (task, tensors or {})
            self._want_model(True)  # the retained model this task trains from
            return
        if task.extras_sha256 != self.cached_hash and task.extras_sha256:
            self.pending = (task, tensors or {})
            self._want_model(True, self.topics.extras)  # the retained extras it names (sent only when changed)
            return
        self.pending = None
        strategy = get_strategy(task.strategy, **task.strategy_overrides)
        down = downlink(self.global_state, strategy, self._build_model(strategy), self.profile or "")
        extras = {**(self.cached if task.extras_sha256 else {}), **unpack(tensors or {}, ("extra",))["extra"]}
        base = state_sha256(down)
        st = self.state
        if task.round < st.last_round:
            logger.info("%s: skipping stale task for round %d (done %d)", self.cid, task.round, st.last_round)
            return
        if task.secagg is not None:  # fresh keys first (the coordinator collects them while we train)
            self.secagg = SecAggSession(self.fed, self.cid, task)
            self._secagg_send([(self.secagg.keys_msg(), None)])
        if task.round == st.last_round and base == st.last_base and st.update is not None:
            logger.info("%s: round %d re-issued; resending the cached update", self.cid, task.round)
            self._upload(task, st.update, base)
            return
        start = st.previous if task.round == st.last_round else st.current
        upd, new_state = self._train(task, down, extras, start)
        prev = start if start is not None else new_state
        self.state = EdgeState(init=st.init, current=new_state, previous=prev, last_round=task.round,
                               last_base=base, update=upd, run_id=st.run_id)
        self.state.save(self.path)
        self.rounds_trained += 1
        # no `training`/`idle` status around it (issue 17): the update itself says the client is done, and
        # presence (online, offline by last will, done) is all the coordinator reads from statuses
        self._upload(task, upd, base)

    def _build_model(self, strategy: Strategy) -> torch.nn.Module:
        """The model of our spec, as the task's strategy builds it (e.g. fleeg_eegnet's ``local_bn_mode``)."""
        assert self.spec is not None
        s = self.spec
        return build_model(s.model, s.n_channels, s.n_classes, s.n_times, s.sfreq, s.bn_mode,
                           ch_names=s.ch_names, **strategy.model_kwargs(s.model))

    def _train(self, task: TaskMsg, down: dict[str, Tensor], extras: dict[str, Tensor],
               start: ClientState | None) -> tuple[ClientUpdate, ClientState]:
        assert self.spec is not None and self.data is not None
        strategy = get_strategy(task.strategy, **task.strategy_overrides)
        cfg = LocalConfig(**task.local).bound(self.data.ch_names, self.data.classes)
        model = self._build_model(strategy)
        if start is None:
            start = init_client_state(self.state.init, model, strategy, self.profile or "")
        t0 = time.monotonic()
        upd, new_state = client_update(model, down, start, self.data.X, self.data.y, strategy, cfg,
                                       client_seed(task.seed, task.round, self.cid), extras, self.profile or "")
        logger.info("%s: round %d trained in %.2f s (loss %.4f)", self.cid, task.round, time.monotonic() - t0,
                    upd.metrics.get("loss", float("nan")))
        return upd, new_state

    def _upload(self, task: TaskMsg, upd: ClientUpdate, base: str) -> None:
        if task.secagg is not None and self.secagg is not None:  # masked, once the neighbours' shares are in
            self._secagg_send(self.secagg.set_update(upd, self.global_state))
            return
        msg = UpdateMsg(federation=self.fed, sender=self.cid, round=task.round, task_id=task.task_id,
                        n_samples=upd.n_samples, base_sha256=base, run_id=task.run_id,
                        metrics={k: float(v) for k, v in upd.metrics.items()})
        # delta-coded against the global model both sides hold (lossless; about half the bytes)
        ref = delta_reference(self.global_state)
        self._send(self.topics.update(self.cid), msg, pack({"state": upd.state, "extra": upd.extras}),
                   compress=task.compress, reference=ref)

    def _secagg_send(self, out: list) -> None:
        for m, tensors in out:
            self._send(self.topics.secagg(self.cid), m, tensors, wait=None)

    def _on_secagg(self, msg: Any) -> None:
        if self.secagg is None or msg.run_id != self.run_id:
            return
        try:
            self._secagg_send(self.secagg.step(msg))
        except SecAggError as exc:  # refuse the round rather than weaken it; the coordinator recovers or re-issues
            logger.error("%s: secure aggregation round %d refused: %s", self.cid, msg.round, exc)
            self.secagg = None
            self._error("secagg_refused", str(exc), msg.round)

    def _on_coordinator_status(self, msg: StatusMsg) -> None:
        if self.run_id is None or not msg.run_id:
            return
        if msg.run_id == self.run_id and msg.state == "done":  # we missed the final result (e.g. reconnected late)
            self.finished = True
        elif msg.run_id != self.run_id and msg.state == "online":
            self._new_run_seen()  # a new run replaced ours: its model tells us what to do

    def _body_cap(self, msg: Any) -> int:
        """The largest body we accept for ``msg`` (issue 54): a task's extras (server-side strategy state such as
        SCAFFOLD's control variate, per parameter) are bounded by a few copies of the model we hold, an evaluation
        request (a candidate and the current release) by two; a model or the
        cached extras (e.g. FedBM's generator, not sized by our model) by :data:`DEFAULT_MAX_BODY_BYTES`, as is
        everything before we hold a model. Bodiless kinds are refused by ``decode`` whatever the cap."""
        if msg.kind == "task" and self.global_state:
            return min(DEFAULT_MAX_BODY_BYTES, TASK_BODY_MODEL_COPIES * body_cap(self.global_state))
        if msg.kind == "eval" and self.global_state:  # a candidate and the current release: two models
            return min(DEFAULT_MAX_BODY_BYTES, 2 * body_cap(self.global_state))
        return DEFAULT_MAX_BODY_BYTES

    def handle(self, item: Incoming) -> None:
        if item.event == "connected":
            self._announce()
            return
        if item.event != "message" or not item.payload:
            return
        try:
            kind, who = self.topics.parse(item.topic)
            msg, tensors = decode(item.payload, max_body=self._body_cap)
            if msg.sender == self.cid and kind == "error":
                return  # our own report, echoed by an MQTT 3.1.1 broker
            if msg.sender != COORDINATOR_ID:
                raise ProtocolError(f"{kind} message from {msg.sender!r}, expected the coordinator")
        except ProtocolError as exc:
            logger.warning("%s: ignoring message on %s: %s", self.cid, item.topic, exc)
            return
        if kind == "model" and msg.kind == "model":
            if msg.meta.profiles and not msg.meta.profile:
                self._on_federation_model(msg)
                return
            if (msg.meta.profile or None) != self.profile or (who or None) != self.profile:
                return  # not the model of our device profile (or a stale subscription)
            self._on_model(msg, tensors)
            if self._pending_eval is not None:
                (ev, et), self._pending_eval = self._pending_eval, None
                self._on_eval(ev, et)
            if self.fetching and self.async_task is not None and self.async_task.run_id == self.run_id:
                self._run_task(self.async_task, None)
            if self.pending is not None and self._task_model(self.pending[0]) == self.global_hash:
                task, t = self.pending
                self._run_task(task, t)
        elif kind == "eval" and msg.kind == "eval":
            try:
                self._on_eval(msg, tensors or {})
            except Exception as exc:  # noqa: BLE001 - report instead of going silent
                logger.error("%s: cannot evaluate version %d: %s", self.cid, msg.version, exc)
                self._error("eval_failed", str(exc), msg.version)
        elif kind == "task" and msg.kind == "task" and msg.mode == "async":
            self._on_async_task(msg)
        elif kind == "task" and msg.kind == "task":
            self._run_task(msg, tensors)
        elif kind == "extras" and msg.kind == "extras" and msg.run_id == self.run_id and self.run_id is not None:
            self.cached, self.cached_hash = tensors or {}, msg.body_sha256
            self._want_model(False, self.topics.extras)
            if self.pending is not None and self.pending[0].extras_sha256 == self.cached_hash:
                self._run_task(*self.pending)
        elif kind == "result" and msg.kind == "result" and msg.final and msg.run_id == self.run_id:
            self.finished = True
        elif kind == "secagg_down" and who == self.cid and msg.kind in SECAGG_DOWN:
            self._on_secagg(msg)
        elif kind == "status" and who == COORDINATOR_ID and msg.kind == "status":
            self._on_coordinator_status(msg)
        elif kind == "error" and msg.kind == "error":
            if msg.reply_to and msg.reply_to in self.sent:
                logger.warning("%s: coordinator rejected our message: %s: %s", self.cid, msg.code, msg.message)
            else:  # about a message we never sent: someone published under our id
                logger.debug("%s: ignoring a reply about message %s, which we did not send", self.cid, msg.reply_to[:8])

    def _run_task(self, task: TaskMsg, tensors: dict[str, Tensor] | None) -> None:
        try:
            self._on_task(task, tensors)
        except Exception as exc:  # noqa: BLE001 - report instead of going silent
            logger.error("%s: cannot run round %d: %s", self.cid, task.round, exc, exc_info=not isinstance(exc, ValueError))
            self.pending = None
            self._error("task_failed", str(exc), task.round)

    # ------------------------------------------------------------------ main loop
    def connect(self, stop: threading.Event | None = None) -> MqttTransport:
        """Connect to the broker: once, or retrying for ``wait_for_broker`` seconds; one clear error otherwise."""
        will = (self.topics.status(self.cid), self._status("offline"))
        try:
            return connect_with_backoff(
                lambda: MqttTransport(self.url, f"{self.fed}-{self.cid}", will=will, **self.transport_kw), stop=stop,
                timeout=self.wait_for_broker)
        except AuthError:
            raise
        except TransportError as exc:
            hint = "" if self.wait_for_broker else NO_BROKER_HINT
            raise TransportError(f"{exc}{hint}") from None

    def run(self, stop: threading.Event | None = None, max_seconds: float | None = None) -> int:
        """Serve the federation until its run finishes (final result), ``stop`` is set or ``max_seconds`` pass."""
        self.transport = self.connect(stop)
        t_end = time.monotonic() + max_seconds if max_seconds else None
        t_join = time.monotonic() + self.join_timeout
        try:
            # not `result`: the coordinator's retained status (`done` + run id) ends a run, so per-round
            # results (participants, loss) need not reach every client
            for t in (self.topics.task, self.topics.status(COORDINATOR_ID), self.topics.secagg_down(self.cid)):
                self.transport.subscribe(t)
            self.transport.subscribe(self.topics.error(self.cid), no_local=True)
            if self.evaluate:
                self.transport.subscribe(self.topics.eval)
            self._want_model(True)
            self._announce()
            while not self.finished:
                if stop is not None and stop.is_set():
                    break
                if t_end is not None and time.monotonic() > t_end:
                    break
                if self.run_id is None and time.monotonic() > t_join:
                    if self.finished_run is not None:
                        raise NeuroFedError(f"federation {self.fed!r}: its last run ({self.finished_run[:8]}) had already "
                                            f"finished and no new run started within {self.join_timeout:.0f} s")
                    raise NeuroFedError(f"no model from a coordinator of {self.fed!r} within {self.join_timeout:.0f} s")
                item = self.transport.get(0.2)
                if item is not None:
                    self.handle(item)
                self._ask_again()
            if self.finished:
                self._pub(self.topics.status(self.cid), self._status("done"), retain=True, wait=5.0)
        finally:
            self.transport.close()
        return self.rounds_trained
