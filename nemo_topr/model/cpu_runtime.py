"""Run Megatron-Core 0.19.2 and Megatron-Bridge 0.6.2 on machines without CUDA.

This is the only module in nemo_topr that patches upstream code. It exists so that the real
Bridge ``finetune()`` loop, tensor/pipeline parallelism over gloo, distributed checkpoints and
AutoBridge conversion run on CPU for tests and demos. On a GPU machine it does nothing.

Two entry points, both explicit (importing this module patches nothing):

* :func:`import_bridge` imports Megatron-Bridge. Bridge imports three GPU-only packages at
  module top level; when (and only when) such a package is absent, a stub is served to exactly
  those importing modules and removed from ``sys.modules`` afterwards, so Megatron-Core's own
  ``try: import transformer_engine`` probes still conclude "not installed" (``HAVE_TE`` stays
  False). On a cluster image with TE and NVRx installed nothing is stubbed. In a process without
  CUDA (``--device cpu``, a login node), the installed packages whose kernels need CUDA
  (:data:`CUDA_ONLY_PACKAGES`) are hidden for the rest of the process, so that Megatron-Core
  builds what the CPU machines this project is tested on build. It also makes Bridge use the
  prebuilt dataset helpers (:func:`use_prebuilt_dataset_helpers`), on every device, and pauses
  Python's cyclic garbage collector while it imports, then freezes what it imported (below).
* :func:`enable_cpu_runtime` applies the CUDA-to-CPU patches listed in :data:`PATCHES`, each
  documented with the upstream ``file:line`` it works around (paths relative to
  ``site-packages/megatron``). It is a no-op when ``torch.cuda.is_available()``, idempotent,
  and fully reversible with :func:`disable_cpu_runtime` (every patch is an attribute swap that
  remembers the original, plus one ``TorchFunctionMode`` that is exited on disable).

Also here: :func:`cpu_model_overrides`, the model-config settings a CPU build needs (local layer
spec instead of TE, fused kernels off, fp32). That is configuration, not a patch.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.abc
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode


# --------------------------------------------------------------------------------------------
# Importing Bridge without Transformer Engine / NVIDIA Resiliency Extension
# --------------------------------------------------------------------------------------------

_STUB_VERSION = "0.0.0+nemo-topr-stub"


class _Unavailable:
    """Base of every stub class: it cannot be instantiated, so nothing silently uses TE."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{type(self).__name__} is a stub: the real package is not installed")


def _stub_classes(module: types.ModuleType, names: tuple[str, ...]) -> None:
    for name in names:
        setattr(module, name, type(name, (_Unavailable,), {}))


def _fill_te_pytorch(module: types.ModuleType) -> None:
    _stub_classes(module, ("Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer",
                           "RMSNorm", "LayerNorm", "GroupedLinear"))
    module.fp8_autocast = lambda *args, **kwargs: contextlib.nullcontext()
    # lora_layers.py:109 evaluates `te.ops.Sequential` in annotations at class-definition time
    module.ops = types.ModuleType("transformer_engine.pytorch.ops")
    _stub_classes(module.ops, ("Sequential", "Linear", "LayerNorm", "RMSNorm"))


def _fill_nvrx_inprocess(module: types.ModuleType) -> None:
    _stub_classes(module, ("CallWrapper",))


@dataclass(frozen=True)
class _ImportStub:
    package: str
    importers: frozenset[str]  # only these modules get the stub
    submodules: dict[str, Callable[[types.ModuleType], None]]
    upstream: str


_IMPORT_STUBS = (
    _ImportStub(
        "transformer_engine",
        frozenset({"megatron.bridge.peft.lora_layers",
                   "megatron.bridge.models.gpt_full_te_layer_autocast_spec"}),
        {"transformer_engine.pytorch": _fill_te_pytorch},
        "bridge/peft/lora_layers.py:20, bridge/models/gpt_full_te_layer_autocast_spec.py:28",
    ),
    _ImportStub(
        "nvidia_resiliency_ext",
        frozenset({"megatron.bridge.training.pretrain"}),
        {"nvidia_resiliency_ext.inprocess": _fill_nvrx_inprocess},
        "bridge/training/pretrain.py:19",
    ),
)


