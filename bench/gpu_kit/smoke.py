"""Stage 2's smoke test on the GPU machine (window.sh ready): TE's import, a TE Linear in BF16 and FP8,
and which cuDNN libraries the process mapped (only the carried 9.28 ones may appear).

    python3 smoke.py CUDNN_LIB_DIR             on the GPU machine
    python3 smoke.py --dry-run CUDNN_LIB_DIR   on a CPU machine, with a stand-in libcuda.so.1 on
                                               LD_LIBRARY_PATH: TE's import (every carried library
                                               loaded), then stop before the first CUDA call
"""

import json
import os
import sys


def mapped_cudnn() -> list[str]:
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libcudnn" in line})


def main() -> None:
    dry = sys.argv[1] == "--dry-run"
    lib_dir = os.path.realpath(sys.argv[-1])
    if not dry:
        import torch  # first, as in every GPU process: its CUDA libraries (NCCL, cuBLAS) are then loaded

    import transformer_engine  # loads cuDNN, NVRTC, cuRAND and TE's core library

    report = {"transformer_engine": transformer_engine.__version__,
              "CUDNN_LIB_CONFIG": os.environ.get("CUDNN_LIB_CONFIG")}
    if not dry:
        import transformer_engine.pytorch as te

        layer = te.Linear(1024, 1024, params_dtype=torch.bfloat16).cuda()
        x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
        report["te_bf16"] = layer(x).float().abs().mean().item()
        with te.fp8_autocast(enabled=True):
            report["te_fp8"] = layer(x).float().abs().mean().item()
        report["cudnn"] = torch.backends.cudnn.version()
        report["device"] = torch.cuda.get_device_name(0)
    report["cudnn_mapped"] = mapped_cudnn()
    foreign = [path for path in report["cudnn_mapped"] if os.path.dirname(os.path.realpath(path)) != lib_dir]
    print(json.dumps(report))
    if foreign:
        sys.exit(f"cuDNN libraries from outside {lib_dir} mapped: {foreign}")


if __name__ == "__main__":
    main()
