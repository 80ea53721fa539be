#!/usr/bin/env bash
# CPU side, after the workplace GPU kit's make-carry.sh, from the project root: what it leaves out
# and the TE route needs on the lent GPU image (bench/README.md, "The verbs on a lent GPU machine"):
#   .gpu/c1..cN     nvidia-cudnn-cu13 9.28.1.4 (TE 2.17.1's PyPI library sets a cuDNN 9.22
#                   attribute in its fused-attention backward; the image's torch brings 9.19)
#   .gpu/kit/       these scripts, the parts' sums, and transformer_engine_torch built here
#                   against the image's torch 2.11.0 (cu130), so the GPU machine builds nothing.
# Needs a registry and ~6 GB in $BUILD; the extension takes ~10 min on 2 cores.
set -euo pipefail
CUDNN=${CUDNN:-nvidia-cudnn-cu13==9.28.1.4}
TORCH=${TORCH:-torch==2.11.0}  # the GPU image's (the workplace kit's device-packages.txt)
TE_VERSION=${TE_VERSION:-2.17.1}
PART_MIB=${PART_MIB:-49}       # a part, the kit and the ~12 MiB tree under the 64 MiB a call carries
BUILD=${BUILD:-/tmp/te-torch-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ -d .gpu/kit ] || { echo "run the workplace GPU kit's make-carry.sh first, from the project root" >&2; exit 1; }
for script in stage-cudnn.sh install-cudnn.sh install-te-prebuilt.sh cudnn-env.sh fused-parity.sh; do
  cp "$here/$script" .gpu/kit/
done
python=$(command -v python3.12 || echo "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3.12")
mkdir -p "$BUILD/dl"
[ -x "$BUILD/venv/bin/python" ] || "$python" -m venv "$BUILD/venv"
pip=("$BUILD/venv/bin/python" -m pip -q --disable-pip-version-check)

echo "[gpu_kit] $CUDNN in parts of $PART_MIB MiB"
rm -rf .gpu/c[0-9]* "$BUILD/cudnn" && mkdir -p "$BUILD/cudnn"
"${pip[@]}" download --no-deps "$CUDNN" -d "$BUILD/cudnn" 2>&1 | grep -v '^WARNING: Location' || true
wheel=$(ls "$BUILD"/cudnn/nvidia_cudnn_cu13-*.whl)
(cd "$BUILD/cudnn" && sha256sum "$(basename "$wheel")" > "$OLDPWD/.gpu/kit/cudnn.SHA256")
split -b "${PART_MIB}M" -d -a 2 "$wheel" "$BUILD/cudnn/part."
n=0
for part in "$BUILD"/cudnn/part.*; do n=$((n + 1)); mkdir -p ".gpu/c$n"; mv "$part" ".gpu/c$n/"; done
(cd .gpu && sha256sum c*/part.* | sed 's| c[0-9]*/| |' > kit/cudnn-parts.SHA256)

echo "[gpu_kit] transformer_engine_torch $TE_VERSION against $TORCH (cu130), on this CPU"
if ! ls .gpu/kit/transformer_engine_torch-*.whl >/dev/null 2>&1; then
  "${pip[@]}" install "$TORCH" "cuda-toolkit[nvcc,cccl]==13.0.2" pybind11 ninja "setuptools<82" wheel packaging 2>&1 \
    | grep -v '^WARNING: Location' || true
  "${pip[@]}" install --no-deps "transformer-engine==$TE_VERSION" "transformer-engine-cu13==$TE_VERSION" \
    nvidia-cudnn-frontend 2>&1 | grep -v '^WARNING: Location' || true
  "${pip[@]}" download --no-deps --no-binary transformer-engine-torch "transformer-engine-torch==$TE_VERSION" \
    -d "$BUILD/dl" 2>&1 | grep -v '^WARNING: Location' || true
  site=$("$BUILD/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  rm -rf "$BUILD/src" && mkdir "$BUILD/src"
  tar xzf "$BUILD"/dl/transformer_engine_torch-"$TE_VERSION".tar.gz -C "$BUILD/src" --strip-components=1
  inc=""; for d in "$site"/nvidia/*/include; do inc="$inc:$d"; done
  start=$(date +%s)
  (cd "$BUILD/src" && CPLUS_INCLUDE_PATH=${inc#:} CUDA_HOME=$site/nvidia/cu13 PATH=$site/nvidia/cu13/bin:$PATH \
     NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_FRAMEWORK=pytorch NVTE_WITH_NCCL_EP=0 MAX_JOBS=$(nproc) \
     "$BUILD/venv/bin/python" -m pip wheel -v --no-build-isolation --no-deps --no-index -w "$BUILD/wheel" . \
     > "$BUILD/build.log" 2>&1) || { tail -40 "$BUILD/build.log"; exit 1; }
  echo "[gpu_kit] built in $(( $(date +%s) - start )) s"
  cp "$BUILD"/wheel/transformer_engine_torch-*.whl .gpu/kit/
fi
echo "[gpu_kit] $(du -sh .gpu | cut -f1) in .gpu; after install-base.sh and stage.sh 1..6, the calls:"
for k in $(seq 1 "$n"); do
  echo "  run  command: bash .gpu/kit/stage-cudnn.sh $k   carry: [\".gpu/c$k\", \".gpu/kit\"]"
done
echo "  run  command: bash .gpu/kit/install-cudnn.sh && bash .gpu/kit/install-te-prebuilt.sh &&"
echo "                bash .gpu/kit/fused-parity.sh SHA DEADLINE      carry: [\".gpu/kit\"]"
