"""``neurofed simulate``: folds x seeds of CT or a federated strategy, resumable, with results.json."""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.attacks import attack_budgets
from neurofed.trainer.checkpoint import ModelMeta, load_checkpoint, save_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_subjects
from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.data.eegmmidb import resolve_data_dir, subjects_root
from neurofed.trainer.data.profiles import (
    channel_intersection,
    get_profile,
    interpolation_matrix,
    load_profile_subject,
)
from neurofed.trainer.errors import DataError, NeuroFedError
from neurofed.trainer.experiments.asyncsim import AsyncConfig, run_async
from neurofed.trainer.experiments.jobs import fold_members, job_checkpoint
from neurofed.trainer.experiments.partition import class_counts, partition_clients
from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.runner import (
    EvalSpec,
    evaluate_subjects,
    global_state_of,
    run_centralised,
    run_federated,
)
from neurofed.trainer.fl.byzantine import Byzantine
from neurofed.trainer.fl.distill import soft_targets, teacher_probabilities
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import CLIPPED_KEY
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import PER_DEVICE_MODELS

logger = logging.getLogger("neurofed.trainer")


@dataclass
class SimConfig:
    """A whole experiment.

    ``rounds`` are communication rounds (federated) or epochs (CT). ``strategy_overrides`` switch
    parts of a strategy on/off (ablations), e.g. ``{"sam_rho": 0.0}``.
    """

    algorithm: str = "fedbs"
    model: str = "eegnet"
    subjects: list[int] = field(default_factory=list)
    protocol: str = "loso"
    rounds: int = 100
    fraction: float = 0.5
    seeds: list[int] = field(default_factory=lambda: [0])
    local: dict = field(default_factory=lambda: LocalConfig().to_dict())
    ct_batch_size: int = 64
    preprocess: dict = field(default_factory=lambda: PreprocessConfig().to_dict())
    test_batch: int = 8
    eval_every: int = 10
    attacks: list[list] = field(default_factory=list)  # [["pgd", 0.03], ...]
    byzantine: str | None = None  # e.g. "0.2:scale:10" (neurofed.trainer.fl.byzantine)
    strategy_overrides: dict = field(default_factory=dict)
    data_dir: str | None = None
    fold_seed: int = 0
    partition: str = "subject"  # subject, dirichlet:BETA[:K], missing-class (neurofed.trainer.experiments.partition)
    #: device profiles (issue 19): subject (as str) -> profile name; empty = every subject on the lab cap
    profiles: dict = field(default_factory=dict)
    #: "own" (each client its profile's channels), "intersection" (every client the channels all profiles share)
    #: or "interpolate" (every client's channels mapped onto the 21 sensorimotor channels by the fixed
    #: spherical-spline matrix, after the usual preprocessing)
    profile_channels: str = "own"
    #: train and evaluate only the subjects of this profile (the device group federated alone); folds unchanged
    only_profile: str | None = None
    noise_seed: int = 0
    #: run only these fold indices of the protocol (a pilot on a subset of folds); empty = all
    folds: list[int] = field(default_factory=list)
    #: also save each held-out job's trained global model beside its JSON (``neurofed sweep`` attacks it later);
    #: output only: a run may be resumed with it switched on or off
    save_models: bool = False
    #: local-training engine: ``vectorised`` (a round's clients as one batched computation, equal to ``sequential``
    #: to float tolerance; falls back to it for what it does not know) or ``sequential`` (one client after the other,
    #: what an edge client runs; the regression hashes). Execution only: a run may be resumed with the other engine
    engine: str = "vectorised"
    #: ensemble distillation (:mod:`neurofed.trainer.fl.distill`): run directories whose saved models of each fold
    #: teach that fold's clients (soft targets with the teachers' weight ``distill_weight``); empty = off
    distill_from: list[str] = field(default_factory=list)
    distill_weight: float = 0.5
    #: ``sync`` (rounds of a selected cohort) or ``async`` (buffered asynchronous aggregation,
    #: :mod:`neurofed.trainer.experiments.asyncsim`; ``rounds`` then counts aggregations, the sequential client path)
    mode: str = "sync"
    #: async: updates per aggregation (K), largest accepted staleness, long-run fraction of time a client is online
    buffer_k: int = 10
    max_staleness: int = 10
    online_fraction: float = 0.3
    #: async: mean online session (simulated time units; a local training takes ``train_time``)
    session_mean: float = 10.0
    train_time: float = 1.0
    async_server_lr: float = 1.0
    #: async: trials newly recorded per session (0 = the whole store from the start); train on the newest N (0 = all)
    async_reveal: int = 0
    async_window: int = 0

    def async_config(self):
        """The :class:`~neurofed.trainer.experiments.asyncsim.AsyncConfig` of the async fields."""
        return AsyncConfig(self.buffer_k, self.max_staleness, self.online_fraction, self.session_mean,
                           self.train_time, self.async_server_lr, self.async_reveal, self.async_window)

    def strategy(self):
        return get_strategy(self.algorithm, **self.strategy_overrides)

    def profile_of(self, subject: int) -> str:
        return self.profiles[str(subject)]


