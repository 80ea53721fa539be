"""The model settings a machine needs, decided in one place for every verb and the benchmarks.

`train`, `score-logprobs`, `import`, `doctor` and `bench/gpu.py` build their models through
:func:`device_model_settings`, so that no verb keeps a Bridge default the machine cannot build:

* CPU: :func:`nemo_topr.model.cpu_runtime.cpu_model_overrides` (local layers, no fused kernels, fp32).
* CUDA with Transformer Engine: TE's layer spec unless ``model.transformer_impl=local``.
* CUDA without Transformer Engine (a supported route, logged): the local layer spec, and off the
  fusions that need TE or Apex (Bridge's TE spec provider is None without TE; ``apply_rope_fusion``
  raises in ``finalize()``; ``masked_softmax_fusion`` needs Apex's ``scaled_masked_softmax_cuda``;
  ``persist_layer_norm`` needs Apex's fast layer norm).
* Gradient-accumulation fusion only where Apex's ``fused_weight_gradient_mlp_cuda`` imports and
  the model is wrapped in DDP: Megatron's output layer raises without the extension
  (megatron/core/tensor_parallel/layers.py:1070-1079) although Bridge turns the fusion on whenever
  TE imports (megatron/bridge/utils/fusions.py:34-53), and without DDP there is no
  ``param.main_grad`` for the fused kernel to accumulate into.

The layer spec follows ``model.transformer_impl`` (:func:`follow_transformer_impl`): setting the
string alone leaves Bridge's TE spec in place (megatron/bridge/models/gpt_provider.py:120-125).
"""

from __future__ import annotations

import importlib.util
import logging
import mmap
from pathlib import Path

import torch

from nemo_topr.errors import UserError
from nemo_topr.model import cpu_runtime

logger = logging.getLogger(__name__)

# fusions whose kernels come from Transformer Engine or Apex: off on a GPU without TE
_FUSIONS_NEEDING_TE_OR_APEX = ("apply_rope_fusion", "masked_softmax_fusion", "persist_layer_norm")


class ModelSettingsError(UserError, ValueError):
    """A model setting this installation cannot run."""


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is absent or half-installed
        return False


def transformer_engine_available() -> bool:
    return _importable("transformer_engine.pytorch")


# cudnn-frontend sets this cuDNN 9.22 attribute in attention's backward only when built against
# cuDNN >= 9.22 headers, and its error text names it: its presence in TE's library marks a build
# that needs cuDNN 9.22 at run time (TE 2.17.1's PyPI wheels, cu12 and cu13; on an H200 with 9.19,
# 2026-11-26, every attention backward failed: docs/cluster.md, "Which Transformer Engine"); the
# doctor knows that failure by the same name
CUDNN_922_ATTRIBUTE = "CUDNN_ATTR_OPERATION_RESHAPE_MODE"
CUDNN_922 = 92200
# what to do about it, for `train`'s refusal and the doctor's `te attention` check alike
CUDNN_922_FIX = ("install nvidia-cudnn-cu12 (or -cu13) >= 9.22 with its nvidia/cudnn/lib first on LD_LIBRARY_PATH (the "
                 "venv route in docs/cluster.md does), or set model.attention_backend=unfused (slower; TE pads every "
                 "packed sequence to the longest) or flash (with flash-attn installed)")


def loaded_cudnn() -> tuple[int | None, str | None]:
    """The cuDNN version torch sees in this process, and torch's refusal (its first line) when the
    cuDNN loaded is not torch's own (on the H200, TE's import had loaded a system 9.14 first)."""
    try:
        return torch.backends.cudnn.version(), None
    except RuntimeError as error:
        return None, str(error).splitlines()[0]


def own_cudnn_fix() -> str:
    """How to make torch's own cuDNN the one a process loads."""
    own = Path(torch.__file__).parents[1] / "nvidia" / "cudnn" / "lib"
    where = str(own) if own.is_dir() else "the directory of the cuDNN torch was built with"
    return (f"put torch's own cuDNN first: export LD_LIBRARY_PATH={where}:$LD_LIBRARY_PATH (another libcudnn, e.g. a "
            "system one, loaded first)")


