"""The options of one ``neurofed simulate`` run as a validated schema, independent of typer.

A grid spec line (``experiments/*.txt``: ``NAME <neurofed simulate options>``) is parsed here into
:class:`SimOptions` (a pydantic model: one field per ``neurofed simulate`` option, strategy parameters included,
from :data:`neurofed.trainer.fl.strategies.PARAMS`), and :meth:`SimOptions.to_sim_config` turns the options into
the validated :class:`~neurofed.trainer.experiments.simulate.SimConfig` (unset training options take the preset's
values). ``neurofed simulate`` builds its SimConfig through the same method, so both read options alike.

Errors are :class:`SpecError` (a ``ValueError``) with one line naming the option.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from neurofed.trainer.attacks import ATTACKS
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import parse_subjects
from neurofed.trainer.data.profiles import parse_assignment
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.partition import parse_partition
from neurofed.trainer.experiments.simulate import SimConfig
from neurofed.trainer.fl.algorithms.classical import CLASSICAL_MODELS
from neurofed.trainer.fl.byzantine import Byzantine
from neurofed.trainer.fl.fedbuff import check_async
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import PARAMS
from neurofed.trainer.fl.vectorised import ENGINES
from neurofed.trainer.presets import get_preset


class SpecError(ValueError):
    """A bad option value; ``param_hint`` names the option (``--preset``) when one is to blame."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param_hint = param_hint

    def __str__(self) -> str:
        return f"Invalid value for {self.param_hint}: {self.message}" if self.param_hint else self.message


def int_list(value: str, option: str) -> list[int]:
    """``"0,1, 2"`` -> [0, 1, 2]; a clear error naming ``option`` for anything but comma-separated integers."""
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{option} {value!r}: expected comma-separated integers, e.g. '2' or '0,1'") from None


def name_list(value: str | None) -> list[str]:
    """``"fedbs, safe,"`` -> ["fedbs", "safe"]: a comma-separated option's names, blanks dropped (None -> [])."""
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def attack_list(spec: str | None) -> list[list]:
    """``pgd:0.03,fgsm:0.01`` -> [["pgd", 0.03], ["fgsm", 0.01]] (names: :data:`neurofed.trainer.attacks.ATTACKS`)."""
    if not spec:
        return []
    out = []
    for part in spec.split(","):
        name, _, eps = part.partition(":")
        if name not in ATTACKS or not eps:
            raise SpecError(f"attack {part!r}: use NAME:EPS with NAME one of {', '.join(ATTACKS)}")
        out.append([name, float(eps)])
    return out


def preprocess_from_options(channels: str, resample: float | None, ea: bool, fmin: float, fmax: float,
                            tmin: float, tmax: float) -> PreprocessConfig:
    return PreprocessConfig.from_preset(channels, resample=resample, ea=ea, fmin=fmin, fmax=fmax, tmin=tmin, tmax=tmax)


