"""One TOPR step and one mu-scoring pass of a tiny Llama, unshared and shared-prefix, at several layouts.

    torchrun --nproc_per_node=2 shared_prefix_step.py ROOT CASE [CASE ...]

Each CASE, LAYOUT-ATTENTION (a LAYOUTS name: tp1, tp2 or pp2; then local or flex), runs in turn in
the same process group: Megatron's parallel state is initialised for its TP and PP and destroyed
after it, so one launch checks them all. In the world of two, tp1 is TP=PP=1 with 2 data-parallel
ranks that each take the whole batch (no DDP: nothing crosses them); DP rank 0's results are
kept. The launch prints "case CASE" before each; ROOT/CASE/done marks a finished one.

`flex`: the layers' core attention is FlexCoreAttention (block mask) instead of Megatron's local
attention (dense boolean mask); TP > 1 then also runs with sequence parallelism.

The same weights (seeded) and the same sequences go through Megatron's own schedule
(`get_forward_backward_func`, 1F1B over gloo p2p for PP=2) twice: packed as today
(`pack_sequences` + `collate_packed`) and in the shared-prefix layout (`pack_shared` +
`collate_shared`). Both runs use the project's `ToprForwardStep` (training) and
`scoring_forward_step` (score-logprobs' forward, eval mode): only the layout differs.

Outputs (ROOT/CASE), from the ranks of DP rank 0:
  rank{R}.pt    {parameter name: (gradient unshared, gradient shared)} of rank R's own shard,
                d(sum of loss_sum over micro-batches)/d theta (no DDP: the raw schedule gradients).
  result.pt     last pipeline stage, TP rank 0: per-sample log pi of both layouts (scoring),
                the two losses (sum loss_sum / sum denominator), and the shared plan's rows.
"""

from __future__ import annotations

import functools
import math
import os
import sys

import torch

VOCAB = 512
SEQ_LENGTH = 128
PAD_ID = 0
ROWS_PER_MICROBATCH = 2
# (prompt length, completion lengths incl. EOS) per prompt group. With SEQ_LENGTH 128 the shared
# plan (asserted by the test) splits group 0 across rows (its block would take 129 positions),
# keeps group 1's single completion in today's layout, fills one row to its last position with a
# completion, and mixes blocks of 1 to 6 completions in one batch.
GROUPS = ((40, (20, 18, 15, 12, 10, 9)), (10, (33,)), (25, (8, 6, 5)), (12, (30, 25, 20, 14)),
          (30, (20, 17)), (6, (12, 7, 5, 4, 1)))
# log mu - log pi(theta_0) per sequence: log rho = minus this (negatives on both sides of 0)
OFFSETS = (-0.5, 0.5, 2.0, -1.0, 0.25)
LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}  # name -> (TP, PP)


def build_sequences():
    """Random prompts shared within each group, random completions, mixed +-1 rewards."""
    from nemo_topr.data.packing import TokenizedSequence, set_group_mean_rewards

    generator = torch.Generator().manual_seed(7)
    seqs = []
    for prompt_id, (prompt_length, completions) in enumerate(GROUPS):
        prompt = torch.randint(1, VOCAB, (prompt_length,), generator=generator).tolist()
        for n in completions:
            sample_id = len(seqs)
            seqs.append(TokenizedSequence(
                input_ids=prompt + torch.randint(1, VOCAB, (n,), generator=generator).tolist(),
                loss_mask=[0] * prompt_length + [1] * n, reward=1.0 if sample_id % 3 else -1.0,
                behavior_logprob=math.nan, prompt_id=prompt_id, sample_id=sample_id))
    set_group_mean_rewards(seqs)
    return seqs


def microbatches(seqs, shared: bool):
    """All sequences as micro-batches of ROWS_PER_MICROBATCH rows (the last completed with filler)."""
    from nemo_topr.data.packing import collate_packed, pack_sequences
    from nemo_topr.data.shared_prefix import collate_shared, pack_shared

    rows = pack_shared(seqs, SEQ_LENGTH) if shared else pack_sequences(seqs, SEQ_LENGTH, PAD_ID)
    rows = rows + [[] for _ in range(-len(rows) % ROWS_PER_MICROBATCH)]
    collate = collate_shared if shared else collate_packed
    return rows, [collate(seqs, rows[i:i + ROWS_PER_MICROBATCH], SEQ_LENGTH, PAD_ID)
                  for i in range(0, len(rows), ROWS_PER_MICROBATCH)]