def load_fold_subjects(cfg: SimConfig, subjects: list[int], pre: PreprocessConfig) -> list:
    """Subjects as loaded for ``cfg``: the plain loader, or each through its device profile."""
    if not cfg.profiles:
        return load_subjects(subjects, pre, cfg.data_dir)

    chans = None
    if cfg.profile_channels == "intersection":
        chans = channel_intersection([get_profile(n) for n in sorted(set(cfg.profiles.values()))])
    elif cfg.profile_channels not in ("own", "interpolate"):
        raise NeuroFedError(f"profile_channels must be own, intersection or interpolate, got {cfg.profile_channels!r}")
    pre = replace(pre, channels=chans)
    subs = [load_profile_subject(s, cfg.profile_of(s), pre, cfg.data_dir, cfg.noise_seed) for s in subjects]
    return [interpolate_subject(sd) for sd in subs] if cfg.profile_channels == "interpolate" else subs


def interpolate_subject(sd, channels: tuple[str, ...] = SENSORIMOTOR_21):
    """``sd`` with its (preprocessed, aligned) trials mapped onto ``channels`` by the fixed spherical-spline
    matrix (:func:`neurofed.trainer.data.profiles.interpolation_matrix`; channels it has are copied exactly)."""

    w = interpolation_matrix(sd.ch_names, channels).astype(np.float32)
    return replace(sd, X=np.einsum("kc,nct->nkt", w, sd.X).astype(np.float32), ch_names=list(channels))


