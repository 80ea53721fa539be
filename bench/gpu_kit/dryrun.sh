#!/usr/bin/env bash
# CPU side, after pack.sh, from the project root: the window's calls (.gpu/kit/sizes.json) played on
# this machine. Each call gets a fresh folder with what the lent machine would receive (the work
# tree and the call's carry, measured against 64 MiB), then runs its command with window.sh
# --dry-run, all sharing one scratch /tmp/stage2 and /tmp/site as a warm machine does; every step
# stops before its first CUDA call. Writes the log and the results JSON (sizes, times, estimate).
#   bash bench/gpu_kit/dryrun.sh IMAGE_PYTHON LOG JSON
# IMAGE_PYTHON: the python of a venv standing in for the GPU image's CUDA libraries, at its
# versions (nvidia-cudnn-cu13 9.19.0.56, nvidia-cublas, -cuda-runtime, -cuda-nvrtc, -curand,
# -nccl-cu13; bench/results/gpu_h200_2026-11-26_image_packages.txt). torch is not needed.
set -uo pipefail
image_python=$1 log=$2 json=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
purelib=$("$image_python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
scratch=$(mktemp -d)
# the stand-in's cuDNN is replaced as the GPU machine's is; put back afterwards for the next dry run
cp -a "$purelib/nvidia/cudnn/lib" "$scratch/cudnn-lib-before"
trap 'rm -rf "$purelib/nvidia/cudnn/lib" && mv "$scratch/cudnn-lib-before" "$purelib/nvidia/cudnn/lib"; rm -rf "$scratch"' EXIT
# a libcuda.so.1 without a driver: every driver function the carried libraries import returns
# CUDA_ERROR_UNKNOWN (999), so that they load and TE's import goes as far as it can without a GPU
mkdir -p "$scratch/stub" "$scratch/peek"
cat .gpu/s*/part.* | xz -dc | tar xf - -C "$scratch/peek" --wildcards 'payload/cudnn/lib/*' 'payload/site/transformer_engine/wheel_lib/*'
find "$scratch/peek" -name 'lib*.so*' -exec nm -D --undefined-only {} + | awk '$NF ~ /^cu[A-Z]/ {print $NF}' | sort -u \
  | sed 's/.*/int &(void) { return 999; }/' | gcc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$scratch/stub/libcuda.so.1"
rm -rf "$scratch/peek"
# what torch's import loads on the GPU machine before TE's: NCCL
export STAGE_DIR=$scratch/stage2 SITE_DIR=$scratch/site PYTHON=$image_python CUDNN_LIB_DIR=$purelib/nvidia/cudnn/lib
export LD_LIBRARY_PATH=$scratch/stub:$purelib/nvidia/nccl/lib
: > "$log"
say() { echo "$*" | tee -a "$log"; }
say "# GPU window dry run on CPU, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), $(nproc) cores"
say "# image stand-in: $image_python; cuDNN before: $(ls "$CUDNN_LIB_DIR" | tr '\n' ' ')"
say "# libcuda.so.1 stand-in exports: $(nm -D --defined-only "$scratch/stub/libcuda.so.1" | awk '$2 == "T" {print $3}' | tr '\n' ' ')"
say "# (env.sh's two notes below are the workplace kit's: the dry run's base is in a scratch site, not /tmp/site)"
calls=$(python3 -c "import json; print(len(json.load(open('.gpu/kit/sizes.json'))['calls']))")
: > "$scratch/times.txt"
for i in $(seq 0 $((calls - 1))); do
  mapfile -t call < <(python3 - "$i" <<'PY'
import json, sys
call = json.load(open(".gpu/kit/sizes.json"))["calls"][int(sys.argv[1])]
# the base: install-base.sh up to its first CUDA call (its import check needs the image's torch)
base = "(cd .gpu/base && sha256sum -c --quiet SHA256SUMS) && mkdir -p $SITE_DIR && tar xJf .gpu/base/site.tar.xz -C $SITE_DIR"
dry = call["command"].replace("bash .gpu/kit/install-base.sh && python3 -m compileall -q -j 16 /tmp/site", base)
print(call["command"], " ".join(call["carry"]), dry.replace("window.sh ", "window.sh --dry-run "), sep="\n")
PY
)
  command=${call[0]} carry=${call[1]} dry=${call[2]}
  fresh=$scratch/call$i/repo && mkdir -p "$fresh"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$fresh"
  for path in $carry; do cp -r --parents "$path" "$fresh"; done
  bytes=$(find "$fresh" -type f -print0 | xargs -0 du -cb | tail -1 | cut -f1)
  say ""
  say "## call $((i + 1)): $(( bytes / 1024 ))"' KiB carried of 65536 (64 MiB), tree and '"$carry"
  say "GPU command: $command"
  say "dry run:     $dry"
  start=$(date +%s.%N)
  (cd "$fresh" && OUT=$scratch/out$i bash -c "$dry") 2>&1 | sed 's/^/    /' | tee -a "$log"
  rc=${PIPESTATUS[0]}
  seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  say "exit $rc after $seconds s"
  echo "$((i + 1)) $bytes $rc $seconds" >> "$scratch/times.txt"
  rm -rf "$scratch/call$i"
done
say ""
say "cuDNN after: $(ls -l "$CUDNN_LIB_DIR" | awk 'NR > 1 {print $5, $9}' | tr '\n' ';')"
python3 "$here/window_estimate.py" .gpu/kit/sizes.json "$scratch/times.txt" "$log" > "$json"
say "$(python3 -c "import json; print(json.load(open('$json'))['estimate']['summary'])")"
