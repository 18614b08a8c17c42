"""Checks every incoming message must pass before it touches coordinator state.

Each check raises :class:`Rejected` with a short machine ``code`` and a human ``detail``; the
coordinator logs it, counts it, and carries on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from neurofed.broker.protocol import COORDINATOR_ID, SECAGG_UP, JoinMsg, ModelSpec, UpdateMsg, unpack
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.api import TensorSpec, tensor_specs
from neurofed.trainer.fl.client import ClientUpdate

__all__ = ["ClientBudget", "Rejected", "TensorSpec", "UpdateRules", "check_envelope", "check_join", "check_update", "tensor_specs",
           "update_norm"]

#: kinds each topic may carry, and who may send them
CLIENT_KINDS = {"join": ("join",), "status": ("status",), "update": ("update",), "error": ("error",),
                "secagg": SECAGG_UP, "eval_report": ("eval_report",)}


class Rejected(NeuroFedError):
    """An incoming message failed validation (never fatal to the coordinator)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


class ClientBudget:
    """Messages and payload bytes each client may send in one window (a round attempt, or the join phase before
    the first round), issue 54.

    Counted on the client id of the topic a message arrived on, before anything is decoded: under the
    generated ACL a client can publish only under its own id, so a client with valid credentials that floods
    costs the coordinator a dict update per message, not a decode. Over a budget the client is cut off for the
    rest of the window (every further message refused unread): ``rate_limited`` (messages) or
    ``volume_limited`` (bytes). 0 turns a budget off.

    Parameters
    ----------
    max_messages, max_bytes : int
        Per client and window.
    max_senders : int
        Distinct client ids counted per window (on an anonymous broker a flood could invent ids); more are
        refused as ``rate_limited``.
    """

    def __init__(self, max_messages: int, max_bytes: int, max_senders: int = 100_000) -> None:
        self.max_messages, self.max_bytes, self.max_senders = max_messages, max_bytes, max_senders
        self.used: dict[str, list[int]] = {}  # client -> [messages, bytes] this window
        self.cut: dict[str, Rejected] = {}  # client -> why it is cut off for the rest of this window

    def reset(self) -> None:
        """A new window (a round opens): every client's budget is whole again."""
        self.used.clear()
        self.cut.clear()

    def charge(self, cid: str, nbytes: int) -> None:
        """Count one message of ``nbytes`` from ``cid``; raises :class:`Rejected` if it is (now) over a budget."""
        if (why := self.cut.get(cid)) is not None:
            raise why
        used = self.used.get(cid)
        if used is None:
            if len(self.used) >= self.max_senders:
                raise Rejected("rate_limited", f"more than {self.max_senders} distinct senders in this round")
            used = self.used[cid] = [0, 0]
        used[0] += 1
        used[1] += nbytes
        if self.max_messages and used[0] > self.max_messages:
            why = Rejected("rate_limited", f"{cid} sent more than {self.max_messages} messages in this round: "
                           "cut off until the next round")
        elif self.max_bytes and used[1] > self.max_bytes:
            why = Rejected("volume_limited", f"{cid} sent more than {self.max_bytes} bytes in this round: "
                           "cut off until the next round")
        else:
            return
        self.cut[cid] = why
        raise why


def check_envelope(kind: str, topic_client: str | None, msg: object, federation: str) -> None:
    """Schema kind fits the topic, the federation matches, the sender is who the topic says."""
    if kind not in CLIENT_KINDS or getattr(msg, "kind", None) not in CLIENT_KINDS[kind]:
        raise Rejected("wrong_kind", f"a {getattr(msg, 'kind', '?')} message on a {kind} topic")
    if msg.federation != federation:  # type: ignore[attr-defined]
        raise Rejected("wrong_federation", f"message for federation {msg.federation!r}")  # type: ignore[attr-defined]
    sender = msg.sender  # type: ignore[attr-defined]
    if sender == COORDINATOR_ID:
        raise Rejected("spoofed_sender", "clients may not send as the coordinator")
    if topic_client is not None and sender != topic_client:
        raise Rejected("spoofed_sender", f"sender {sender!r} published on {topic_client!r}'s topic")


