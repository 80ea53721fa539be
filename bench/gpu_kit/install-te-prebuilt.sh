#!/usr/bin/env bash
# GPU machine, after stage.sh 1..N: TE's wheels (install-te.sh) and the torch extension built on
# a CPU machine (prepare.sh), unpacked into /tmp/site beside them (pip --target would skip the
# transformer_engine/ folder that is already there), then a TE layer in BF16 and FP8 on the cuDNN
# of cudnn-env.sh. Nothing is built here.
set -euo pipefail
start=$(date +%s)
bash .gpu/kit/install-te.sh
python3 -m zipfile -e .gpu/kit/transformer_engine_torch-*.whl /tmp/site
source .gpu/kit/cudnn-env.sh
cd /tmp && python3 - <<'PY'
import torch
import transformer_engine
import transformer_engine.pytorch as te

layer = te.Linear(1024, 1024, params_dtype=torch.bfloat16).cuda()
x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
print("TE bf16", layer(x).float().abs().mean().item())
with te.fp8_autocast(enabled=True):
    print("TE fp8", layer(x).float().abs().mean().item())
cudnn = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcudnn" in line})
print("transformer-engine", transformer_engine.__version__, "cuDNN", torch.backends.cudnn.version(), cudnn)
PY
echo "TE and its prebuilt extension installed and smoke-tested in $(( $(date +%s) - start )) s"
