"""The memory model of `nemo-topr plan`: bytes per GPU for each pipeline stage (weights, grads,
optimizer states, FP8 copies, activations in flight, logits, a reserve)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nemo_topr.model.architecture import Architecture
from nemo_topr.cluster.layout import Layout

GIB = 2**30


@dataclass(frozen=True)
class Stage:
    """One pipeline rank: what it holds per GPU."""

    name: str  # "first" and "last", or "all" when PP = 1
    rank: int
    params: int  # parameters on one GPU of this stage
    gemm_params: int  # of which transformer-layer GEMM weights (FP8 casts)
    params_arithmetic: str
    has_output_layer: bool


def pipeline_stages(arch: Architecture, lay: Layout) -> list[Stage]:
    """The first and last pipeline stage (one stage when PP = 1). GEMM weights are split over TP,
    RMSNorm weights are replicated; the embedding sits on the first stage, the final norm and the
    output layer on the last (a tied output layer keeps its own copy of the embedding there)."""
    t, layers = lay.tp, arch.num_layers // lay.pp
    gemm_per_layer = (arch.attention_gemm_params + arch.mlp_gemm_params) // t
    layer_params = gemm_per_layer + arch.layer_norm_params
    body = f"{layers} layers x {layer_params:,} ((attention + MLP)/TP + 2 norms)"
    embedding = arch.embedding_params // t
    head = arch.hidden_size + embedding  # final norm + output layer (own or tied copy)
    first = (embedding, f"embedding V·h/TP {embedding:,}")
    last = (head, f"final norm {arch.hidden_size:,} + output layer V·h/TP {embedding:,}")

    def stage(name: str, rank: int, extras: list[tuple[int, str]], has_output: bool) -> Stage:
        params = layers * layer_params + sum(n for n, _ in extras)
        text = " + ".join([body] + [s for _, s in extras]) + f" = {params:,}"
        return Stage(name, rank, params, layers * gemm_per_layer, text, has_output)

    if lay.pp == 1:
        return [stage("all", 0, [first, last], True)]
    return [stage("first", 0, [first], False), stage("last", lay.pp - 1, [last], True)]


def chunk_forwards_in_flight(lay: Layout, rank: int) -> int:
    """Chunk-forwards whose activations one pipeline rank holds at its peak.

    Megatron-Core's schedules run ``warmup`` forwards before the first backward, then alternate
    one forward / one backward, so the peak is warmup + 1
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches):

        1F1B:        warmup = PP - rank - 1              -> PP micro-batches on the first stage
        interleaved: warmup = 2(PP - rank - 1) + (VP - 1)·PP chunks of L/(PP·VP) layers

    On the first stage the interleaved count is L·(1 + (PP-1)/(PP·VP)) layers' worth, Korthikanti
    et al. 2022's figure for the interleaved schedule. Capped by the chunk-forwards of a step.
    """
    if lay.pp == 1:
        return 1
    if lay.vp:
        warmup = 2 * (lay.pp - rank - 1) + (lay.vp - 1) * lay.pp
    else:
        warmup = lay.pp - rank - 1
    return min(warmup + 1, lay.micro_batches * lay.chunks)


def activation_bytes_per_layer(arch: Architecture, lay: Layout, granularity: str | None) -> tuple[int, str]:
    """Bytes one transformer layer keeps for backward, 16-bit activations (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models", Table 2), t = TP:

        no recompute, no SP:   s·b·h·(10 + 24/t + 5·a·s/(h·t))
        no recompute, SP:      s·b·h·(34 + 5·a·s/h) / t
        selective recompute:   the 5·a·s/h attention-score term is recomputed, not stored
        full recompute:        only the layer input, 2·s·b·h (/t with SP)

    Flash and cuDNN fused attention never store the a·s² scores, so with them (Transformer
    Engine, the GPU path of the TOPR step) "no recompute" keeps what selective recompute keeps;
    Megatron-Core itself warns that recomputing core_attn is then unnecessary. The formula is the
    paper's GPT layer (4h GeLU MLP, multi-head attention); for Llama's SwiGLU (3.5h, no dropout)
    and GQA it is the usual estimate.
    """
    s, b, h, a, t = lay.seq_length, lay.micro_batch, arch.hidden_size, arch.num_attention_heads, lay.tp
    sbh = s * b * h
    scores = 5 * a * s / h
    if granularity == "full":
        return round(2 * sbh / lay.sp_divisor), f"2·s·b·h{'/t' if lay.sequence_parallel else ''}"
    keep_scores = granularity is None and not lay.fused_attention
    if lay.sequence_parallel:
        per_layer = sbh * (34 + (scores if keep_scores else 0)) / t
        text = "s·b·h·(34 + 5·a·s/h)/t" if keep_scores else "s·b·h·34/t"
    else:
        per_layer = sbh * (10 + 24 / t + (scores / t if keep_scores else 0))
        text = "s·b·h·(10 + 24/t + 5·a·s/(h·t))" if keep_scores else "s·b·h·(10 + 24/t)"
    return round(per_layer), text


def chunk_activation_bytes(arch: Architecture, lay: Layout, chunk_layers: int) -> tuple[int, int, str, str]:
    """(bytes one chunk-forward keeps, recompute working set, formula, arithmetic) for a model
    chunk of `chunk_layers` layers. Full recompute keeps one input per checkpoint: per layer for
    the first recompute_num_layers layers ("block"), or per group of recompute_num_layers layers
    ("uniform"); recomputing rebuilds a checkpoint's layers once, the working set."""
    stored, stored_text = activation_bytes_per_layer(arch, lay, lay.recompute)
    if lay.recompute != "full":
        return chunk_layers * stored, 0, f"{stored_text} per layer", f"{chunk_layers} layers x {stored:,}"
    whole, whole_text = activation_bytes_per_layer(arch, lay, None)
    group = lay.recompute_num_layers or 1
    formula = f"{stored_text} per checkpoint + working set of {whole_text} per layer"
    if lay.recompute_method == "block":
        recomputed = min(group, chunk_layers)
        plain = chunk_layers - recomputed
        return (recomputed * stored + plain * whole, whole, formula,
                f"({recomputed} x {stored:,} + {plain} x {whole:,})")
    checkpoints = math.ceil(chunk_layers / group)
    return checkpoints * stored, min(group, chunk_layers) * whole, formula, f"{checkpoints} checkpoints x {stored:,}"


@dataclass(frozen=True)
class MemoryLine:
    name: str
    formula: str  # symbolic
    bytes: int
    arithmetic: str  # with this stage's numbers, without the result


def optimizer_bytes_per_param(lay: Layout) -> int:
    """Adam: fp32 master weights (only when the model weights are 16-bit) + exp_avg + exp_avg_sq."""
    return 12 if lay.half_precision_weights else 8


def stage_memory(arch: Architecture, lay: Layout, stage: Stage, reserve_bytes: int) -> list[MemoryLine]:
    """The memory lines of one GPU of `stage`; every stage has the same lines, in the same order."""
    p = stage.params
    grad_bytes = 4 if lay.grad_reduce_in_fp32 else lay.weight_bytes
    adam = optimizer_bytes_per_param(lay)
    shards = lay.dp if lay.distributed_optimizer else 1
    weights_dtype = "bf16" if lay.half_precision_weights else "fp32"
    lines = [
        MemoryLine(f"weights ({weights_dtype})", f"{lay.weight_bytes} B/param", lay.weight_bytes * p,
                   f"{lay.weight_bytes} x {p:,}"),
        MemoryLine(f"main grads ({'fp32' if grad_bytes == 4 else weights_dtype})", f"{grad_bytes} B/param",
                   grad_bytes * p, f"{grad_bytes} x {p:,}"),
        MemoryLine("Adam states" + (" (distributed optimizer)" if lay.distributed_optimizer else ""),
                   f"{adam} B/param / {shards} (DP shards)", adam * p // shards, f"{adam} x {p:,} / {shards}"),
    ]
    if lay.fp8:
        lines.append(MemoryLine("FP8 weight copies (TE cache)", "2 B/GEMM param (FP8 + transpose)",
                                2 * stage.gemm_params, f"2 x {stage.gemm_params:,}"))
    lines.append(activation_line(arch, lay, stage))
    lines.append(logits_line(arch, lay, stage))
    lines.append(MemoryLine("runtime reserve", "--reserve-gb: CUDA context, NCCL, fragmentation", reserve_bytes,
                            f"{reserve_bytes / GIB:g} GiB"))
    return lines


def activation_line(arch: Architecture, lay: Layout, stage: Stage) -> MemoryLine:
    """Chunk-forwards in flight x one chunk's activations (+ the recompute working set)."""
    chunk_layers = arch.num_layers // (lay.pp * lay.chunks)
    in_flight = chunk_forwards_in_flight(lay, stage.rank)
    per_chunk, working_set, formula, arithmetic = chunk_activation_bytes(arch, lay, chunk_layers)
    total = in_flight * per_chunk + working_set
    unit = "chunk-forwards" if lay.vp and lay.pp > 1 else ("micro-batch" if in_flight == 1 else "micro-batches")
    arithmetic = f"{in_flight} {unit} in flight x {arithmetic}"
    if working_set:
        arithmetic += f" + working set {working_set:,}"
    attention = "fused attention" if lay.fused_attention else "unfused attention"
    return MemoryLine(f"activations ({lay.recompute or 'no'} recompute, {attention})", f"{formula} x in flight",
                      total, arithmetic)


def logits_line(arch: Architecture, lay: Layout, stage: Stage) -> MemoryLine:
    """fp32 logits of one micro-batch for the cross-entropy, on the stage with the output layer."""
    if not stage.has_output_layer:
        return MemoryLine("logits (fp32 cross-entropy)", "s·b·V/t·4 B", 0, "no output layer on this stage")
    vocab_shard = arch.vocab_size // lay.tp
    logits = lay.seq_length * lay.micro_batch * vocab_shard * 4
    return MemoryLine("logits (fp32 cross-entropy)", "s·b·V/t·4 B", logits,
                      f"{lay.seq_length} x {lay.micro_batch} x {vocab_shard:,} x 4")


@dataclass(frozen=True)
class MemoryEstimate:
    stages: list[Stage]
    lines: dict[str, list[MemoryLine]]  # stage name -> lines
    capacity_bytes: int

    def total(self, stage: str) -> int:
        return sum(line.bytes for line in self.lines[stage])

    @property
    def worst(self) -> Stage:
        return max(self.stages, key=lambda s: self.total(s.name))

    @property
    def fits(self) -> bool:
        return self.total(self.worst.name) <= self.capacity_bytes


def estimate_memory(arch: Architecture, lay: Layout, gpu_memory_gib: float = 80,
                    reserve_gib: float = 4) -> MemoryEstimate:
    reserve = round(reserve_gib * GIB)
    stages = pipeline_stages(arch, lay)
    return MemoryEstimate(stages, {s.name: stage_memory(arch, lay, s, reserve) for s in stages},
                          round(gpu_memory_gib * GIB))
