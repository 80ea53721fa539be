"""GPU bench of shared-prefix packing (issue 30): one command, NEVER run on a GPU yet.

    python -m bench.shared_prefix_gpu --out FILE_bf16.json --precision bf16
    python -m bench.shared_prefix_gpu --out FILE_fp8.json --precision fp8
    python -m bench.shared_prefix_gpu --out /tmp/dry.json --tiny        # CPU dry run (plumbing only)

GSM8K 8-shot x 16 completions (bench.shared_prefix's workload and length model). One TOPR
optimizer step (forward + backward of every micro-batch through Megatron's schedule and the
project's `ToprForwardStep`) over the same sequences, twice, each model built from the same seed:
* unshared: `pack_sequences` rows of 2,048, Transformer Engine layers, TE's fused THD attention;
* shared: `pack_shared` rows, the same TE layers with `FlexCoreAttention` (compiled FlexAttention).
Per side: step time (median of `--reps` after a warm-up that includes compilation), tokens of
data per second (sequence tokens, padding and prompt copies excluded, over step time) and peak
GPU memory. The model has 8B-shaped layers (Llama 3.1 8B widths, GQA 32/8) and `--layers` of them
(default 4: both sides and their gradients fit one GPU; per-step ratios do not depend on depth).
`--tiny` runs bench.shared_prefix's tiny Llama on CPU with the local spec on the unshared side
(Transformer Engine is absent there): it checks the plumbing, its times mean nothing.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

LLAMA31_8B_LAYER = dict(hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8,
                        vocab_size=128256)


def build(shape: dict, seq_length: int, *, shared: bool, precision: str, on_gpu: bool):
    from megatron.bridge.models.gpt_provider import transformer_engine_layer_spec

    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.training.flex_attention import prepare_shared_prefix_attention

    torch.manual_seed(1234)
    provider = tiny_llama_provider(seq_length=seq_length, **shape)
    if on_gpu:  # tiny_llama_provider is the CPU runtime's (local spec, fp32): the cluster's TE layers instead
        provider.transformer_layer_spec, provider.transformer_impl = transformer_engine_layer_spec, "transformer_engine"
        provider.bf16, provider.params_dtype = True, torch.bfloat16
        if precision == "fp8":
            provider.fp8, provider.fp8_recipe = "hybrid", "tensorwise"
    if shared:
        prepare_shared_prefix_attention(provider)
    provider.pipeline_dtype = provider.params_dtype
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=not on_gpu)
    chunks[0].config.calculate_per_token_loss = True
    return chunks


def measure_side(seqs, *, shared: bool, shape: dict, seq_length: int, precision: str, reps: int) -> dict:
    from bench.shared_prefix import _microbatches
    from bench.step import run_step
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    on_gpu = torch.cuda.is_available()
    chunks = build(shape, seq_length, shared=shared, precision=precision, on_gpu=on_gpu)
    batches = _microbatches(seqs, shared, seq_length)
    step = functools.partial(run_step, chunks, functools.partial(ToprForwardStep(ObjectiveConfig()), None), batches)
    step()  # warm-up (FlexAttention and block-mask compilation on GPU)
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    data_tokens = sum(len(seq.input_ids) for seq in seqs)
    result = {"rows": len(batches), "seq_length": seq_length, "positions": len(batches) * seq_length,
              "step_seconds": times, "step_seconds_median": statistics.median(times),
              "data_tokens_per_second": data_tokens / statistics.median(times),
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None}
    del chunks
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=8, help="GSM8K questions (x --samples completions each)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--precision", choices=("bf16", "fp8"), default="bf16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="CPU dry run at tiny size")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from bench.common import environment
    from bench.shared_prefix import TINY_MODEL, UNSHARED_LENGTH, sequences, timing_length, workload
    from nemo_topr.model.device import use_device
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel

    if args.tiny:
        use_device("cpu", where="bench.shared_prefix_gpu --tiny")
        shape = TINY_MODEL
    else:
        use_device("cuda", where="bench.shared_prefix_gpu")
        shape = {**LLAMA31_8B_LAYER, "num_layers": args.layers}
    initialize_model_parallel(1, 1)
    seqs = sequences(workload("8shot", args.questions, args.samples))
    shared_length = timing_length(seqs)
    unshared_length = max(UNSHARED_LENGTH, max(len(seq.input_ids) for seq in seqs))
    sides = {name: measure_side(seqs, shared=name == "shared", shape=shape, precision=args.precision, reps=args.reps,
                                seq_length=shared_length if name == "shared" else unshared_length)
             for name in ("unshared", "shared")}
    result = {"command": "python -m bench.shared_prefix_gpu " + " ".join(sys.argv[1:] if argv is None else argv),
              "tiny_cpu_dry_run": args.tiny,
              "precision": args.precision, "model": shape, "questions": args.questions, "samples": args.samples,
              **sides,
              "step_time_unshared_over_shared": sides["unshared"]["step_seconds_median"]
              / sides["shared"]["step_seconds_median"],
              "target": "step time unshared / shared >= 3 at equal data",
              "environment": environment()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("precision", "step_time_unshared_over_shared")}))
    destroy_model_parallel()


if __name__ == "__main__":
    main()
