"""The TOPR forward step: Megatron model -> per-token log pi -> `nemo_topr.objective.policy_loss`.

Plugs into Bridge's ``finetune()`` as its ``forward_step_func``; Bridge keeps the training loop,
the pipeline schedule, the optimizer, checkpointing and logging.

Per micro-batch (layout in `nemo_topr.data.packing`):

0. `check_batch` validates the collated batch on the host, while its tensors are still on the
   CPU (missing behaviour log-probs, baselines), and reads the few sizes the loss needs; the
   loss itself then never waits for the device (no ``.item()``/``.tolist()``/boolean-mask
   indexing): metrics stay on the device until Bridge reduces them.
1. The model's labels path returns per-token cross-entropy from the vocab-parallel logits
   (no full-vocabulary gather); log pi = -CE.
2. Packed rows are unpacked into a per-sequence table [N, T_max] (position t of sequence i at
   column t), so every completion is scored on its own whatever row it was packed in. Under
   context parallelism each rank holds part of every sequence: the tables are all-reduced over
   the CP group (sum forward, identity backward), so the sequence-level ratio sees the whole
   completion.
3. `policy_loss` returns the batch mean; the step hands Bridge the *sum* and its denominator
   (sequences, or completion tokens for `batch_token_mean`) and runs with
   ``calculate_per_token_loss=True``, so Megatron divides by the global denominator across
   micro-batches and data-parallel ranks: the loss is exactly the global-batch objective.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from nemo_topr.errors import UserError
from nemo_topr.model.attention_check import FLEX, MASK, THD, check_model_attention, route_of
from nemo_topr.objective import ObjectiveConfig, policy_loss

# logged name -> (objective metric, sign, count it is averaged over when micro-batches and
# data-parallel ranks are combined; None: plain mean over micro-batches). Log-probs are logged
# as NLL because Bridge's console log prints only positive values.
_LOGGED_METRICS = {
    "positive_share": ("positive_share", 1.0, "num_sequences"),
    "effective_positive_share": ("effective_positive_share", 1.0, "num_sequences"),
    "log_ratio_abs_mean": ("log_ratio_abs_mean", 1.0, "num_sequences"),
    "log_ratio_abs_max": ("log_ratio_abs_max", 1.0, None),  # mean of the micro-batch maxima
    "weight_ess": ("weight_ess", 1.0, None),
    "positive_weight_mean": ("positive_weight_mean", 1.0, "num_positive"),
    "negative_weight_mean": ("negative_weight_mean", 1.0, "num_negative"),
    "negative_truncated_share": ("negative_truncated_share", 1.0, "num_negative"),
    "positive_nll": ("positive_logprob_mean", -1.0, "num_positive"),
    "negative_nll": ("negative_logprob_mean", -1.0, "num_negative"),
}


_LOGGED_NAMES = ("topr_loss", *_LOGGED_METRICS)


class BatchError(UserError, ValueError):
    """A batch the step cannot train on: `key` names the problem (``"record.behavior_logprob.missing"``),
    `where` the samples and field (``"sample_ids [0, 1] (2 of 8): behavior_logprob"``) or the setting."""


@dataclass(frozen=True)
class BatchSummary:
    """What the loss needs to know about a batch as Python values (read on the host)."""

    num_sequences: int
    max_length: int  # longest sequence, in tokens: the width of the per-sequence tables
    record_baselines: bool  # the data supplies per-record baselines (`baselines` column)


def check_batch(batch: dict[str, torch.Tensor], objective: ObjectiveConfig) -> BatchSummary:
    """Validate a collated batch on the host, before it moves to the device, once per batch.

    Raises BatchError naming the sample ids for missing behaviour log-probs, a baseline field
    present on some records but not others, and asymre without whole-group mean rewards; and
    for record baselines together with a nonzero `objective.baseline`.
    Runs on CPU tensors only (a device batch would make every check a synchronisation).
    """
    if batch["rewards"].device.type != "cpu":
        raise BatchError("check_batch runs on the collated CPU batch, before it moves to the device",
                         key="batch.rewards.on_device", where="rewards")
    num_sequences = len(batch["rewards"])
    if num_sequences == 0:
        return BatchSummary(0, 0, False)
    sample_ids = batch["sample_ids"]

    def named(missing: torch.Tensor) -> str:
        return f"sample_ids {sample_ids[missing][:5].tolist()} ({int(missing.sum())} of {num_sequences})"

    missing = torch.isnan(batch["behavior_logprobs"])
    if missing.any():
        raise BatchError(f"{named(missing)}: behavior_logprob missing: score the data first "
                         "(`nemo-topr score-logprobs`)",
                         key="record.behavior_logprob.missing", where=f"{named(missing)}: behavior_logprob")
    has_baseline = ~torch.isnan(batch["baselines"])
    if has_baseline.any() and not has_baseline.all():
        raise BatchError(f"{named(~has_baseline)}: no baseline while other records have one: "
                         "give every record a baseline or none",
                         key="record.baseline.on_some_records", where=f"{named(~has_baseline)}: baseline")
    record_baselines = bool(has_baseline.all())
    if record_baselines and objective.baseline != 0.0:
        raise BatchError(f"the records carry their own baseline field, which replaces objective.baseline; "
                         f"leave objective.baseline at 0.0 (got {objective.baseline})",
                         key="objective.baseline.with_record_baselines", where="objective.baseline")
    if objective.variant == "asymre" and not record_baselines:
        missing = torch.isnan(batch["group_mean_rewards"])
        if missing.any():
            raise BatchError(f"{named(missing)}: no whole-group mean reward for asymre's baseline: build "
                             "batches from the whole dataset (nemo_topr.data.packing.set_group_mean_rewards)",
                             key="record.group_mean_reward.missing_for_asymre",
                             where=f"{named(missing)}: group_mean_reward")
    return BatchSummary(num_sequences, int(batch["seq_len"].max()), record_baselines)


def sequence_table(values: torch.Tensor, batch: dict[str, torch.Tensor], max_length: int) -> torch.Tensor:
    """Scatter per-position values [R, L] of packed rows into a per-sequence table [N, max_length].

    Entry (i, t) holds the value at position t of sequence i; positions outside a sequence are 0.
    Differentiable: gradients flow back to exactly the packed positions they came from. Padding
    is written to a spare row N that is cut off, so that no boolean mask (whose indexing would
    wait for the device to count its True entries) is needed.
    """
    num_sequences = len(batch["rewards"])
    owner = batch["seq_index"]
    rows = torch.where(owner >= 0, owner, num_sequences)
    table = values.new_zeros(num_sequences + 1, max_length)
    return table.index_put((rows, batch["position_ids"]), values)[:num_sequences]


def completion_logprob_table(per_token_ce: torch.Tensor, batch: dict[str, torch.Tensor], max_length: int):
    """(log pi per completion token [N, max_length], its mask) from a packed batch's per-token
    cross-entropy [R, L]; `max_length` is `BatchSummary.max_length`.

    float64: s_i sums hundreds of terms and rho = exp(s_i - log mu_i) turns any rounding of that
    sum into a relative error of rho (the table is small: N x T). Scoring uses the same table, so
    log mu and log pi are summed the same way.
    """
    completion = batch["loss_mask"].to(torch.float64)
    logprobs = sequence_table(-per_token_ce.reshape(completion.shape).to(torch.float64) * completion, batch,
                              max_length)
    return logprobs, sequence_table(completion, batch, max_length) > 0


class _AllReduceSumIdentityBackward(torch.autograd.Function):
    """Sum over a group; each rank then computes the same loss, and its gradient w.r.t. its own
    partial table is the gradient w.r.t. the sum (d sum / d part = 1)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        tensor = tensor.clone()
        torch.distributed.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001
        return grad, None