def check_join(msg: JoinMsg, spec: ModelSpec, profile_specs: Mapping[str, ModelSpec] | None = None) -> None:
    """A client's data must fit the federation's model (in a hierarchical federation: its device profile's)."""
    if profile_specs:
        if not msg.profile:
            raise Rejected("no_profile", f"this federation serves device profiles {sorted(profile_specs)}; the join "
                           "names none")
        if msg.profile not in profile_specs:
            raise Rejected("unknown_profile", f"device profile {msg.profile!r} is not in this federation "
                           f"({', '.join(sorted(profile_specs))})")
        spec = profile_specs[msg.profile]
    elif msg.profile:
        raise Rejected("unknown_profile", f"device profile {msg.profile!r}: this federation has no device profiles")
    if msg.n_channels != spec.n_channels or msg.n_times != spec.n_times:
        raise Rejected("incompatible", f"data {msg.n_channels}x{msg.n_times}, model needs {spec.n_channels}x{spec.n_times}")
    if abs(msg.sfreq - spec.sfreq) > 1e-6:
        raise Rejected("incompatible", f"sampling rate {msg.sfreq} Hz, model needs {spec.sfreq} Hz")
    if list(msg.classes) != list(spec.classes):
        raise Rejected("incompatible", f"classes {msg.classes}, federation uses {spec.classes}")
    if msg.n_trials < 2:
        raise Rejected("too_few_trials", f"{msg.n_trials} trials (need >= 2)")


@dataclass
class UpdateRules:
    """What a valid update looks like this round."""

    round: int
    task_id: str
    base_sha256: str
    selected: frozenset[str]
    state_specs: dict[str, TensorSpec]
    extra_specs: dict[str, TensorSpec]
    global_state: dict[str, Tensor]
    n_trials: dict[str, int] = field(default_factory=dict)
    norm_bound: float = 0.0
    norm_action: str = "clip"
    max_update_ratio: float = 0.0  # reject ||update - global|| > ratio * max(||global||, 1); 0 = off
    #: hierarchical rounds: the device profile these rules are for (shapes, base and global view are its)
    profile: str = ""
    #: hierarchical rounds: selected client -> its profile, and each profile's rules
    client_profiles: dict[str, str] = field(default_factory=dict)
    by_profile: dict[str, UpdateRules] = field(default_factory=dict)
    #: asynchronous federations: any joined client may send (``selected`` is not used; the coordinator checks the
    #: registry), and ``round`` is the model version the update trained from
    any_client: bool = False
    #: the global state's floating entries, flattened in float64, and its norm: computed once per round (issue 54:
    #: recomputing the global norm for every update was a fifth of the coordinator's validation time)
    _ref: tuple[list[str], Tensor, float] | None = field(default=None, init=False, repr=False, compare=False)

    def reference(self) -> tuple[list[str], Tensor, float]:
        """``(floating keys, their values flattened as float64, L2 norm)`` of the global state, once per round."""
        if self._ref is None:
            keys = [k for k, v in self.global_state.items() if v.is_floating_point()]
            flat = torch.cat([self.global_state[k].reshape(-1).double() for k in keys]) if keys else torch.zeros(0)
            self._ref = (keys, flat, float(torch.linalg.vector_norm(flat)))
        return self._ref

    def distance(self, state: Mapping[str, Tensor]) -> float:
        """L2 norm of (update - global) over the floating entries (:func:`update_norm`, in one vector op)."""
        keys, flat, _ = self.reference()
        if not keys:
            return 0.0
        return float(torch.linalg.vector_norm(torch.cat([state[k].reshape(-1) for k in keys]).double() - flat))

    def for_client(self, cid: str) -> UpdateRules:
        """The rules of ``cid``'s device profile (these rules when the round has no profiles or cid is unknown)."""
        p = self.client_profiles.get(cid)
        return self.by_profile[p] if p is not None and p in self.by_profile else self


