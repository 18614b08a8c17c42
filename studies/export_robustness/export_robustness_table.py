"""Markdown table of the exported models' BCA (benign, int8, FGSM/PGD at several budgets) from the JSON files
written by studies/export_robustness/export_robustness.sh. Usage: python studies/export_robustness/export_robustness_table.py [studies/export_robustness/results]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

d = Path(sys.argv[1] if len(sys.argv) > 1 else "studies/export_robustness/results")
EPS = ("0.01", "0.03", "0.05", "0.1")


def cell(p: Path, key: str = "bca_attacked") -> str:
    if not p.is_file():
        return "-"
    s = json.loads(p.read_text())["summary"][key]
    return f"{100 * s['mean']:.1f} ± {100 * s['std_subjects']:.1f}"


print("| model | benign (ORT fp32) | int8 | torch − ORT BCA | "
      + " | ".join(f"{a.upper()} {e}" for a in ("fgsm", "pgd") for e in EPS) + " | PGD 0.03 / benign |")
print("|---" * (5 + 2 * len(EPS)) + "|")
for alg in ("fedavg", "safe"):
    if not (d / f"{alg}.benign.json").is_file():
        continue
    benign = json.loads((d / f"{alg}.benign.json").read_text())["summary"]["bca"]["mean"]
    tvo = json.loads((d / f"{alg}.torch_vs_onnx.json").read_text())["max_abs_bca_difference"]
    pgd = d / f"{alg}.pgd.0.03.json"
    ratio = json.loads(pgd.read_text())["summary"]["bca_attacked"]["mean"] / benign if pgd.is_file() else None
    row = [alg, cell(d / f"{alg}.benign.json", "bca"), cell(d / f"{alg}.int8.benign.json", "bca"), f"{tvo:.1f}"]
    row += [cell(d / f"{alg}.{a}.{e}.json") for a in ("fgsm", "pgd") for e in EPS]
    row.append("-" if ratio is None else f"{100 * ratio:.0f} %")
    print("| " + " | ".join(row) + " |")

# BCA vs attack budget of the exported models (ORT), next to the JSON files
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 4))
for alg in ("fedavg", "safe"):
    if not (d / f"{alg}.benign.json").is_file():
        continue
    benign = json.loads((d / f"{alg}.benign.json").read_text())["summary"]["bca"]["mean"]
    for atk, style in (("fgsm", "-o"), ("pgd", "--s")):
        xs, ys = [0.0], [100 * benign]
        for e in EPS:
            p = d / f"{alg}.{atk}.{e}.json"
            if p.is_file():
                xs.append(float(e))
                ys.append(100 * json.loads(p.read_text())["summary"]["bca_attacked"]["mean"])
        ax.plot(xs, ys, style, label=f"{alg} {atk.upper()}")
ax.axhline(50, color="grey", lw=0.8, ls=":")
ax.set_xlabel("attack budget ε (× per-channel std)")
ax.set_ylabel("BCA on held-out subjects (%)")
ax.set_title("Exported models (onnxruntime), 6 held-out subjects")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(d / "bca_vs_eps.png", dpi=100)