def reduce_over_context_parallel(table: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
    if group is None or torch.distributed.get_world_size(group) == 1:
        return table
    return _AllReduceSumIdentityBackward.apply(table, group)


def baseline_source(variant: str, record_baselines: bool) -> str:
    """Where each sequence's baseline c comes from (docs/objective.md): "records", the data's own
    `baselines` when it has them (asymre adds deltaV); else "group_means" for asymre, the whole
    group's `group_mean_rewards`; else "scalar", `config.baseline`. The step takes c from here, and
    so do the data report and `train`'s baseline check (`nemo_topr.training.recipe`)."""
    if record_baselines:
        return "records"
    return "group_means" if variant == "asymre" else "scalar"


def baseline_column(variant: str, record_baselines: bool) -> str | None:
    """The batch column (`nemo_topr.data.packing`) holding each sequence's c per `baseline_source`,
    or None for the scalar `config.baseline`."""
    return {"records": "baselines", "group_means": "group_mean_rewards", "scalar": None}[
        baseline_source(variant, record_baselines)]


def topr_loss(
    per_token_ce: torch.Tensor,
    batch: dict[str, torch.Tensor],
    config: ObjectiveConfig,
    summary: BatchSummary,
    cp_group=None,  # noqa: ANN001
    report_denominator: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss_sum, denominator, metrics)`` for one micro-batch, in Bridge's loss convention.

    `summary` is `check_batch(batch)`, taken on the host before the batch moved to the device.
    Every returned tensor stays on the loss's device (no host-device synchronisation).
    `metrics` values are ``[numerator, count]`` tensors that Bridge sums over micro-batches and
    data-parallel ranks before dividing. `report_denominator=False` (context-parallel ranks other
    than the first) reports a zero denominator so the global one counts each sequence once.

    Baselines: `baseline_source`.
    """
    device = per_token_ce.device
    if summary.num_sequences == 0:  # only filler rows: contributes nothing (zero counts), keeps the graph
        zero = per_token_ce.sum() * 0.0
        return (zero, torch.zeros((), dtype=torch.int, device=device),
                {name: torch.zeros(2, device=device) for name in _LOGGED_NAMES})
    token_logprobs, loss_mask = completion_logprob_table(per_token_ce, batch, summary.max_length)
    token_logprobs = reduce_over_context_parallel(token_logprobs, cp_group)
    loss_mask = reduce_over_context_parallel(loss_mask.to(torch.float64), cp_group) > 0
    column = baseline_column(config.variant, summary.record_baselines)
    baseline = None if column is None else batch[column]
    loss, metrics = policy_loss(token_logprobs, loss_mask, batch["behavior_logprobs"], batch["rewards"],
                                config=config, baseline=baseline, check_values=False)
    denominator = metrics["num_tokens"] if config.normalization == "batch_token_mean" else metrics["num_sequences"]
    loss_sum = loss * denominator
    # on the loss's device: Megatron adds it to a device counter and Bridge all-reduces the pairs
    reported = denominator.round().to(torch.int) if report_denominator else torch.zeros((), dtype=torch.int,
                                                                                          device=device)
    return loss_sum, reported, _reduction_pairs(loss_sum.detach(), reported, metrics)


def _reduction_pairs(loss_sum: torch.Tensor, denominator: torch.Tensor,
                     metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    pairs = {"topr_loss": torch.stack([loss_sum.float(), denominator.float()])}
    one = metrics["num_sequences"].new_ones(())
    for logged, (name, sign, count_name) in _LOGGED_METRICS.items():
        count = metrics[count_name] if count_name else one
        pairs[logged] = torch.stack([sign * metrics[name] * count, count]).float()
    return pairs


def to_device(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not torch.cuda.is_available():
        return batch
    return {k: v.cuda(non_blocking=True) for k, v in batch.items()}


def packed_attention_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[R, 1, L, L] boolean mask, True = blocked: causal within each sequence, nothing across
    sequences; padding attends only to itself (its outputs are never used).

    Shared-prefix batches (`prefix_index`, `nemo_topr.data.shared_prefix`): a key is visible
    when it is earlier in the same block and either in the query's own sequence or in the
    block's shared part (seq_index -1): a segment reads its prompt and itself, a shared part
    only itself. Without `prefix_index` each sequence is its own block and the rule is the one
    above (a -1 key then is padding, visible only from padding).
    """
    owner = batch["seq_index"]
    block = batch.get("prefix_index", owner)
    length = owner.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=owner.device).tril()
    same_block = block[:, :, None] == block[:, None, :]
    own_or_shared = (owner[:, :, None] == owner[:, None, :]) | (owner[:, None, :] < 0)
    return ~(same_block & own_or_shared & causal)[:, None]


