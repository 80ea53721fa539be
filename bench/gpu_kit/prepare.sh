#!/usr/bin/env bash
# CPU side, from the project root, before pack.sh:
# .gpu/kit/transformer_engine_torch-*.whl, TE's torch extension built here against the GPU image's
# torch 2.11.0 (cu130) and the CUDA 13.0.2 wheels, so the GPU machine builds nothing (pack.sh puts
# it in stage 2's payload). Needs a registry and ~6 GB in $BUILD; ~7-10 min on 2 cores.
set -euo pipefail
TORCH=${TORCH:-torch==2.11.0}  # the GPU image's (the workplace kit's device-packages.txt)
TE_VERSION=${TE_VERSION:-2.17.1}
BUILD=${BUILD:-/tmp/te-torch-build}
mkdir -p .gpu/kit
python=$(command -v python3.12 || echo "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3.12")
mkdir -p "$BUILD/dl"
[ -x "$BUILD/venv/bin/python" ] || "$python" -m venv "$BUILD/venv"
pip=("$BUILD/venv/bin/python" -m pip -q --disable-pip-version-check)

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
echo "[gpu_kit] $(ls .gpu/kit/transformer_engine_torch-*.whl); next: bash bench/gpu_kit/pack.sh"
