"""The layout rules Megatron-Core, Transformer Engine and the TOPR step enforce at start-up, as
arithmetic: each check returns a Finding naming its rule and the numbers, or None when it does
not apply (`nemo-topr plan`, `nemo-topr submit`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from nemo_topr.model.architecture import Architecture
from nemo_topr.cluster.layout import Layout

FP8_ALIGNMENT = 16


@dataclass(frozen=True)
class Finding:
    rule: str
    passed: bool
    detail: str
    severity: str = "error"  # "error" fails the plan; "warning" does not
    fix: str | None = None  # the option that passes the rule, where one does

    @property
    def blocking(self) -> bool:
        return not self.passed and self.severity == "error"

    @property
    def explained(self) -> str:
        """The detail, with the fix where there is one."""
        return f"{self.detail}: {self.fix}" if self.fix else self.detail

    def format(self) -> str:
        status = "ok" if self.passed else ("FAIL" if self.severity == "error" else "WARN")
        return f"  {status:<4}  {self.rule}: {self.explained}"


def _divisible(rule: str, numerator: int, denominator: int, what: str) -> Finding:
    remainder = numerator % denominator
    relation = "=" if remainder == 0 else "leaves remainder"
    result = numerator // denominator if remainder == 0 else remainder
    return Finding(rule, remainder == 0, f"{what} = {numerator} / {denominator} {relation} {result}")


def check_world_size(arch: Architecture, lay: Layout) -> Finding:
    world, mp = lay.world_size, lay.model_parallel
    passed = world % mp == 0
    dp = f"{world // mp}" if passed else f"{world / mp:.3g}, not a positive integer"
    # the fewest nodes whose GPUs TP·PP·CP divides, and the next count of them from --nodes on
    step = mp // math.gcd(mp, lay.gpus_per_node)
    nodes = -(-lay.nodes // step) * step
    also = f", or any multiple of {step}" if nodes != step else ""
    return Finding("world size = TP·PP·CP·DP", passed,
                   f"{lay.nodes} node(s) x {lay.gpus_per_node} GPUs = {world}; TP·PP·CP = "
                   f"{lay.tp}·{lay.pp}·{lay.cp} = {mp}, so DP = {world}/{mp} = {dp}",
                   fix=None if passed else f"--nodes {nodes} gives DP = {nodes * lay.gpus_per_node // mp}{also}")


def check_virtual_pipeline(arch: Architecture, lay: Layout) -> Finding | None:
    """Virtual stages: 2 or more, with PP > 1 (nemo_topr/training/config.py, check_virtual_pipeline)."""
    if lay.vp is None:
        return None
    passed = lay.vp >= 2 and lay.pp > 1
    detail = (f"VP = {lay.vp} chunks per stage of PP = {lay.pp}" if passed else
              f"VP = {lay.vp}: one chunk per stage; Megatron's interleaved schedule fails at the first step: "
              "leave VP unset" if lay.vp < 2 else
              f"VP = {lay.vp} at PP = 1: Megatron refuses virtual stages without a pipeline")
    return Finding("VP >= 2 with PP > 1", passed, detail)


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


def check_interleaved_p2p(arch: Architecture, lay: Layout) -> Finding | None:
    """Batched p2p crosses activations and gradients at PP = 2 with virtual stages, where the
    previous and the next stage are one rank (nemo_topr/training/config.py, choose_pipeline_p2p)."""
    if lay.pp != 2 or (lay.vp or 1) < 2:
        return None
    return Finding("unbatched p2p at PP = 2 with VP (Megatron)", not lay.batched_p2p,
                   "model.batch_p2p_comm=true: Megatron's batched sends to the one neighbour arrive crossed "
                   "(NVIDIA/Megatron-LM#750): leave it unset" if lay.batched_p2p else
                   "overlapped, unbatched p2p (the recipe's choice)")


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
    check_world_size, check_virtual_pipeline, check_layers_per_stage, check_attention_heads, check_query_groups,
    check_vocab, check_global_batch, check_interleaved_micro_batches, check_interleaved_p2p,
    check_context_parallel_sequence, check_sequence_parallel_sequence, check_sequence_parallel_needs_tp,
    check_fp8_shapes, check_fp8_recipe, check_topr_context_parallel, check_topr_pipeline_micro_batch,
)


def check_layout(arch: Architecture, lay: Layout) -> list[Finding]:
    return [finding for check in CHECKS if (finding := check(arch, lay)) is not None]
