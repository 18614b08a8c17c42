"""Coordinator configuration: ``federation.toml`` -> validated, frozen pydantic models (unknown keys rejected).

Example::

    [federation]
    name = "demo"
    rounds = 3
    fraction = 0.5
    seed = 0
    min_clients = 4
    round_deadline_s = 60
    strategy = "fedbs"
    private_metadata = false  # true: no participants / loss on the retained result

    [model]
    name = "eegnet"
    classes = ["left_fist", "right_fist"]
    source_sfreq = 160.0

    [preprocess]
    channels = "sensorimotor21"
    resample = 80.0

    [local]                   # defaults: the published protocol (neurofed.trainer.fl.local.LocalConfig)
    lr = 0.05
    batch_size = 8

    [secagg]                  # used when [federation] secure_aggregation = true (docs/security.md)
    neighbours = 0            # SecAgg+ degree k; 0 = 2 ceil(1.5 log2 n), capped at n - 1 (complete graph)
    threshold = 0.5           # shares t = floor(threshold * k) + 1 of k
    bound = 8.0               # clients clamp each update coordinate to [-bound, bound]
    phase_s = 30.0            # wait for keys, masked inputs after the deadline, and unmask replies

    [validation]
    max_message_mb = 16
    max_client_messages = 100 # per client and round, else cut off until the next round ("rate_limited"); 0 = off
    # max_client_mb = 2       # per client and round ("volume_limited"); unset: 4 x the largest update + 1 MiB
    norm_bound = 0.0          # L2 bound on (update - global); 0 = off
    norm_action = "clip"      # or "reject"
    max_update_ratio = 10.0   # reject ||update - global|| > 10 x ||global|| (absurd / scaled updates); 0 = off

    [async]                   # used when [federation] mode = "async" (docs/async.md)
    buffer_k = 10             # accepted updates per new model version
    max_staleness = 10        # older updates are rejected "stale"
    server_lr = 1.0

    [release]                 # federated validation and signed releases (async mode; docs/howto)
    every = 0                 # versions between candidates; 0 = off
    min_clients = 2           # validating clients a release needs
    margin = 0.02             # candidate may be at most this much worse (mean paired BCA) than the release
    # key = "keys/release.key"  # sign and publish each release (retained on neurofed/<name>/release)

    [output]
    dir = "runs/federation"
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from neurofed.broker.protocol import NAME_PATTERN, ModelSpec
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.profiles import ProfileError, get_profile
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.fedbuff import AsyncRefused, check_async
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import MODEL_NAMES, PER_DEVICE_MODELS


class ConfigError(NeuroFedError, ValueError):
    """federation.toml is missing, unreadable or invalid."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FederationSection(_Frozen):
    name: str = Field(default="neurofed", pattern=NAME_PATTERN, description="topic namespace neurofed/<name>/...")
    rounds: int = Field(default=3, ge=1, le=100_000, description="communication rounds")
    fraction: float = Field(default=0.5, gt=0, le=1, description="clients per round = max(1, floor(fraction x joined))")
    seed: int = Field(default=0, ge=0, description="client selection and local-training seeds (as neurofed simulate --seeds)")
    min_clients: int = Field(default=2, ge=1, description="training clients (not --evaluate ones) that must join "
                                                         "before round 1")
    join_timeout_s: float = Field(default=300.0, gt=0, description="how long to wait for them (s)")
    round_deadline_s: float = Field(default=120.0, gt=0, description="a round closes at its deadline with the updates received (s)")
    min_updates: int = Field(default=1, ge=1, description="fewer updates by the deadline: the round is re-issued")
    max_round_retries: int = Field(default=3, ge=0, description="re-issues of a round before giving up")
    strategy: str = Field(default="fedbs", description="a registered algorithm (`neurofed algorithms`): fedavg, fedprox, "
                          "scaffold, moon, fedbn, fedbs, safe, ...")
    strategy_overrides: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="the strategy's parameters for ablations and compositions, e.g. "
        "{sam_rho = 0.0}, {prox_mu = 1.0} (the strategy options of neurofed simulate --help)")
    compress: bool = Field(default=True, description="bit-shuffle and LZMA2-compress tensor bodies (lossless; docs/protocol.md)")
    aggregation: Literal["exact", "streaming"] = Field(
        default="exact", description="exact: server_update over all updates sorted by id (bit-reproducible); "
        "streaming: the same aggregator fed as updates arrive, O(model) memory (same maths, arrival summation order)")
    profiles: list[str] = Field(
        default_factory=list, max_length=64, description="device profiles of a hierarchical federation (shipped "
        "names or profile .json paths; needs a strategy with group keys, e.g. fleeg, and model fleeg_eegnet, "
        "fleeg_proj_eegnet or fleeg_fixmap_eegnet)")
    secure_aggregation: bool = Field(
        default=False, description="SecAgg+ over MQTT: clients upload pairwise-masked updates, the coordinator "
        "decodes only their trial-weighted sum ([secagg] settings; plain weighted mean only, see docs/security.md)")
    private_metadata: bool = Field(
        default=False, description="keep per-client metadata off topics every client can read: the retained "
        "result carries no participant list and no loss (both stay in the coordinator's metrics.json)")
    mode: Literal["sync", "async"] = Field(
        default="sync", description="sync: rounds of selected clients; async: buffered asynchronous aggregation "
        "for a long-lived federation ([async] settings, docs/async.md): clients train whenever they are online, "
        "every buffer_k updates make a new model version, and rounds counts versions")

    @model_validator(mode="after")
    def _strategy_exists(self) -> FederationSection:
        try:
            get_strategy(self.strategy, **self.strategy_overrides).check_participation(self.fraction)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"strategy: {exc}") from None
        return self


