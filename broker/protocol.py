"""The NeuroFed wire protocol: topics, versioned message schemas, framing (imported by broker/ and edge/).

No other module builds topic strings or message bytes. A message on the wire is::

    b"NF" | version (1 byte) | flags (1 byte) | header length (uint32 big-endian) | header | body

The header is the JSON of one of the pydantic models below (``extra='forbid'``, no NaN/inf) without
the fields at their defaults, raw-deflated with a preset dictionary; the body, when present, is a
safetensors file (``safetensors.torch.save``; never pickle) whose length and SHA-256 are in the
header, possibly delta-coded, bit-shuffled and LZMA2-compressed (flags). See ``docs/protocol.md``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import lzma
import math
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from neurofed.trainer.checkpoint import MODEL_FIELDS, ModelMeta, meta_fields
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.models import MODEL_NAMES

#: 2: device profiles, secure aggregation, cached extras; 3: compact deflated headers, bit-shuffled bodies,
#: word-difference delta coding, compact secure-aggregation messages (base64 blobs and roster indices instead
#: of hex keys and names); an older peer gets a clear "unsupported schema version" error
SCHEMA_VERSION = 3
MAGIC = b"NF"
FLAG_LZMA = 0x01      # body compressed: raw LZMA2 stream (:func:`compress_body`)
FLAG_DELTA = 0x02     # body delta-coded against a reference both sides hold (:func:`delta_code`)
FLAG_SHUFFLE = 0x04   # body bit-shuffled after its safetensors header (:func:`shuffle`)
FLAG_HEADER = 0x08    # header raw-deflated with the preset dictionary HEADER_DICT
FLAGS = FLAG_LZMA | FLAG_DELTA | FLAG_SHUFFLE | FLAG_HEADER
_PREFIX = struct.Struct(">2sBBI")
MAX_HEADER_BYTES = 1 << 20
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: Cap on a body's declared (decoded) length for callers that do not know the federation's model: a body
#: never decodes past this, whatever its header declares (see :func:`decode`'s ``max_body``, :func:`body_cap`)
DEFAULT_MAX_BODY_BYTES = 64 << 20
#: Safetensors header allowance of :func:`body_cap`: per tensor (its JSON entry: name, dtype, shape, offsets)
#: and per body (the framing of the JSON, the 8-byte length, alignment padding)
BODY_CAP_PER_TENSOR = 512
BODY_CAP_SLACK = 64 << 10
_UNSHUFFLE_CHUNK_WORDS = 1 << 18  # unshuffle's scratch (8 bytes per bit) is 8 x 4 x this, not 8 x the body
COORDINATOR_ID = "coordinator"
NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
HEX64 = r"^([0-9a-f]{64})?$"
HEX32_OR_EMPTY = r"^([0-9a-f]{32})?$"
KEY_B64 = r"^[A-Za-z0-9+/]{43}=$"  # an X25519 public key (32 bytes, base64)
B64 = r"^[A-Za-z0-9+/]*={0,2}$"  # secure-aggregation keys or shares, concatenated (base64)

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Scalar = bool | int | float | str


class ProtocolError(NeuroFedError, ValueError):
    """A payload is not a valid NeuroFed message (bad framing, schema, hash or tensors)."""


# ----------------------------------------------------------------------------- topics
class Topics:
    """Topic builders for one federation: everything lives under ``neurofed/<federation>/``."""

    KINDS_PER_CLIENT = ("join", "status", "update", "error", "secagg", "secagg_down", "eval_report")

    def __init__(self, federation: str) -> None:
        if not isinstance(federation, str) or not _is_name(federation):
            raise ProtocolError(f"federation name {federation!r} must match {NAME_PATTERN}")
        self.federation = federation
        self.root = f"neurofed/{federation}"

    def join(self, client_id: str) -> str:
        return f"{self.root}/join/{_checked(client_id)}"

    @property
    def task(self) -> str:
        return f"{self.root}/task"

    @property
    def model(self) -> str:
        return f"{self.root}/model"

    def profile_model(self, profile: str) -> str:
        """Retained model of one device profile (hierarchical federations): shared module + that profile's own."""
        return f"{self.root}/model/{_checked(profile)}"

    @property
    def result(self) -> str:
        return f"{self.root}/result"

    @property
    def extras(self) -> str:
        return f"{self.root}/extras"

    @property
    def eval(self) -> str:
        """Retained evaluation request: a candidate model (and the current release) for clients to validate."""
        return f"{self.root}/eval"

    def eval_report(self, client_id: str) -> str:
        """A client's federated-validation report (BCA and counts, never trials)."""
        return f"{self.root}/eval_report/{_checked(client_id)}"

    @property
    def release(self) -> str:
        """Retained signed release (a ``neurofed_runtime.release`` envelope, not a framed message; docs/protocol.md)."""
        return f"{self.root}/release"

    def probe(self, client_id: str) -> str:
        """A client's own liveness probe (neurofed.broker.transport): it publishes there and reads it back, nobody else."""
        return f"{self.root}/probe/{_checked(client_id)}"

    def status(self, client_id: str) -> str:
        return f"{self.root}/status/{_checked(client_id)}"

    def update(self, client_id: str) -> str:
        return f"{self.root}/update/{_checked(client_id)}"

    def error(self, client_id: str) -> str:
        return f"{self.root}/error/{_checked(client_id)}"

    def secagg(self, client_id: str) -> str:
        """Secure aggregation, client to coordinator: keys, sealed shares, masked input, revealed shares."""
        return f"{self.root}/secagg/{_checked(client_id)}"

    def secagg_down(self, client_id: str) -> str:
        """Secure aggregation, coordinator to one client: roster, its sealed shares, unmask request."""
        return f"{self.root}/secagg_down/{_checked(client_id)}"

    def all(self) -> str:
        return f"{self.root}/#"

    def any_client(self, kind: str) -> str:
        """Subscription filter for one per-client kind from every client, e.g. ``.../update/+``."""
        if kind not in self.KINDS_PER_CLIENT:
            raise ProtocolError(f"{kind!r} is not a per-client topic kind")
        return f"{self.root}/{kind}/+"

    def parse(self, topic: str) -> tuple[str, str | None]:
        """``(kind, client_id or None)`` of a topic of this federation; raises ProtocolError otherwise."""
        parts = topic.split("/")
        if len(parts) < 3 or parts[0] != "neurofed" or parts[1] != self.federation:
            raise ProtocolError(f"topic {topic!r} is not in federation {self.federation!r}")
        rest = parts[2:]
        if len(rest) == 1 and rest[0] in ("task", "model", "result", "extras", "release", "eval"):
            return rest[0], None
        if len(rest) == 2 and rest[0] == "model" and _is_name(rest[1]):
            return "model", rest[1]  # a device profile's model (the second part names the profile)
        if len(rest) == 2 and rest[0] in self.KINDS_PER_CLIENT and _is_name(rest[1]):
            return rest[0], rest[1]
        raise ProtocolError(f"unknown topic {topic!r}")