def per_profile_summary(cfg: SimConfig, per_subject: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Mean held-out BCA (and n) per device profile."""
    out: dict[str, dict] = {}
    for s, row in per_subject.items():
        out.setdefault(cfg.profiles[str(int(s[1:]))], []).append(row["bca"])
    return {p: {"bca": float(np.mean(v)), "n": len(v)} for p, v in sorted(out.items())}


RoundFn = Callable[[int, int, int, int, dict], None]


def local_config(local: dict, train: list) -> LocalConfig:
    """The clients' local configuration, bound to the training subjects' channel and class names
    (:meth:`LocalConfig.bound`: only an augmentation that mirrors needs them).

    Raises
    ------
    NeuroFedError
        ``mirror`` over training subjects with different montages (``--profiles``), or a montage it cannot mirror.
    """
    cfg = LocalConfig(**local)
    if not train:
        return cfg
    try:
        bound = cfg.bound(train[0].ch_names, train[0].classes)
    except ValueError as exc:
        raise NeuroFedError(str(exc)) from None
    if bound is not cfg and any((tuple(sd.ch_names), tuple(sd.classes)) != (bound.channels, bound.classes)
                                for sd in train):
        raise NeuroFedError("--augment mirror needs one montage and one class list across the training subjects "
                            "(not with --profiles)")
    return bound


def _job(cfg_dict: dict, fold_idx: int, test_subjects: list[int], seed: int, out_path: str, threads: int,
         on_round: RoundFn | None = None) -> dict:
    """One (fold, seed): train, evaluate, write its JSON atomically. Runs in a worker process.

    ``on_round(fold, seed, round, rounds, point)`` is called after every round (``point``: ``loss``, and ``bca`` when
    evaluated) when the job runs in this process (progress display)."""
    torch.set_num_threads(threads)
    cfg = SimConfig(**cfg_dict)
    pre = PreprocessConfig.from_dict(cfg.preprocess)
    train_ids = [s for s in cfg.subjects if s not in test_subjects]
    if cfg.only_profile:
        train_ids = [s for s in train_ids if cfg.profile_of(s) == cfg.only_profile]
        test_subjects = [s for s in test_subjects if cfg.profile_of(s) == cfg.only_profile]
    train = load_fold_subjects(cfg, train_ids, pre)
    test = load_fold_subjects(cfg, test_subjects, pre)
    strategy = cfg.strategy()
    groups = {sd.subject: cfg.profile_of(int(sd.subject[1:])) for sd in train + test} if cfg.profiles else None
    if (groups and cfg.profile_channels == "own" and not strategy.group_prefixes
            and len({cfg.profile_of(s) for s in train_ids + list(test_subjects)}) > 1):
        raise NeuroFedError("clients of different device profiles have different channels: use a hierarchical "
                            f"strategy (--group-keys local. --model {' / '.join(PER_DEVICE_MODELS)}), "
                            "--profile-channels intersection or interpolate, or --only-profile")
    if strategy.group_prefixes and groups:
        untrained = sorted({groups[sd.subject] for sd in test} - {groups[sd.subject] for sd in train})
        if untrained:
            raise NeuroFedError(f"fold {fold_idx}: no training client has profile(s) {untrained} of a held-out subject")
    spec = EvalSpec(test=test, test_batch=cfg.test_batch, every=cfg.eval_every,
                    attacks=[(a, float(e)) for a, e in cfg.attacks])
    t0 = time.time()
    teachers_used: list[str] = []

    def log_round(r: int, total: int, point: dict) -> None:
        if on_round is not None:
            on_round(fold_idx, seed, r, total, point)
        if "bca" in point or r == total:
            logger.info("fold %d seed %d: round %d/%d loss %.3f%s", fold_idx, seed, r, total, point["loss"],
                        f" held-out BCA {100 * point['bca']:.1f}%" if "bca" in point else "")

    if cfg.mode == "async":
        if cfg.byzantine or groups:
            raise NeuroFedError("--mode async does not combine with --byzantine or --profiles yet")
        local = local_config(cfg.local, train)
        clients = partition_clients(train, cfg.partition, seed)
        model, info = run_async(clients, cfg.model, strategy, local, cfg.rounds, cfg.async_config(), seed,
                                (lambda m: float(np.mean([r["bca"] for r in evaluate_subjects(m, replace(spec, attacks=()), seed).values()])))
                                if test else None, cfg.eval_every, log_round)
        info["client_classes"] = class_counts(clients)
    elif strategy.centralised:
        local = local_config({**cfg.local, "batch_size": cfg.ct_batch_size}, train)
        fit = distilled(cfg, fold_idx, train, test, teachers_used) if cfg.distill_from else train
        model, info = run_centralised(fit, cfg.model, strategy, local, cfg.rounds, seed, spec, log_round)
    else:
        local = local_config(cfg.local, train)
        byz = Byzantine.parse(cfg.byzantine, seed) if cfg.byzantine else None
        if groups and cfg.partition != "subject":
            raise NeuroFedError("--partition with --profiles is not supported yet (clients are split within subjects)")
        clients = partition_clients(train, cfg.partition, seed)
        counts = class_counts(clients)
        if cfg.distill_from:
            clients = dict(zip(clients, distilled(cfg, fold_idx, list(clients.values()), test, teachers_used)))
        model, info = run_federated(clients, cfg.model, strategy, local,
                                    cfg.rounds, cfg.fraction, seed, spec, log_round, byzantine=byz, groups=groups,
                                    engine=cfg.engine)
        info["client_classes"] = counts
    seconds = time.time() - t0
    if strategy.group_prefixes and test:  # each held-out subject decoded by its profile's model
        per_subject = {}
        for g, m in info["models"].items():
            sub = replace(spec, test=[sd for sd in test if groups[sd.subject] == g])
            per_subject.update(evaluate_subjects(m, sub, seed) if sub.test else {})
    else:
        per_subject = evaluate_subjects(model, spec, seed) if test else {}
    if info.get("trained_states") and test:  # a released weight average: the last trained model beside it (paired)
        plain = replace(spec, attacks=())
        for g, st in info["trained_states"].items():
            m = copy.deepcopy(info["models"][g] if g in info.get("models", {}) else model)
            m.load_state_dict(st)
            sub = replace(plain, test=[sd for sd in test if not g or groups[sd.subject] == g])
            for s_, row in evaluate_subjects(m, sub, seed).items():
                per_subject[s_]["bca_global"] = row["bca"]
    result = {
        "fold": fold_idx, "seed": seed, "test_subjects": [sd.subject for sd in test],
        "per_subject": per_subject,
        "curve": info["curve"], "participation": info.get("participation", {}), "seconds": seconds,
        # the final evaluation (benign and every --attack) on the held-out subjects; "seconds" is the training
        "eval_seconds": time.time() - t0 - seconds,
        **{k: info[k] for k in ("attackers", "privacy", "async") if info.get(k)},
        **({"distill": {"teachers": teachers_used, "weight": cfg.distill_weight}} if teachers_used else {}),
        "client_classes": info.get("client_classes", {}), "server_cost": info.get("server_cost", {}),
        "data_hashes": {k: v for sd in train + test for k, v in sd.file_hashes.items()},
    }
    if not test or cfg.save_models:  # deployment mode or --save-models: the global model (one per device profile
        # under a hierarchical strategy) beside the job's JSON
        per_group = info.get("models", {}) if strategy.group_prefixes else {"": model}
        kwargs = strategy.model_kwargs(cfg.model)
        for g, m in sorted(per_group.items()):
            ref = next(sd for sd in train if not g or groups[sd.subject] == g)
            meta = ModelMeta(cfg.model, ref.X.shape[1], len(ref.classes), ref.X.shape[2], ref.sfreq,
                             strategy.bn_mode, list(ref.ch_names), list(ref.classes), pre.to_dict(), cfg.algorithm,
                             cfg.test_batch, {k: v for sd in train for k, v in sd.file_hashes.items()},
                             {"seed": seed, "rounds": cfg.rounds, **({"profile": g} if g else {}),
                              **({"model_kwargs": kwargs} if kwargs else {})})
            ckpt = Path(out_path).with_suffix(f".{g}.safetensors" if g else ".safetensors")
            save_checkpoint(ckpt, global_state_of(m), meta)
            result.setdefault("checkpoints", []).append(str(ckpt))
        result["checkpoint"] = result["checkpoints"][0]
    atomic_write_bytes(out_path, json.dumps(result).encode())
    return result


def distilled(cfg: SimConfig, fold_idx: int, subjects: list, test: list, used: list[str]) -> list:
    """``subjects`` with soft targets from the saved models of fold ``fold_idx`` in ``cfg.distill_from``
    (:mod:`neurofed.trainer.fl.distill`); the checkpoints used are appended to ``used``.

    A teacher may read the trials through another preprocessing than the student's (its checkpoint says which: e.g.
    all 64 channels for a 21-channel student, the classic use of distillation: a model too costly to deploy teaches
    one that fits): each subject is then loaded again with the teacher's preprocessing, and its trials must be the
    same ones (the same labels in the same order).

    Raises
    ------
    NeuroFedError
        A teacher run without this fold's saved models, a teacher that held out other subjects (it would have
        trained on this fold's held-out subjects), other classes, or its preprocessing giving other trials.
    """
    members = fold_members([Path(r) for r in cfg.distill_from], None).get(fold_idx, [])
    if not members:
        raise NeuroFedError(f"fold {fold_idx}: no saved model of this fold in {', '.join(cfg.distill_from)} to distil")
    held = [sd.subject for sd in test]
    ref = subjects[0]
    own = PreprocessConfig.from_dict(cfg.preprocess).to_dict()
    views: dict[str, tuple[dict, list]] = {}  # teacher preprocessing (as JSON) -> (config, teachers)
    for jp, job in members:
        if list(job["test_subjects"]) != held:
            raise NeuroFedError(f"teacher {jp} held out {job['test_subjects']}, this fold holds out {held}: a teacher "
                                "must never have trained on this fold's held-out subjects (same subjects, folds, "
                                "fold seed)")
        ckpt = job_checkpoint(jp, job)
        model, meta = load_checkpoint(ckpt)
        if tuple(meta.classes) != tuple(ref.classes):
            raise NeuroFedError(f"teacher {ckpt} decodes {', '.join(meta.classes)}, this run "
                                f"{', '.join(ref.classes)}")
        pre = meta.preprocess or own
        views.setdefault(json.dumps(pre, sort_keys=True), (pre, []))[1].append(model)
        used.append(str(ckpt))
    probs = {sd.subject: [] for sd in subjects}
    for pre, teachers in views.values():
        if pre == own:
            seen = {sd.subject: sd for sd in subjects}
        else:
            if cfg.partition != "subject":
                raise NeuroFedError("a teacher with another preprocessing needs whole-subject clients "
                                    f"(--partition subject), not {cfg.partition}")
            again = load_subjects([int(sd.subject[1:]) for sd in subjects], PreprocessConfig.from_dict(pre),
                                  cfg.data_dir)
            seen = {sd.subject: sd for sd in again}
        for sd in subjects:
            tv = seen[sd.subject]
            if len(tv.y) != len(sd.y) or not np.array_equal(tv.y, sd.y):
                raise NeuroFedError(f"{sd.subject}: the teacher's preprocessing gives {len(tv.y)} trials, this run "
                                    f"{len(sd.y)} (or other labels): distil from teachers of the same trials")
            probs[sd.subject].append((len(teachers), teacher_probabilities(teachers, tv.X, cfg.test_batch)))
    out = []
    for sd in subjects:
        n = sum(k for k, _ in probs[sd.subject])
        mean = sum(k * p for k, p in probs[sd.subject]) / n  # every teacher counts once
        out.append(replace(sd, y=soft_targets(sd.y, mean, cfg.distill_weight)))
    return out


def aggregate_seeds(per_seed: dict) -> tuple[dict[str, dict[str, float]], dict[str, dict]]:
    """Per-subject means over seeds and the summary (mean and std over subjects, std of the seed means).

    Parameters
    ----------
    per_seed : dict
        ``{seed: {subject: {metric: value}}}``.

    Returns
    -------
    per_subject, summary : dict, dict
    """
    metrics = sorted({m for ps in per_seed.values() for row in ps.values() for m in row})
    subjects = sorted({s for ps in per_seed.values() for s in ps})
    per_subject = {s: {m: float(np.mean([per_seed[sd][s][m] for sd in per_seed if s in per_seed[sd]]))
                       for m in metrics} for s in subjects}
    summary = {}
    for m in metrics:
        seed_means = [float(np.mean([row[m] for row in ps.values()])) for ps in per_seed.values()]
        subj = [per_subject[s][m] for s in subjects]
        summary[m] = {"mean": float(np.mean(subj)), "std_subjects": float(np.std(subj)),
                      "std_seeds": float(np.std(seed_means)), "per_seed": seed_means}
    return per_subject, summary


def mean_curve(jobs: list[dict]) -> list[dict[str, float]]:
    """Held-out BCA of the global model at each evaluated round, mean over ``jobs`` (folds and/or seeds)."""
    rounds = sorted({p["round"] for j in jobs for p in j["curve"] if "bca" in p})
    return [{"round": r, "bca": float(np.mean([p["bca"] for j in jobs for p in j["curve"]
                                               if p["round"] == r and "bca" in p]))} for r in rounds]


def clip_summary(jobs: list[dict]) -> dict[str, dict[str, int]]:
    """How often the server's adaptive norm clip fired, per seed: ``{seed: {"clipped", "updates", "jobs"}}`` summed
    over that seed's jobs that count it (``server_cost["robust.stat_clipped"]``, jobs since 2026-11-28; ``updates`` =
    their participants over all rounds). Seeds with no such job (older jobs, no clipping rule) are left out."""
    out: dict[str, dict[str, int]] = {}
    for j in jobs:
        if CLIPPED_KEY not in j.get("server_cost", {}):
            continue
        c = out.setdefault(str(j["seed"]), {"clipped": 0, "updates": 0, "jobs": 0})
        c["clipped"] += int(j["server_cost"][CLIPPED_KEY])
        c["updates"] += int(sum(p.get("participants", 0) for p in j["curve"]))
        c["jobs"] += 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def summarise(cfg: SimConfig, jobs: list[dict]) -> dict:
    """Aggregate per-(fold, seed) results into results.json content."""
    per_seed: dict[int, dict[str, dict]] = {}
    for j in jobs:
        per_seed.setdefault(j["seed"], {}).update(j["per_subject"])
    per_subject, summary = aggregate_seeds(per_seed)
    curve = mean_curve(jobs)
    curve_per_seed = {str(k): mean_curve([j for j in jobs if j["seed"] == k]) for k in sorted(per_seed)}
    hashes = {}
    for j in jobs:
        hashes.update(j["data_hashes"])
    extra = {"per_profile": per_profile_summary(cfg, per_subject)} if cfg.profiles and per_subject else {}
    return {
        **extra,
        "algorithm": cfg.algorithm, "model": cfg.model, "config": asdict(cfg),
        "strategy": cfg.strategy().to_dict(), "summary": summary, "per_subject": per_subject,
        "per_seed": {str(k): v for k, v in per_seed.items()}, "curve": curve, "curve_per_seed": curve_per_seed,
        "seconds": float(sum(j["seconds"] for j in jobs)), "data_hashes": hashes,
        "checkpoints": [c for j in jobs for c in j.get("checkpoints", [j["checkpoint"]] if "checkpoint" in j else [])],
        "attack_budgets": attack_budgets([a for a, _ in cfg.attacks]),
        "torch": torch.__version__,
        **({"privacy": jobs[0]["privacy"]} if jobs and "privacy" in jobs[0] else {}),
        **({"clipping": c} if (c := clip_summary(jobs)) else {}),
        **({"async": async_summary(jobs)} if cfg.mode == "async" else {}),
    }


def async_summary(jobs: list[dict]) -> dict:
    """Asynchronous runs: per job (seed, fold) the aggregations, updates used/accepted/submitted, rejected stale,
    lost offline, simulated time and measured online fraction; and their totals."""
    keys = ("aggregations", "updates_used", "updates_accepted", "submitted", "rejected_stale", "lost_offline",
            "too_few_trials", "sessions")
    per_job = {f"seed{j['seed']}_fold{j['fold']:02d}": {k: j["async"][k] for k in
                                                        (*keys, "sim_time", "online_fraction_measured")}
               for j in jobs if "async" in j}
    return {"per_job": per_job, "total": {k: int(sum(r[k] for r in per_job.values())) for k in keys}}


def _data_root(data_dir: str | None) -> str | None:
    """The EEGMMIDB subjects folder ``data_dir`` resolves to (None = the default places), for comparing runs.

    ``/work/shared/data``, ``../shared/data/eegmmidb`` and no ``--data-dir`` at all name the same files on one
    machine; a folder that cannot be resolved here is compared as written.
    """

    try:
        root = subjects_root(resolve_data_dir(data_dir))
    except DataError:
        return data_dir
    return str(root) if root is not None else data_dir


def run_differences(old: dict, new: dict) -> list[str]:
    """The configuration fields that keep ``new`` from resuming ``old``'s directory (empty: it may resume).

    Equal configurations may resume, except that seeds may be added: jobs are stored per (seed, fold), so extending
    ``--seeds 0`` to ``--seeds 0,1,2`` reuses seed 0's jobs. The data folder counts by the files it resolves to.
    Each entry reads ``field: OLD -> NEW``.
    """
    a, b = dict(old), dict(new)
    a.pop("save_models", None), b.pop("save_models", None)  # output only: switching it on or off is the same run
    a.pop("engine", None), b.pop("engine", None)  # execution only: the engines agree to float tolerance
    if "local_bn_mode" in a:  # before it was a strategy parameter, fleeg_eegnet's local BN was a field of its own
        lbn = a.pop("local_bn_mode")
        if lbn:
            a["strategy_overrides"] = {**a.get("strategy_overrides", {}), "local_bn_mode": lbn}
    defaults = asdict(SimConfig())
    for k in [k for k in b if k not in a and b[k] == defaults.get(k)]:  # a field added later, at its default
        b.pop(k)
    if a.get("data_dir") != b.get("data_dir") and _data_root(a.get("data_dir")) == _data_root(b.get("data_dir")):
        b["data_dir"] = a.get("data_dir")
    held, wanted = a.pop("seeds", []), b.pop("seeds", [])
    diffs = [] if set(held) <= set(wanted) else [f"seeds: {held!r} -> {wanted!r} (seeds may only be added)"]
    pairs = {k: (a.get(k, "(absent)"), b.get(k, "(absent)")) for k in sorted(set(a) | set(b))}
    return diffs + [f"{k}: {u!r} -> {v!r}" for k, (u, v) in pairs.items() if u != v]


def refuse_other_run(out: Path, old: dict, new: dict) -> None:
    """Raise :class:`NeuroFedError` naming the fields when ``new`` may not resume the run in ``out``."""
    diffs = run_differences(old, new)
    if diffs:
        shown = "; ".join(d if len(d) < 160 else d[:157] + "..." for d in diffs[:4])
        raise NeuroFedError(f"{out} holds a run with a different configuration ({shown}{'; ...' if len(diffs) > 4 else ''}); "
                            "only --seeds may be extended: use another --out or delete it")


def open_run(out_dir: str | os.PathLike, cfg: Any) -> Path:
    """Create ``out_dir/jobs`` and write the run configuration ``cfg`` (a dataclass) as ``config.json``.

    A folder that already holds a run resumes it only when :func:`run_differences` finds nothing but more seeds;
    otherwise :func:`refuse_other_run` raises, naming the fields, and the folder's configuration is left as it was.
    An unchanged configuration is not rewritten.
    """
    out = Path(out_dir)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.json"
    cfg_json = json.dumps(asdict(cfg), indent=1, sort_keys=True)
    if cfg_path.exists():
        held, wanted = json.loads(cfg_path.read_text()), json.loads(cfg_json)
        refuse_other_run(out, held, wanted)
        if held == wanted:
            return out  # a plain resume leaves the file byte for byte as it was (a committed config keeps its layout)
    atomic_write_bytes(cfg_path, cfg_json.encode())  # a crash mid-write never leaves a config that blocks resuming
    return out


def plan_jobs(cfg: SimConfig, out_dir: str | os.PathLike) -> tuple[list[tuple[int, list[int], int, str]], list[dict]]:
    """Prepare ``out_dir`` for ``cfg`` and split its (seed, fold) jobs into to-do and finished (resume).

    A job is finished when its ``jobs/seed{S}_fold{K}.json`` exists (written atomically by :func:`_job`).

    Returns
    -------
    todo : list of (fold index, test subjects, seed, job JSON path)
    done : list of finished job results
    """
    todo, done = [], []
    for k, fold, seed, p in job_paths(cfg, open_run(out_dir, cfg)):
        if p.exists():
            done.append(json.loads(p.read_text()))
        else:
            todo.append((k, fold, seed, str(p)))
    return todo, done


def job_paths(cfg: SimConfig, out_dir: str | os.PathLike) -> list[tuple[int, list[int], int, Path]]:
    """Every (fold index, test subjects, seed, job JSON path) of ``cfg`` in ``out_dir``; touches no file."""
    folds = make_folds(cfg.subjects, cfg.protocol, cfg.fold_seed)
    return [(k, fold, seed, Path(out_dir) / "jobs" / f"seed{seed}_fold{k:02d}.json")
            for seed in cfg.seeds for k, fold in enumerate(folds) if not cfg.folds or k in cfg.folds]


def write_results(cfg: SimConfig, out_dir: str | os.PathLike, done: list[dict]) -> dict:
    """Summarise finished jobs into ``out_dir/results.json`` (atomically) and return the results."""
    out = Path(out_dir)
    results = summarise(cfg, sorted(done, key=lambda j: (j["seed"], j["fold"])))
    atomic_write_bytes(out / "results.json", json.dumps(results, indent=1).encode())
    return results


def default_threads(workers: int = 1) -> int:
    """torch threads per job: ``$OMP_NUM_THREADS`` if it is a positive integer, else cores / ``workers`` (>= 1)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(workers, 1))