class ModelSection(_Frozen):
    name: Literal[MODEL_NAMES] = Field(  # type: ignore[valid-type]  # the registry's names (neurofed.trainer.models)
        default="eegnet", description="architecture; the fleeg_* models need federation.profiles")
    classes: list[str] = Field(default_factory=lambda: ["left_fist", "right_fist"], min_length=2,
                               description="class names in logit order")
    source_sfreq: float = Field(default=160.0, gt=0, description="recording rate, used when preprocess.resample is unset")
    test_batch_size: int = Field(default=8, ge=1, description="batch size of batch-specific BN at evaluation and inference")


class ValidationSection(_Frozen):
    max_message_mb: float = Field(default=16.0, gt=0, description="larger messages are rejected")
    max_client_messages: int = Field(
        default=100, ge=0, description="messages one client may send per round (join, status, update, error, "
        "secure-aggregation steps; the join phase before the first round is a round too): more cut it off for the "
        "rest of the round, unread ('rate_limited'); an honest client sends fewer than 10; 0 = off")
    max_client_mb: float | None = Field(
        default=None, ge=0, description="payload MiB one client may send per round: more cut it off for the rest "
        "of the round ('volume_limited'); unset: 4 x the largest update the model allows + 1 MiB; 0 = off")
    norm_bound: float = Field(default=0.0, ge=0, description="L2 bound on (update - global); 0 = off")
    norm_action: Literal["clip", "reject"] = Field(default="clip", description="what happens to an update beyond "
                                                   "norm_bound")
    max_update_ratio: float = Field(
        default=10.0, ge=0, description="reject an update whose L2 distance from the global model exceeds this "
        "multiple of the global model's L2 norm (floating entries; 0 = off). Honest EEGNet updates measure "
        "0.003-0.38 x (studies/update_norms/update_norm_ratio.py); this catches absurd (e.g. 1000x scaled) updates without per-round buffering")


class SecAggSection(_Frozen):
    neighbours: int = Field(default=0, ge=0, description="SecAgg+ degree k (0: 2 ceil(1.5 log2 n), at most n - 1)")
    threshold: float = Field(default=0.5, gt=0, lt=1, description="t = floor(threshold * k) + 1 shares of k")
    bound: float = Field(default=8.0, gt=0, le=2**20, description="clients clamp each update coordinate to "
                         "[-bound, bound] (fixes the fixed-point scale: 2^(30 - ceil(log2 bound)))")
    phase_s: float = Field(default=30.0, gt=0, description="seconds to wait for keys, for masked inputs after the "
                           "round deadline, and for unmask replies")