def _importing_module() -> str:
    """Name of the module whose ``import`` statement is being executed."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
            return name
        frame = frame.f_back
    return ""


class _StubLoader(importlib.abc.Loader):
    def __init__(self, fill: Callable[[types.ModuleType], None] | None) -> None:
        self.fill = fill

    def create_module(self, spec):  # noqa: ANN001 - importlib protocol
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = _STUB_VERSION
        if self.fill is not None:
            self.fill(module)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _ScopedStubFinder(importlib.abc.MetaPathFinder):
    """Serves each stub to its importers only; any other import of a `hidden` package fails as
    if it were not installed."""

    def __init__(self, stubs: tuple[_ImportStub, ...], hidden: tuple[str, ...] = ()) -> None:
        self.stubs = {stub.package: stub for stub in stubs}
        self.hidden = hidden

    def find_spec(self, name, path, target=None):  # noqa: ANN001 - importlib protocol
        package = name.split(".")[0]
        stub = self.stubs.get(package)
        if stub is not None and _importing_module() in stub.importers:
            if name == stub.package:
                return importlib.util.spec_from_loader(name, _StubLoader(None), is_package=True)
            if name in stub.submodules:
                return importlib.util.spec_from_loader(name, _StubLoader(stub.submodules[name]),
                                                       is_package=True)
        if package in self.hidden:
            raise ModuleNotFoundError(f"No module named {name!r} ({package} is hidden without CUDA: "
                                      "nemo_topr.model.cpu_runtime.CUDA_ONLY_PACKAGES)", name=name)
        return None


BRIDGE_MODULES = ("megatron.bridge", "megatron.bridge.training.pretrain",
                  "megatron.bridge.training.finetune")


# Installed packages whose kernels need CUDA, hidden in a process without it. With TE importable,
# Megatron-Core gives even a block of local layers TE's norm as its final norm
# (core/transformer/transformer_block.py:53-56, used at :253), and Apex's where only Apex imports
# (:57-59); on CPU tensors TE's kernel raises "CUDAGuardImpl initialized with non-CUDA DeviceType:
# cpu" (`nemo-topr doctor` on an H200 node with TE, 2026-11-26: its CPU scoring failed so).
CUDA_ONLY_PACKAGES = ("transformer_engine", "apex")


def _installed(package: str) -> bool:
    return package in sys.modules or importlib.util.find_spec(package) is not None


def import_bridge(modules: tuple[str, ...] = BRIDGE_MODULES) -> list[str]:
    """Import Megatron-Bridge, stubbing absent or hidden GPU-only packages for their importers.

    Without CUDA, :data:`CUDA_ONLY_PACKAGES` are hidden from then on: importing them fails and
    ``importlib.util.find_spec`` finds nothing, as where they are not installed. Returns the names
    of the stubbed packages (empty on a full GPU image). Raises if any Megatron-Core module ends
    up believing Transformer Engine is installed when it is absent or hidden.
    """
    hidden = () if torch.cuda.is_available() else tuple(p for p in CUDA_ONLY_PACKAGES if _installed(p))
    imported = [p for p in hidden if sys.modules.get(p) is not None]
    if imported:
        raise RuntimeError(f"{imported} imported in a process without CUDA before nemo_topr.model.cpu_runtime.import_bridge() "
                           "could hide it: Megatron would build CUDA kernels for the CPU")
    missing = tuple(s for s in _IMPORT_STUBS if s.package in hidden or not _installed(s.package))
    finder = _ScopedStubFinder(missing, hidden)
    # Importing Bridge makes hundreds of thousands of objects that live as long as the process,
    # and next to no garbage: a collection during the import, or any full one after it, only
    # walks them again. So the collector waits until the import is done, and what it made is
    # frozen (gc.freeze: no collection looks at it again).
    pause = gc.isenabled() and any(module not in sys.modules for module in modules)
    if pause:
        gc.disable()
    sys.meta_path.insert(0, finder)
    try:
        for module in modules:
            importlib.import_module(module)
        use_prebuilt_dataset_helpers()
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in list(sys.modules.items())
                     if m is not None and vars(m).get("__version__") == _STUB_VERSION]:
            del sys.modules[name]
        for package in hidden:  # from now on `import` raises and find_spec() returns None
            sys.modules[package] = None
        if pause:
            gc.enable()
    if pause:
        gc.freeze()
    if any(s.package == "transformer_engine" for s in missing):
        fooled = [n for n, m in list(sys.modules.items())
                  if n.startswith("megatron.core") and m is not None and vars(m).get("HAVE_TE", False)]
        if fooled:
            raise RuntimeError(f"Transformer Engine stub leaked into Megatron-Core: {fooled}")
    return [s.package for s in missing]


def _prebuilt_helpers_loaded() -> None:
    """Replaces Bridge's compile_helpers: there is nothing to compile."""


