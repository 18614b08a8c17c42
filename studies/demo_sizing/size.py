"""Demo sizing: in-process FedBS on the demo's protocol, first N shared subjects train, S047-S050 held out.

Usage: python studies/demo_sizing/size.py N ROUNDS OUT.json [FRACTION]
"""
import json
import sys
import time

import torch

from neurofed.trainer.data import PreprocessConfig, list_subjects, load_subjects
from neurofed.trainer.experiments.runner import EvalSpec, run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

torch.set_num_threads(1)
n, rounds, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
fraction = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
shared = list_subjects(None)
held = shared[-4:]
train_ids = shared[:n]
pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
train = load_subjects(train_ids, pre, None)
test = load_subjects(held, pre, None)
spec = EvalSpec(test=test, test_batch=8, every=5)
t0 = time.time()
curve = []
def prog(r, total, p):
    if "bca" in p:
        print(r, p, flush=True)
model, info = run_federated({sd.subject: sd for sd in train}, "eegnet", get_strategy("fedbs"),
                            LocalConfig(0.05, 0.9, 1e-4, 8, 2), rounds, fraction, 0, spec, prog)
from neurofed.trainer.experiments.runner import evaluate_subjects

res = {"fraction": fraction, "train": train_ids, "heldout": held, "rounds": rounds, "seconds": time.time() - t0,
       "per_subject": evaluate_subjects(model, spec, 0), "curve": info["curve"]}
print(json.dumps(res["per_subject"]), res["seconds"])
with open(out, "w") as fh:
    fh.write(json.dumps(res, indent=1))