class AsyncSection(_Frozen):
    buffer_k: int = Field(default=10, ge=1, le=100_000, description="federation.mode = async: accepted updates per "
                          "aggregation (K); each aggregation makes a new model version")
    max_staleness: int = Field(default=10, ge=0, le=10_000, description="largest accepted staleness (versions "
                               "made since the update's base version); older updates are rejected 'stale' and the "
                               "client is told; the coordinator keeps this many + 1 versions")
    server_lr: float = Field(default=1.0, gt=0, le=100, description="server step on the buffer's weighted mean "
                             "delta (weights n_i / sqrt(1 + staleness_i); 1 = FedAvg's mean at zero staleness)")


class ReleaseSection(_Frozen):
    every: int = Field(default=0, ge=0, le=1_000_000, description="federation.mode = async: every this many model "
                       "versions (and at the last) the version becomes a candidate that the validating clients "
                       "(edge-client join --evaluate) evaluate; 0 = no federated validation, no releases")
    min_clients: int = Field(default=2, ge=1, description="a candidate becomes a release only if at least this many "
                             "clients validated it")
    margin: float = Field(default=0.02, ge=0, le=1, description="... and if its mean paired BCA difference to the "
                          "current release (per client, candidate - release) is not below -margin")
    wait_s: float = Field(default=60.0, gt=0, le=86_400, description="seconds to collect validation reports (it "
                          "closes earlier when every validating client online at the request answered)")
    dir: str = Field(default="", description="release folder: history.json (every decision and its statistics), "
                     "the releases' weights, signed graphs ('' = <output dir>/releases)")
    key: str = Field(default="", description="Ed25519 private key (neurofed release keygen): each release is "
                     "exported as a standalone ONNX graph (one per device profile), signed and published retained "
                     "on neurofed/<name>/release for edge-client infer --follow; '' = releases are recorded, not "
                     "published")


class OutputSection(_Frozen):
    dir: str = Field(default="runs/federation", description="checkpoints, metrics.json and the final model "
                     "(neurofed coordinator --out overrides it)")
    checkpoint_every: int = Field(default=1, ge=1, description="rounds between server-state checkpoints (atomic)")


