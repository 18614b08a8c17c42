"""
Federate three subjects and score a held-out one
================================================

Three EEGMMIDB subjects (1, 2 and 3) train one EEGNet together with FedBS, the project's default federated
rule, for two communication rounds; subject 4 never takes part and is decoded afterwards. This is the
in-process simulation behind ``neurofed simulate``: the same clients, local training and aggregation as a
federation over MQTT, without the broker.

Two rounds on three subjects is a smoke test, not a result: expect chance-level accuracy here. The
46-subject numbers (100 rounds, several seeds) are in the studies.
"""

# %%
# The run, as a command line
# --------------------------
# ``parse_line`` reads exactly the options ``neurofed simulate`` takes, so this run is also
# ``neurofed simulate --algorithm fedbs --subjects 1-4 --folds 3 ...``. Leave-one-subject-out over
# subjects 1-4 has four folds; ``--folds 3`` runs only the one that holds out subject 4. Everything not
# given is the published protocol (21 sensorimotor channels at 80 Hz, Euclidean alignment, client batch 8,
# two local epochs, SGD lr 0.05).
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from neurofed.trainer.experiments.simulate import run_simulation
from neurofed.trainer.experiments.spec import parse_line

torch.set_num_threads(1)
OPTIONS = "--algorithm fedbs --subjects 1-4 --folds 3 --rounds 2 --fraction 1 --eval-every 1 --save-models"
cfg = parse_line(OPTIONS).to_sim_config()
print(f"neurofed simulate {OPTIONS}")
print(f"clients: subjects {[s for s in cfg.subjects if s != 4]}, held out: subject 4")
print(f"preprocessing: {len(cfg.preprocess['channels'])} channels, "
      f"{cfg.preprocess['fmin']:g}-{cfg.preprocess['fmax']:g} Hz, resampled to {cfg.preprocess['resample']:g} Hz")

# %%
# Train
# -----
# Preprocessed recordings are cached in ``$NEUROFED_CACHE``; the run directory holds one JSON per
# (fold, seed) job and, with ``--save-models``, the trained global model. Re-running the same
# configuration into the same directory resumes it (here: nothing left to do).
runs = Path(os.environ.get("NEUROFED_DOCS_RUNS") or tempfile.mkdtemp(prefix="neurofed-docs-"))
out = runs / "federate-1-4"
results = run_simulation(cfg, out, threads=1)

# %%
# Score the held-out subject
# --------------------------
# Balanced classification accuracy (BCA, the mean of the per-class recalls: 0.5 is chance for left
# vs right fist) of the global model on subject 4's 45 trials, after each round.
for point in results["curve"]:
    print(f"round {point['round']}: held-out BCA {100 * point['bca']:.1f} %")
print("subject 4:", {k: round(v, 3) for k, v in results["per_subject"]["S004"].items()})

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([p["round"] for p in results["curve"]], [100 * p["bca"] for p in results["curve"]], "o-",
        label="FedBS, subject 4 held out")
ax.axhline(50, color="grey", ls="--", label="chance")
ax.set(xlabel="communication round", ylabel="held-out BCA (%)", ylim=(30, 80), xticks=[1, 2])
ax.legend(loc="upper left")
fig.tight_layout()

# %%
# What was written
# ----------------
# ``results.json`` is what ``neurofed report`` reads; the checkpoint (safetensors, no pickle) is the
# model the next example exports.
print(sorted(p.name for p in out.iterdir()))
print(sorted(p.name for p in (out / "jobs").iterdir()))
