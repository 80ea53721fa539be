"""`nemo-topr plan`: pre-flight check of a parallel layout and of per-GPU memory.

    nemo-topr plan llama31_70b_fp8 --nodes 4 --gpus-per-node 8 [key=value ...]

Composes the run config exactly as `nemo-topr train` does (conf/ + key=value overrides), checks
the layout against the rules Megatron-Core, Transformer Engine and the TOPR step enforce at
start-up (so a bad layout fails here, not after the job waited in the queue), and estimates
the memory of each GPU. Every key and value is checked as `train` checks it
(`nemo_topr.training.config.check_values`, which imports Bridge's config classes); the rest is
arithmetic: no model is built, no GPU is needed.

The architecture comes from the HF config of ``base_model`` (its config.json, or a Megatron
checkpoint's hf_artifacts/config.json) when that model is readable here, else from a built-in
reference (Llama 3.1 8B / 70B, chosen by ``--arch`` or by the config's name); ``model.*``
architecture keys in the config override either, as they do in training. The report also shows
how training will load ``base_model`` (converted from HF at every start, or a Megatron checkpoint
loaded directly); a checkpoint that is visible here but unfinished or inconsistent fails the plan.

Exit status: 0 when every check passes and the estimate fits; 1 otherwise; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from nemo_topr.model_source import load_route

GIB = 2**30
FP8_ALIGNMENT = 16


# --------------------------------------------------------------------------------------------
# Architecture and parameter count
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Architecture:
    """A Llama-style decoder; field names are Megatron-Core's (``model.*`` keys)."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    kv_channels: int  # head dim
    share_embeddings_and_output_weights: bool = False

    @property
    def query_width(self) -> int:
        """heads * head_dim: the width of Q and of the attention output projection's input."""
        return self.num_attention_heads * self.kv_channels

    @property
    def key_value_width(self) -> int:
        """query_groups * head_dim: the width of K and of V (grouped-query attention)."""
        return self.num_query_groups * self.kv_channels

    @property
    def attention_gemm_params(self) -> int:
        """QKV projection h*(q + 2kv) plus output projection q*h (no biases)."""
        h = self.hidden_size
        return h * (self.query_width + 2 * self.key_value_width) + self.query_width * h

    @property
    def mlp_gemm_params(self) -> int:
        """SwiGLU: gate and up projections h*ffn each, down projection ffn*h."""
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def layer_norm_params(self) -> int:
        """Two RMSNorm weight vectors per layer (before attention, before the MLP)."""
        return 2 * self.hidden_size

    @property
    def layer_params(self) -> int:
        return self.attention_gemm_params + self.mlp_gemm_params + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def output_layer_params(self) -> int:
        """V*h for an untied output layer; 0 when it shares the embedding."""
        return 0 if self.share_embeddings_and_output_weights else self.embedding_params

    @property
    def total_params(self) -> int:
        """embedding + L * layer + final RMSNorm + output layer."""
        return (self.embedding_params + self.num_layers * self.layer_params + self.hidden_size
                + self.output_layer_params)

    def describe(self) -> str:
        tying = "tied" if self.share_embeddings_and_output_weights else "untied"
        return (f"L={self.num_layers} h={self.hidden_size} ffn={self.ffn_hidden_size} "
                f"heads={self.num_attention_heads} query groups={self.num_query_groups} "
                f"head dim={self.kv_channels} vocab={self.vocab_size}, {tying} embeddings")

    def params_breakdown(self) -> str:
        return (f"embedding {self.embedding_params:,} + {self.num_layers} layers x {self.layer_params:,} "
                f"(attention {self.attention_gemm_params:,} + MLP {self.mlp_gemm_params:,} + 2 RMSNorm "
                f"{self.layer_norm_params:,}) + final norm {self.hidden_size:,} + output layer "
                f"{self.output_layer_params:,} = {self.total_params:,}")