def te_core_library():
    """TE's core shared library, where TE itself finds it (None if it cannot say)."""
    try:
        from transformer_engine.common import _get_shared_object_file
        return _get_shared_object_file("core")
    except Exception:  # noqa: BLE001 - a private TE function: a TE without it is not judged
        return None


def te_attention_cudnn_problem() -> str | None:
    """Why a backward through TE's cuDNN attention would fail in this process, or None: torch
    loaded a cuDNN other than its own, or TE's library needs cuDNN 9.22 and an older one is loaded."""
    if not transformer_engine_available():
        return None
    cudnn, refusal = loaded_cudnn()
    if refusal:
        return f"torch found a cuDNN other than its own ({refusal}); {own_cudnn_fix()}"
    library = te_core_library()
    if not cudnn or cudnn >= CUDNN_922 or library is None:
        return None
    with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as image:
        if image.find(CUDNN_922_ATTRIBUTE.encode()) < 0:
            return None
    return (f"Transformer Engine's library ({library}) was built against cuDNN >= 9.22 and sets a 9.22 attribute "
            f"in attention's backward, but this process loaded cuDNN {cudnn}: every backward through cuDNN "
            "attention would fail (CUDNN_STATUS_BAD_PARAM)")


def gradient_accumulation_fusion_available() -> bool:
    """Whether Apex's fused_weight_gradient_mlp_cuda (the kernel Megatron's linear layers need
    for gradient-accumulation fusion) is importable."""
    return _importable("fused_weight_gradient_mlp_cuda")


def fused_adam_available() -> bool:
    """Whether Megatron's optimizers get Transformer Engine's or Apex's FusedAdam (Megatron's own
    flag). Without either, Megatron-Core 0.19.2 falls back to torch's Adam, and its distributed
    optimizer then cannot load a checkpoint: `state_dict()` reads the step from the optimizer
    state, empty before the first step (megatron/core/optimizer/distrib_optimizer.py:836-839,
    `assert len(steps) == 1`; the resume of issue 27's first GPU run)."""
    from megatron.core.optimizer import distrib_optimizer

    return distrib_optimizer.HAVE_APEX_OR_TE


def masked_softmax_kernel_available() -> bool:
    return _importable("scaled_masked_softmax_cuda")


def device_model_settings(provider, *, wrapped_in_ddp: bool = True):
    """Settle `provider` (a Bridge GPTModelProvider) for this machine; returns it.

    `wrapped_in_ddp`: whether the model will be built with ``wrap_with_ddp=True`` (training);
    forward-only and benchmark builds without DDP pass False."""
    if not torch.cuda.is_available():
        return cpu_runtime.cpu_model_overrides(provider)
    provider.gradient_accumulation_fusion = wrapped_in_ddp and gradient_accumulation_fusion_available()
    if not transformer_engine_available():
        if provider.transformer_impl != "local":
            logger.warning("Transformer Engine is not installed: GPU route without TE (local layer spec, BF16 only, "
                           "no FP8; rope, masked-softmax and persistent layer-norm fusions off)")
        provider.transformer_impl = "local"
        for flag in _FUSIONS_NEEDING_TE_OR_APEX:
            setattr(provider, flag, False)
    return follow_transformer_impl(provider)


def follow_transformer_impl(provider):
    """Bridge's layer spec for ``provider.transformer_impl``, replacing only Bridge's own two
    defaults (a custom spec stays; the step's attention check still judges it).

    Local layers get the packed-sequence mask as a tensor; the fused causal softmax kernel would
    drop it (megatron/core/fusions/fused_softmax.py:285-291), so masked_softmax_fusion is off."""
    from megatron.bridge.models.gpt_provider import default_layer_spec, local_layer_spec

    if provider.transformer_layer_spec not in (default_layer_spec, local_layer_spec):
        return provider
    if provider.transformer_impl == "local":
        provider.transformer_layer_spec = local_layer_spec
        provider.masked_softmax_fusion = False
    else:
        if not transformer_engine_available():
            raise ModelSettingsError(f"model.transformer_impl={provider.transformer_impl!r} needs Transformer "
                                     "Engine, which is not installed; use model.transformer_impl=local (or install "
                                     "requirements-gpu.txt)", key="model.transformer_impl.without_transformer_engine",
                                     where="model.transformer_impl")
        provider.transformer_layer_spec = default_layer_spec
    return provider