@contextlib.contextmanager
def rotary_at_position_ids(model: torch.nn.Module, position_ids: torch.Tensor):
    """Within the block, the model's RoPE angles follow `position_ids` [R, L] instead of the row
    position.

    Megatron's GPTModel builds RoPE for row positions 0..L-1 whatever the position ids
    (core/models/gpt/gpt_model.py:403-410); packed sequences are still exact because RoPE is
    relative and a packed sequence is contiguous. Shared-prefix segments are not contiguous
    with their prompt, so their angles are taken at their position ids: the RotaryEmbedding's
    output [L, 1, 1, D] (angles of positions 0..L-1) is indexed per row into [L, R, 1, D],
    which `_apply_rotary_pos_emb_bshd` broadcasts over heads (core/models/common/embeddings/
    rope_utils.py:92-140; the unfused path: fused RoPE is refused).
    """
    from megatron.core.utils import get_attr_wrapped_model

    config = get_attr_wrapped_model(model, "config")
    if config.position_embedding_type == "learned_absolute":  # the embedding reads position_ids itself
        yield
        return
    if config.position_embedding_type != "rope" or config.apply_rope_fusion:
        raise BatchError("shared-prefix batches need model.position_embedding_type rope or learned_absolute, "
                         f"unfused (got {config.position_embedding_type!r}, apply_rope_fusion="
                         f"{config.apply_rope_fusion})",
                         key="model.position_embedding_type.not_for_shared_prefix",
                         where="model.position_embedding_type")
    rope = get_attr_wrapped_model(model, "rotary_pos_emb")

    def at_position_ids(module, args, angles):  # noqa: ANN001
        return angles[position_ids.t()].flatten(2, 3)  # [L, R, 1, 1, D] -> [L, R, 1, D]

    handle = rope.register_forward_hook(at_position_ids)
    try:
        yield
    finally:
        handle.remove()