class _SimOptionsBase(BaseModel):
    """The options of ``neurofed simulate`` (defaults as there; None: the preset's value)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    algorithm: str = "fedbs"
    preset: str = "published"
    model: str = "eegnet"
    subjects: str = "all"
    protocol: str = "loso"
    test_subjects: str | None = None
    rounds: int | None = None
    fraction: float | None = None
    local_epochs: int | None = None
    batch_size: int | None = None
    ct_batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    augment: str | None = None
    distill_from: str | None = None
    distill_weight: float = 0.5
    seeds: str = "0"
    channels: str | None = None
    resample: float | None = None
    ea: bool = True
    fmin: float = 8.0
    fmax: float = 30.0
    tmin: float = 0.0
    tmax: float = 4.0
    attack: str | None = None
    byzantine: str | None = None
    test_batch: int = 8
    eval_every: int = 10
    workers: int = 1
    threads: int | None = None
    fold_seed: int = 0
    folds: str | None = None
    save_models: bool = False
    engine: str = "vectorised"
    mode: str = "sync"
    buffer_k: int = 10
    max_staleness: int = 10
    online_fraction: float = 0.3
    session_mean: float = 10.0
    train_time: float = 1.0
    async_server_lr: float = 1.0
    async_reveal: int = 0
    async_window: int = 0
    partition: str = "subject"
    data_dir: str | None = None
    out: Path = Path("runs/simulate")
    profiles: str | None = None
    profile_seed: int = 0
    profile_channels: str = "own"
    only_profile: str | None = None
    noise_seed: int = 0

    def to_sim_config(self, warn: Callable[[str], None] | None = None) -> SimConfig:
        """The validated :class:`SimConfig` of these options (``warn``: shown the preset's caveat, if any).

        Raises
        ------
        SpecError
            A bad value or combination, naming the option.
        """
        o = self
        try:
            pre_set = get_preset(o.preset)
        except ValueError as exc:
            raise SpecError(str(exc), "--preset") from None
        if pre_set.caveat and warn is not None:
            warn(f"preset {pre_set.name}: {pre_set.caveat}")

        def pick(v, d):
            return d if v is None else v

        resample = pick(o.resample, pre_set.resample)
        profiles, channels = o.profiles, o.channels
        if profiles and channels is not None:
            raise SpecError("--channels does not combine with --profiles (each profile has its channels; "
                            "use --profile-channels intersection)", "--channels")
        pre = preprocess_from_options("all" if profiles else pick(channels, pre_set.channels), resample or None, o.ea,
                                      o.fmin, o.fmax, o.tmin, o.tmax)
        if profiles and pre.resample is None:
            raise SpecError("--profiles needs --resample (the model's rate, where all devices meet)")
        protocol = o.protocol
        if o.test_subjects is not None:
            if o.test_subjects.lower() != "none":
                raise SpecError("--test-subjects takes only 'none' (use --protocol for held-out subjects)")
            protocol = "none"
        p = pre_set.local
        try:
            local = LocalConfig(pick(o.lr, p.lr), pick(o.momentum, p.momentum), pick(o.weight_decay, p.weight_decay),
                                pick(o.batch_size, p.batch_size), pick(o.local_epochs, p.local_epochs),
                                pick(o.augment, p.augment))
        except ValueError as exc:
            if o.augment and str(exc).startswith("augment"):
                raise SpecError(str(exc), "--augment") from None
            raise
        if local.augment and o.algorithm in CLASSICAL_MODELS:
            raise SpecError(f"--algorithm {o.algorithm} is fitted from summed statistics, not trained on batches: "
                            "nothing to augment", "--augment")
        distill_from = [r.strip() for r in (o.distill_from or "").split(",") if r.strip()]
        if distill_from:
            if o.algorithm in CLASSICAL_MODELS:
                raise SpecError(f"--algorithm {o.algorithm} is fitted from summed statistics: nothing to distil into",
                                "--distill-from")
            if not 0.0 < o.distill_weight <= 1.0:
                raise SpecError(f"use a weight in (0, 1], got {o.distill_weight:g}", "--distill-weight")
            if o.byzantine or o.mode != "sync" or o.profiles:
                raise SpecError("distillation runs in synchronous federations of one device profile without "
                                "simulated attackers", "--distill-from")
        subject_ids = parse_subjects(o.subjects, o.data_dir)
        assignment: dict[str, str] = {}
        only_profile = o.only_profile
        if profiles:
            try:
                assignment = {str(k): v for k, v in parse_assignment(profiles, subject_ids, o.profile_seed).items()}
            except NeuroFedError as exc:
                raise SpecError(str(exc), "--profiles") from None
            if only_profile and only_profile not in assignment.values():
                raise SpecError(f"no subject has profile {only_profile!r}", "--only-profile")
        elif only_profile:
            raise SpecError("--only-profile needs --profiles", "--only-profile")
        if o.profile_channels not in ("own", "intersection", "interpolate"):
            raise SpecError("use own, intersection or interpolate", "--profile-channels")
        try:
            parse_partition(o.partition)
        except ValueError as exc:
            raise SpecError(str(exc), "--partition") from None
        folds = o.folds
        model, rounds, fraction = o.model, pick(o.rounds, pre_set.rounds), pick(o.fraction, pre_set.fraction)
        if o.algorithm in CLASSICAL_MODELS:  # fitted from summed statistics: its model, two rounds, every client
            if o.model not in ("eegnet", CLASSICAL_MODELS[o.algorithm]):
                raise SpecError(f"--algorithm {o.algorithm} trains model {CLASSICAL_MODELS[o.algorithm]}, not "
                                f"{o.model}", "--model")
            model, rounds, fraction = CLASSICAL_MODELS[o.algorithm], pick(o.rounds, 2), pick(o.fraction, 1.0)
        strategy_overrides = {k: getattr(o, k) for k in PARAMS if getattr(o, k, None) is not None}
        cfg = SimConfig(
            algorithm=o.algorithm, model=model, subjects=subject_ids, protocol=protocol,
            rounds=rounds, fraction=fraction,
            seeds=int_list(o.seeds, "--seeds"), local=local.to_dict(),
            ct_batch_size=pick(o.ct_batch_size, pre_set.ct_batch_size), preprocess=pre.to_dict(),
            test_batch=o.test_batch, eval_every=o.eval_every, attacks=attack_list(o.attack),
            byzantine=o.byzantine, strategy_overrides=strategy_overrides,
            data_dir=o.data_dir, fold_seed=o.fold_seed, profiles=assignment,
            profile_channels=o.profile_channels, only_profile=only_profile, noise_seed=o.noise_seed,
            folds=sorted(set(int_list(folds, "--folds"))) if folds else [],
            partition=o.partition, save_models=bool(o.save_models), engine=o.engine,
            distill_from=distill_from, distill_weight=float(o.distill_weight) if distill_from else 0.5,
            mode=o.mode, buffer_k=o.buffer_k, max_staleness=o.max_staleness, online_fraction=o.online_fraction,
            session_mean=o.session_mean, train_time=o.train_time, async_server_lr=o.async_server_lr,
            async_reveal=o.async_reveal, async_window=o.async_window,
        )
        if o.mode not in ("sync", "async"):
            raise SpecError("use sync or async", "--mode")
        if o.mode == "async":  # NeuroFedError (one line, exit 2): a strategy or setting the async mode cannot run
            cfg.async_config()
            check_async(cfg.strategy())
        if o.engine not in ENGINES:
            raise SpecError(f"use one of {', '.join(ENGINES)}", "--engine")
        try:
            st = cfg.strategy()  # validate overrides before any work
            st.model_kwargs(cfg.model)  # e.g. --local-bn-mode needs fleeg_eegnet
            if not st.centralised:
                st.check_participation(cfg.fraction)  # GA needs every client in every round
            clash = [k for k in ("moon_mu", "ga_step", "fedbm_temperature") if st.settings.get(k)]
            if distill_from and clash:  # their losses read class indices, not the soft targets
                raise SpecError(f"distillation does not combine with {', '.join(clash)} (its loss needs class "
                                "indices)", "--distill-from")
            if o.byzantine:
                Byzantine.parse(o.byzantine)
        except SpecError:
            raise
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        return cfg


#: The schema: ``neurofed simulate``'s options plus one optional field per registered strategy parameter.
SimOptions = create_model(  # type: ignore[call-overload]
    "SimOptions", __base__=_SimOptionsBase, **{p.name: (p.type | None, None) for p in PARAMS.values()}
)


def _flags() -> tuple[dict[str, str], dict[str, tuple[str, bool]]]:
    """``--flag`` -> field of the options taking a value, and ``--flag`` -> (field, value) of the switches
    (spelled as ``neurofed simulate`` spells them)."""
    valued: dict[str, str] = {}
    switches: dict[str, tuple[str, bool]] = {}
    for name, f in SimOptions.model_fields.items():
        prm = PARAMS.get(name)
        decl = (prm.flag if prm is not None and prm.flag else None) or f"--{name.replace('_', '-')}"
        if f.annotation in (bool, bool | None):
            on, _, off = decl.partition("/")
            switches[on] = (name, True)
            switches[off or f"--no-{on[2:]}"] = (name, False)
        else:
            valued[decl] = name
    return valued, switches


def options_of_line(opts: str) -> dict[str, Any]:
    """The ``--flag value`` / ``--flag=value`` / ``--switch`` / ``--no-switch`` options of a spec line, by field
    name (the last one wins, as on the command line); values stay text for :class:`SimOptions` to validate."""
    valued, switches = _flags()
    try:
        args = shlex.split(opts)
    except ValueError as exc:
        raise SpecError(f"cannot split the options ({exc})") from None
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        if flag in switches and not eq:
            name, on = switches[flag]
            out[name] = on
        elif flag in valued:
            if not eq:
                if i + 1 >= len(args):
                    raise SpecError(f"option {flag} requires an argument")
                i += 1
                value = args[i]
            out[valued[flag]] = value
        elif arg.startswith("-"):
            raise SpecError(f"no such option: {flag}")
        else:
            raise SpecError(f"unexpected argument {arg!r} (options only: --name value)")
        i += 1
    return out


def parse_options(values: Mapping[str, Any]) -> _SimOptionsBase:
    """Validated :class:`SimOptions` of option values by field name (text or typed)."""
    try:
        return SimOptions.model_validate(dict(values))
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        flag = f"--{name.replace('_', '-')}" if name else "options"
        got = f" {first['input']!r}" if "input" in first and not isinstance(first["input"], dict) else ""
        raise SpecError(f"{flag}{got}: {first['msg']}") from None


def parse_line(opts: str) -> _SimOptionsBase:
    """A spec line's options (without its run name) -> validated :class:`SimOptions`."""
    return parse_options(options_of_line(opts))


__all__ = ["SimOptions", "SpecError", "attack_list", "int_list", "name_list", "options_of_line", "parse_line",
           "parse_options", "preprocess_from_options"]
