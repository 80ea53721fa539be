"""GPU section: an 8B-shaped Llama (Llama 3 8B widths, reduced depth), TOPR step vs Bridge's
SFT step, BF16 and FP8 (current and delayed scaling), tokens/s and MFU, and each FP8 recipe's
TOPR loss and gradient norm against BF16's from the same weights. Runs only with CUDA; otherwise
it records why not.

Measured on one H200 without Transformer Engine (Megatron's local spec, BF16, FP8 recorded as
skipped: bench/results/gpu_bench_h200_2026-11-26.json), and with TE 2.17.1 in BF16 and both FP8
recipes at one layer with unfused attention only (TE's cuDNN attention backward failed there:
bench/results/gpu_bench_h200_2026-11-26_te.json). At 16 layers with TE it has NOT run; the CPU
machines that run `make bench` have no GPU.

Model FLOPs per step (for MFU) count matrix multiplies only, forward + backward = 3x forward:
    6 * N_matmul * positions  +  6 * layers * hidden * sum_i len_i^2   (causal attention)
with N_matmul the parameters of every linear layer incl. the output layer (not the input
embedding). MFU = model FLOPs / (step seconds * dense peak of the precision). Peaks: H100/H200
SXM 989 TFLOP/s BF16, 1979 TFLOP/s FP8 (dense).
"""

from __future__ import annotations

import functools
import time
import traceback

import torch

LLAMA3_8B = dict(hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8,
                 vocab_size=128_256)
DENSE_PEAK_TFLOPS = {"bf16": {"H100": 989.4, "H200": 989.4}, "fp8": {"H100": 1978.9, "H200": 1978.9}}
# precision -> Megatron's fp8_recipe (None: BF16); FP8 in the "hybrid" format (E4M3 forward, E5M2
# gradients). Current scaling ("tensorwise") takes each tensor's amax as it is cast; delayed
# scaling takes it from the amax history of earlier steps, so its first step has no history.
PRECISIONS = {"bf16": None, "fp8_current": "tensorwise", "fp8_delayed": "delayed"}
# Megatron's AttnBackend names (model.attention_backend). "auto" lets TE choose (cuDNN fused attention
# on THD); "unfused" is the way round a cuDNN that TE's fused backward refuses (H200, 2026-11-26:
# bench/README.md), at the cost of TE padding every packed sequence to the longest one.
ATTENTION_BACKENDS = ("auto", "fused", "flash", "unfused", "local")


def skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "CUDA not available on this machine (CPU-only): GPU section not measured"
    return None


def has_te() -> bool:
    from nemo_topr.model.settings import transformer_engine_available

    return transformer_engine_available()


def build_model(layers: int, seq_length: int, precision: str, attention_backend: str = "auto"):
    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.model.settings import device_model_settings

    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.enums import AttnBackend

    # Megatron draws the weights on the GPU from its RNG tracker, which each build advances:
    # reset it, so that every precision starts from the same weights (`weights_checksum`)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    provider = tiny_llama_provider(num_layers=layers, seq_length=seq_length, **LLAMA3_8B)
    provider.bf16, provider.fp16 = True, False
    provider.attention_backend = AttnBackend[attention_backend]
    provider.params_dtype = provider.pipeline_dtype = torch.bfloat16
    if PRECISIONS[precision]:
        provider.fp8, provider.fp8_recipe = "hybrid", PRECISIONS[precision]
    provider.tensor_model_parallel_size = provider.pipeline_model_parallel_size = 1
    device_model_settings(provider, wrapped_in_ddp=False)  # built without DDP: no main_grad to fuse into
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False)
    from megatron.core.utils import get_model_config

    get_model_config(chunks[0]).calculate_per_token_loss = True
    return chunks


def matmul_parameters(chunk) -> int:
    return sum(p.numel() for name, p in chunk.named_parameters() if p.dim() == 2 and "embedding" not in name)


def model_flops(chunk, batches, layers: int, hidden: int) -> float:
    positions = sum(b["tokens"].numel() for b in batches)
    attention = sum(int((b["seq_len"].double() ** 2).sum()) for b in batches)
    return 6.0 * matmul_parameters(chunk) * positions + 6.0 * layers * hidden * attention


def peak_tflops(precision: str) -> float | None:
    name = torch.cuda.get_device_name(0)
    peaks = DENSE_PEAK_TFLOPS["fp8" if PRECISIONS[precision] else "bf16"]
    return next((peak for gpu, peak in peaks.items() if gpu in name), None)


def timed_step(step) -> None:
    torch.cuda.synchronize()
    step()
    torch.cuda.synchronize()


