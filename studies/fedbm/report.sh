#!/usr/bin/env bash
# The fedbm summaries from the committed raw results (no training): FedBM, its two ablations (no concept-guided
# generator: nocgde; no frozen concept classifier: nolkcc) and FedAvg, FedProx, MOON, FedBS, SAFE under each split
# (Dirichlet 0.05 / 0.1 / 0.5 label skew, one class per client, one client per subject). Run from the repository root.
set -euo pipefail
R=studies/fedbm/raw.jsonl.gz
A=studies/attacks46/raw.jsonl.gz   # FedBS and SAFE with one client per subject: sweep46's runs
O=studies/fedbm
neurofed report $R:fedbm_core/fedavg_dir005 $R:fedbm_core/fedbm_dir005 $R:fedbm_core/fedbm_nocgde_dir005 \
  $R:fedbm_core/fedbm_nolkcc_dir005 $R:fedbm_rest/fedprox_dir005 $R:fedbm_rest/moon_dir005 $R:fedbm_rest/fedbs_dir005 \
  $R:fedbm_rest/safe_dir005 --refs fedavg,fedbm --out $O/dir005
for s in dir01 dir05 missing; do
  neurofed report $R:fedbm_rest/fedavg_$s $R:fedbm_rest/fedbm_$s $R:fedbm_rest/fedbm_nocgde_$s \
    $R:fedbm_rest/fedbm_nolkcc_$s $R:fedbm_rest/fedprox_$s $R:fedbm_rest/moon_$s $R:fedbm_rest/fedbs_$s \
    $R:fedbm_rest/safe_$s --refs fedavg,fedbm --out $O/$s
done
neurofed report $R:fedbm_core/fedavg_subject $R:fedbm_core/fedbm_subject $R:fedbm_core/fedbm_nocgde_subject \
  $R:fedbm_core/fedbm_nolkcc_subject $R:fedbm_rest/fedprox_subject $R:fedbm_rest/moon_subject $A:sweep46/fedbs \
  $A:sweep46/safe --refs fedavg,fedbm --out $O/subject
# FedBM's slower convergence: 100 rounds (2 folds of seed 0), and twice the local epochs under Dirichlet(0.5) (seed 0)
neurofed report $R:fedbm_long/fedavg_subject_r100 $R:fedbm_long/fedbm_subject_r100 --refs fedavg,fedbm --out $O/long
# (studies/fedbm/steps/report.md: seed 0 of fedbm_steps, whose seeds 1-2 never finished; `neurofed report` needs a
# finished run, so it is not rewritten here)