def _is_name(s: str) -> bool:
    import re

    return bool(re.fullmatch(NAME_PATTERN, s))


def _checked(client_id: str) -> str:
    if not isinstance(client_id, str) or not _is_name(client_id):
        raise ProtocolError(f"client id {client_id!r} must match {NAME_PATTERN}")
    return client_id


# ----------------------------------------------------------------------------- schemas
class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=False)

    v: Literal[3] = SCHEMA_VERSION
    federation: Name
    sender: Name
    msg_id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=r"^[0-9a-f]{32}$")
    sent_at: float = Field(default_factory=time.time, ge=0)
    body_len: int = Field(default=0, ge=0)
    body_sha256: str = Field(default="", pattern=HEX64)
    run_id: str = Field(default="", pattern=HEX32_OR_EMPTY)  # the coordinator run this message belongs to


#: Wire bounds of the model description. Its fields, types and defaults are those of
#: ``neurofed.trainer.checkpoint.ModelMeta`` named in ``MODEL_FIELDS`` (one description, defined there); each
#: bound here must narrow ModelMeta's type, and every model field needs one (both checked at import).
MODEL_BOUNDS: dict[str, Any] = {
    "model": Literal[MODEL_NAMES],  # type: ignore[valid-type]  # the registry's names (neurofed.trainer.models)
    "n_channels": Annotated[int, Field(ge=0, le=1024)],  # 0 only in the federation-wide spec of a multi-profile federation
    "n_classes": Annotated[int, Field(ge=2, le=64)],
    "n_times": Annotated[int, Field(ge=1, le=100_000)],
    "sfreq": Annotated[float, Field(gt=0, le=100_000)],
    "bn_mode": Literal["standard", "batch_specific"],
    "ch_names": Annotated[list[Annotated[str, Field(max_length=32)]], Field(max_length=1024)],
    "classes": Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=64)],
    "preprocess": dict[str, Any],
    "strategy": Annotated[str, Field(max_length=32)],
}


def _kind(t: Any) -> Any:
    """The plain type behind ``Annotated``/``Literal``/generic aliases (``list[str]`` -> list)."""
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    if get_origin(t) is Literal:
        return type(get_args(t)[0])
    return get_origin(t) or t


def _model_fields() -> dict[str, Any]:
    """ModelMeta's model fields with their wire bounds; a TypeError if the two disagree."""
    card = meta_fields(MODEL_FIELDS)
    if set(MODEL_BOUNDS) != set(card):
        raise TypeError(f"MODEL_BOUNDS names {sorted(MODEL_BOUNDS)}, neurofed.trainer.checkpoint.MODEL_FIELDS {sorted(card)}")
    for name, (hint, _) in card.items():
        if _kind(MODEL_BOUNDS[name]) is not _kind(hint):
            raise TypeError(f"ModelSpec.{name}: wire type {MODEL_BOUNDS[name]} does not narrow ModelMeta's {hint}")
    return {name: (MODEL_BOUNDS[name], default) for name, (_, default) in card.items()}


_ModelFields = create_model(  # type: ignore[call-overload]
    "_ModelFields", __config__=ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False), **_model_fields()
)


