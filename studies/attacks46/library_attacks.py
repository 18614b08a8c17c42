"""Library attacks (issue 21 item 1) on published-protocol models: fold 0 (seed 0) of the 30-subject table.

Trains FedAvg and SAFE exactly as studies/table30/spec.toml (subject 5-fold, fold seed 0, 50 rounds, lr 0.05, ...),
fold 0 only, and evaluates its 6 held-out subjects under NeuroFed's FGSM/PGD and ART's AutoAttack, Square and
HopSkipJump (budgets in trainer/art_attacks.py LIBRARY_BUDGETS, copied into the JSON).

Run: NEUROFED_DATA=... nice -n 10 python studies/attacks46/library_attacks.py fedavg   (and: ... safe, ... ct_at)
Writes runs/studies/results/library_attacks/<run>.json; benign/FGSM/PGD per subject are checked against the
published job runs/studies/results/table/<run>/jobs/seed0_fold00.json (same training, same numbers) where one
exists. ``ct_at`` (CT + FGSM adversarial training, SAFE's "AT" reference) is table.txt's CT row with
``--algorithm ct_at``; the 30-subject table has no published job of it.
Re-run some attacks only (the training is repeated, it is deterministic; the other attacks' numbers are kept):
  ... python studies/attacks46/library_attacks.py fedavg hsj
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from neurofed.trainer.art_attacks import HSJ_STATS, reset_hsj_stats
from neurofed.trainer.experiments.grid import parse_spec
from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results
from neurofed.trainer.experiments.simulate import _job

SUBJECTS_30 = [*range(1, 20), *range(24, 34), 42]
ATTACKS = [["fgsm", 0.03], ["pgd", 0.03], ["autoattack", 0.03], ["square", 0.05], ["hsj", 0.05]]


def main(name: str, only: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    out = Path("runs/studies/results/library_attacks")
    base = {"ct_at": "ct"}.get(name, name)
    (run,) = parse_spec(Path("studies/table30/spec.toml"), out, only=[base])
    cfg = run.cfg
    cfg.algorithm = name
    cfg.subjects = SUBJECTS_30  # table.txt says --subjects all: the 30 subjects the shared data held then
    attacks = [a for a in ATTACKS if not only or a[0] in only or a[0] == "fgsm"]  # FGSM: the check on the training
    cfg.attacks = attacks
    fold = make_folds(cfg.subjects, cfg.protocol, cfg.fold_seed)[0]
    reset_hsj_stats()
    res = _job(asdict(cfg), 0, fold, 0, str(out / f"{name}.job.json"), 1)
    published = Path(f"runs/studies/results/table/{name}/jobs/seed0_fold00.json")
    pub = json.loads(published.read_text()) if published.exists() else None
    from neurofed.trainer.attacks import attack_budgets

    if only:  # keep the earlier run's numbers of the attacks not re-run (its benign/FGSM must equal this one's)
        old = json.loads((out / f"{name}.json").read_text())
        for s, row in res["per_subject"].items():
            prev = old["per_subject"][s]
            if abs(prev["bca"] - row["bca"]) > 1e-12 or abs(prev["fgsm@0.03"] - row["fgsm@0.03"]) > 1e-12:
                raise SystemExit(f"{s}: the re-trained model differs from the earlier run's; re-run all attacks")
            res["per_subject"][s] = {**prev, **row}
        if "hsj_stats" in old and not any(a[0] == "hsj" for a in attacks):
            res["hsj_stats"] = old["hsj_stats"]
    if any(a[0] == "hsj" for a in attacks):
        res["hsj_stats"] = dict(HSJ_STATS)  # trials attacked, and stopped at the query budget (failed attacks)
    if pub is not None:
        res["published_fold0"] = pub["per_subject"]
    res["attack_budgets"] = attack_budgets([a for a, _ in ATTACKS])
    res["attacks"] = ATTACKS
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    (out / f"{name}.job.json").unlink()


if __name__ == "__main__":
    unpack_studies(['table30'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main(sys.argv[1], sys.argv[2:] or None)
