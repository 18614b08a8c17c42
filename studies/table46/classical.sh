#!/usr/bin/env bash
# Classical references (issue 21 item 3) on the published folds (subject 5-fold, fold seed 0) and epochs
# (21 sensorimotor channels, 8-30 Hz, 80 Hz, [0, 4) s): EA + CSP(6) + LDA, and OAS covariances re-centred per
# subject -> tangent space -> logistic regression; on the 30 subjects of studies/table30/spec.toml and on all 46.
# Run from the repository root with NEUROFED_DATA set: bash studies/table46/classical.sh   (about 5 min on 1 core)
set -euo pipefail
S30=1-19,24-33,42
S46=1-19,24-50
for m in csp-lda riemann; do
  OMP_NUM_THREADS=1 neurofed classical --method $m --subjects $S30 --protocol kfold:5 --seeds 0,1,2 \
    --out runs/studies/results/classical/s30/$m
  OMP_NUM_THREADS=1 neurofed classical --method $m --subjects $S46 --protocol kfold:5 --seeds 0,1,2 \
    --out runs/studies/results/classical/s46/$m
done
# Under ART's Square attack (black box, 1000 queries per test batch of 8, eps 0.05 x channel std), seed 0;
# minutes per fold, resumable (finished folds are kept):
# OMP_NUM_THREADS=1 neurofed classical --method csp-lda --subjects $S30 --protocol kfold:5 --seeds 0 \
#   --attack square:0.05 --out runs/studies/results/classical/s30_attacked/csp-lda
