#!/usr/bin/env bash
# The disk a venv made from nothing needs: scripts/setup_venv.sh into a new temporary directory,
# with pip's TMPDIR in another, both measured with `du` every second, and the filesystem's used space
# (`df`, which sees pip's writes anywhere: keep the machine otherwise quiet); writes the peaks and
# the final sizes as JSON (the figures scripts/setup_venv.sh checks and the README gives).
# Usage: bench/venv_disk.sh OUT.json   (about 5 minutes, 12.5 GB free, package registry reachable)
set -euo pipefail
out=$1
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/downloads"
bytes() { du -s -B1 "$@" 2>/dev/null | awk '{ total += $1 } END { printf "%.0f\n", total }'; }
used() { df -P -B1 "$work" | awk 'NR == 2 { print $3 }'; }

start=$(date +%s) used_before=$(used)
NEMO_TOPR_VENV=$work/venv TMPDIR=$work/downloads "$repo_root/scripts/setup_venv.sh" > "$work/setup.log" 2>&1 &
setup=$!
peak=0 peak_downloads=0 peak_used=0
while kill -0 "$setup" 2>/dev/null; do
    venv=$(bytes "$work/venv") downloads=$(bytes "$work/downloads")
    ((venv + downloads > peak)) && peak=$((venv + downloads))
    ((downloads > peak_downloads)) && peak_downloads=$downloads
    now=$(($(used) - used_before))
    ((now > peak_used)) && peak_used=$now
    sleep 1
done
wait "$setup" || { tail -20 "$work/setup.log" >&2; exit 1; }
cat > "$out" <<EOF
{
  "what": "scripts/setup_venv.sh into an empty directory, pip's TMPDIR in another, du every second",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "commit": "$(git -C "$repo_root" rev-parse --short HEAD)",
  "seconds": $(($(date +%s) - start)),
  "venv_bytes": $(bytes "$work/venv"),
  "peak_downloads_bytes": $peak_downloads,
  "peak_bytes": $peak,
  "filesystem_peak_bytes": $peak_used,
  "filesystem_final_bytes": $(($(used) - used_before))
}
EOF
cat "$out"
