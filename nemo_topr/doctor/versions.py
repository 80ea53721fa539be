"""The doctor's "versions" check: what the GPU path depends on, and what to do when the node's
cuDNN is not the one Transformer Engine was built against."""

from __future__ import annotations

import torch

from nemo_topr import installed_version
from nemo_topr.doctor.runner import CheckFailed
from nemo_topr.model.settings import CUDNN_922_ATTRIBUTE, CUDNN_922_FIX, loaded_cudnn, own_cudnn_fix

# The H200's failure (2026-11-26): TE's library set an attribute that cuDNN has only since 9.22
CUDNN_TOO_OLD = (f"Transformer Engine was built against a newer cuDNN than the one loaded ({CUDNN_922_ATTRIBUTE} "
                 f"exists since cuDNN 9.22): {CUDNN_922_FIX}")


def versions() -> dict[str, str | None]:
    """Versions of what the GPU path depends on (None: not installed / not available)."""
    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    cudnn, refusal = loaded_cudnn()  # a refusal is recorded, and the versions check fails
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": f"error: {refusal}" if refusal else None if cudnn is None else str(cudnn),
            "nccl": nccl, "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "transformer_engine": installed_version("transformer_engine", "transformer-engine"),
            "apex": installed_version("apex"), "megatron_core": installed_version("megatron-core", "megatron_core"),
            "megatron_bridge": installed_version("megatron-bridge", "megatron_bridge")}


def check_versions(found: dict[str, str | None], device: str) -> str:
    """The versions check's verdict on what `versions()` found."""
    if device == "cuda" and not found["cuda"]:
        raise CheckFailed("torch has no CUDA build", "install the CUDA build of torch (requirements-gpu.txt)")
    if (found["cudnn"] or "").startswith("error:"):
        raise CheckFailed(f"cuDNN {found['cudnn']}", own_cudnn_fix())
    return ", ".join(f"{k} {v}" for k, v in found.items() if v)


def attention_fix(detail: str) -> str:
    """What to do when TE's attention fails on the node, from the failure's text."""
    if CUDNN_922_ATTRIBUTE in detail:
        return CUDNN_TOO_OLD
    return ("check the TE and cuDNN versions in the table (NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 shows TE's choice of "
            "backend); model.attention_backend=unfused avoids cuDNN attention")
