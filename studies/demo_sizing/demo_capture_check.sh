#!/bin/bash
# The demo's capture phase alone (neurofed demo's defaults: 32 headsets S001-S019, S024-S036, runs 4/8/12, 20x,
# one `edge-client record` per headset, started after the headsets as the demo does), then the trials each
# recorder stored. Used on 2026-11-25 to look for the demo's lost trials (README, docs/demo.md): 3 runs, 1440/1440.
#   bash studies/demo_sizing/demo_capture_check.sh [OUT_DIR]        (~1-2 min; add CPU load to stress it)
set -u
out=${1:-$(mktemp -d /tmp/capcheck.XXXX)}
data=${NEUROFED_DATA:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/data}
mkdir -p "$out/stores" "$out/logs"
subj="1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,24,25,26,27,28,29,30,31,32,33,34,35,36"
name="capcheck$$"
headset-sim --subjects "$subj" --data-dir "$data" --runs 4,8,12 --speed 20 --name "$name" --wait-consumers 240 \
  --lead-in 1.0 > "$out/logs/headsets.log" 2>&1 &
for _ in $(seq 1 360); do [ "$(grep -c source_id "$out/logs/headsets.log")" -ge 32 ] && break; sleep 0.5; done
sleep 2
for s in ${subj//,/ }; do
  S=$(printf "S%03d" "$s")
  edge-client record --stream "$name-$S" --store "$out/stores/$S" --subject "$S" --sfreq 160 --resolve-timeout 180 \
    --idle-timeout 5 --duration 600 > "$out/logs/record-$S.log" 2>&1 &
done
wait
stored=0
for f in "$out"/logs/record-*.log; do
  n=$(grep -c '^trial ' "$f"); stored=$((stored + n))
  [ "$n" -lt 45 ] && echo "$(basename "$f" .log): $n of 45; $(grep -h 'skipped\|dropped' "$f" | head -3)"
done
echo "stored $stored of 1440 cued trials ($out)"
