"""Issue 57, lever 1: label-free test-time adaptation on the saved models of `neurofed simulate --save-models`.

For every job (seed, fold) of the given run directories, each held-out subject's session is decoded in its recorded
order under every condition below by the SAME trained model; per-subject BCA goes to
``OUT/GROUP/<condition>/jobs/seedS_foldKK.json`` (plus ``results.json``: per-subject means over seeds), so
``neurofed report OUT/tta/<a> OUT/tta/<b> --refs <a>`` pairs them, and ``raw.pack`` stores them.

Conditions (``neurofed.trainer.tta``):

* ``protocol``: the table46 evaluation (offline per-subject EA, consecutive test batches of 8) -- checked equal to
  the job's own per-subject BCA;
* ``{off,on}_context``: causal, batch-specific BN over the window and the 7 before it (the standalone graph's
  decoder), EA offline (``off``) or online (``on``, the standalone graph's running reference);
* ``{off,on}_adabn``: running BN moments of the session (no parameter update);
* ``{off,on}_tent``: adaptive BN + entropy minimisation on the BN affine parameters with the safeguards;
* ``{off,on}_im``: as ``tent`` with the diversity term (information maximisation, T-TIME's objective);
* secondary: ``{off,on}_ctxall`` (batch-specific BN over every window so far) and ``{off,on}_adabn125``
  (running moments, momentum 0.125), ``{off,on}_im10`` (``im`` at lr 1e-2).

Usage::

    python studies/tta/tta_eval.py runs/tta_fedbs runs/tta_fedbs_s12 --out runs/tta_results --group tta_fedbs
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import load_subjects
from neurofed.trainer.evaluate import bca, predict
from neurofed.trainer.experiments.simulate import aggregate_seeds
from neurofed.trainer.tta import TTAConfig, decode_stream

CONDITIONS: dict[str, TTAConfig | None] = {
    "context": TTAConfig(bn="context"),
    "adabn": TTAConfig(bn="adaptive"),
    "tent": TTAConfig(bn="adaptive", entropy=True),
    "im": TTAConfig(bn="adaptive", entropy=True, diversity=1.0),
    # secondary (added after fold 0 of seed 0 showed adaptive BN below the context of 8): other BN statistics
    "ctxall": TTAConfig(bn="context", context=100_000),  # batch-specific BN over every window so far
    "adabn125": TTAConfig(bn="adaptive", momentum=0.125),  # running moments with a memory of ~8 windows
    # secondary (added after seed 0: "im" changed almost no prediction at lr 1e-3): ten times the step size
    "im10": TTAConfig(bn="adaptive", entropy=True, diversity=1.0, lr=1e-2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="neurofed simulate run dirs with --save-models")
    ap.add_argument("--out", type=Path, default=Path("runs/tta_results"))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--group", default="tta", help="results sub-folder: OUT/GROUP/<condition>")
    ap.add_argument("--only", default="", help="comma list of conditions (default: all)")
    ap.add_argument("--seeds", default="", help="comma list: only these seeds' jobs (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    conds = {k: v for k, v in CONDITIONS.items() if not args.only or k in args.only.split(",")}
    names = ["protocol"] + [f"{e}_{k}" for e in ("off", "on") for k in conds]
    for run in args.runs:
        for job_path in sorted((run / "jobs").glob("seed*_fold*.json")):
            job = json.loads(job_path.read_text())
            if args.seeds and job["seed"] not in {int(v) for v in args.seeds.split(",")}:
                continue
            model, meta = load_checkpoint(job["checkpoint"])
            if meta.test_batch_size != CONDITIONS["context"].context:
                raise SystemExit(f"{job_path}: test batch {meta.test_batch_size}, the context conditions assume 8")
            pre = PreprocessConfig.from_dict(meta.preprocess)
            ids = [int(s[1:]) for s in job["test_subjects"]]
            aligned = load_subjects(ids, pre, args.data_dir)
            raw = load_subjects(ids, replace(pre, ea=False), args.data_dir)
            t0 = time.time()
            rows: dict[str, dict] = {n: {} for n in names}
            stats: dict[str, dict] = {n: {} for n in names}
            for sa, sr in zip(aligned, raw):
                assert sa.subject == sr.subject and np.array_equal(sa.y, sr.y)
                y = sa.y
                rows["protocol"][sa.subject] = {"bca": bca(y, predict(model, sa.X, meta.test_batch_size))}
                ref = job["per_subject"][sa.subject]["bca"]
                if abs(rows["protocol"][sa.subject]["bca"] - ref) > 1e-12:
                    raise SystemExit(f"{job_path}: {sa.subject} protocol BCA differs from the job's ({ref})")
                for e, X, online in (("off", sa.X, False), ("on", sr.X, True)):
                    for k, cfg in conds.items():
                        cfg = replace(cfg, seed=job["seed"])
                        r = decode_stream(model, X, cfg, ea_online=online)
                        rows[f"{e}_{k}"][sa.subject] = {"bca": bca(y, r.pred)}
                        stats[f"{e}_{k}"][sa.subject] = {"updates": r.updates, "skipped": r.skipped,
                                                          "resets": r.resets, "windows": len(X)}
            for n in names:
                d = args.out / args.group / n / "jobs"
                d.mkdir(parents=True, exist_ok=True)
                cfg = None if n == "protocol" else CONDITIONS[n.split("_", 1)[1]]
                out = {"fold": job["fold"], "seed": job["seed"], "test_subjects": job["test_subjects"],
                       "per_subject": rows[n], "tta_stats": stats[n], "source_job": str(job_path),
                       "condition": n, "tta": asdict(cfg) if cfg else None, "ea_online": n.startswith("on_")}
                (d / job_path.name).write_text(json.dumps(out))
            logging.info("%s: %s (%.0f s)", job_path, "  ".join(
                f"{n} {100 * np.mean([r['bca'] for r in rows[n].values()]):.1f}" for n in names), time.time() - t0)
    for n in names:  # every job of the group's condition so far (runs evaluated in several calls add up)
        per_seed_n: dict[int, dict] = {}
        for f in sorted((args.out / args.group / n / "jobs").glob("seed*_fold*.json")):
            j = json.loads(f.read_text())
            per_seed_n.setdefault(j["seed"], {}).update(j["per_subject"])
        per_subject, summary = aggregate_seeds(per_seed_n)
        res = {"algorithm": "tta", "condition": n, "summary": summary, "per_subject": per_subject,
               "per_seed": {str(k): v for k, v in sorted(per_seed_n.items())},
               "tta": None if n == "protocol" else asdict(CONDITIONS[n.split("_", 1)[1]]),
               "ea_online": n.startswith("on_")}
        (args.out / args.group / n / "results.json").write_text(json.dumps(res, indent=1))
        print(f"{n:12s} {100 * summary['bca']['mean']:.2f}  seeds {sorted(per_seed_n)}")

if __name__ == "__main__":
    main()