def use_prebuilt_dataset_helpers() -> bool:
    """Make Bridge skip compiling the dataset helpers when the prebuilt ``helpers_cpp`` imports.

    Bridge's set-up runs ``compile_helpers()`` on local rank 0 (bridge/training/initialize.py:
    141-153), i.e. ``make`` in megatron/core/datasets, which ``sys.exit(1)``s when it fails
    (core/datasets/utils.py:20-30); the PyPI wheel ships the built extension and no Makefile, so
    every `nemo-topr train` would exit 1 before its first step, on GPU as on CPU. Returns whether
    the compile step was replaced (an installation without the prebuilt module keeps it)."""
    if importlib.util.find_spec("megatron.core.datasets.helpers_cpp") is None:
        return False
    bridge_initialize = importlib.import_module("megatron.bridge.training.initialize")
    bridge_initialize.compile_helpers = _prebuilt_helpers_loaded
    return True


# --------------------------------------------------------------------------------------------
# CUDA -> CPU patches
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Patch:
    """One documented patch: what it replaces and which upstream code needs it."""

    name: str
    upstream: str
    why: str


class _NullStream:
    """Stands in for torch.cuda.Stream/current_stream(): CPU work is already ordered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event

    def synchronize(self) -> None:
        pass


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):  # a bare ordinal means a CUDA device to torch
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class CudaToCpuMode(TorchFunctionMode):
    """Redirects ``device="cuda"`` (factories, ``.to``) to CPU and makes ``Tensor.cuda()`` a no-op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda_device(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and any(_is_cuda_device(a) for a in args[1:]):
            args = tuple("cpu" if i and _is_cuda_device(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


def _clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """Device-agnostic copy of megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if isinstance(clip_coeff, torch.Tensor):
        if grads:
            torch._foreach_mul_(grads, clip_coeff.clamp_max(1.0))
    elif clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


@contextlib.contextmanager
def _no_rng_fork(self, name=None):  # noqa: ANN001 - replaces a method
    yield


def _spoof_cuda_tensor_type(init: Callable) -> Callable:
    """Wrap DistributedOptimizer.__init__ so CPU params report 'torch.cuda.*Tensor' types."""

    def wrapped(self, *args: Any, **kwargs: Any) -> None:
        real_type = torch.Tensor.type

        def cuda_named_type(tensor, dtype=None, non_blocking=False, **kw):  # noqa: ANN001
            if dtype is None and not tensor.is_cuda:
                return real_type(tensor).replace("torch.", "torch.cuda.", 1)
            return real_type(tensor, dtype, non_blocking, **kw)

        torch.Tensor.type = cuda_named_type
        try:
            init(self, *args, **kwargs)
        finally:
            torch.Tensor.type = real_type

    return wrapped


class _CompletedWork:
    """The handle of a collective that already ran (what ``async_op=True`` callers ``wait()`` on)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):  # noqa: ANN001
    """torch.distributed.all_gather_into_tensor over gloo (which lacks it): rank k's input lands in
    the k-th block of `output_tensor` along dim 0, exactly as NCCL's all-gather-into-tensor."""
    blocks = list(output_tensor.chunk(torch.distributed.get_world_size(group)))
    torch.distributed.all_gather(blocks, input_tensor.contiguous(), group=group)
    return _CompletedWork() if async_op else None


def _reduce_scatter_tensor(output, input, op=torch.distributed.ReduceOp.SUM, group=None,  # noqa: A002, ANN001
                           async_op=False):
    """torch.distributed.reduce_scatter_tensor over gloo (which lacks it): the rank-k block along
    dim 0 of the element-wise reduction of every rank's `input` (all-reduce, then this rank's chunk)."""
    reduced = input.clone()
    torch.distributed.all_reduce(reduced, op=op, group=group)
    output.copy_(reduced.chunk(torch.distributed.get_world_size(group))[torch.distributed.get_rank(group)])
    return _CompletedWork() if async_op else None


def _sequence_parallel_torch_norm(original_new: Callable) -> Callable:
    """WrappedTorchNorm.__new__ that accepts sequence_parallel: the norm is per token, so it runs
    on a sequence shard unchanged; its weights are tagged ``sequence_parallel`` as Megatron's own
    norms tag them (core/fusions/fused_layer_norm.py:119), so that finalize_model_grads sums
    their gradients over the tensor-parallel group (core/distributed/finalize_model_grads.py:452)."""

    def new(cls, config, hidden_size, *args, **kwargs):  # noqa: ANN001
        if not config.sequence_parallel:
            return original_new(cls, config, hidden_size, *args, **kwargs)
        config.sequence_parallel = False  # only to pass the constructor's assertion
        try:
            norm = original_new(cls, config, hidden_size, *args, **kwargs)
        finally:
            config.sequence_parallel = True
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    return new


PATCHES: tuple[Patch, ...] = (
    Patch("torch.cuda.current_device -> torch.device('cpu')",
          "core/tensor_parallel/layers.py:305, core/models/common/embeddings/rotary_pos_embedding.py:78, "
          "core/distributed/param_and_grad_buffer.py:1186, bridge/models/model_provider.py:689",
          "Megatron places new buffers, weights and RoPE tables on current_device()."),
    Patch("torch.cuda.synchronize -> no-op",
          "core/timers.py:152, core/dist_checkpointing/strategies/filesystem_async.py:248",
          "timers and checkpoint saves synchronize the device; CPU work is synchronous."),
    Patch("torch.cuda.{Stream, current_stream, stream} -> null stream",
          "core/distributed/param_and_grad_buffer.py:632, training/models/dist_utils.py:303-306",
          "DDP grad sync and model wrapping order work on CUDA streams."),
    Patch("torch.cuda.get_rng_state -> torch.get_rng_state; torch.cuda.set_rng_state -> no-op",
          "bridge/training/checkpointing.py:491 (save), :3155 and :3167 (load)",
          "checkpoints store and restore the CUDA RNG; the CPU RNG is saved beside it already."),
    Patch("CudaToCpuMode: device='cuda' -> 'cpu', Tensor.cuda() -> identity",
          "core/pipeline_parallel/schedules.py:749, core/optimizer/clip_grads.py:108, "
          "core/optimizer/optimizer.py:315, bridge/training/setup.py:281, "
          "bridge/training/initialize.py:895-944, bridge/data/loaders.py:406, "
          "bridge/training/eval.py:295, bridge/training/utils/train_utils.py:769",
          "literal CUDA devices in schedules, optimizer, seeding checks, data loading and logging."),
    Patch("CudaRNGStatesTracker.fork -> null context",
          "core/tensor_parallel/random.py:311 (tracker empty: bridge/training/initialize.py:869 "
          "seeds it only when a CUDA device exists)",
          "dropout under tensor parallelism forks a CUDA RNG; on CPU it uses the CPU generator."),
    Patch("clip_grad_by_total_norm_fp32 -> device-agnostic version",
          "core/optimizer/clip_grads.py:174 (asserts grad.type() == 'torch.cuda.FloatTensor')",
          "gradient clipping would reject CPU gradients."),
    Patch("DistributedOptimizer.__init__ sees CPU params as torch.cuda.*Tensor",
          "core/optimizer/distrib_optimizer.py:401, :466 (TypeError for other tensor types)",
          "the distributed optimizer accepts only CUDA tensor types."),
    Patch("bridge setup: initialize_megatron(allow_no_cuda=True)",
          "bridge/training/initialize.py:91 (assert torch.cuda.is_available()), called at "
          "bridge/training/setup.py:253",
          "Bridge refuses to initialise without CUDA unless told otherwise."),
    Patch("all_gather_into_tensor / reduce_scatter_tensor -> gloo emulations (all_gather + cat along "
          "dim 0; all_reduce + this rank's chunk)",
          "core/tensor_parallel/mappings.py:12-13 (dist_all_gather_func, dist_reduce_scatter_func: used "
          "by _gather_along_first_dim :96/:146 and _reduce_scatter_along_first_dim :186), "
          "core/tensor_parallel/layers.py:85-86 (used at :571, :617, :650 by the sequence-parallel "
          "linear layers)",
          "sequence parallelism gathers and reduce-scatters activations along the sequence dimension; "
          "gloo implements neither collective."),
    Patch("WrappedTorchNorm accepts sequence_parallel, tagging its weights",
          "core/transformer/torch_norm.py:50 (asserts not sequence_parallel)",
          "the local layer spec's torch norms refuse sequence parallelism, which only needs their "
          "gradients summed over TP (the tag finalize_model_grads looks for)."),
    Patch("bridge _warmup_jit_function -> no-op",
          "bridge/training/initialize.py:311 (called for every model), :886-944 (torch.compile of "
          "the fused bias-SwiGLU and bias-dropout-add kernels, core/fusions/fused_bias_swiglu.py:29)",
          "the CPU model turns those fusions off (cpu_model_overrides), so warming them up only builds "
          "inductor C++ kernels nothing calls: about 12 s of every training process on 2 cores."),
)


class _Runtime:
    """Book-keeping of what was swapped, so disable_cpu_runtime() restores it exactly."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []
        self.mode: CudaToCpuMode | None = None

    def swap(self, owner: Any, attr: str, new: Any) -> None:
        self.saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    def restore(self) -> None:
        for owner, attr, original in reversed(self.saved):
            setattr(owner, attr, original)
        self.saved.clear()
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None


_active: _Runtime | None = None


def is_enabled() -> bool:
    return _active is not None


def enable_cpu_runtime() -> tuple[Patch, ...]:
    """Apply every patch in :data:`PATCHES` (imports Bridge via :func:`import_bridge`).

    Returns the patches applied: all of them on a machine without CUDA, none when
    ``torch.cuda.is_available()`` is true or the runtime is already enabled. Bridge is imported
    through :func:`import_bridge` in every case, so a GPU venv without Transformer Engine or
    NVRx can still import it.
    """
    global _active
    import_bridge()
    if torch.cuda.is_available() or _active is not None:
        return ()
    import megatron.bridge.training.initialize as bridge_initialize
    import megatron.bridge.training.setup as bridge_setup
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer
    import megatron.core.tensor_parallel.layers as tp_layers
    import megatron.core.tensor_parallel.mappings as tp_mappings
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    runtime = _Runtime()
    try:
        runtime.swap(torch.cuda, "current_device", lambda: torch.device("cpu"))
        runtime.swap(torch.cuda, "synchronize", lambda device=None: None)
        runtime.swap(torch.cuda, "Stream", _NullStream)
        runtime.swap(torch.cuda, "current_stream", lambda device=None: _NullStream())
        runtime.swap(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
        runtime.swap(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
        runtime.swap(torch.cuda, "set_rng_state", lambda new_state, device="cuda": None)
        runtime.mode = CudaToCpuMode()
        runtime.mode.__enter__()
        runtime.swap(CudaRNGStatesTracker, "fork", _no_rng_fork)
        runtime.swap(clip_grads, "clip_grad_by_total_norm_fp32", _clip_grad_by_total_norm_fp32)
        runtime.swap(optimizer, "clip_grad_by_total_norm_fp32", _clip_grad_by_total_norm_fp32)
        runtime.swap(DistributedOptimizer, "__init__",
                     _spoof_cuda_tensor_type(DistributedOptimizer.__init__))
        for module in (tp_mappings, tp_layers):
            runtime.swap(module, "dist_all_gather_func", _all_gather_into_tensor)
            runtime.swap(module, "dist_reduce_scatter_func", _reduce_scatter_tensor)
        runtime.swap(WrappedTorchNorm, "__new__", _sequence_parallel_torch_norm(WrappedTorchNorm.__new__))
        runtime.swap(bridge_setup, "initialize_megatron",
                     _with_kwargs(bridge_initialize.initialize_megatron, allow_no_cuda=True))
        runtime.swap(bridge_initialize, "_warmup_jit_function", lambda model_config, micro_batch_size: None)
    except BaseException:
        runtime.restore()
        raise
    _active = runtime
    return PATCHES


def disable_cpu_runtime() -> None:
    """Undo :func:`enable_cpu_runtime` (restores every attribute, exits the device mode)."""
    global _active
    if _active is not None:
        _active.restore()
        _active = None


def _with_kwargs(func: Callable, **fixed: Any) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **{**kwargs, **fixed})

    call.__wrapped__ = func
    return call


# --------------------------------------------------------------------------------------------
# Model settings a CPU build needs (configuration, not patches)
# --------------------------------------------------------------------------------------------

_FUSIONS = ("bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm",
            "bias_dropout_fusion", "apply_rope_fusion", "cross_entropy_loss_fusion",
            "gradient_accumulation_fusion")


def cpu_model_overrides(provider: Any) -> Any:
    """Make a Bridge model provider buildable without CUDA/TE: local layer spec, no fused
    kernels (they are CUDA or TE kernels), fp32 params. No-op when CUDA is available."""
    if torch.cuda.is_available():
        return provider
    from megatron.bridge.models.gpt_provider import local_layer_spec

    provider.transformer_layer_spec = local_layer_spec
    provider.transformer_impl = "local"
    for flag in _FUSIONS:
        if hasattr(provider, flag):
            setattr(provider, flag, False)
    provider.params_dtype = provider.pipeline_dtype = torch.float32
    provider.bf16 = provider.fp16 = False
    provider.use_cpu_initialization = True
    return provider