def check_update(msg: UpdateMsg, tensors: dict[str, Tensor] | None, rules: UpdateRules,
                 accepted: set[str], seen_ids: set[str], bodies: Mapping[str, tuple[int, str]] | None = None
                 ) -> ClientUpdate:
    """Validate an update and turn it into a :class:`ClientUpdate` (clipped if the rules say so).

    ``bodies`` maps the body SHA-256 of every update accepted so far to ``(round, sender)``: the same
    weights again under a fresh header (an old update replayed, or another client's copied) are a
    ``replay``; only the same sender re-sending in the same round (a re-issued task) may repeat a body.
    """
    cid = msg.sender
    rules = rules.for_client(cid)
    if msg.msg_id in seen_ids:
        raise Rejected("replay", f"message id {msg.msg_id} was already received")
    first = bodies.get(msg.body_sha256) if bodies is not None else None
    if first is not None and first != (rules.round, cid):
        raise Rejected("replay", f"identical update body was already accepted (round {first[0]}, from {first[1]})")
    if msg.round != rules.round:
        code = "late" if msg.round < rules.round else "future_round"
        raise Rejected(code, f"update for round {msg.round} during round {rules.round}")
    if msg.task_id != rules.task_id:
        raise Rejected("wrong_task", f"task id {msg.task_id} is not this round's {rules.task_id}")
    if not rules.any_client and cid not in rules.selected:
        raise Rejected("not_selected", f"{cid} was not selected for round {rules.round}")
    if cid in accepted:
        raise Rejected("duplicate", f"{cid} already delivered round {rules.round}")
    if msg.base_sha256 != rules.base_sha256:
        raise Rejected("wrong_base", "update was trained from a different global model")
    limit = rules.n_trials.get(cid)
    if limit is not None and msg.n_samples > limit:
        raise Rejected("bad_count", f"claims {msg.n_samples} samples, joined with {limit}")
    if tensors is None:
        raise Rejected("no_body", "update carries no tensors")
    try:
        groups = unpack(tensors, ("state", "extra"))
    except NeuroFedError as exc:
        raise Rejected("bad_tensors", str(exc)) from None
    state, extras = groups["state"], groups["extra"]
    _match(state, rules.state_specs, "state", rules.profile)
    _match(extras, rules.extra_specs, "extra", rules.profile)
    floats = [v.reshape(-1) for v in (*state.values(), *extras.values()) if v.is_floating_point()]
    if floats and not bool(torch.isfinite(torch.cat(floats)).all()):  # one pass; name the tensor only on failure
        bad = next(k for k, v in {**state, **extras}.items() if v.is_floating_point() and not torch.isfinite(v).all())
        raise Rejected("non_finite", f"tensor {bad} has NaN or inf")
    norm = rules.distance(state) if rules.max_update_ratio > 0 or rules.norm_bound > 0 else 0.0
    if rules.max_update_ratio > 0:
        ref = max(rules.reference()[2], 1.0)
        if norm > rules.max_update_ratio * ref:
            raise Rejected("absurd_update", f"update norm {norm:.4g} is {norm / ref:.3g} x the global model's "
                           f"(limit {rules.max_update_ratio:g} x)")
    if rules.norm_bound > 0:
        state = _bound(state, rules, norm)
    return ClientUpdate(state, int(msg.n_samples), extras, dict(msg.metrics), rules.profile)


def _match(got: dict[str, Tensor], want: dict[str, TensorSpec], group: str, profile: str = "") -> None:
    if got.keys() != want.keys():
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        raise Rejected("bad_tensors", f"{group}: missing {missing[:3]}, unexpected {[e[:60] for e in extra[:3]]}")
    for k, spec in want.items():
        v = got[k]
        if profile and tuple(v.shape) != spec.shape:
            raise Rejected("wrong_profile", f"{group}.{k} has shape {tuple(v.shape)}, but device profile {profile} "
                           f"expects {spec.shape} (an update of another profile's model?)")
        if tuple(v.shape) != spec.shape or v.dtype != spec.dtype:
            raise Rejected("bad_tensors", f"{group}.{k}: {tuple(v.shape)} {v.dtype}, expected {spec.shape} {spec.dtype}")


def update_norm(state: dict[str, Tensor], global_state: dict[str, Tensor]) -> float:
    """L2 norm of (update - global) over floating entries."""
    sq = 0.0
    for k, v in state.items():
        if v.is_floating_point():
            sq += float(((v.double() - global_state[k].double()) ** 2).sum())
    return math.sqrt(sq)


def state_norm(state: dict[str, Tensor]) -> float:
    """L2 norm over the floating entries of a state dict."""
    return math.sqrt(sum(float((v.double() ** 2).sum()) for v in state.values() if v.is_floating_point()))


def _bound(state: dict[str, Tensor], rules: UpdateRules, norm: float) -> dict[str, Tensor]:
    if norm <= rules.norm_bound:
        return state
    if rules.norm_action == "reject":
        raise Rejected("norm_bound", f"update norm {norm:.4g} exceeds bound {rules.norm_bound:.4g}")
    scale = rules.norm_bound / norm
    return {k: (rules.global_state[k] + (v - rules.global_state[k]) * scale).to(v.dtype) if v.is_floating_point() else v
            for k, v in state.items()}