class ModelSpec(_ModelFields):  # type: ignore[misc, valid-type]
    """How to build the federation's model and feed it: the model fields of
    :class:`neurofed.trainer.checkpoint.ModelMeta` (``MODEL_FIELDS``), bounded for the wire, plus the wire-only device
    profiles of a hierarchical federation (a checkpoint keeps them in ``extra["device_profiles"]``)."""

    #: the device profile this spec is for ("" = one architecture for every client)
    profile: str = Field(default="", pattern=r"^([A-Za-z0-9_.\-]{1,64})?$")
    #: device profiles of a hierarchical federation (:meth:`neurofed.trainer.data.profiles.DeviceProfile.to_dict`):
    #: every profile in the federation-wide spec, the one profile in a profile's spec
    profiles: list[dict[Annotated[str, Field(max_length=32)], Any]] = Field(default_factory=list, max_length=64)

    def to_meta(self, test_batch_size: int = 8, extra: dict[str, Any] | None = None) -> ModelMeta:
        """The checkpoint description of this model (no training-data hashes: the coordinator holds no data)."""
        own = {k: copy.deepcopy(getattr(self, k)) for k in MODEL_FIELDS}
        return ModelMeta(**own, test_batch_size=test_batch_size, extra=dict(extra or {}))

    @classmethod
    def from_meta(cls, meta: ModelMeta) -> ModelSpec:
        """The wire description of a checkpoint's model (validated against the bounds)."""
        return cls(**{k: getattr(meta, k) for k in MODEL_FIELDS})


class JoinMsg(_Msg):
    """A client announces itself: what data it holds (counts and shape only, never samples)."""

    kind: Literal["join"] = "join"
    n_trials: int = Field(ge=0, le=1_000_000)
    n_channels: int = Field(ge=1, le=1024)
    n_times: int = Field(ge=1, le=100_000)
    sfreq: float = Field(gt=0, le=100_000)
    classes: list[Annotated[str, Field(max_length=64)]] = Field(max_length=64)
    capabilities: dict[Annotated[str, Field(max_length=64)], Scalar] = Field(default_factory=dict, max_length=32)
    profile: str = Field(default="", pattern=r"^([A-Za-z0-9_.\-]{1,64})?$")  # device profile its data matches


class StatusMsg(_Msg):
    """Heartbeat / presence (``offline`` is the last will)."""

    kind: Literal["status"] = "status"
    state: Literal["online", "offline", "idle", "training", "done"]
    round: int | None = Field(default=None, ge=0)


class SecAggSpec(BaseModel):
    """Secure aggregation settings of a round (in the task): the clients mask their update before uploading it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    neighbours: int = Field(ge=0, le=100_000)  # SecAgg+ degree k (0: chosen from the roster size)
    threshold: float = Field(gt=0, lt=1)       # t = floor(threshold * k) + 1 shares of k
    bound: float = Field(gt=0, le=2**20)       # |update coordinate| clamp; fixes the fixed-point scale
    n_ref: int = Field(ge=1, le=2**31 - 1)     # the selected clients' joined trials (weights n_k / n_ref)
    norm_bound: float = Field(default=0.0, ge=0)  # > 0: clients clip their update's L2 norm before masking


class TaskMsg(_Msg):
    """Round ``round``: the selected clients train from the body (``down.*`` + ``extra.*``) and upload."""

    kind: Literal["task"] = "task"
    round: int = Field(ge=0, le=1_000_000)
    rounds_total: int = Field(ge=1, le=1_000_000)
    task_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    selected: list[Name] = Field(max_length=1_000_000)
    deadline_s: float = Field(gt=0, le=86_400)
    seed: int = Field(ge=0, lt=2**63)
    strategy: Name
    strategy_overrides: dict[Annotated[str, Field(max_length=32)], Scalar] = Field(default_factory=dict, max_length=32)
    local: dict[Annotated[str, Field(max_length=32)], float | int] = Field(default_factory=dict, max_length=16)
    compress: bool = False  # clients compress their update bodies too
    model_sha256: str = Field(default="", pattern=HEX64)  # the retained global model the round trains from
    #: hierarchical federations: each selected client's device profile, and each profile's retained model hash
    profiles: dict[Name, Name] = Field(default_factory=dict, max_length=1_000_000)
    profile_models: dict[Name, Annotated[str, Field(pattern=HEX64)]] = Field(default_factory=dict, max_length=64)
    secagg: SecAggSpec | None = None  # set: secure aggregation round (updates go masked on `secagg/<id>`)
    extras_sha256: str = Field(default="", pattern=HEX64)  # the retained cached extras the round needs ("" none)
    #: async (federation.mode = async, docs/async.md): retained for the whole run, ``selected`` empty, any joined
    #: client trains from the retained model whenever it is online; its update's ``round`` is the model version
    #: (``ModelMsg.round``) it trained from, ``rounds_total`` the versions the run makes
    mode: Literal["sync", "async"] = "sync"


class UpdateMsg(_Msg):
    """A client's round result; body ``state.*`` (full state dict) + ``extra.*`` (strategy extras)."""

    kind: Literal["update"] = "update"
    round: int = Field(ge=0, le=1_000_000)
    task_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    n_samples: int = Field(ge=1, le=1_000_000)
    base_sha256: str = Field(pattern=HEX64)
    metrics: dict[Annotated[str, Field(max_length=32)], float] = Field(default_factory=dict, max_length=16)


class ErrorMsg(_Msg):
    """Either side reports a problem instead of going silent."""

    kind: Literal["error"] = "error"
    round: int | None = Field(default=None, ge=0)
    code: Annotated[str, Field(pattern=r"^[a-z_]{1,32}$")]
    message: str = Field(max_length=1000)
    reply_to: str = Field(default="", pattern=HEX32_OR_EMPTY)  # msg_id of the rejected message


class ResultMsg(_Msg):
    """Per-round summary published by the coordinator."""

    kind: Literal["result"] = "result"
    round: int = Field(ge=0)
    participants: list[Name]
    rejected: int = Field(ge=0)
    bytes_down: int = Field(ge=0)
    bytes_up: int = Field(ge=0)
    seconds: float = Field(ge=0)
    loss: float | None = None
    final: bool = False
    model_sha256: str = Field(pattern=HEX64)


