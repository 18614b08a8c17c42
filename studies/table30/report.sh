#!/usr/bin/env bash
# The table30 summaries from the committed raw results (no training): the published table (seeds 0-2), its 5-seed
# check, the ablations (seed 0 and seeds 0-2) and the sensitivity runs. Run from the repository root.
set -euo pipefail
R=studies/table30/raw.jsonl.gz
O=studies/table30
neurofed report $R:table/ct $R:table/ct_noea $R:table/fedavg $R:table/fedprox $R:table/scaffold $R:table/moon \
  $R:table/fedbn $R:table/fedbs $R:table/safe --seeds 0,1,2 --p-metrics bca,pgd@0.03 --out $O/report
neurofed report $R:table/ct $R:table/fedavg $R:table/fedbs $R:table/safe --seeds 0,1,2,3,4 --p-metrics bca,pgd@0.03 \
  --out $O/seeds5
neurofed report $R:table/fedavg $R:table/fedbs $R:ablation/fedbs_nosam $R:ablation/fedavg_sam $R:table/safe \
  $R:ablation/safe_noawp $R:ablation/safe_nofat --seeds 0,1,2 --refs fedavg,fedbs,safe --p-metrics bca,pgd@0.03 \
  --out $O/ablation
neurofed report $R:table/fedavg $R:table/fedbs $R:ablation/fedbs_nosam $R:ablation/fedbs_standardbn \
  $R:ablation/fedavg_sam $R:table/safe $R:ablation/safe_noawp $R:ablation/safe_nofat $R:ablation/safe_fat005 \
  $R:ablation/safe_fat010 --seeds 0 --refs fedavg --p-metrics bca,pgd@0.03 --out $O/ablation_s0
neurofed report $R:table/fedbs $R:sensitivity/fedbs_e1 $R:sensitivity/fedbs_e4 $R:sensitivity/fedbs_b16 \
  $R:sensitivity/fedbs_b32 $R:sensitivity/fedbs_rho005 $R:sensitivity/fedbs_rho02 $R:sensitivity/fedbs_ch64 \
  --seeds 0 --refs fedbs --out $O/sensitivity
