#!/usr/bin/env bash
# GPU machine: one lent window, stage 2 included, as the calls that bench/README.md ("A GPU window
# in three calls") lists. After the workplace kit's install-base.sh, on the same warm machine:
#   window.sh stage K              keep carried part K (.gpu/sK) in /tmp/stage2, its sum checked
#   window.sh ready                the parts joined and checked, cuDNN 9.28 (its graph-API JIT
#                                  subset) put in place of torch's cuDNN, TE into /tmp/site, a TE
#                                  layer in BF16 and FP8: stage 2 ready
#   window.sh items SHA SECONDS    the issue's GPU items by priority, each with its own budget,
#                                  until SECONDS from the call's start; an item done is not rerun
# Every step appends to $OUT/window.log as it ends, and every item writes its results to $OUT at
# once (7 files at most), so a call cut off still returns what ran. --dry-run (first argument):
# the same steps on a CPU machine (bench/gpu_kit/dryrun.sh), each stopping before its first CUDA call.
set -uo pipefail
dry=0; [ "${1:-}" = --dry-run ] && { dry=1; shift; }
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stage=${STAGE_DIR:-/tmp/stage2} site=${SITE_DIR:-/tmp/site} start=$(date +%s)
python=${PYTHON:-python3}
export OUT; mkdir -p "$stage" "$OUT"
log() { echo "[window $(date -u +%T) +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/window.log"; }

case "${1:-}" in
stage)
  part=$(basename .gpu/s"$2"/part.*)
  cp .gpu/s"$2/$part" "$stage/"
  (cd "$stage" && grep " $part\$" "$kit/parts.SHA256" | sha256sum -c --quiet -) || { log "part $2 BAD SUM"; exit 1; }
  log "part $2 staged and checked: $(ls "$stage"/part.* | wc -l) of $(wc -l < "$kit/parts.SHA256")"
  ;;
ready)
  [ "$(ls "$stage"/part.* 2>/dev/null | wc -l)" = "$(wc -l < "$kit/parts.SHA256")" ] || { log "parts missing"; exit 1; }
  t=$(date +%s)
  cat "$stage"/part.* | xz -dc -T0 | tar xf - -C "$stage" && rm "$stage"/part.* || { log "unpack FAILED"; exit 1; }
  (cd "$stage/payload" && sha256sum -c --quiet MANIFEST.SHA256) || { log "payload sums FAILED"; exit 1; }
  log "payload unpacked and checked in $(( $(date +%s) - t )) s"
  # torch's own nvidia/cudnn/lib: every cuDNN 9.19 library goes, so nothing can load one beside 9.28
  lib=${CUDNN_LIB_DIR:-$($python -c "import os, torch; print(os.path.realpath(torch.__file__ + '/../../nvidia/cudnn/lib'))")}
  log "replacing $(ls "$lib" | tr '\n' ' ')in $lib"
  rm -f "$lib"/libcudnn*.so* && cp -a "$stage"/payload/cudnn/lib/. "$lib/" || { log "cuDNN copy FAILED"; exit 1; }
  mkdir -p "$site" && cp -a "$stage"/payload/site/. "$site/" && rm -rf "$stage/payload"
  log "cuDNN 9.28 subset in $lib, TE in $site"
  ldconfig -p | grep libcudnn | tee -a "$OUT/window.log"  # a system cuDNN that a missing name would reach
  CUDNN_LIB_DIR=$lib source "$kit/cudnn-env.sh"; export PYTHONPATH=$site:$PYTHONPATH
  flags=(); [ "$dry" = 1 ] && flags=(--dry-run)
  timeout 120 "$python" "$kit/smoke.py" "${flags[@]}" "$lib" 2>&1 | tee -a "$OUT/window.log"
  rc=${PIPESTATUS[0]}; log "stage 2 ready: smoke test exit $rc"; exit "$rc"
  ;;
items)
  sha=$2 until=$(( start + $3 ))
  source "$kit/cudnn-env.sh"
  # name, budget in seconds (the issue's priorities: 2, then 3, then 1, then 4), command
  while IFS='|' read -r name budget cmd; do
    [ -f "$stage/done.$name" ] && continue
    left=$(( until - $(date +%s) ))
    [ "$left" -lt 60 ] && { log "$name: not started, $left s left"; continue; }
    [ "$budget" -gt "$left" ] && budget=$left
    if [ "$dry" = 1 ]; then log "$name: would run for at most $budget s: $cmd"; continue; fi
    log "$name: start, budget $budget s"
    timeout "$budget" bash -c "$cmd" < /dev/null >> "$OUT/window.log" 2>&1
    rc=$?; log "$name: exit $rc"; [ "$rc" = 0 ] && touch "$stage/done.$name"
  done < <(sed "s/@SHA@/$sha/g" "$kit/items.txt")
  ;;
*) echo "usage: window.sh [--dry-run] stage K | ready | items SHA SECONDS" >&2; exit 2 ;;
esac