def run(chunks, forward_step, batches, forward_only: bool):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.train(not forward_only)
    with torch.set_grad_enabled(not forward_only):
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches), model=chunks,
            num_microbatches=len(batches), seq_length=SEQ_LENGTH, micro_batch_size=ROWS_PER_MICROBATCH,
            forward_only=forward_only)


def score(chunks, batches) -> dict[int, float]:
    from nemo_topr.training.scoring import scoring_forward_step

    scores: dict[int, float] = {}
    run(chunks, scoring_forward_step(scores, chunks[0].config), batches, forward_only=True)
    return scores


def train_step(chunks, batches):
    """(gradients by name, total loss) of one TOPR step over `batches`."""
    from megatron.core import parallel_state

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    for param in chunks[0].parameters():
        param.grad = None
    losses = run(chunks, functools.partial(ToprForwardStep(ObjectiveConfig()), None), batches, forward_only=False)
    for param in chunks[0].parameters():
        if getattr(param, "sequence_parallel", False):
            # each TP rank holds the gradient of its share of the positions (what Megatron's
            # finalize_model_grads sums over TP under sequence parallelism)
            torch.distributed.all_reduce(param.grad, group=parallel_state.get_tensor_model_parallel_group())
    grads = {name: param.grad.clone() for name, param in chunks[0].named_parameters()}
    total = None
    if parallel_state.is_pipeline_last_stage():
        pairs = torch.stack([d["topr_loss"].double() for d in losses])
        total = (pairs[:, 0].sum() / pairs[:, 1].sum()).item()
    return grads, total


def run_case(tp: int, pp: int, out_dir: str, flex: bool) -> None:
    """Both layouts' scores and steps at TP x PP, written to OUT_DIR (see the module's docstring)."""
    from megatron.core import parallel_state

    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.utils.distributed import initialize_model_parallel

    initialize_model_parallel(tensor_parallel=tp, pipeline_parallel=pp)
    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = pp
    provider.pipeline_dtype = torch.float32
    provider.calculate_per_token_loss = True
    if flex:
        from nemo_topr.training.flex_attention import use_flex_attention

        use_flex_attention(provider)
        provider.sequence_parallel = tp > 1
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)

    seqs = build_sequences()
    _, unshared = microbatches(seqs, shared=False)
    shared_rows, shared = microbatches(seqs, shared=True)
    logprobs = {"unshared": score(chunks, unshared), "shared": score(chunks, shared)}

    # behaviour log-probs from the unshared scores (broadcast from the last stage to all ranks)
    mu = [logprobs["unshared"]]
    torch.distributed.broadcast_object_list(mu, src=torch.distributed.get_world_size() - 1)
    for seq in seqs:
        seq.behavior_logprob = mu[0][seq.sample_id] + OFFSETS[seq.sample_id % len(OFFSETS)]
    _, unshared = microbatches(seqs, shared=False)
    _, shared = microbatches(seqs, shared=True)
    grads_unshared, loss_unshared = train_step(chunks, unshared)
    grads_shared, loss_shared = train_step(chunks, shared)

    if parallel_state.get_data_parallel_rank() == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save({name: (grads_unshared[name], grads_shared[name]) for name in grads_unshared},
                   os.path.join(out_dir, f"rank{torch.distributed.get_rank()}.pt"))
        if parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0:
            torch.save({"tp": tp, "pp": pp, "logprobs": logprobs, "loss_unshared": loss_unshared,
                        "loss_shared": loss_shared, "shared_rows": shared_rows,
                        "unshared_rows": sum(b["tokens"].shape[0] for b in unshared)},
                       os.path.join(out_dir, "result.pt"))
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()


def main(root: str, cases: list[str]) -> None:
    from nemo_topr.model import cpu_runtime

    cpu_runtime.enable_cpu_runtime()
    for case in cases:
        print(f"[shared_prefix_step] case {case}", flush=True)
        layout, attention = case.split("-")
        out_dir = os.path.join(root, case)
        run_case(*LAYOUTS[layout], out_dir, flex=attention == "flex")
        if torch.distributed.get_rank() == 0:  # every rank has finished the case (its closing barrier)
            open(os.path.join(out_dir, "done"), "w").close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
