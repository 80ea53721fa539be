#!/usr/bin/env bash
# CPU side, from the project root: stage 2's carry for window.sh, as few parts as the calls' 64 MiB
# allow (bench/README.md, "A GPU window in three calls"). Writes:
#   .gpu/s1..sN   one xz stream in parts: TE 2.17.1 (core library pruned to sm_90 by
#                 prune_fatbin.py, Python package, torch extension) and cuDNN 9.28.1.4's graph-API
#                 JIT subset (libcudnn, libcudnn_graph, libcudnn_engines_runtime_compiled; every other
#                 library of that wheel as an empty stand-in with its soname, which TE's core library
#                 names as NEEDED and which would otherwise be looked for in another cuDNN)
#   .gpu/kit/     window.sh and what it runs, the parts' sums, sizes.json (what each call carries)
#   bash bench/gpu_kit/pack.sh [MAKE_CARRY]
# MAKE_CARRY: the workplace GPU kit's make-carry.sh, run first for .gpu/base and .gpu/kit; its TE
# parts (.gpu/p*) are removed, the payload here replaces them. The torch extension comes from
# prepare.sh (.gpu/kit/transformer_engine_torch-*.whl); NO_EXTENSION=1 packs without it (dry runs).
# make-carry.sh writes .git/info/exclude, so run both from a clone, not from a linked worktree.
set -euo pipefail
CUDNN=${CUDNN:-nvidia-cudnn-cu13==9.28.1.4}
TE_VERSION=${TE_VERSION:-2.17.1}
KEEP_SM=${KEEP_SM:-90}         # H100 and H200
LIMIT_MIB=${LIMIT_MIB:-63}     # what a call carries, tree included, with 1 MiB for later commits
BUILD=${BUILD:-/tmp/gpu-kit-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${1:-}" ]; then  # make-carry.sh starts from an empty .gpu: prepare.sh's extension kept aside
  keep=$(mktemp -d); cp .gpu/kit/transformer_engine_torch-*.whl "$keep/" 2>/dev/null || true
  bash "$1"; cp -r "$keep"/. .gpu/kit/; rm -rf .gpu/p[0-9]* "$keep"
fi
[ -f .gpu/kit/install-base.sh ] || { echo "pack.sh: no .gpu/kit: run it with the workplace GPU kit's make-carry.sh" >&2; exit 1; }
cp "$here"/{window.sh,smoke.py,items.txt,cudnn-env.sh,fused-parity.sh} .gpu/kit/
ext=$(ls .gpu/kit/transformer_engine_torch-*.whl 2>/dev/null || true)
[ -n "$ext" ] || [ "${NO_EXTENSION:-0}" = 1 ] || { echo "pack.sh: no TE torch extension: run prepare.sh" >&2; exit 1; }

pip=(python3 -m pip -q --disable-pip-version-check)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$BUILD/dl"
"${pip[@]}" download --no-deps "${plat[@]}" -d "$BUILD/dl" "$CUDNN" "transformer-engine==$TE_VERSION" \
  "transformer-engine-cu13==$TE_VERSION" nvdlfw-inspect importlib-metadata 2>&1 | grep -v '^WARNING: Location' || true

payload=$BUILD/payload
rm -rf "$payload" && mkdir -p "$payload/site" "$payload/cudnn/lib"
"${pip[@]}" install --no-deps --no-compile --target "$payload/site" "$BUILD"/dl/transformer_engine-"$TE_VERSION"-*.whl \
  "$BUILD"/dl/transformer_engine_cu13-"$TE_VERSION"-*.whl "$BUILD"/dl/nvdlfw_inspect-*.whl "$BUILD"/dl/importlib_metadata-*.whl
# unzipped, not pip-installed: pip --target skips the transformer_engine/ folder that is already there
[ -z "$ext" ] || python3 -m zipfile -e "$ext" "$payload/site"
python3 "$here/prune_fatbin.py" --keep-sm "$KEEP_SM" "$payload/site/transformer_engine/wheel_lib/libtransformer_engine.so" \
  > "$BUILD/prune.json"

wheel=$(ls "$BUILD"/dl/nvidia_cudnn_cu13-*.whl)
python3 - "$wheel" "$payload/cudnn/lib" > "$BUILD/stand-ins.txt" <<'PY'
import shutil, sys, zipfile
carried = ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_engines_runtime_compiled.so.9")
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in sorted(wheel.namelist()):
        soname = name.rsplit("/", 1)[1]
        if not name.startswith("nvidia/cudnn/lib/lib"):
            continue
        if soname not in carried:
            print(soname)  # a stand-in below
            continue
        with wheel.open(name) as source, open(f"{sys.argv[2]}/{soname}", "wb") as target:
            shutil.copyfileobj(source, target)
PY
while read -r soname; do
  echo 'int cudnn_sublibrary_not_carried;' | gcc -shared -x c - -Wl,-soname,"$soname" -o "$payload/cudnn/lib/$soname"
done < "$BUILD/stand-ins.txt"
(cd "$payload" && find site cudnn -type f | sort | xargs sha256sum > MANIFEST.SHA256)

# xz -9e on one core takes minutes: an archive made from a payload with the same sums is kept
manifest=$(sha256sum < "$payload/MANIFEST.SHA256" | cut -d' ' -f1)
if [ "$(cat "$BUILD/stage2.manifest" 2>/dev/null)" != "$manifest" ] || [ ! -f "$BUILD/stage2.tar.xz" ]; then
  start=$(date +%s)
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -C "$BUILD" payload | xz -9e -T1 > "$BUILD/stage2.tar.xz"
  echo "$(( $(date +%s) - start ))" > "$BUILD/stage2.xz-seconds" && echo "$manifest" > "$BUILD/stage2.manifest"
fi
xz_s=$(cat "$BUILD/stage2.xz-seconds")

tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb | tail -1 | cut -f1)
kit_bytes=$(du -sb .gpu/kit | cut -f1)
part_bytes=$(( LIMIT_MIB * 1048576 - tree_bytes - kit_bytes ))
# the first part rides with the base in call 1 when there is room beside it (a MiB at least)
room=$(( part_bytes - $(du -sb .gpu/base | cut -f1) )) first=()
[ "$room" -ge 1048576 ] && first=(--first-part-with-base)
rm -rf .gpu/s[0-9]*
size=$(stat -c %s "$BUILD/stage2.tar.xz") offset=0 n=0
while [ "$offset" -lt "$size" ]; do
  bytes=$part_bytes; [ "$n" = 0 ] && [ -n "${first[*]}" ] && bytes=$room
  n=$((n + 1)); mkdir -p ".gpu/s$n"
  dd if="$BUILD/stage2.tar.xz" of=".gpu/s$n/part.$(printf %02d $((n - 1)))" bs=1M iflag=skip_bytes,count_bytes \
     skip="$offset" count="$bytes" status=none
  offset=$((offset + bytes))
done
(cd .gpu && sha256sum s*/part.* | sed 's| s[0-9]*/| |' > kit/parts.SHA256)
python3 "$here/carry_sizes.py" --tree-bytes "$tree_bytes" --payload "$payload" --archive "$BUILD/stage2.tar.xz" \
  --xz-seconds "$xz_s" --prune "$BUILD/prune.json" --stand-ins "$BUILD/stand-ins.txt" "${first[@]}" > .gpu/kit/sizes.json
python3 -c "import json; [print(c['command'], ' carry:', json.dumps(c['carry']), f\"({c['bytes'] / 2**20:.1f} MiB)\")
            for c in json.load(open('.gpu/kit/sizes.json'))['calls']]"
