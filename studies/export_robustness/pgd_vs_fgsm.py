"""Why PGD-10 is no stronger than FGSM on these models: where PGD's perturbation ends relative to FGSM's.

For every test batch (8 trials, as evaluated) of the given held-out subjects: the fraction of PGD's
perturbation entries at the budget's edge, the fraction with FGSM's sign, mean cross-entropy on clean,
FGSM and PGD inputs, and how often the two attacks give the same prediction.
Usage: python studies/export_robustness/pgd_vs_fgsm.py CHECKPOINT SUBJECTS EPS OUT.json   (SUBJECTS like 3,5,11)
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.trainer.attacks import channel_budget, fgsm, pgd
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.eegmmidb import parse_subjects

torch.set_num_threads(1)
ckpt, subjects, eps, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
model, meta = load_checkpoint(ckpt)
model.eval()
cfg = PreprocessConfig.from_dict(meta.preprocess)
rows = {k: [] for k in ("at_edge", "same_sign", "loss_clean", "loss_fgsm", "loss_pgd", "same_prediction")}
for s in parse_subjects(subjects, None):
    sd = load_eegmmidb_subject(s, cfg)
    for b, i in enumerate(range(0, len(sd.X), meta.test_batch_size)):
        x, y = torch.as_tensor(sd.X[i : i + meta.test_batch_size]), torch.as_tensor(sd.y[i : i + meta.test_batch_size])
        xf, xp = fgsm(model, x, y, eps), pgd(model, x, y, eps, seed=b)
        budget = channel_budget(x, eps)
        with torch.no_grad():
            lc, lf, lp = (model(v) for v in (x, xf, xp))
        rows["at_edge"].append(float(((xp - x).abs() >= budget * 0.999).float().mean()))
        rows["same_sign"].append(float(((xp - x).sign() == (xf - x).sign()).float().mean()))
        rows["loss_clean"].append(float(F.cross_entropy(lc, y)))
        rows["loss_fgsm"].append(float(F.cross_entropy(lf, y)))
        rows["loss_pgd"].append(float(F.cross_entropy(lp, y)))
        rows["same_prediction"].append(float((lf.argmax(1) == lp.argmax(1)).float().mean()))
res = {"command": "python " + " ".join(sys.argv), "eps": eps, "batches": len(rows["at_edge"]),
       **{k: float(np.mean(v)) for k, v in rows.items()}}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps(res, indent=1))