def thd_cu_seqlens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Segment boundaries [S+1] (int32, on the host) of the rows flattened into one THD stream:
    each sequence, and each row's padding tail, is its own segment. Computed from the collated
    CPU batch before it moves to the device, so the forward reads no device values."""
    if batch["seq_start"].device.type != "cpu":
        raise BatchError("thd_cu_seqlens runs on the collated CPU batch (on the device it would synchronise); "
                         "add it with with_thd_boundaries before the batch moves",
                         key="batch.seq_start.on_device", where="seq_start")
    rows, length = batch["tokens"].shape
    starts = set(batch["seq_start"].tolist()) | {r * length for r in range(rows)}
    ends = (batch["seq_start"] + batch["seq_len"]).tolist()
    starts |= {e for e in ends if e % length}  # a row's padding tail starts where its last sequence ends
    return torch.tensor(sorted(starts | {rows * length}), dtype=torch.int32)


def with_thd_boundaries(batch: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """The host batch plus its `cu_seqlens` when the model takes packed THD streams (it then
    moves to the device with the rest of the batch)."""
    return {**batch, "cu_seqlens": thd_cu_seqlens(batch)} if route_of(config) == THD else batch


def packed_seq_params(batch: dict[str, torch.Tensor]):
    """THD metadata for Transformer Engine attention from the batch's `cu_seqlens`.

    max_seqlen is the row length, a bound on every segment that stays the same from batch to
    batch: a data-dependent maximum would be read from the device and would make cuDNN build a
    new attention graph for each new value."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if "cu_seqlens" not in batch:
        raise BatchError("the batch has no cu_seqlens: add them on the host (with_thd_boundaries) before the move",
                         key="batch.cu_seqlens.missing", where="cu_seqlens")
    cu_seqlens, max_seqlen = batch["cu_seqlens"], batch["tokens"].shape[1]
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)


def single_row_micro_batches(config: Any) -> bool:
    """Whether each micro-batch must hold one row: a THD micro-batch goes through the model as one
    packed stream [1, rows*L], while the pipeline schedule sizes its p2p buffers [L, rows, hidden]
    (megatron/core/pipeline_parallel/schedules.py:1157 and :2116): same element count, different
    token order, so several rows with PP > 1 would mix tokens up. Training and scoring both obey it."""
    return config.pipeline_model_parallel_size > 1 and route_of(config) == THD


def forward_packed(model: torch.nn.Module, batch: dict[str, torch.Tensor], config: Any) -> torch.Tensor:
    """Per-token cross-entropy of a packed batch through the model's labels path.

    Local attention gets a block-diagonal causal mask (shared-prefix batches: each segment
    also sees its prompt, with RoPE at the position ids); Transformer Engine attention gets the
    rows as one THD stream with cu_seqlens (`with_thd_boundaries`); `FlexCoreAttention` (in either
    layer spec) gets the batch's block mask, shared-prefix rows included. Either way no token
    attends across sequences: the attention the model will run is checked to honour what it gets
    (`nemo_topr.model.attention_check`), and refused otherwise.
    """
    shared = "prefix_index" in batch
    route = route_of(config)
    if shared and route == THD:
        raise NotImplementedError(
            "shared-prefix batches (dataset.shared_prefix=true / score-logprobs --shared-prefix) run only with "
            f"model.transformer_impl=local or FlexCoreAttention in the layer spec (got "
            f"{config.transformer_impl!r} without it; nemo_topr.training.flex_attention)")
    check_model_attention(model, config, shared_prefix=shared)
    if route == FLEX:  # the block mask is built once here, for every layer
        from nemo_topr.training.flex_attention import segment_block_mask

        with rotary_at_position_ids(model, batch["position_ids"]) if shared else contextlib.nullcontext():
            return model(batch["tokens"], batch["position_ids"], segment_block_mask(batch), labels=batch["labels"])
    if route == MASK:
        with rotary_at_position_ids(model, batch["position_ids"]) if shared else contextlib.nullcontext():
            return model(batch["tokens"], batch["position_ids"], packed_attention_mask(batch),
                         labels=batch["labels"])
    flat = {k: batch[k].reshape(1, -1) for k in ("tokens", "labels", "position_ids")}
    return model(flat["tokens"], flat["position_ids"], None, labels=flat["labels"],
                 packed_seq_params=packed_seq_params(batch))


