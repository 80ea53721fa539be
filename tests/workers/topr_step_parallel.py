"""One TOPR training step (forward + backward, no optimizer) of a tiny Llama at a given layout.

    torchrun --nproc_per_node=TP*PP topr_step_parallel.py MODE TP PP CKPT_DIR OUT_DIR

MODE=save (TP=PP=1 only) initialises the model, saves it as a Megatron distributed checkpoint in
CKPT_DIR/weights and fixes the behaviour log-probs of the batch in CKPT_DIR/behavior.pt: the
sequence log-prob under this very model plus per-sequence offsets, so that log rho = -offset at
these weights (some negatives above 0, i.e. truncated to weight 1; some below, weight rho < 1).
MODE=load loads both, resharded by Megatron to the TP/PP layout (fused QKV and SwiGLU fc1 are
handled by Megatron's sharded state dict, which naive chunking would not).

Both modes then run Megatron's own schedule (`get_forward_backward_func`: no pipelining for
PP=1, 1F1B over gloo p2p for PP=2) over several packed micro-batches with the project's
`ToprForwardStep`, exactly as Bridge's ``finetune()`` calls it (``calculate_per_token_loss=True``,
no DDP, so each parameter's ``.grad`` is d(sum of micro-batch loss sums)/d theta).

Outputs, layout-independent:
  OUT_DIR/result.pt  (written by the last pipeline stage, TP rank 0): per-micro-batch
                     [loss_sum, denominator] pairs and metric pairs, the total loss
                     sum(loss_sum) / sum(denominator), and what the layout really split.
  OUT_DIR/grads/     a Megatron distributed checkpoint of the *gradients* (each .grad copied
                     into its parameter before saving), so any layout's gradients load as
                     global tensors (`dist_checkpointing.load_plain_tensors`).
"""

from __future__ import annotations

import functools
import math
import os
import sys

import torch

VOCAB = 512
SEQ_LENGTH = 128  # row length of the packed batches = the model's seq_length
PAD_ID = 0
ROWS_PER_MICROBATCH = 2  # micro_batch_size for the pipeline schedule (constant p2p shapes)
# Sequence lengths per micro-batch; each list packs (best-fit decreasing) into exactly 2 rows of
# 128 with some padding left, one row holding a single sequence and others holding up to 4.
MICROBATCH_LENGTHS = ([60, 50, 40, 30, 20, 16], [70, 45, 33, 28, 19, 12, 9], [100, 64, 40, 21])
# log mu - log pi(theta_0) per sequence: log rho at the saved weights is minus this.
OFFSETS = (-0.5, 0.5, 2.0, -1.0, 0.25)


def build_sequences(lengths, *, seed: int, first_sample_id: int = 0, behavior=None):
    """Deterministic TokenizedSequences: random ids, a 2-5 token prompt, +-1 rewards (mixed),
    prompt ids shared by pairs. `behavior` maps sample_id -> log mu (NaN when absent)."""
    from nemo_topr.data.packing import TokenizedSequence

    generator = torch.Generator().manual_seed(seed)
    seqs = []
    for k, n in enumerate(lengths):
        sample_id = first_sample_id + k
        n_prompt = 2 + sample_id % 4
        ids = torch.randint(1, VOCAB, (n,), generator=generator).tolist()
        seqs.append(TokenizedSequence(
            input_ids=ids,
            loss_mask=[0] * n_prompt + [1] * (n - n_prompt),
            reward=1.0 if sample_id % 3 else -1.0,  # two positives for each negative: the loss
            # does not nearly cancel, so its relative difference measures the step, not cancellation
            behavior_logprob=math.nan if behavior is None else float(behavior[sample_id]),
            prompt_id=sample_id // 2,
            sample_id=sample_id,
        ))
    return seqs


def build_microbatches(behavior=None):
    """The step's micro-batches: each list of MICROBATCH_LENGTHS packed into 2 rows."""
    from nemo_topr.data.packing import collate_packed, pack_sequences

    batches, first = [], 0
    for m, lengths in enumerate(MICROBATCH_LENGTHS):
        seqs = build_sequences(lengths, seed=100 + m, first_sample_id=first, behavior=behavior)
        rows = pack_sequences(seqs, SEQ_LENGTH, PAD_ID)
        assert len(rows) == ROWS_PER_MICROBATCH, rows
        batches.append(collate_packed(seqs, rows, SEQ_LENGTH, PAD_ID))
        first += len(lengths)
    return batches


