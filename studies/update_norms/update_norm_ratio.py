"""Honest update sizes vs the default absurd-update limit (`[validation] max_update_ratio = 10`).

One round of local training from the coordinator's initial model on real subjects (2 local epochs,
batch 8, and the config default), per strategy: ||update - global|| / ||global|| over floating
entries, as `neurofed.broker.validation` computes it.

Usage: python studies/update_norms/update_norm_ratio.py  (writes studies/update_norms/update_norm_ratio.json)
"""
import json
from pathlib import Path

import torch

torch.set_num_threads(1)
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import initial_model
from neurofed.broker.validation import state_norm, update_norm
from neurofed.trainer.data import load_eegmmidb_subject
from neurofed.trainer.fl.client import client_update, init_client_state
from neurofed.trainer.fl.server import downlink

rows = []
for strat in ("fedavg", "fedbs"):
    for local in ({"batch_size": 8, "local_epochs": 2}, {"lr": 0.05, "batch_size": 8, "local_epochs": 2}, {}):
        cfg = config_from_dict({"federation": {"strategy": strat}, "local": local})
        m = initial_model(cfg)
        g = {k: v.detach().clone() for k, v in m.state_dict().items()}
        s = cfg.strategy()
        for subj in (1, 2, 5):
            d = load_eegmmidb_subject(subj, cfg.preprocess_config())
            upd, _ = client_update(m, downlink(g, s, m), init_client_state(g, m, s), d.X, d.y, s, cfg.local_config(), 0, {})
            rows.append({"strategy": strat, "local": local or "default", "subject": subj,
                         "ratio": update_norm(upd.state, g) / max(state_norm(g), 1.0)})
            print(rows[-1], flush=True)
out = Path(__file__).parent / "update_norm_ratio.json"
out.write_text(json.dumps({"command": "python studies/update_norms/update_norm_ratio.py", "rows": rows,
                           "max": max(r["ratio"] for r in rows), "limit": 10.0}, indent=1))