class ModelMsg(_Msg):
    """Retained global model (full state dict incl. aggregated BN) after ``round`` completed rounds."""

    kind: Literal["model"] = "model"
    round: int = Field(ge=0)
    final: bool = False
    meta: ModelSpec


class ExtrasMsg(_Msg):
    """Retained strategy extras that are large and change rarely (e.g. FedBM's generator): published only
    when their content changes; a task names the body hash it needs (``TaskMsg.extras_sha256``)."""

    kind: Literal["extras"] = "extras"
    round: int = Field(ge=0)


class EvalMsg(_Msg):
    """Retained on ``eval``: validate candidate model ``version`` (body ``cand.*``, the full state) and, when there
    is a current release, that release too (body ``rel.*``) on your own trials, then report (:class:`EvalReportMsg`).
    Only clients that do not train in this federation (``edge-client join --evaluate``) answer."""

    kind: Literal["eval"] = "eval"
    eval_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    version: int = Field(ge=0, le=1_000_000)  # the candidate's model version
    release: int = Field(default=0, ge=0, le=1_000_000)  # the current release's number (0: none; no ``rel.*``)
    batch_size: int = Field(default=8, ge=1, le=4096)  # test batch (batch-specific BatchNorm)
    deadline_s: float = Field(gt=0, le=86_400)


class EvalReportMsg(_Msg):
    """A client's federated validation of an evaluation request: balanced accuracy and counts only, never trials.

    ``class_counts`` are its trials per class (logit order), summing to ``n_trials``; ``bca_release`` is present
    exactly when the request carried a release."""

    kind: Literal["eval_report"] = "eval_report"
    eval_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    version: int = Field(ge=0, le=1_000_000)
    n_trials: int = Field(ge=2, le=1_000_000)
    class_counts: list[Annotated[int, Field(ge=0, le=1_000_000)]] = Field(min_length=2, max_length=64)
    bca: float = Field(ge=0, le=1)
    bca_release: float | None = Field(default=None, ge=0, le=1)


# ----------------------------------------------------------------------------- secure aggregation
# Compact: keys and shares travel as one base64 blob per message (fixed-size records, concatenated) and
# neighbours are named by their roster index; which record belongs to whom follows from the order (ascending
# roster index), so only the blobs' lengths need checking (the receiver does: a wrong length is refused).
Blob = Annotated[str, Field(pattern=B64, max_length=MAX_HEADER_BYTES)]
Index = Annotated[int, Field(ge=1, le=1_000_000)]
SA_MAX = 100_000  # neighbours per client (the complete graph of a very large round)


class _SaMsg(_Msg):
    round: int = Field(ge=0, le=1_000_000)
    task_id: str = Field(pattern=r"^[0-9a-f]{32}$")


class SaKeysMsg(_SaMsg):
    """Step 1, client: its two fresh X25519 public keys (channel: shares are sealed to it; mask: pairwise masks)."""

    kind: Literal["sa_keys"] = "sa_keys"
    channel_pk: str = Field(pattern=KEY_B64)
    mask_pk: str = Field(pattern=KEY_B64)


class SaRosterMsg(_SaMsg):
    """Step 1, coordinator to one client: the roster's size, the client's index in it, the graph, and its
    neighbours' keys (O(k) bytes per client: the roster itself is not sent). The client derives its neighbours'
    indices from the seeded graph (``size``, ``neighbours``, ``graph_seed``, ``index``)."""

    kind: Literal["sa_roster"] = "sa_roster"
    size: int = Field(ge=2, le=1_000_000)     # clients that advertised keys
    index: Index                              # this client's 1-based rank in the sorted roster
    graph_seed: int = Field(ge=0, lt=2**63)
    neighbours: int = Field(ge=1, le=SA_MAX)
    threshold: int = Field(ge=1, le=SA_MAX)
    keys: Blob  # per neighbour, in ascending index: channel_pk (32 bytes) + mask_pk (32 bytes)


class SaSharesMsg(_SaMsg):
    """Step 2, client: its shares for each neighbour, each sealed to that neighbour (the coordinator cannot read them)."""

    kind: Literal["sa_shares"] = "sa_shares"
    shares: Blob = Field(min_length=4)  # per neighbour, in ascending index: its sealed share (49 bytes)


class SaInboxMsg(_SaMsg):
    """Step 2, coordinator to one client: the sealed shares its neighbours sent it (their senders took part)."""

    kind: Literal["sa_inbox"] = "sa_inbox"
    senders: list[Index] = Field(min_length=1, max_length=SA_MAX)  # ascending roster indices
    shares: Blob = Field(min_length=4)  # per sender, in that order: the share it sealed to this client (49 bytes)


class SaMaskedMsg(_SaMsg):
    """Step 3, client: the masked fixed-point update, body ``masked`` (int32, uniformly random to the coordinator)."""

    kind: Literal["sa_masked"] = "sa_masked"


class SaUnmaskMsg(_SaMsg):
    """Step 4, coordinator to one client: which of its neighbours (roster indices, ascending) delivered a masked
    input and which dropped."""

    kind: Literal["sa_unmask"] = "sa_unmask"
    survivors: list[Index] = Field(max_length=SA_MAX)
    dropped: list[Index] = Field(max_length=SA_MAX)


