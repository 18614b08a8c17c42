#!/usr/bin/env bash
# The table46 summaries from the committed raw results (no training). Run from the repository root.
set -euo pipefail
R=studies/table46/raw.jsonl.gz
A=studies/attacks46/raw.jsonl.gz   # sweep46: the same runs as table46's trained again with --save-models
O=studies/table46
neurofed report $R:table46 $R:classical/s46 --refs ct,fedavg,riemann --p-metrics bca,pgd@0.03 --out $O/report
neurofed report $R:table46/fedavg $R:table46/ct $R:baselines46/ct_at $R:baselines46/fedprox_mu1 $R:baselines46/fedfa \
  $R:baselines46/ga $R:table46/safe $R:classical/s46/riemann --refs fedavg,ct_at --p-metrics bca,pgd@0.03 \
  --out $O/baselines
neurofed report $R:table46/fedavg $R:table46/safe $R:baselines46/ct_at --refs fedavg,safe \
  --p-metrics bca,fgsm@0.03,pgd@0.03 --out $O/ct_at
neurofed report $R:table46/fedavg $R:baselines46/ct_at $R:baselines46/fal $R:table46/safe --refs fedavg,ct_at,safe \
  --p-metrics bca,pgd@0.03 --out $O/fal
neurofed report $R:table46/fedavg $R:baselines46/fedfa --refs fedavg --p-metrics bca,pgd@0.03 --out $O/fedfa
neurofed report $R:table46/fedavg $R:baselines46/fedprox_mu1 --refs fedavg --p-metrics bca,pgd@0.03 --out $O/fedprox
neurofed report $R:table46/fedavg $R:baselines46/fedfa $R:fedfa_p46/fedfa_p025 $R:fedfa_p46/fedfa_p01 --seeds 0 \
  --refs fedavg,fedfa --p-metrics bca,pgd@0.03 --out $O/fedfa_p
neurofed report $A:sweep46/fedavg $A:sweep46/fedbs $A:sweep46/safe $R:ensemble46/fedavg_3seeds $R:ensemble46/fedbs_3seeds \
  $R:ensemble46/safe_3seeds $R:ensemble46/safe_fedavg_3seeds $R:ensemble46/safe_fedbs_3seeds \
  $R:ensemble46/safe_3seeds_batch64 $R:classical/s46/csp-lda $R:classical/s46/riemann --refs riemann,safe --out $O/ensemble
