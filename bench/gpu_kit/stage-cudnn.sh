#!/usr/bin/env bash
# GPU machine: keep carried cuDNN part K in /tmp (it survives while the machine is warm).
set -euo pipefail
mkdir -p /tmp/cudnn-carry
cp .gpu/c"$1"/part.* /tmp/cudnn-carry/
part=$(basename .gpu/c"$1"/part.*)
(cd /tmp/cudnn-carry && grep " $part\$" "$OLDPWD/.gpu/kit/cudnn-parts.SHA256" | sha256sum -c --quiet -)
echo "cuDNN parts staged and checked: $(ls /tmp/cudnn-carry | wc -l)"