def run_simulation(
    cfg: SimConfig, out_dir: str | os.PathLike, workers: int = 1,
    on_done: Callable[[dict, int, int], None] | None = None, threads: int | None = None,
    on_round: RoundFn | None = None,
) -> dict:
    """Run every (fold, seed) job not already finished in ``out_dir`` (resume), then write results.json.

    ``on_round`` (see :func:`_job`) is called after every round of the jobs that run in this process (``workers``
    1); with worker processes only ``on_done`` reports."""
    todo, done = plan_jobs(cfg, out_dir)
    total = len(todo) + len(done)
    if todo:
        # cores / workers threads by default, or $OMP_NUM_THREADS when set (the usual knob: extra threads only spin
        # when cores are shared, e.g. under parallel test workers)
        threads = threads or default_threads(workers)
        if workers <= 1:
            for k, fold, seed, p in todo:
                done.append(_job(asdict(cfg), k, fold, seed, p, threads, on_round))
                if on_done:
                    on_done(done[-1], len(done), total)
        else:
            with ProcessPoolExecutor(workers) as ex:
                futs = [ex.submit(_job, asdict(cfg), k, fold, seed, p, threads) for k, fold, seed, p in todo]
                for f in as_completed(futs):
                    done.append(f.result())
                    if on_done:
                        on_done(done[-1], len(done), total)
    return write_results(cfg, out_dir, done)
