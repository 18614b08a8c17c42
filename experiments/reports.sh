#!/usr/bin/env bash
# Render the published reports from the committed results (no training): the comparison table, the ablations
# and the sensitivity runs. Usage: bash experiments/reports.sh
set -euo pipefail
t=experiments/results/table
neurofed report $t/ct $t/ct_noea $t/fedavg $t/fedprox $t/scaffold $t/moon $t/fedbn $t/fedbs $t/safe \
  --seeds 0,1,2 --p-metrics bca,pgd@0.03 --out docs/results   # the published table: seeds 0-2 for every run
a=experiments/results/ablation
runs=(); for r in $t/fedavg $t/fedbs $a/fedbs_nosam $a/fedbs_standardbn $a/fedavg_sam $t/safe $a/safe_noawp $a/safe_nofat \
  $a/safe_fat005 $a/safe_fat010; do [ -f $r/results.json ] && runs+=($r); done
neurofed report "${runs[@]}" --seeds 0 --p-metrics bca,pgd@0.03 --out docs/results/ablation   # ablations ran seed 0: compare on seed 0
s=experiments/results/sensitivity
runs=($t/fedbs); for r in $s/fedbs_e1 $s/fedbs_e4 $s/fedbs_b16 $s/fedbs_b32 $s/fedbs_rho005 $s/fedbs_rho02 $s/fedbs_ch64; do
  [ -f $r/results.json ] && runs+=($r); done
neurofed report "${runs[@]}" --seeds 0 --refs fedbs --out docs/results/sensitivity
# the ablations extended to seeds 0-2 (experiments/ablation_seeds.txt), against the table's 3-seed runs
neurofed report $t/fedavg $t/fedbs $a/fedbs_nosam $a/fedavg_sam $t/safe $a/safe_noawp $a/safe_nofat \
  --seeds 0,1,2 --p-metrics bca,pgd@0.03 --refs fedavg,fedbs,safe --out docs/results/ablation_seeds
# the four headline runs on 5 seeds (experiments/table_seeds5.txt), as the SAFE paper reports
neurofed report $t/ct $t/fedavg $t/fedbs $t/safe --p-metrics bca,pgd@0.03 --refs ct,fedavg --out docs/results/seeds5
