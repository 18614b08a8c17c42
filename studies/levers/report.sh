#!/usr/bin/env bash
# The levers study's report (no training): the best deployable recipe against SAFE at 50 rounds (table46) and the best
# classical reference; studies/headline.toml points at its table. Run from the repository root.
set -euo pipefail
L=studies/levers/raw.jsonl.gz
T=studies/table46/raw.jsonl.gz
neurofed report $L:levers/safe_r100_swa $T:table46/safe $T:classical/s46/riemann --refs riemann,safe \
  --p-metrics bca,pgd@0.03 --out studies/levers/report
