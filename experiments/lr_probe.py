"""Learning-rate probe on fold 0 of the subject 5-fold split (issue 3 known gap).

Usage: python experiments/lr_probe.py ALGORITHM LR BATCH ROUNDS  (prints held-out BCA every 5 rounds)
"""
import sys
import time

import torch

torch.set_num_threads(1)
from neurofed.trainer.data import PreprocessConfig, list_subjects, load_subjects
from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.runner import EvalSpec, run_centralised, run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
subs = list_subjects()
test_ids = make_folds(subs, "kfold:5", 0)[0]
train = load_subjects([s for s in subs if s not in test_ids], cfg)
test = load_subjects(test_ids, cfg)
spec = EvalSpec(test=test, every=5)
alg, lr, bs, R = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = time.time()
def prog(r, tot, p):
    if 'bca' in p:
        print(f"{alg} lr={lr} bs={bs} round {r} loss {p['loss']:.3f} bca {p['bca']*100:.1f} ({time.time()-t:.0f}s)", flush=True)
if alg == "ct":
    run_centralised(train, "eegnet", get_strategy("ct"), LocalConfig(lr=lr, batch_size=bs), R, 0, spec, prog)
else:
    run_federated({sd.subject: sd for sd in train}, "eegnet", get_strategy(alg), LocalConfig(lr=lr, batch_size=bs), R, 0.5, 0, spec, prog)