def measure_precision(precision: str, layers: int, seq_length: int, rows: int, microbatches: int, reps: int,
                      attention_backend: str = "auto") -> dict:
    """SFT and TOPR steps interleaved; if the TOPR step fails, SFT alone and the error."""
    from bench.common import interleaved, summary
    from bench.step import first_step_numbers, packed_microbatches, run_step, sft_forward_step
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    chunks = build_model(layers, seq_length, precision, attention_backend)
    batches = packed_microbatches(seq_length, rows, microbatches)
    topr_step = functools.partial(ToprForwardStep(ObjectiveConfig()), None)
    sft = functools.partial(timed_step, functools.partial(run_step, chunks, sft_forward_step, batches))
    topr = functools.partial(timed_step, functools.partial(run_step, chunks, topr_step, batches))
    flops = model_flops(chunks[0], batches, layers, LLAMA3_8B["hidden_size"])
    positions = sum(b["tokens"].numel() for b in batches)
    peak = peak_tflops(precision)
    out = {"precision": precision, "layers": layers, "attention_backend": attention_backend, "seq_length": seq_length,
           "rows": rows, "microbatches": microbatches, "positions_per_step": positions,
           "model_tflop_per_step": flops / 1e12, "transformer_engine": has_te(), "topr_error": None,
           "weights_checksum": sum(float(p.double().abs().sum()) for p in chunks[0].parameters())}
    torch.cuda.reset_peak_memory_stats()
    try:  # twice from the seeded weights (no optimizer): the second with an amax history
        out["steps"] = [first_step_numbers(chunks, topr_step, batches) for _ in range(2)]
    except Exception:  # noqa: BLE001 - keep the SFT numbers, record why TOPR did not run
        out["topr_error"] = traceback.format_exc()[-3000:]
    if out["topr_error"] is None:
        result = interleaved(sft, topr, reps)["wall"]
        out["topr_over_sft_time"] = result["ratio_b_over_a"]
        seconds = {"sft": result["a"]["median"], "topr": result["b"]["median"]}
    else:
        sft()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            sft()
            times.append(time.perf_counter() - start)
        seconds = {"sft": summary(times)["median"]}
    out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    for side, value in seconds.items():
        out[f"{side}_step_seconds"] = value
        out[f"{side}_tokens_per_s"] = positions / value
        out[f"{side}_mfu"] = flops / value / (peak * 1e12) if peak else None
    out["loss_only"] = loss_only(batches, 5 * reps)
    del chunks
    torch.cuda.empty_cache()
    return out


def loss_only(batches, reps: int) -> dict:
    """Bridge's SFT loss vs `topr_loss` alone on the GPU (forward + backward from a per-token CE
    tensor), and how many host-device synchronisations each makes per micro-batch
    (`torch.cuda.set_sync_debug_mode`)."""
    import warnings

    from megatron.bridge.training.gpt_step import _create_loss_function

    from bench.common import interleaved
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, topr_loss

    objective = ObjectiveConfig()
    summaries = [check_batch(b, objective) for b in batches]  # on the host, as ToprForwardStep does
    device_batches = [{k: v.cuda() for k, v in b.items()} for b in batches]
    ces = [torch.rand(b["loss_mask"].shape, device="cuda") * 6 for b in device_batches]

    def sft():
        for batch, ce in zip(device_batches, ces):
            ce = ce.clone().requires_grad_()
            _create_loss_function(batch["loss_mask"], True, False)(ce)[0].backward()

    def topr():
        for batch, summary, ce in zip(device_batches, summaries, ces):
            ce = ce.clone().requires_grad_()
            topr_loss(ce, batch, objective, summary)[0].backward()

    syncs = {}
    for name, fn in (("sft", sft), ("topr", topr)):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            sync_lines = [f"{'/'.join(w.filename.split('/')[-3:])}:{w.lineno}" for w in caught
                          if "synchroniz" in str(w.message)]
            syncs[name] = {"per_microbatch": len(sync_lines) / len(device_batches), "where": sorted(set(sync_lines))}
        except Exception:  # noqa: BLE001
            return {"error": traceback.format_exc()[-2000:]}
    timing = interleaved(functools.partial(timed_step, sft), functools.partial(timed_step, topr), reps, warmup=3)["wall"]
    return {"microbatches": len(batches), "sft_ms": 1e3 * timing["a"]["median"], "topr_ms": 1e3 * timing["b"]["median"],
            "topr_minus_sft_ms_per_microbatch": 1e3 * timing["b_minus_a"]["median"] / len(batches),
            "syncs": syncs}


def measure(layers: int = 16, seq_length: int = 4096, rows: int = 1, microbatches: int = 4, reps: int = 5,
            attention_backend: str = "auto") -> dict:
    if attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {attention_backend!r}: choose from {ATTENTION_BACKENDS}")
    reason = skip_reason()
    if reason:
        return {"skipped": True, "reason": reason}
    from nemo_topr.model import cpu_runtime
    from nemo_topr.utils.distributed import initialize_model_parallel

    # With CUDA the CPU-runtime patches are no-ops; only Bridge's import (TE stubbed for its
    # importers when TE is absent) is needed, and only the modules this section uses.
    cpu_runtime.import_bridge(("megatron.bridge", "megatron.bridge.training.gpt_step"))
    initialize_model_parallel(1, 1)  # with CUDA it also seeds the RNG tracker, as Bridge's setup does
    results = {"skipped": False, "device": torch.cuda.get_device_name(0), "runs": [], "errors": {}}
    for precision, recipe in PRECISIONS.items():
        if recipe and not has_te():
            results["errors"][precision] = "skipped: FP8 needs Transformer Engine, not installed"
            continue
        try:
            results["runs"].append(measure_precision(precision, layers, seq_length, rows, microbatches, reps,
                                                     attention_backend))
        except Exception:  # noqa: BLE001 - one precision failing must not hide the other
            results["errors"][precision] = traceback.format_exc()[-3000:]
    results["fp8_minus_bf16"] = fp8_minus_bf16(results["runs"])
    return results


def fp8_minus_bf16(runs: list[dict]) -> dict:
    """Per FP8 run and step: its TOPR loss minus BF16's and its gradient norm over BF16's, minus 1,
    on the same batches, and whether the two started from the same weights (their checksums);
    empty without a BF16 run's steps to compare with."""
    bf16 = next((run for run in runs if run["precision"] == "bf16" and run.get("steps")), None)
    if bf16 is None:
        return {}
    return {run["precision"]: {"same_weights": run["weights_checksum"] == bf16["weights_checksum"], "steps": [
                {"topr_loss": fp8["topr_loss"] - base["topr_loss"],
                 "grad_norm_relative": fp8["grad_norm"] / base["grad_norm"] - 1}
                for fp8, base in zip(run["steps"], bf16["steps"])]}
            for run in runs if run["precision"] != "bf16" and run.get("steps")}
