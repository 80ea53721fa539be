#!/usr/bin/env bash
# GPU machine, after install-cudnn.sh and install-te-prebuilt.sh: issue 27's last stage-2 item,
# TE's cuDNN fused attention against local layers on packed rows (per-token CE, per-sequence log pi,
# TOPR gradients), then the doctor and the verbs on this commit until DEADLINE seconds from now.
# Writes $OUT as it goes: versions.json, parity_fused.log, then bench.gpu_verbs's files.
#   bash .gpu/kit/fused-parity.sh SHA DEADLINE
set -uo pipefail
sha=$1 deadline=$2 start=$(date +%s)
source .gpu/kit/cudnn-env.sh
python3 -c "import json; from nemo_topr.doctor.versions import versions; print(json.dumps(versions()))" > "$OUT/versions.json"
cat "$OUT/versions.json"
t0=$(date +%s)
timeout 180 python3 -m nemo_topr.doctor.packed_parity > "$OUT/parity_fused.log" 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s; $(date -u +%FT%TZ)" >> "$OUT/parity_fused.log"
tail -3 "$OUT/parity_fused.log"
left=$(( deadline - ($(date +%s) - start) ))
[ "$left" -gt 60 ] && python3 -m bench.gpu_verbs --out "$OUT" --commit "$sha" --deadline "$left" \
  --only doctor import "shared prefix" "score run" "export scores" eval
echo "fused-parity.sh done after $(( $(date +%s) - start )) s"
