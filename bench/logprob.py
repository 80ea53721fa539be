"""Section 2: memory and time of the per-token log pi path at Llama 3's vocabulary size.

Two ways from the output layer's logits [s, b, V/TP] (Megatron's layout, this rank's vocabulary
shard) to per-token log pi and back to d loss / d logits:

* ``megatron``: the project's labels path, `megatron.core.tensor_parallel.vocab_parallel_cross_entropy`
  (what `GPTModel` runs when given labels): max / sum-exp all-reduced over TP, computed in place
  in the logits buffer, whose softmax is reused as the gradient; no rank ever holds the full
  vocabulary.
* ``naive``: all-gather the vocabulary shards (Megatron's `gather_from_tensor_model_parallel_region`,
  TP>1 only), `log_softmax` over the full vocabulary, `gather` the label's column.

Memory is the extra peak resident set over the block (logits already allocated, forward and
backward inside; the block drops its own reference to the logits after the forward, as
`GPTModel` does), from the kernel's VmHWM after resetting it (`bench.common.PeakRss`), and is
reported as a multiple of this rank's logits bytes. Both variants alternate in one process, so
a rank's numbers come from the same allocator state; the logits are rebuilt before each block.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

LLAMA3_VOCAB = 128_256


class _OutputLayer(torch.autograd.Function):
    """Stands in for the output layer: produces the logits as a non-leaf tensor and consumes
    d loss / d logits in backward without copying it (as the layer's matmul backward would), so
    neither path pays for an artificial gradient copy into a leaf's ``.grad``."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:  # noqa: ANN001
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=generator, dtype=torch.float32).mul_(3.0).to(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001
        return grad.new_zeros(()), None, None, None


def make_logits(tokens: int, vocab_shard: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return _OutputLayer.apply(torch.zeros((), requires_grad=True), (tokens, 1, vocab_shard), dtype, seed)


def megatron_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    return -vocab_parallel_cross_entropy(logits, labels, tp_group=parallel_state.get_tensor_model_parallel_group())


def naive_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        logits = gather_from_tensor_model_parallel_region(logits)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels[..., None]).squeeze(-1)


PATHS = {"megatron": megatron_logprobs, "naive": naive_logprobs}


def one_block(path: str, tokens: int, vocab: int, dtype: torch.dtype, seed: int) -> dict:
    from megatron.core import parallel_state

    from bench.common import PeakRss

    tp = parallel_state.get_tensor_model_parallel_world_size()
    logits = make_logits(tokens, vocab // tp, dtype, seed + parallel_state.get_tensor_model_parallel_rank())
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (tokens, 1), generator=generator)
    weights = torch.rand(tokens, 1, generator=generator)
    logits_bytes = logits.numel() * logits.element_size()
    with PeakRss() as memory:
        wall, cpu = time.perf_counter(), time.process_time()
        logprobs = PATHS[path](logits, labels)
        del logits  # as in GPTModel: nothing but the loss's own autograd state keeps the logits
        (logprobs.float() * weights).sum().backward()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    checksum = float(logprobs.detach().double().sum())
    del logprobs
    return {"extra_peak_bytes": memory.extra, "extra_over_logits": memory.extra / logits_bytes,
            "logits_bytes": logits_bytes, "cpu_s": cpu, "wall_s": wall, "logprob_sum": checksum}


def measure(tokens: int, vocab: int, dtype: torch.dtype, reps: int) -> dict:
    """Alternate megatron / naive blocks (warm-up pair first) and summarise per variant."""
    from bench.common import PeakRss, summary

    one_block("megatron", 64, vocab, dtype, 0)
    one_block("naive", 64, vocab, dtype, 0)
    runs: dict[str, list[dict]] = {"megatron": [], "naive": []}
    for rep in range(reps):
        for path in (("megatron", "naive") if rep % 2 == 0 else ("naive", "megatron")):
            runs[path].append(one_block(path, tokens, vocab, dtype, seed=rep))
    agree = max(abs(a["logprob_sum"] - b["logprob_sum"]) / abs(a["logprob_sum"])
                for a, b in zip(runs["megatron"], runs["naive"]))
    result = {"logits_bytes": runs["megatron"][0]["logits_bytes"], "relative_logprob_difference": agree,
              "peak_method": "VmHWM reset via /proc/self/clear_refs" if PeakRss().resettable
              else "VmHWM without reset (UNRELIABLE: first block only)"}
    for path, blocks in runs.items():
        result[path] = {key: summary([b[key] for b in blocks])
                        for key in ("extra_peak_bytes", "extra_over_logits", "cpu_s", "wall_s")}
    result["naive_over_megatron_cpu_time"] = summary(
        [n["cpu_s"] / m["cpu_s"] for m, n in zip(runs["megatron"], runs["naive"])])
    result["naive_over_megatron_extra_memory"] = summary(
        [n["extra_peak_bytes"] / max(m["extra_peak_bytes"], 1) for m, n in zip(runs["megatron"], runs["naive"])])
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.logprob`` (TP=1) or under ``torch.distributed.run --nproc_per_node=2``;
    rank 0 writes --out, with every rank's numbers under "ranks"."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size = number of processes")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=LLAMA3_VOCAB)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from nemo_topr.model.device import use_device
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != args.tp:
        parser.error(f"--tp {args.tp} needs {args.tp} processes (torch.distributed.run); got {world}")
    if world > 1:  # the naive path's TP all-gather asks for torch.cuda.current_device()
        use_device("cpu", where="bench.logprob")
    initialize_model_parallel(world, 1)
    result = measure(args.tokens, args.vocab, getattr(torch, args.dtype), args.reps)
    ranks = [None] * world
    torch.distributed.all_gather_object(ranks, result)
    if torch.distributed.get_rank() == 0:
        summary_ = {"tp": world, "tokens": args.tokens, "vocab": args.vocab, "dtype": args.dtype,
                    "reps": args.reps, **result, "ranks": ranks}
        Path(args.out).write_text(json.dumps(summary_))
    destroy_model_parallel()


if __name__ == "__main__":
    main()