def is_first_model_chunk(model: torch.nn.Module) -> bool:
    """Whether `model` is its rank's first virtual-pipeline chunk, or the only model. With virtual
    pipelining Megatron's interleaved schedule calls the forward step once per model chunk for the
    same micro-batch (core/pipeline_parallel/schedules.py:1366-1369, forward_step(forward_step_func,
    data_iterator[model_chunk_id], model[model_chunk_id])): the first chunk's call stands for it."""
    from megatron.bridge.training.utils.flop_utils import get_model_chunk_vp_stage

    return get_model_chunk_vp_stage(model) in (None, 0)


class ToprForwardStep:
    """Bridge forward-step functor: ``step(state, data_iterator, model)``.

    `sample_log_dir`: optional directory; per micro-batch the step appends the iteration and the
    sample ids it trained on to ``samples_dp{data-parallel rank}.jsonl`` there (a ledger that
    shows resumed runs neither repeat nor skip data): one line per micro-batch and data-parallel
    rank, written by tensor-parallel rank 0 of the first pipeline stage's first model chunk.
    """

    def __init__(self, objective: ObjectiveConfig, sample_log_dir: str | Path | None = None) -> None:
        self.objective = objective
        self.sample_log_dir = Path(sample_log_dir) if sample_log_dir else None
        # the sample ids of the current iteration's micro-batches on this rank, read from the host
        # batch: what a non-finite loss names (`nemo_topr.training.nonfinite`)
        self.iteration_sample_ids: list[int] = []
        self._ids_iteration: int | None = None

    def __call__(self, state: Any, data_iterator: Iterator, model: torch.nn.Module,
                 return_schedule_plan: bool = False):
        from megatron.core.utils import get_attr_wrapped_model

        config = get_attr_wrapped_model(model, "config")
        if config.context_parallel_size > 1:
            # topr_loss already reduces sequence tables over the CP group; what is missing is
            # splitting packed THD streams across CP ranks (segments padded to 2*CP).
            raise NotImplementedError("context_parallel_size > 1 is not supported by the TOPR step yet; "
                                      "use tensor/pipeline/data parallelism")
        host_batch = next(data_iterator)
        summary = check_batch(host_batch, self.objective)
        self._record_samples(state, host_batch, model)
        batch = to_device(with_thd_boundaries(host_batch, config))
        output = forward_packed(model, batch, config)

        def loss_func(per_token_ce: torch.Tensor):
            return topr_loss(per_token_ce.reshape(batch["loss_mask"].shape), batch, self.objective, summary)

        return output, loss_func

    def _record_samples(self, state: Any, batch: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
        """Remember and log the micro-batch's samples, once: the interleaved schedule gives every
        model chunk each micro-batch."""
        if is_first_model_chunk(model):
            self._remember_samples(state, batch)
            self._log_samples(state, batch)

    def _remember_samples(self, state: Any, batch: dict[str, torch.Tensor]) -> None:
        # state is None when the step runs outside Bridge's loop (forward-only checks, tests):
        # the ids then belong to one unnumbered iteration
        iteration = None if state is None else int(state.train_state.step)
        if iteration != self._ids_iteration:
            self.iteration_sample_ids, self._ids_iteration = [], iteration
        self.iteration_sample_ids += batch["sample_ids"].tolist()

    def _log_samples(self, state: Any, batch: dict[str, torch.Tensor]) -> None:
        if self.sample_log_dir is None:
            return
        from megatron.core import parallel_state

        if parallel_state.get_tensor_model_parallel_rank() or parallel_state.get_pipeline_model_parallel_rank():
            return
        ledger = self.sample_log_dir / f"samples_dp{parallel_state.get_data_parallel_rank()}.jsonl"
        with ledger.open("a") as log:
            log.write(json.dumps({"iteration": int(state.train_state.step),
                                  "sample_ids": batch["sample_ids"].tolist()}) + "\n")