def _llama31(name: str, layers: int, hidden: int, ffn: int, heads: int) -> Architecture:
    return Architecture(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
                        num_attention_heads=heads, num_query_groups=8, vocab_size=128256,
                        kv_channels=hidden // heads, share_embeddings_and_output_weights=False)


# Published Llama 3.1 configs (config.json of meta-llama/Llama-3.1-8B and -70B).
REFERENCE_ARCHITECTURES: dict[str, Architecture] = {
    "llama31_8b": _llama31("Llama 3.1 8B", layers=32, hidden=4096, ffn=14336, heads=32),
    "llama31_70b": _llama31("Llama 3.1 70B", layers=80, hidden=8192, ffn=28672, heads=64),
}

# Hugging Face LlamaConfig key -> Architecture field.
HF_CONFIG_KEYS = {
    "num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_query_groups",
    "vocab_size": "vocab_size", "head_dim": "kv_channels",
    "tie_word_embeddings": "share_embeddings_and_output_weights",
}


def architecture_from_hf_config(config: dict[str, Any], name: str) -> Architecture:
    """Architecture of a local HF Llama ``config.json`` (GQA and head_dim defaults as in HF)."""
    values = {field: config[key] for key, field in HF_CONFIG_KEYS.items() if key in config}
    values.setdefault("num_query_groups", values["num_attention_heads"])
    values.setdefault("kv_channels", values["hidden_size"] // values["num_attention_heads"])
    values.setdefault("share_embeddings_and_output_weights", False)  # LlamaConfig's default
    return Architecture(name=name, **values)


def with_model_overrides(arch: Architecture, model: dict[str, Any]) -> Architecture:
    """Apply ``model.*`` architecture keys from the run config (they win in training too)."""
    names = {f.name for f in dataclasses.fields(Architecture)} - {"name"}
    overrides = {key: value for key, value in model.items() if key in names and value is not None}
    return dataclasses.replace(arch, **overrides) if overrides else arch


# --------------------------------------------------------------------------------------------
# Layout (parallelism, batch, precision, recompute) from a composed run config
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """What the planner needs from a run config (parallelism, batch, recompute, precision), plus
    the cluster size. Field defaults are those of a GPU run whose config is silent."""

    nodes: int = 1
    gpus_per_node: int = 8
    tp: int = 1
    pp: int = 1
    vp: int | None = None
    cp: int = 1
    sequence_parallel: bool = False
    seq_length: int = 2048
    micro_batch: int = 1
    global_batch: int = 8
    recompute: str | None = None  # None | "selective" | "full"
    recompute_method: str | None = None  # full only: "uniform" | "block"
    recompute_num_layers: int | None = None
    fused_attention: bool = True  # TE flash/cuDNN attention: the a·s² scores are never stored
    half_precision_weights: bool = True  # model.bf16 or model.fp16: 2 B/param, else fp32
    grad_reduce_in_fp32: bool = True
    distributed_optimizer: bool = True
    fp8: str | None = None
    fp8_recipe: str = "delayed"
    first_last_layers_bf16: bool = False
    bf16_layers_at_start: int = 1
    bf16_layers_at_end: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel size (world // TP*PP*CP; at least 1 so the estimate still runs when the
        world-size check fails)."""
        return max(1, self.world_size // self.model_parallel)

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (the virtual pipeline size, 1 without interleaving)."""
        return self.vp or 1

    @property
    def micro_batches(self) -> int:
        """Micro-batches per optimizer step on each DP rank: GBS / (MBS * DP)."""
        return max(1, self.global_batch // (self.micro_batch * self.dp))

    @property
    def weight_bytes(self) -> int:
        return 2 if self.half_precision_weights else 4

    @property
    def sp_divisor(self) -> int:
        """Sequence parallelism splits the sequence dimension over TP."""
        return self.tp if self.sequence_parallel else 1

    def describe(self) -> str:
        vp = f"VP={self.vp}" if self.vp else "VP off"
        return (f"TP={self.tp} PP={self.pp} CP={self.cp} DP={self.dp} ({vp}, SP "
                f"{'on' if self.sequence_parallel else 'off'}); seq {self.seq_length} x micro-batch "
                f"{self.micro_batch}, global batch {self.global_batch} = {self.micro_batches} "
                f"micro-batches per DP rank")


def layout_from_config(cfg: dict[str, Any], nodes: int, gpus_per_node: int) -> Layout:
    """The layout of a composed run config. What it leaves out is what a GPU run gets:
    `default_container` (nemo_topr/training/config.py: distributed optimizer, fp32 gradient
    reduction, global batch 8) and Megatron-Core's TransformerConfig (delayed FP8 scaling, one BF16
    layer at each end). Weights are FP32 unless ``model.bf16`` (or fp16) is set, because the HF
    provider is built in FP32. Attention is fused unless ``model.transformer_impl`` or
    ``model.attention_backend`` says "local"/"unfused": the TOPR step hands Transformer Engine
    packed THD streams, which TE gives to flash or cuDNN fused attention; TE 2.17.1's
    UnfusedDotProductAttention takes them too, but pads every sequence to the longest and holds the
    scores (an 8B-shaped model at 4,096 tokens ran out of an H200's 140 GiB at 4 layers, 2026-11-26)."""
    model, train = cfg.get("model") or {}, cfg.get("train") or {}
    optimizer, ddp = cfg.get("optimizer") or {}, cfg.get("ddp") or {}
    defaults = Layout()

    def get(section: dict[str, Any], key: str, default: Any) -> Any:
        value = section.get(key)
        return default if value is None else value

    # Bridge turns the distributed optimizer on for both when either asks for it
    # (bridge/training/config.py, _validate_and_sync_distributed_optimizer_settings).
    dist_opt_keys = [section["use_distributed_optimizer"] for section in (optimizer, ddp)
                     if section.get("use_distributed_optimizer") is not None]
    return Layout(
        nodes=nodes, gpus_per_node=gpus_per_node,
        tp=get(model, "tensor_model_parallel_size", defaults.tp),
        pp=get(model, "pipeline_model_parallel_size", defaults.pp),
        vp=model.get("virtual_pipeline_model_parallel_size"),
        cp=get(model, "context_parallel_size", defaults.cp),
        sequence_parallel=bool(model.get("sequence_parallel")),
        seq_length=get(model, "seq_length", defaults.seq_length),
        micro_batch=get(train, "micro_batch_size", defaults.micro_batch),
        global_batch=get(train, "global_batch_size", defaults.global_batch),
        recompute=model.get("recompute_granularity"),
        recompute_method=model.get("recompute_method"),
        recompute_num_layers=model.get("recompute_num_layers"),
        fused_attention=(model.get("transformer_impl") != "local"
                         and str(model.get("attention_backend")).split(".")[-1] not in ("local", "unfused")),
        half_precision_weights=bool(model.get("bf16") or model.get("fp16")),
        grad_reduce_in_fp32=get(ddp, "grad_reduce_in_fp32", defaults.grad_reduce_in_fp32),
        distributed_optimizer=any(dist_opt_keys) if dist_opt_keys else defaults.distributed_optimizer,
        fp8=model.get("fp8"),
        fp8_recipe=get(model, "fp8_recipe", defaults.fp8_recipe),
        first_last_layers_bf16=bool(model.get("first_last_layers_bf16")),
        bf16_layers_at_start=get(model, "num_layers_at_start_in_bf16", defaults.bf16_layers_at_start),
        bf16_layers_at_end=get(model, "num_layers_at_end_in_bf16", defaults.bf16_layers_at_end),
    )


# --------------------------------------------------------------------------------------------
# Checks: each returns a Finding naming its rule and the numbers, or None when not applicable
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    rule: str
    passed: bool
    detail: str
    severity: str = "error"  # "error" fails the plan; "warning" does not

    @property
    def blocking(self) -> bool:
        return not self.passed and self.severity == "error"

    def format(self) -> str:
        status = "ok" if self.passed else ("FAIL" if self.severity == "error" else "WARN")
        return f"  {status:<4}  {self.rule}: {self.detail}"


def _divisible(rule: str, numerator: int, denominator: int, what: str) -> Finding:
    remainder = numerator % denominator
    relation = "=" if remainder == 0 else "leaves remainder"
    result = numerator // denominator if remainder == 0 else remainder
    return Finding(rule, remainder == 0, f"{what} = {numerator} / {denominator} {relation} {result}")


def check_world_size(arch: Architecture, lay: Layout) -> Finding:
    world, mp = lay.world_size, lay.model_parallel
    passed = world % mp == 0
    dp = f"{world // mp}" if passed else f"{world / mp:.3g}, not a positive integer"
    return Finding("world size = TP·PP·CP·DP", passed,
                   f"{lay.nodes} node(s) x {lay.gpus_per_node} GPUs = {world}; TP·PP·CP = "
                   f"{lay.tp}·{lay.pp}·{lay.cp} = {mp}, so DP = {world}/{mp} = {dp}")


def check_layers_per_stage(arch: Architecture, lay: Layout) -> Finding:
    if lay.vp:
        return _divisible("layers % (PP·VP)", arch.num_layers, lay.pp * lay.vp,
                          f"layers per model chunk (PP·VP = {lay.pp}·{lay.vp})")
    return _divisible("layers % PP", arch.num_layers, lay.pp, "layers per pipeline stage")


def check_attention_heads(arch: Architecture, lay: Layout) -> Finding:
    return _divisible("attention heads % TP", arch.num_attention_heads, lay.tp, "heads per TP rank")


def check_query_groups(arch: Architecture, lay: Layout) -> Finding:
    return _divisible("query groups % TP", arch.num_query_groups, lay.tp, "KV groups per TP rank")


def check_vocab(arch: Architecture, lay: Layout) -> Finding:
    """The HF vocabulary is not padded (Bridge: should_pad_vocab=False), so the vocab-parallel
    embedding and output layer need vocab % TP == 0."""
    return _divisible("vocab % TP", arch.vocab_size, lay.tp, "vocab rows per TP rank")


def check_global_batch(arch: Architecture, lay: Layout) -> Finding:
    return _divisible("global batch % (micro batch·DP)", lay.global_batch, lay.micro_batch * lay.dp,
                      f"micro-batches per step (MBS·DP = {lay.micro_batch}·{lay.dp})")


def check_interleaved_micro_batches(arch: Architecture, lay: Layout) -> Finding | None:
    """The interleaved schedule runs micro-batches in groups of PP (microbatch_group_size_per_vp_stage
    defaults to PP) and rejects a total below PP or a trailing group shorter than PP
    (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving)."""
    if not lay.vp or lay.pp == 1:
        return None
    m = lay.micro_batches
    passed = m >= lay.pp and m % lay.pp == 0
    return Finding("micro-batches % PP (interleaved schedule)", passed,
                   f"{m} micro-batches per step (GBS/(MBS·DP)), PP = {lay.pp}: {m} % {lay.pp} = {m % lay.pp}, "
                   f"{m} {'>=' if m >= lay.pp else '<'} {lay.pp}")


def check_context_parallel_sequence(arch: Architecture, lay: Layout) -> Finding | None:
    if lay.cp == 1:
        return None
    return _divisible("sequence % 2·CP", lay.seq_length, 2 * lay.cp, "load-balanced CP chunks (2·CP)")


def check_sequence_parallel_sequence(arch: Architecture, lay: Layout) -> Finding | None:
    if not lay.sequence_parallel:
        return None
    return _divisible("sequence % TP (sequence parallel)", lay.seq_length, lay.tp, "tokens per TP rank")


def check_sequence_parallel_needs_tp(arch: Architecture, lay: Layout) -> Finding | None:
    """A warning: Bridge's TransformerConfig.finalize turns sequence_parallel off when TP = 1
    (megatron/bridge/models/transformer_config.py) before Megatron-Core would reject it."""
    if not lay.sequence_parallel:
        return None
    detail = f"TP = {lay.tp}" + ("" if lay.tp > 1 else "; Bridge switches sequence parallelism off")
    return Finding("sequence parallel needs TP > 1", lay.tp > 1, detail, severity="warning")


def fp8_gemm_dimensions(arch: Architecture, lay: Layout) -> dict[str, int]:
    """Every dimension an FP8 GEMM of one transformer layer sees on one GPU.

    Transformer Engine checks FP8 GEMM operands with ``assert_dim_for_fp8_exec``
    (transformer_engine/pytorch/utils.py): the product of the leading dimensions divisible by 8
    and the last dimension by 16. Forward (X·Wᵀ), data-gradient and weight-gradient GEMMs put
    each of tokens, input features and output features in the last (reduced) position once, so
    all of them need a multiple of 16. Tokens: the TOPR step flattens a micro-batch of packed
    rows into one THD stream of seq·MBS tokens, split over TP under sequence parallelism.
    """
    t = lay.tp
    return {
        "hidden": arch.hidden_size,
        "QKV out/TP": (arch.query_width + 2 * arch.key_value_width) // t,
        "attention proj in/TP": arch.query_width // t,
        "MLP fc1 out/TP": 2 * arch.ffn_hidden_size // t,
        "ffn/TP": arch.ffn_hidden_size // t,
        "tokens per micro-batch": lay.seq_length * lay.micro_batch // lay.sp_divisor,
    }


def check_fp8_shapes(arch: Architecture, lay: Layout) -> Finding | None:
    if not lay.fp8:
        return None
    dims = fp8_gemm_dimensions(arch, lay)
    bad = {name: value for name, value in dims.items() if value % FP8_ALIGNMENT}
    shown = bad or dims
    listing = ", ".join(f"{name} {value}" for name, value in shown.items())
    detail = f"{'not multiples of 16: ' if bad else 'all multiples of 16: '}{listing}"
    return Finding(f"FP8 GEMM dimensions % {FP8_ALIGNMENT} (Transformer Engine)", not bad, detail)


def check_fp8_recipe(arch: Architecture, lay: Layout) -> Finding | None:
    """Megatron-Core (transformer_config.py) rejects BF16 first/last layers with delayed scaling and
    more BF16 layers at either end than a pipeline stage holds."""
    if not lay.fp8:
        return None
    if lay.first_last_layers_bf16 and lay.fp8_recipe == "delayed":
        return Finding("FP8 recipe", False, "delayed scaling does not support first_last_layers_bf16; "
                       "set model.first_last_layers_bf16=false or use fp8_recipe=tensorwise")
    per_stage = arch.num_layers // lay.pp
    ends = (lay.bf16_layers_at_start, lay.bf16_layers_at_end) if lay.first_last_layers_bf16 else (0, 0)
    passed = all(0 <= n <= per_stage for n in ends)
    return Finding("FP8 recipe", passed, f"{lay.fp8}/{lay.fp8_recipe}, BF16 layers at start/end "
                   f"{ends[0]}/{ends[1]} (at most {per_stage} = layers per stage)")


def check_topr_context_parallel(arch: Architecture, lay: Layout) -> Finding:
    """nemo_topr/training/step.py raises NotImplementedError for context_parallel_size > 1."""
    return Finding("CP = 1 (TOPR step)", lay.cp == 1,
                   f"CP = {lay.cp}" + ("" if lay.cp == 1 else "; the TOPR step does not split packed "
                                       "THD streams across CP ranks yet: use TP/PP/DP"))


def check_topr_pipeline_micro_batch(arch: Architecture, lay: Layout) -> Finding | None:
    """The TOPR step hands Transformer Engine each micro-batch as one packed THD stream of MBS·seq
    tokens, while pipeline stages exchange [seq, MBS, hidden] buffers: with PP > 1 only MBS = 1
    keeps the token order (nemo_topr/training/config.py rejects the same at start-up)."""
    if lay.pp == 1 or not lay.fused_attention:  # local attention takes [MBS, seq] batches as they are
        return None
    return Finding("micro batch = 1 with PP > 1 (TOPR step)", lay.micro_batch == 1,
                   f"micro batch {lay.micro_batch}, PP = {lay.pp}" + ("" if lay.micro_batch == 1 else
                   "; packed THD streams would arrive in [seq, MBS, hidden] order: set train.micro_batch_size=1"))


CHECKS: tuple[Callable[[Architecture, Layout], Finding | None], ...] = (
    check_world_size, check_layers_per_stage, check_attention_heads, check_query_groups, check_vocab,
    check_global_batch, check_interleaved_micro_batches, check_context_parallel_sequence,
    check_sequence_parallel_sequence, check_sequence_parallel_needs_tp, check_fp8_shapes,
    check_fp8_recipe, check_topr_context_parallel, check_topr_pipeline_micro_batch,
)


def check_layout(arch: Architecture, lay: Layout) -> list[Finding]:
    return [finding for check in CHECKS if (finding := check(arch, lay)) is not None]


# --------------------------------------------------------------------------------------------
# Memory per GPU
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def format_memory(estimate: MemoryEstimate) -> list[str]:
    """The per-GPU table (one column per stage) and the worst stage's arithmetic."""
    names = [s.name for s in estimate.stages]
    worst = estimate.worst
    row = "  {:<46}{:<50}" + "{:>8}" * len(names)
    which = f"worst stage: {worst.name}" if len(names) > 1 else "one pipeline stage"
    out = [f"memory per GPU, GiB ({which})", row.format("item", "formula", *names)]
    for lines in zip(*(estimate.lines[n] for n in names)):
        out.append(row.format(lines[0].name, lines[0].formula, *(f"{l.bytes / GIB:.2f}" for l in lines)))
    out.append(row.format("total", "", *(f"{estimate.total(n) / GIB:.2f}" for n in names)))
    out.append(f"arithmetic{f', {worst.name} stage' if len(names) > 1 else ''} (bytes)")
    out.append(f"  parameters on one GPU = {worst.params_arithmetic}")
    out += [f"  {line.name} = {line.arithmetic} = {line.bytes:,}" for line in estimate.lines[worst.name]]
    return out


def optimizer_notes(lay: Layout, estimate: MemoryEstimate) -> list[str]:
    """What the distributed optimizer saves, and what Adam costs over the paper's Adafactor."""
    worst = estimate.worst
    p, adam = worst.params, optimizer_bytes_per_param(lay)
    sharded, replicated = adam * p // lay.dp, adam * p
    current, other = (sharded, replicated) if lay.distributed_optimizer else (replicated, sharded)
    other_total = estimate.total(worst.name) - current + other
    moments = 8 * p // (lay.dp if lay.distributed_optimizer else 1)
    return [
        f"  distributed optimizer: Adam states {_gib(sharded)} sharded over DP={lay.dp}, {_gib(replicated)} "
        f"replicated; {'without' if lay.distributed_optimizer else 'with'} it a GPU would need "
        f"{_gib(other_total)}",
        f"  Adam replaces the paper's Adafactor (Megatron has none): its exp_avg + exp_avg_sq, 8 B/param = "
        f"{_gib(moments)} here, are what Adafactor (factored second moment, no momentum) avoids",
    ]


def format_report(title: str, arch: Architecture, source: str, lay: Layout, findings: list[Finding],
                  estimate: MemoryEstimate) -> str:
    fp8 = f"FP8 {lay.fp8}/{lay.fp8_recipe}" if lay.fp8 else "FP8 off"
    lines = [
        f"nemo-topr plan: {title} on {lay.nodes} node(s) x {lay.gpus_per_node} GPUs, "
        f"{estimate.capacity_bytes / GIB:g} GiB each",
        f"model      {arch.name} ({source}): {arch.total_params:,} parameters ({arch.total_params / 1e9:.2f} B)",
        f"           {arch.describe()}",
        f"           {arch.params_breakdown()}",
        f"layout     {lay.describe()}",
        f"precision  {'bf16' if lay.half_precision_weights else 'fp32'} weights, "
        f"{'fp32' if lay.grad_reduce_in_fp32 else 'bf16'} main grads, Adam"
        f"{' with the distributed optimizer' if lay.distributed_optimizer else ''}, "
        f"{lay.recompute or 'no'} recompute, {fp8}",
        "checks",
        *(f.format() for f in findings),
        *format_memory(estimate),
        "notes",
        *optimizer_notes(lay, estimate),
        verdict(findings, estimate),
    ]
    return "\n".join(lines)


def verdict(findings: list[Finding], estimate: MemoryEstimate) -> str:
    worst = estimate.worst
    need, have = estimate.total(worst.name), estimate.capacity_bytes
    where = f", {worst.name} pipeline stage" if len(estimate.stages) > 1 else ""
    if estimate.fits:
        memory = f"FITS: {_gib(need)} of {_gib(have)} per GPU ({_gib(have - need)} headroom{where})"
    else:
        memory = f"DOES NOT FIT: {_gib(need)} needed, {_gib(have)} per GPU ({_gib(need - have)} short{where})"
    failed = [f.rule for f in findings if f.blocking]
    layout = "layout OK" if not failed else f"LAYOUT REJECTED ({'; '.join(failed)})"
    return f"verdict: {memory}; {layout}"


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def resolve_architecture(cfg: dict[str, Any], config_name: str, arch_key: str | None) -> tuple[Architecture, str]:
    """(architecture, where it came from): base_model's HF config.json if readable, else a reference."""
    source, route = load_route(cfg, must_exist=False)
    config_json = source.hf_dir / "config.json" if source is not None else None
    if arch_key is None and config_json is not None:
        arch = architecture_from_hf_config(json.loads(config_json.read_text()), source.path.name)
        return with_model_overrides(arch, cfg.get("model") or {}), str(config_json)
    why = "--arch" if arch_key else route
    key = arch_key or _reference_key_from_name(config_name)
    if key is None:
        raise ValueError(f"cannot tell the architecture of {config_name!r} ({why}): set base_model to a local "
                         f"model or pass --arch {{{','.join(REFERENCE_ARCHITECTURES)}}}")
    arch = REFERENCE_ARCHITECTURES[key]
    return with_model_overrides(arch, cfg.get("model") or {}), f"built-in reference {key}; {why}"


def _reference_key_from_name(config_name: str) -> str | None:
    match = re.search(r"(\d+)b", config_name.lower())
    key = f"llama31_{match.group(1)}b" if match else None
    return key if key in REFERENCE_ARCHITECTURES else None


def compose_config(config: str, overrides: list[str], config_path: str | None) -> tuple[dict[str, Any], str]:
    """Compose like `nemo-topr train` and run its key, type and range checks (`check_values`):
    CONFIG is a name in the config dir or a path to a YAML file."""
    from omegaconf import OmegaConf

    from nemo_topr.training.config import check_values, compose, config_location

    raw = compose(config, overrides, config_path)
    values = OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
    check_values(values)
    return values, config_location(config, config_path)[1]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nemo-topr plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="run config: a name in the config dir (e.g. llama31_8b_bf16) or a YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for `nemo-topr train`")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default: %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: %(default)s)")
    parser.add_argument("--gpu-memory-gb", type=float, default=80,
                        help="memory of one GPU in GiB (default: %(default)s, H100 80GB)")
    parser.add_argument("--reserve-gb", type=float, default=4,
                        help="GiB set aside for CUDA context, NCCL buffers, workspaces and allocator "
                             "fragmentation (default: %(default)s)")
    parser.add_argument("--arch", choices=sorted(REFERENCE_ARCHITECTURES),
                        help="use a built-in architecture instead of base_model's config.json")
    parser.add_argument("--config-path", default=None, help="config directory (default: the repository's conf/)")
    return parser.parse_intermixed_args(argv)


def machine_problem(args: argparse.Namespace) -> str | None:
    """Why the machine described by the options cannot be planned for (a usage error, not a
    layout that does not fit), or None."""
    if args.nodes < 1 or args.gpus_per_node < 1:
        return "--nodes and --gpus-per-node must be >= 1"
    if not (math.isfinite(args.gpu_memory_gb) and args.gpu_memory_gb > 0):
        return f"--gpu-memory-gb {args.gpu_memory_gb:g}: must be a GPU's memory in GiB, above 0 (H100: 80)"
    if not (math.isfinite(args.reserve_gb) and 0 <= args.reserve_gb < args.gpu_memory_gb):
        return (f"--reserve-gb {args.reserve_gb:g}: must be at least 0 and below --gpu-memory-gb "
                f"{args.gpu_memory_gb:g}")
    return None


def plan(cfg: dict[str, Any], title: str, args: argparse.Namespace) -> tuple[int, str]:
    """(exit status, report) for a composed config."""
    arch, source = resolve_architecture(cfg, title, args.arch)
    lay = layout_from_config(cfg, args.nodes, args.gpus_per_node)
    findings = check_layout(arch, lay)
    estimate = estimate_memory(arch, lay, args.gpu_memory_gb, args.reserve_gb)
    status = 0 if estimate.fits and not any(f.blocking for f in findings) else 1
    report = format_report(title, arch, source, lay, findings, estimate).split("\n")
    report.insert(1, f"load       {load_route(cfg, must_exist=False)[1]}")
    return status, "\n".join(report)


def main(argv: list[str] | None = None) -> int:
    from nemo_topr.training.config import ConfigError

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if problem := machine_problem(args):
        print(f"nemo-topr plan: {problem}", file=sys.stderr)
        return 2
    try:
        cfg, title = compose_config(args.config, args.overrides, args.config_path)
        status, report = plan(cfg, title, args)
    except (ConfigError, ValueError) as error:
        print(f"nemo-topr plan: {error}", file=sys.stderr)
        return 1
    print(report)
    return status


if __name__ == "__main__":
    sys.exit(main())