def sequence_logprobs(model, batch) -> torch.Tensor:
    """sum_t m_t log pi_t per sequence (seq_index order), through the project's step code."""
    from nemo_topr.training.step import forward_packed, sequence_table

    with torch.no_grad():
        ce = forward_packed(model, batch, model.config).reshape(batch["loss_mask"].shape)
        table = sequence_table(-ce * batch["loss_mask"], batch, int(batch["seq_len"].max()))
    return table.sum(-1)


def main(mode: str, tp: int, pp: int, ckpt_dir: str, out_dir: str) -> None:
    from nemo_topr import cpu_runtime
    from nemo_topr.distributed import destroy_model_parallel, initialize_model_parallel

    cpu_runtime.enable_cpu_runtime()
    initialize_model_parallel(tensor_parallel=tp, pipeline_parallel=pp)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nemo_topr.model import tiny_llama_provider
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    assert torch.distributed.get_world_size() == tp * pp, "data parallelism is not part of this check"
    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = pp
    provider.pipeline_dtype = torch.float32
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    assert len(chunks) == 1, "no virtual pipeline stages here"
    model = chunks[0]
    config = model.config
    config.calculate_per_token_loss = True  # as the recipe sets it (nemo_topr/training/config.py)
    assert config.finalize_model_grads_func is None  # .grad = sum over micro-batches of d loss_sum

    weights_dir = os.path.join(ckpt_dir, "weights")
    behavior_file = os.path.join(ckpt_dir, "behavior.pt")
    if mode == "save":
        assert tp == 1 and pp == 1, "the reference weights come from the TP=1, PP=1 run"
        os.makedirs(weights_dir, exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), weights_dir)
        behavior = {}
        for batch in build_microbatches():
            scores = sequence_logprobs(model, batch)
            for sample_id, score in zip(batch["sample_ids"].tolist(), scores.tolist()):
                behavior[sample_id] = score + OFFSETS[sample_id % len(OFFSETS)]
        torch.save(behavior, behavior_file)
    else:
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), weights_dir))
        behavior = torch.load(behavior_file)
    batches = build_microbatches(behavior)

    for param in model.parameters():
        param.grad = None
    step = ToprForwardStep(ObjectiveConfig())  # sample_log_dir=None: the step never reads `state`
    losses = get_forward_backward_func()(
        forward_step_func=functools.partial(step, None),
        data_iterator=iter(batches),
        model=chunks,
        num_microbatches=len(batches),
        seq_length=SEQ_LENGTH,
        micro_batch_size=ROWS_PER_MICROBATCH,
        forward_only=False,
    )

    # Parameters replicated over TP ranks (norm weights) must get identical gradients on every
    # rank: without sequence parallelism nothing all-reduces them later.
    replica_diff = torch.zeros(())
    tp_group = parallel_state.get_tensor_model_parallel_group()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        if tp > 1 and not getattr(param, "tensor_model_parallel", False):
            first = param.grad.clone()
            torch.distributed.broadcast(first, parallel_state.get_tensor_model_parallel_src_rank(), group=tp_group)
            replica_diff = torch.maximum(replica_diff, (param.grad - first).abs().max())
    torch.distributed.all_reduce(replica_diff, op=torch.distributed.ReduceOp.MAX)

    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.grad)
    grads_dir = os.path.join(out_dir, "grads")
    os.makedirs(grads_dir, exist_ok=True)
    dist_checkpointing.save(model.sharded_state_dict(), grads_dir)

    if parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0:
        assert len(losses) == len(batches)
        pairs = torch.stack([d["topr_loss"] for d in losses]).double()
        metrics = {name: torch.stack([d[name] for d in losses]).double().sum(0)
                   for name in losses[0] if name != "topr_loss"}
        torch.save({
            "tp": tp, "pp": pp,
            "loss_pairs": pairs,
            "total_loss": (pairs[:, 0].sum() / pairs[:, 1].sum()).item(),
            "metrics": metrics,
            "output_rows": model.output_layer.weight.shape[0],
            "local_layers": len(model.decoder.layers),
            "replica_grad_max_abs_diff": replica_diff.item(),
            "num_sequences": sum(len(b["rewards"]) for b in batches),
            "num_rows": sum(b["tokens"].shape[0] for b in batches),
        }, os.path.join(out_dir, "result.pt"))
    torch.distributed.barrier()
    destroy_model_parallel()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
