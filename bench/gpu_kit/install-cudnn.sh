#!/usr/bin/env bash
# GPU machine, after stage-cudnn.sh 1..N: the wheel assembled, checked and unpacked over the
# image's own nvidia/cudnn (the machine is discarded after the lease). Over it, not beside it: TE's
# import loads every libcudnn*.so.9 of sysconfig's purelib/nvidia/cudnn/lib by path
# (transformer_engine/common/__init__.py, _load_cuda_library_from_python), so a second cuDNN put
# first on LD_LIBRARY_PATH met the image's 9.19 sub-libraries there: "undefined symbol".
set -euo pipefail
start=$(date +%s)
wheel=/tmp/$(cut -d' ' -f3 .gpu/kit/cudnn.SHA256)
cat /tmp/cudnn-carry/part.* > "$wheel"
(cd /tmp && sha256sum -c --quiet "$OLDPWD/.gpu/kit/cudnn.SHA256")
rm -rf /tmp/cudnn && python3 -m zipfile -e "$wheel" /tmp/cudnn && rm "$wheel"
target=$(python3 -c "import sysconfig; print(sysconfig.get_path('purelib'))")/nvidia/cudnn
cp -f /tmp/cudnn/nvidia/cudnn/lib/* "$target/lib/" && cp -f /tmp/cudnn/nvidia/cudnn/include/* "$target/include/"
rm -rf /tmp/cudnn
echo "cuDNN $(basename "$wheel") unpacked over $target in $(( $(date +%s) - start )) s"
