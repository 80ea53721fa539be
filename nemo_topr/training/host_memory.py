"""Room in host memory for the CPU runtime's attention.

On the CPU, Megatron's local DotProductAttention computes each micro-batch's attention scores in
fp32, [MBS, heads per TP rank, L, L], into a global buffer, and its softmax writes a second tensor
of that size (megatron/core/transformer/dot_product_attention.py); the TOPR step's packed mask
adds [MBS, L, L] booleans (`nemo_topr.training.step.packed_attention_mask`). Where that exceeds
the host's available memory, the first forward ends in the allocator's traceback, or the kernel's
OOM killer ends a rank without a word, after the data was prepared and the run directory written.
`nemo-topr train` and `score-logprobs` refuse such a start (`check_cpu_attention`).

The figure is a lower bound: one layer, no activations saved for the backward pass, nothing else
of the model. The tiny CPU Llama at model.seq_length=4096 and micro-batch 2 (4 heads) peaked at
3.7 GiB resident where the bound says 1.03 GiB (by hand, 2026-11-30), so a refusal is never a
false alarm, and a start that passes can still run out of memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.disk_space import size_text

MEMINFO = Path("/proc/meminfo")


def attention_bytes(micro_batch: int, heads_per_rank: int, seq_length: int) -> int:
    """Bytes one rank holds at once in one layer's attention: two fp32 score tensors and the
    boolean mask, each over seq_length² for every sequence of the micro-batch."""
    return micro_batch * seq_length**2 * (2 * 4 * heads_per_rank + 1)


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's MemAvailable, or None where it gives none (not Linux)."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024  # kB
    return None


def check_cpu_attention(model: Any, micro_batch: int, available: int | None, local_ranks: int | None = None, *,
                        names: tuple[str, str] = ("model.seq_length", "train.micro_batch_size")) -> None:
    """Refuse a CPU run whose ranks on this host cannot hold one layer's attention at once.
    `names`: the sequence length's and the micro-batch's, as the command takes them."""
    if available is None:
        return
    ranks = local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    heads = math.ceil(model.num_attention_heads / model.tensor_model_parallel_size)
    per_rank = attention_bytes(micro_batch, heads, model.seq_length)
    if ranks * per_rank <= available:
        return
    on_host = f", x {ranks} ranks on this host" if ranks > 1 else ""
    raise ConfigError(
        f"{_setting(names[0], model.seq_length)} with {_setting(names[1], micro_batch)} on the CPU: one layer's "
        f"attention takes at least {size_text(per_rank)} per rank (fp32 scores [{micro_batch}, {heads} heads, "
        f"L, L] twice, and the packed mask){on_host}, and this host has {size_text(available)} available. "
        f"Lower {names[0]} or {names[1]}, or use a GPU",
        key=f"{names[0]}.attention_above_host_memory", where=names[0])


def _setting(name: str, value: int) -> str:
    """`model.seq_length=4096` as an override, `--seq-length 4096` as a flag."""
    return f"{name} {value}" if name.startswith("--") else f"{name}={value}"
