"""Run in a fresh interpreter: enable, check, disable, check that everything is restored."""

import torch

from nemo_topr.model import cpu_runtime

SWAPPED = [(torch.cuda, name) for name in ("current_device", "synchronize", "Stream", "current_stream",
                                           "stream", "get_rng_state", "set_rng_state")]


def main() -> None:
    assert not torch.cuda.is_available()
    cpu_runtime.import_bridge()
    import megatron.bridge.training.initialize as bridge_initialize
    import megatron.bridge.training.setup as bridge_setup
    import megatron.core.optimizer.clip_grads as clip_grads
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    targets = SWAPPED + [(bridge_setup, "initialize_megatron"), (clip_grads, "clip_grad_by_total_norm_fp32"),
                         (DistributedOptimizer, "__init__"), (CudaRNGStatesTracker, "fork"),
                         (bridge_initialize, "_warmup_jit_function")]
    before = {(id(owner), name): getattr(owner, name) for owner, name in targets}

    applied = cpu_runtime.enable_cpu_runtime()
    assert applied == cpu_runtime.PATCHES and cpu_runtime.is_enabled()
    assert cpu_runtime.enable_cpu_runtime() == ()  # idempotent
    changed = [name for owner, name in targets if getattr(owner, name) is before[(id(owner), name)]]
    assert not changed, f"not patched: {changed}"
    assert torch.zeros(2, device="cuda").device.type == "cpu"
    assert torch.cuda.current_device() == torch.device("cpu")

    cpu_runtime.disable_cpu_runtime()
    assert not cpu_runtime.is_enabled()
    restored = [name for owner, name in targets if getattr(owner, name) is not before[(id(owner), name)]]
    assert not restored, f"not restored: {restored}"
    try:
        torch.zeros(2, device="cuda")
    except (RuntimeError, AssertionError):
        pass
    else:
        raise AssertionError("device='cuda' still redirected after disable")
    print("REVERSIBLE OK")


if __name__ == "__main__":
    main()