class FederationConfig(_Frozen):
    """The whole coordinator configuration."""

    federation: FederationSection = FederationSection()
    model: ModelSection = ModelSection()
    preprocess: dict[str, Any] = Field(default_factory=lambda: {"channels": "sensorimotor21", "resample": 80.0})
    local: dict[str, float | int] = Field(default_factory=dict)
    validation: ValidationSection = ValidationSection()
    secagg: SecAggSection = SecAggSection()
    async_: AsyncSection = Field(default=AsyncSection(), alias="async")
    release: ReleaseSection = ReleaseSection()
    output: OutputSection = OutputSection()

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @field_validator("preprocess")
    @classmethod
    def _pre(cls, v: dict[str, Any]) -> dict[str, Any]:
        _preprocess_config(v)
        return v

    @model_validator(mode="after")
    def _profiles(self) -> FederationConfig:
        fed, grouped = self.federation, bool(self.strategy().group_prefixes)
        if self.release.every and fed.mode != "async":
            raise ValueError("release.every: federated validation and releases need federation.mode = \"async\"")
        if self.release.key and not self.release.every:
            raise ValueError("release.key: set release.every (versions between candidates) too, or nothing is ever "
                             "released and signed")
        if fed.mode == "async":
            try:
                check_async(self.strategy(), fed.secure_aggregation)
            except AsyncRefused as exc:
                raise ValueError(f"federation.mode: {exc}") from None
        try:
            self.strategy().model_kwargs(self.model.name)
        except ValueError as exc:
            raise ValueError(f"federation.strategy_overrides: {exc}") from None
        if grouped and not fed.profiles:
            raise ValueError(f"federation.strategy {fed.strategy!r} aggregates per device profile: list "
                             "federation.profiles")
        if fed.profiles and not grouped:
            raise ValueError("federation.profiles needs a hierarchical strategy (e.g. strategy = \"fleeg\")")
        if not fed.profiles:
            return self
        if self.model.name not in PER_DEVICE_MODELS:
            raise ValueError("federation.profiles needs a model with a per-device module, model.name = one of "
                             f"{', '.join(PER_DEVICE_MODELS)}; got {self.model.name!r}")
        if len(set(fed.profiles)) != len(fed.profiles):
            raise ValueError(f"federation.profiles lists a profile twice: {fed.profiles}")
        pre = self.preprocess_config()
        if pre.channels is not None:
            raise ValueError("preprocess.channels: with federation.profiles each device keeps its own channels; "
                             "remove the channel list")
        if pre.resample is None:
            raise ValueError("preprocess.resample: with federation.profiles the devices' rates differ; set the "
                             "model's rate")
        names = [p.name for p in self.device_profiles()]
        if len(set(names)) != len(names):
            raise ValueError(f"federation.profiles: two entries define the same profile name ({names})")
        return self

    @field_validator("local")
    @classmethod
    def _local(cls, v: dict[str, float | int]) -> dict[str, float | int]:
        try:
            LocalConfig(**v)
        except TypeError as exc:
            raise ValueError(f"unknown key in [local]: {exc}") from None
        return v

    # ------------------------------------------------------------------ derived objects
    def preprocess_config(self):
        return _preprocess_config(self.preprocess)

    def strategy(self):
        return get_strategy(self.federation.strategy, **self.federation.strategy_overrides)

    def local_config(self):
        return LocalConfig(**self.local)

    def device_profiles(self) -> list:
        """The federation's device profiles (:class:`neurofed.trainer.data.profiles.DeviceProfile`), sorted by name."""

        try:
            return sorted((get_profile(p) for p in self.federation.profiles), key=lambda p: p.name)
        except ProfileError as exc:
            raise ValueError(f"federation.profiles: {exc}") from None

    def model_spec(self, profile: str | None = None) -> ModelSpec:
        """Shape of the federation's model, derived from preprocessing.

        In a hierarchical federation (``federation.profiles``) the shape depends on the device:
        ``profile=None`` gives the federation-wide spec (``n_channels=0``, every profile listed),
        a profile's name that profile's spec (its channels, ``profile`` and its definition).
        """
        pre = self.preprocess_config()
        sfreq = float(pre.resample or self.model.source_sfreq)
        if self.federation.profiles:
            profs = {p.name: p for p in self.device_profiles()}
            if profile is not None and profile not in profs:
                raise ConfigError(f"device profile {profile!r} is not in federation.profiles ({', '.join(profs)})")
            chans = list(profs[profile].channels) if profile is not None else []
            return ModelSpec(
                model=self.model.name, n_channels=len(chans), n_classes=len(self.model.classes),
                n_times=int(round((pre.tmax - pre.tmin) * sfreq)), sfreq=sfreq, bn_mode=self.strategy().bn_mode,
                ch_names=chans, classes=list(self.model.classes), preprocess=pre.to_dict(),
                strategy=self.federation.strategy, profile=profile or "",
                profiles=[p.to_dict() for n, p in profs.items() if profile is None or n == profile],
            )
        if pre.channels is None:
            raise ConfigError("[preprocess] channels must be listed (or a preset) so the model shape is known")
        return ModelSpec(
            model=self.model.name, n_channels=len(pre.channels), n_classes=len(self.model.classes),
            n_times=int(round((pre.tmax - pre.tmin) * sfreq)), sfreq=sfreq, bn_mode=self.strategy().bn_mode,
            ch_names=list(pre.channels), classes=list(self.model.classes), preprocess=pre.to_dict(),
            strategy=self.federation.strategy,
        )


def _preprocess_config(d: dict[str, Any]):
    d = dict(d)
    try:
        ch = d.pop("channels", None)
        if isinstance(ch, str):
            return PreprocessConfig.from_preset(ch, **d)
        if ch is not None:
            d["channels"] = tuple(ch)
        return PreprocessConfig(**d)
    except TypeError as exc:
        raise ValueError(f"unknown key in [preprocess]: {exc}") from None


def load_config(path: str | Path | None) -> FederationConfig:
    """Read and validate a federation TOML file (None = all defaults); every problem in one error."""
    if path is None:
        return FederationConfig()
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such configuration file") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read TOML ({exc})") from None
    return config_from_dict(raw, str(p))


def config_from_dict(raw: dict[str, Any], where: str = "config") -> FederationConfig:
    try:
        return FederationConfig.model_validate(raw)
    except ValidationError as exc:
        probs = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {probs}") from None
