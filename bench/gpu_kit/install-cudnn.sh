#!/usr/bin/env bash
# GPU machine, after stage-cudnn.sh 1..N: the wheel assembled, checked and unpacked over torch's
# own nvidia/cudnn (the machine is discarded after the lease), so that whichever way a library
# looks, it finds 9.28: torch by its RPATH, TE by CUDNN_PATH (cudnn-env.sh) or, on a machine
# without a CUDA toolkit, by globbing every libcudnn*.so.9 of that folder
# (transformer_engine/common/__init__.py, _load_cuda_library_from_python), which beside a second
# cuDNN loaded 9.19 and 9.28 libraries together in a CPU dry run: "undefined symbol".
set -euo pipefail
start=$(date +%s)
wheel=/tmp/$(cut -d' ' -f3 .gpu/kit/cudnn.SHA256)
cat /tmp/cudnn-carry/part.* > "$wheel"
(cd /tmp && sha256sum -c --quiet "$OLDPWD/.gpu/kit/cudnn.SHA256")
rm -rf /tmp/cudnn && python3 -m zipfile -e "$wheel" /tmp/cudnn && rm "$wheel"
target=$(python3 -c "import os, torch; print(os.path.realpath(torch.__file__ + '/../../nvidia/cudnn'))")
mkdir -p "$target/lib" "$target/include"
cp -f /tmp/cudnn/nvidia/cudnn/lib/* "$target/lib/" && cp -f /tmp/cudnn/nvidia/cudnn/include/* "$target/include/"
rm -rf /tmp/cudnn
echo "cuDNN $(basename "$wheel") unpacked over $target in $(( $(date +%s) - start )) s"