class SaRevealMsg(_SaMsg):
    """Step 4, client: self-mask shares of the surviving neighbours, key shares of the dropped ones (never both),
    each ``share index (1 byte) + 16 bytes``, in the order of the unmask request's lists."""

    kind: Literal["sa_reveal"] = "sa_reveal"
    b_shares: Blob
    key_shares: Blob


SECAGG_UP = ("sa_keys", "sa_shares", "sa_masked", "sa_reveal")
SECAGG_DOWN = ("sa_roster", "sa_inbox", "sa_unmask")

Message = Annotated[JoinMsg | StatusMsg | TaskMsg | UpdateMsg | ErrorMsg | ResultMsg | ModelMsg | ExtrasMsg | EvalMsg
                    | EvalReportMsg | SaKeysMsg
                    | SaRosterMsg | SaSharesMsg | SaInboxMsg | SaMaskedMsg | SaUnmaskMsg | SaRevealMsg,
                    Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)
#: message kind -> must carry a safetensors body (True), must not (False), may (None: a task carries
#: strategy extras such as SCAFFOLD's ``c`` only; the weights come from the retained ``model``)
BODY_REQUIRED: dict[str, bool | None] = {"join": False, "status": False, "task": None, "update": True,
                                         "error": False, "result": False, "model": True, "extras": True, "sa_keys": False,
                                         "sa_roster": False, "sa_shares": False, "sa_inbox": False, "sa_masked": True,
                                         "sa_unmask": False, "sa_reveal": False, "eval": True, "eval_report": False}


# ----------------------------------------------------------------------------- tensors
def tensors_to_bytes(tensors: dict[str, Tensor]) -> bytes:
    """safetensors bytes of a flat tensor dict (contiguous CPU copies)."""
    return st_save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def bytes_to_tensors(data: bytes) -> dict[str, Tensor]:
    try:
        return st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types
        raise ProtocolError(f"body is not a valid safetensors file ({type(exc).__name__}: {str(exc)[:120]})") from None


