"""Cost of the secure-aggregation core (trainer/fl/secagg.py) per round, in process, EEGNet-sized updates.

Run: python studies/secagg_cost/secagg_cost.py 24 100   -> docs/bench/secagg_cost.json
Times every step for n clients (threshold n // 2 + 1, no dropout and 10 % dropout) and the bytes a client sends
beyond its plain update (public key, 2 x n Shamir shares of two 32-byte secrets, the masked vector is the same size
as a 32-bit fixed-point update). Single process, so the per-client time is the total divided by n.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from neurofed.trainer.fl.secagg import secure_weighted_mean

D = 1653  # EEGNet, 21 channels, 80 Hz, 4 s: floating entries of the state dict


def main(sizes: list[int]) -> None:
    rows = []
    for n in sizes:
        rng = np.random.default_rng(0)
        ups = {c: (rng.normal(0, 0.05, D), 45) for c in range(1, n + 1)}
        for drop in (0.0, 0.1):
            dropout = list(range(1, int(round(drop * n)) + 1))
            t0 = time.perf_counter()
            got = secure_weighted_mean(ups, t=n // 2 + 1, dropout=dropout)
            sec = time.perf_counter() - t0
            keep = [c for c in ups if c not in dropout]
            err = float(np.abs(got - sum(ups[c][0] for c in keep) / len(keep)).max())
            extra = 32 + n * 2 * (2 * (16 + 1))  # public key + per recipient two secrets as two 16-byte shares
            rows.append({"clients": n, "dropout": drop, "threshold": n // 2 + 1, "seconds_total": sec,
                         "max_abs_error_vs_plain_mean": err, "extra_bytes_per_client": extra,
                         "masked_vector_bytes": 4 * (D + 1)})
            print(rows[-1], flush=True)
    out = {"update_floats": D, "rows": rows, "load_average": os.getloadavg()}
    Path("docs/bench/secagg_cost.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [24, 100])