def pack(groups: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
    """``{"down": {...}, "extra": {...}}`` -> ``{"down.k": ..., "extra.k": ...}``."""
    return {f"{g}.{k}": v for g, d in groups.items() for k, v in d.items()}


def unpack(flat: dict[str, Tensor], allowed: tuple[str, ...]) -> dict[str, dict[str, Tensor]]:
    """Inverse of :func:`pack`; a key outside ``allowed`` groups raises ProtocolError."""
    out: dict[str, dict[str, Tensor]] = {g: {} for g in allowed}
    for k, v in flat.items():
        g, _, rest = k.partition(".")
        if g not in out or not rest:
            raise ProtocolError(f"unexpected tensor name {k[:80]!r} (allowed groups: {allowed})")
        out[g][rest] = v
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_sha256(tensors: dict[str, Tensor]) -> str:
    """Content hash of a tensor dict (of its canonical safetensors bytes)."""
    return sha256(tensors_to_bytes(tensors))


# ----------------------------------------------------------------------------- framing
#: Preset dictionary of the raw-deflated headers (flag bit 3): the schemas' field names and common values,
#: so that even a 200-byte header compresses. Part of the wire format: changing it is a schema change
#: (bump SCHEMA_VERSION; tests/broker/test_protocol.py pins its hash).
HEADER_DICT = (
    # rare: secure aggregation, errors, results, joins, model descriptions
    b'"neighbours":"threshold":"bound":"n_ref":"norm_bound":"channel_pk":"mask_pk":"size":"index":"graph_seed":'
    b'"keys":"shares":"survivors":"dropped":"b_shares":"key_shares":"kind":"sa_keys""kind":"sa_roster"'
    b'"kind":"sa_shares""kind":"sa_inbox""kind":"sa_masked""kind":"sa_unmask""kind":"sa_reveal"'
    b'"code":"message":"reply_to":"kind":"error""participants":"rejected":"bytes_down":"bytes_up":"seconds":'
    b'"loss":"kind":"result""kind":"extras""n_trials":"capabilities":{"torch":"threads":"kind":"join"'
    b'"Fp1","Fpz","Fp2","AF7","AF3","AFz","AF4","AF8","F7","F5","F3","F1","Fz","F2","F4","F6","F8","FT7","FT8",'
    b'"T7","T8","T9","T10","TP7","TP8","P7","P5","P3","P1","Pz","P2","P4","P6","P8","PO7","PO3","POz","PO4","PO8",'
    b'"O1","Oz","O2","Iz"'
    b'"meta":{"model":"eegnet","n_channels":"n_classes":"n_times":"sfreq":"bn_mode":"standard","bn_mode":'
    b'"batch_specific","ch_names":["FC5","FC3","FC1","FCz","FC2","FC4","FC6","C5","C3","C1","Cz","C2","C4","C6",'
    b'"CP5","CP3","CP1","CPz","CP2","CP4","CP6"],"classes":["left_fist","right_fist"],"preprocess":{"fmin":'
    b'"fmax":"tmin":"tmax":"resample":"channels":["FC5","FC3","FC1","FCz","FC2","FC4","FC6","C5","C3","C1","Cz",'
    b'"C2","C4","C6","CP5","CP3","CP1","CPz","CP2","CP4","CP6"],"ea":true,"filter_order":"version":"strategy":'
    b'"profile":"profiles":"kind":"model","final":true'
    # every round: the task, the update, statuses; the envelope last (nearest, cheapest to refer to)
    b'"rounds_total":"selected":["deadline_s":"seed":"strategy":"fedavg","strategy_overrides":{"local":{"lr":'
    b'"momentum":"weight_decay":"batch_size":"local_epochs":"compress":true,"model_sha256":"profile_models":'
    b'"secagg":{"extras_sha256":"kind":"task"'
    b'"n_samples":"base_sha256":"metrics":{"loss":"steps":"kind":"update"'
    b'"state":"online""state":"offline""state":"done""kind":"status","round":'
    b'{"kind":"federation":"sender":"coordinator","msg_id":"sent_at":"body_len":"body_sha256":"run_id":"task_id":'
)
_ALWAYS_SENT = ("kind", "msg_id", "sent_at")  # their defaults are drawn afresh, so "equal to the default" means nothing


def encode_header(msg: _Msg) -> bytes:
    """The compact header JSON of ``msg``: fields equal to their default are left out (:func:`decode` fills
    them back in; ``kind``, ``msg_id`` and ``sent_at`` are always sent)."""
    doc = msg.model_dump(mode="json", exclude_defaults=True)
    doc = {**{k: getattr(msg, k) for k in _ALWAYS_SENT}, **doc}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _deflate_header(raw: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, HEADER_DICT)
    return c.compress(raw) + c.flush()


def _inflate_header(data: bytes) -> bytes:
    try:
        d = zlib.decompressobj(-15, HEADER_DICT)
        raw = d.decompress(data, MAX_HEADER_BYTES + 1)
    except zlib.error as exc:
        raise ProtocolError(f"compressed header is corrupt ({exc})") from None
    if len(raw) > MAX_HEADER_BYTES or d.unconsumed_tail:
        raise ProtocolError(f"compressed header expands beyond {MAX_HEADER_BYTES} bytes")
    if not d.eof or d.unused_data:
        raise ProtocolError("compressed header is truncated or followed by stray bytes")
    return raw


def delta_reference(global_state: dict[str, Tensor]) -> bytes:
    """The bytes an update trained from ``global_state`` is delta-coded against (same layout as the update)."""
    return tensors_to_bytes(pack({"state": global_state}))


def delta_code(body: bytes, reference: bytes) -> bytes:
    """``body`` as differences from ``reference``, 32-bit word by word (lossless; inverse :func:`delta_decode`).

    From byte 8 (the safetensors header length before it stays plain: :func:`shuffle` reads it) over their
    common length in whole words, each little-endian uint32 word becomes the zigzag code of ``word -
    reference word`` (mod 2**32); left-over bytes are XORed. For a trained state dict against the global
    model it came from (same names, shapes and dtypes, so the same safetensors layout) the header words
    are 0 and a float32 weight that moved a little differs from its old bit pattern by a small integer,
    whose high bits are 0 - which :func:`shuffle` then lines up for the compressor (raw float32 weights barely
    compress).
    """
    a = np.frombuffer(body, dtype=np.uint8).copy()
    n = min(len(a), len(reference))
    w = 8 + max(n - 8, 0) // 4 * 4
    ref = np.frombuffer(reference, dtype=np.uint8, count=n)
    d = (a[8:w].view("<u4") - ref[8:w].view("<u4")).view("<i4")
    a[8:w] = ((d << 1) ^ (d >> 31)).view(np.uint8)
    a[w:n] ^= ref[w:n]
    return a.tobytes()


def delta_decode(coded: bytes, reference: bytes) -> bytes:
    """Inverse of :func:`delta_code`."""
    a = np.frombuffer(coded, dtype=np.uint8).copy()
    n = min(len(a), len(reference))
    w = 8 + max(n - 8, 0) // 4 * 4
    ref = np.frombuffer(reference, dtype=np.uint8, count=n)
    z = a[8:w].view("<u4")
    a[8:w] = (((z >> 1) ^ (np.uint32(0) - (z & np.uint32(1)))) + ref[8:w].view("<u4")).view(np.uint8)
    a[w:n] ^= ref[w:n]
    return a.tobytes()


def _shuffle_span(data: bytes) -> tuple[int, int]:
    """``(start, end)``: the bytes :func:`shuffle` permutes, whole groups of eight 32-bit words (so each bit
    plane is whole bytes) after the safetensors header.

    The header length is read from the first 8 bytes, which neither shuffling nor :func:`delta_code`
    changes, so both sides agree on the span whatever the bytes are.
    """
    start = 8
    if len(data) >= 8:
        n = int.from_bytes(data[:8], "little")
        start = 8 + n if n <= len(data) - 8 else 8
    start = min(start, len(data))
    return start, start + (len(data) - start) // 32 * 32


def shuffle(data: bytes) -> bytes:
    """Bit-transpose the 32-bit words after the safetensors header (lossless; inverse :func:`unshuffle`).

    All words' bit 31 first, then all bit 30, ...: float32 sign and exponent bits (and the zero high bits
    of :func:`delta_code`'s small differences) become long runs that LZMA2 squeezes.
    """
    start, end = _shuffle_span(data)
    if end == start:
        return bytes(data)
    words = np.frombuffer(data, dtype="<u4", count=(end - start) // 4, offset=start)
    bits = np.unpackbits(words.astype(">u4").view(np.uint8).reshape(-1, 4), axis=1)  # (words, 32), MSB first
    return bytes(data[:start]) + np.packbits(bits.T).tobytes() + bytes(data[end:])


def unshuffle(data: bytes) -> bytes:
    """Inverse of :func:`shuffle`, chunk by chunk of words (the bit matrix of the whole body would cost 8 x its size)."""
    start, end = _shuffle_span(data)
    if end == start:
        return bytes(data)
    n = (end - start) // 4  # a multiple of 8: each bit plane is n / 8 whole bytes
    planes = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start).reshape(32, n // 8)
    out = np.empty(n, dtype="<u4")
    step = _UNSHUFFLE_CHUNK_WORDS  # a multiple of 8
    for a in range(0, n, step):
        b = min(a + step, n)
        bits = np.unpackbits(planes[:, a // 8:b // 8], axis=1)  # (32, b - a), bit 31 first
        out[a:b] = np.ascontiguousarray(np.packbits(bits.T, axis=1)).view(">u4").ravel()
    return bytes(data[:start]) + out.tobytes() + bytes(data[end:])


def body_cap(*tensor_sets: Mapping[str, Any]) -> int:
    """The largest legitimate body for tensors of these shapes and dtypes (tensors or ``TensorSpec`` objects, one
    body's sets together, e.g. an update's state and extras): their data bytes, plus
    :data:`BODY_CAP_PER_TENSOR` per tensor and :data:`BODY_CAP_SLACK` for the safetensors header."""
    total = BODY_CAP_SLACK
    for tensors in tensor_sets:
        for t in tensors.values():
            total += math.prod(t.shape) * t.dtype.itemsize + BODY_CAP_PER_TENSOR
    return total


def frame_cap(max_body: int) -> int:
    """The largest legitimate frame (prefix, header, body as sent) whose body is at most ``max_body`` bytes
    decoded: the prefix, :data:`MAX_HEADER_BYTES` and the body plus LZMA2's worst-case expansion of data it
    cannot compress (a 3-byte header per 64 KiB chunk of stored data, and the stream's end; delta coding and the
    shuffle keep the length). Sizes the broker's packet limit (:mod:`neurofed.broker.secure`)."""
    return _PREFIX.size + MAX_HEADER_BYTES + max_body + 3 * (max_body // (64 << 10) + 1) + 64


#: Body compression (flag bit 0): a raw LZMA2 stream (no container; the header has length and hash). lc=lp=pb=0
#: suits bit-shuffled words (no byte-position or literal context to learn); a 1 MiB window bounds the
#: decoder's memory. Part of the wire format.
LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": 1 << 20, "lc": 0, "lp": 0, "pb": 0}]


def compress_body(data: bytes) -> bytes:
    """The compressed form of a (coded) body: a raw LZMA2 stream with :data:`LZMA_FILTERS`."""
    return lzma.compress(data, format=lzma.FORMAT_RAW, filters=LZMA_FILTERS)


def decompress_body(data: bytes, limit: int) -> bytes:
    """Inverse of :func:`compress_body`, never producing more than ``limit`` bytes (a compression bomb is refused)."""
    try:
        d = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=LZMA_FILTERS)
        out = d.decompress(data, limit + 1)
    except lzma.LZMAError as exc:
        raise ProtocolError(f"compressed body is corrupt ({exc})") from None
    if len(out) > limit or (not d.eof and not d.needs_input):
        raise ProtocolError("compressed body expands beyond its declared length")
    if not d.eof or d.unused_data:
        raise ProtocolError("compressed body is truncated or followed by stray bytes")
    return out


def transmitted_body(payload: bytes, limit: int = DEFAULT_MAX_MESSAGE_BYTES) -> bytes:
    """The body of a framed message as coded on the wire but decompressed (delta-coded and shuffled if its
    flags say so), b"" if ``payload`` is not a frame; nothing is validated (for the wire audit)."""
    try:
        magic, _, flags, hlen = _PREFIX.unpack_from(payload)
        if magic != MAGIC:
            return b""
        body = bytes(payload[_PREFIX.size + hlen:])
        return decompress_body(body, limit) if flags & FLAG_LZMA else body
    except (struct.error, ProtocolError):
        return b""


def encode(msg: _Msg, tensors: dict[str, Tensor] | None = None, compress: bool = False,
           reference: bytes | None = None) -> bytes:
    """Frame ``msg`` (and its tensors) for the wire; fills ``body_len``/``body_sha256``.

    The header is :func:`encode_header`'s compact JSON, raw-deflated with :data:`HEADER_DICT` (flag bit 3).
    ``reference``: safetensors bytes both sides hold (an update's: the global model it trained from,
    ``tensors_to_bytes(pack({"state": global}))``); the body is sent delta-coded against it
    (:func:`delta_code`, flag bit 1). ``compress``: the body is bit-shuffled (:func:`shuffle`, flag bit 2)
    and LZMA2-compressed (:func:`compress_body`, flag bit 0). Length and hash stay those of the plain body.
    """
    body = tensors_to_bytes(tensors) if tensors is not None else b""
    if BODY_REQUIRED.get(msg.kind) and tensors is None:  # type: ignore[attr-defined]
        raise ProtocolError(f"a {msg.kind} message needs tensors")  # type: ignore[attr-defined]
    msg = msg.model_copy(update={"body_len": len(body), "body_sha256": sha256(body) if body else ""})
    header, flags = _deflate_header(encode_header(msg)), FLAG_HEADER
    if reference is not None and body:
        body, flags = delta_code(body, reference), flags | FLAG_DELTA
    if compress and body:
        body, flags = compress_body(shuffle(body)), flags | FLAG_SHUFFLE | FLAG_LZMA
    return _PREFIX.pack(MAGIC, SCHEMA_VERSION, flags, len(header)) + header + body


def peek(payload: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """The validated header of a framed message, its body left unread (e.g. to pick the reference a delta-coded
    asynchronous update needs, or to refuse a stale one before decoding its body). Raises ProtocolError as
    :func:`decode` does for the frame and header."""
    return _header(payload, max_bytes)[1]


def _header(payload: bytes, max_bytes: int) -> tuple[bytes, Any, int, bytes]:
    """``(payload, header message, flags, body as sent)`` of a frame (prefix and header checked)."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise ProtocolError("payload is not bytes")
    payload = bytes(payload)
    if len(payload) > max_bytes:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds the limit of {max_bytes}")
    if len(payload) < _PREFIX.size:
        raise ProtocolError(f"payload of {len(payload)} bytes is shorter than the frame prefix")
    magic, version, flags, hlen = _PREFIX.unpack_from(payload)
    if magic != MAGIC:
        raise ProtocolError("bad magic: not a NeuroFed message")
    if version != SCHEMA_VERSION:
        raise ProtocolError(f"unsupported schema version {version} (this build speaks {SCHEMA_VERSION})")
    if flags & ~FLAGS:
        raise ProtocolError(f"unknown frame flags {flags:#x}")
    if hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > len(payload):
        raise ProtocolError(f"header length {hlen} does not fit the payload")
    raw = payload[_PREFIX.size:_PREFIX.size + hlen]
    body = payload[_PREFIX.size + hlen:]
    if flags & FLAG_HEADER:
        raw = _inflate_header(raw)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        msg = _ADAPTER.validate_python(doc)
    except ProtocolError:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"header is not valid JSON ({type(exc).__name__})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ProtocolError(f"header fails the schema at {where or '<root>'}: {first.get('msg')}") from None
    return payload, msg, flags, body


def decode(payload: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
           reference: bytes | None = None,
           max_body: int | Callable[[Any], int] | None = None) -> tuple[Any, dict[str, Tensor] | None]:
    """Parse and verify a framed message: ``(message model, tensors or None)``.

    ``reference``: the bytes a delta-coded body (flag bit 1) was coded against; such a body without
    a reference is refused. Header fields left out are filled with their defaults.
    ``max_body``: the largest body (decoded length) the caller accepts, or a function of the validated header
    (per message kind) giving it; None is :data:`DEFAULT_MAX_BODY_BYTES`. A header declaring more is refused
    before any decompression, and the body is never decompressed past its declared length (a compression
    bomb costs at most the cap, not what its header claims). The header is capped at :data:`MAX_HEADER_BYTES`,
    compressed and inflated.

    Raises
    ------
    ProtocolError
        Oversized payload, bad magic/version/flags, header not valid JSON or not a known schema,
        body length or SHA-256 mismatch, body not safetensors, body missing or unexpected.
    """
    payload, msg, flags, body = _header(payload, max_bytes)
    cap = max_body(msg) if callable(max_body) else max_body
    cap = DEFAULT_MAX_BODY_BYTES if cap is None else int(cap)
    if msg.body_len > cap:
        raise ProtocolError(f"{msg.kind} body declared as {msg.body_len} bytes exceeds the cap of {cap}")
    if msg.body_len and BODY_REQUIRED[msg.kind] is False:
        raise ProtocolError(f"a {msg.kind} message must not carry a body")
    if flags & FLAG_LZMA:
        body = decompress_body(body, msg.body_len)
    if len(body) != msg.body_len:
        raise ProtocolError(f"body is {len(body)} bytes, header says {msg.body_len}")
    if flags & FLAG_SHUFFLE:
        body = unshuffle(body)
    if flags & FLAG_DELTA:
        if reference is None:
            raise ProtocolError("delta-coded body, but no reference model to decode it against")
        body = delta_decode(body, reference)
    if not body:
        if BODY_REQUIRED[msg.kind]:
            raise ProtocolError(f"a {msg.kind} message must carry tensors")
        return msg, None
    if BODY_REQUIRED[msg.kind] is False:
        raise ProtocolError(f"a {msg.kind} message must not carry a body")
    if sha256(body) != msg.body_sha256:
        raise ProtocolError("body SHA-256 does not match the header (corrupt or tampered)")
    return msg, bytes_to_tensors(body)


def _reject_constant(name: str) -> None:
    raise ProtocolError(f"header contains {name}, which is not allowed")


def new_id() -> str:
    """A fresh 32-hex message / task id."""
    return uuid.uuid4().hex


__all__ = [
    "COORDINATOR_ID",
    "DEFAULT_MAX_BODY_BYTES",
    "SCHEMA_VERSION",
    "ErrorMsg",
    "EvalMsg",
    "EvalReportMsg",
    "JoinMsg",
    "ModelMsg",
    "ModelSpec",
    "ProtocolError",
    "ResultMsg",
    "SaInboxMsg",
    "SaKeysMsg",
    "SaMaskedMsg",
    "SaRevealMsg",
    "SaRosterMsg",
    "SaSharesMsg",
    "SaUnmaskMsg",
    "SecAggSpec",
    "StatusMsg",
    "TaskMsg",
    "Topics",
    "UpdateMsg",
    "body_cap",
    "frame_cap",
    "bytes_to_tensors",
    "decode",
    "delta_reference",
    "encode",
    "encode_header",
    "new_id",
    "pack",
    "peek",
    "sha256",
    "state_sha256",
    "tensors_to_bytes",
    "transmitted_body",
    "unpack",
]
