"""One TOPR training step (forward + backward, no optimizer) of a tiny Llama at each of several layouts.

    torchrun --nproc_per_node=WORLD topr_step_parallel.py ROOT LAYOUT [LAYOUT ...]

Every LAYOUT (a name of LAYOUTS, whose TP x PP x DP is WORLD, or "ledger") runs in turn in the
same process group: Megatron's parallel state is initialised for it and destroyed after it, so
one launch (one start-up and Megatron import per rank) checks every layout of its world size.
The launch prints "layout NAME" before each, so a failure names the layout it happened in.
A layout of LAYERS layers loads ROOT/ckpt{LAYERS} and writes ROOT/NAME; "ledger" runs
ledger_virtual_pipeline.record_ledger into ROOT/ledger. ROOT/NAME/done marks a finished layout.

`take_step` with MODE=save (TP=PP=DP=1 only; the test runs it in its own world of one)
initialises the model, saves it as a Megatron distributed checkpoint in CKPT_DIR/weights and
fixes the behaviour log-probs of the batch in CKPT_DIR/behavior.pt: the sequence log-prob under
this very model plus per-sequence offsets, so that log rho = -offset at these weights (some
negatives above 0, i.e. truncated to weight 1; some below, weight rho < 1). MODE=load loads
both, resharded by Megatron to the TP/PP layout (fused QKV and SwiGLU fc1 are handled by
Megatron's sharded state dict, which naive chunking would not).

SP: sequence parallelism (needs TP > 1; the CPU runtime emulates its collectives).
VP: model chunks per pipeline rank (VP > 1 runs Megatron's interleaved schedule with one data
iterator per chunk, as Bridge's training loop does); PP x VP must divide LAYERS.

Both modes then run Megatron's own schedule (`get_forward_backward_func`: no pipelining for
PP=1, 1F1B over gloo p2p for PP=2, interleaved with VP > 1) over the global batch of packed micro-batches with the
project's `ToprForwardStep`, as Bridge's ``finetune()`` runs a step: the model wrapped in
Megatron's DistributedDataParallel (no overlap, average_in_collective=False, as
nemo_topr/training/config.py sets it), ``calculate_per_token_loss=True`` and
``finalize_model_grads`` as the schedule's finalize function. So after the step each
``main_grad`` is d(global-batch loss)/d theta: summed over micro-batches and DP ranks, sequence-
parallel norm gradients summed over TP, divided by the global denominator. DP rank r runs
micro-batches r, r + DP, ... of the global batch (any split of the same set is the same batch).

Outputs, layout-independent:
  OUT_DIR/grads/     a Megatron distributed checkpoint of the *gradients* (each main_grad copied
                     into its parameter before saving), so any layout's gradients load as
                     global tensors (`dist_checkpointing.load_plain_tensors`).
  OUT_DIR/result.pt  (written last, by the last pipeline stage, TP rank 0, DP rank 0): per-micro-batch
                     [loss_sum, denominator] pairs (gathered over DP, in global order) and metric
                     pairs summed over micro-batches and all-reduced over DP as Bridge's training
                     loop reduces them, the total loss sum(loss_sum) / sum(denominator), the
                     sequence log-probs of every micro-batch before the step, and what the layout
                     really split.
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
# Sequence lengths per micro-batch (the global batch: 4 micro-batches, 2 per DP rank at DP=2);
# each list packs (best-fit decreasing) into exactly 2 rows of 128 with some padding left, one
# row holding a single sequence and others holding up to 4.
MICROBATCH_LENGTHS = ([60, 50, 40, 30, 20, 16], [70, 45, 33, 28, 19, 12, 9], [100, 64, 40, 21],
                      [80, 48, 36, 30, 22])
# log mu - log pi(theta_0) per sequence: log rho at the saved weights is minus this.
OFFSETS = (-0.5, 0.5, 2.0, -1.0, 0.25)
LAYOUTS = {  # name -> (TP, PP, DP, sequence parallel, VP, layers)
    "tp2": (2, 1, 1, False, 1, 2),
    "pp2": (1, 2, 1, False, 1, 2),
    "dp2": (1, 1, 2, False, 1, 2),
    "tp2_sp": (2, 1, 1, True, 1, 2),
    "dp2_tp2_sp": (2, 1, 2, True, 1, 2),
    "tp2_pp2_sp": (2, 2, 1, True, 1, 2),  # the presets' kind of layout (70B: TP=8 x PP=4 with SP)
    # the 70B preset's interleaved kind (conf/llama31_70b_bf16.yaml: PP=4, VP=5): one layer per chunk
    "pp2_vp2": (1, 2, 1, False, 2, 4),
}


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


def check_emulated_collectives(tp_group) -> None:  # noqa: ANN001
    """The CPU runtime's all-gather-into-tensor and reduce-scatter against hand-computed values
    (Megatron calls them through these module attributes under sequence parallelism)."""
    from megatron.core.tensor_parallel import mappings

    rank, size = torch.distributed.get_rank(tp_group), torch.distributed.get_world_size(tp_group)
    mine = torch.arange(6.0).reshape(3, 2) + 100 * rank  # rank k holds 100k + [[0, 1], [2, 3], [4, 5]]
    gathered = torch.empty(3 * size, 2)
    mappings.dist_all_gather_func(gathered, mine, group=tp_group)
    assert torch.equal(gathered, torch.cat([torch.arange(6.0).reshape(3, 2) + 100 * k for k in range(size)]))
    full = torch.arange(4.0 * size).reshape(2 * size, 2) * (rank + 1)  # sum over ranks: x * size(size+1)/2
    scattered = torch.empty(2, 2)
    mappings.dist_reduce_scatter_func(scattered, full, group=tp_group)
    expected = torch.arange(4.0 * size).reshape(2 * size, 2)[2 * rank:2 * rank + 2] * size * (size + 1) / 2
    assert torch.equal(scattered, expected)


def initialize_world(tp: int, pp: int, vp: int = 1) -> None:
    """The process groups of this torchrun world: the project's (`initialize_model_parallel`, as
    scoring makes them), or with VP > 1 parallel_state's own with that virtual pipeline size, from
    which Megatron chooses the interleaved schedule (as Bridge initialises it)."""
    from nemo_topr.utils.distributed import initialize_model_parallel

    if vp == 1:
        initialize_model_parallel(tensor_parallel=tp, pipeline_parallel=pp)
        return
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             virtual_pipeline_model_parallel_size=vp, create_gloo_process_groups=True)


def take_step(mode: str, tp: int, pp: int, dp: int, sp: bool, vp: int, layers: int, ckpt_dir: str,
              out_dir: str) -> None:
    """One layout's step (see the module's docstring), in a world whose parallel state is
    `initialize_world(tp, pp, vp)`'s (made here unless some already is)."""
    initialize_world(tp, pp, vp)
    from megatron.bridge.data.iterator_utils import make_data_iterator_list
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.config import choose_pipeline_p2p
    from nemo_topr.training.step import ToprForwardStep

    assert torch.distributed.get_world_size() == tp * pp * dp
    assert parallel_state.get_data_parallel_world_size() == dp
    tp_group = parallel_state.get_tensor_model_parallel_group()
    if sp:
        check_emulated_collectives(tp_group)
    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH, num_layers=layers)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = pp
    provider.virtual_pipeline_model_parallel_size = vp if vp > 1 else None
    choose_pipeline_p2p(provider, set())  # the p2p mode `nemo-topr train` gives this layout
    provider.sequence_parallel = sp
    provider.pipeline_dtype = torch.float32
    # before wrapping, as the recipe sets it (nemo_topr/training/config.py): DDP reads it to
    # decide whether to divide gradients by the DP size (distributed_data_parallel.py)
    provider.calculate_per_token_loss = True
    provider.finalize()
    # as nemo_topr/training/config.py configures DDP on CPU (per-token loss: no averaging in the collective)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False, average_in_collective=False)
    chunks = provider.provide_distributed_model(ddp_config=ddp_config, wrap_with_ddp=True,
                                                use_cpu_initialization=True)
    assert len(chunks) == vp
    modules = [chunk.module for chunk in chunks]
    model = modules[-1]  # the one with the output layer on the last pipeline stage
    config = model.config
    config.finalize_model_grads_func = finalize_model_grads  # as Bridge's setup does
    assert config.sequence_parallel == sp
    # every chunk's tensors under its own key (as Megatron-LM's checkpoints hold model0, model1, ...);
    # the tensors inside carry their global names and layer offsets
    def sharded_state_dict():
        return {f"model{k}": module.sharded_state_dict() for k, module in enumerate(modules)}

    weights_dir = os.path.join(ckpt_dir, "weights")
    behavior_file = os.path.join(ckpt_dir, "behavior.pt")
    if mode == "save":
        assert tp == pp == dp == 1, "the reference weights come from the TP=PP=DP=1 run"
        os.makedirs(weights_dir, exist_ok=True)
        dist_checkpointing.save(sharded_state_dict(), weights_dir)
        behavior = {}
        for batch in build_microbatches():
            scores = sequence_logprobs(model, batch)
            for sample_id, score in zip(batch["sample_ids"].tolist(), scores.tolist()):
                behavior[sample_id] = score + OFFSETS[sample_id % len(OFFSETS)]
        torch.save(behavior, behavior_file)
    else:
        loaded = dist_checkpointing.load(sharded_state_dict(), weights_dir)
        for k, module in enumerate(modules):
            module.load_state_dict(loaded[f"model{k}"])
        behavior = torch.load(behavior_file)
    global_batch = build_microbatches(behavior)
    # log pi of every sequence before the step, through the project's step code (all layouts)
    logprobs = torch.cat([sequence_logprobs(model, batch) for batch in global_batch]) if pp == 1 else None

    dp_rank = parallel_state.get_data_parallel_rank()
    mine = list(range(dp_rank, len(global_batch), dp))
    batches = [global_batch[m] for m in mine]
    for chunk in chunks:
        chunk.zero_grad_buffer()
    step = ToprForwardStep(ObjectiveConfig())  # sample_log_dir=None: the step never reads `state`
    losses = get_forward_backward_func()(
        forward_step_func=functools.partial(step, None),
        # one iterator over the same micro-batches per chunk (bridge/training/train.py)
        data_iterator=make_data_iterator_list(model=chunks, data_iterator=iter(batches)),
        model=chunks,
        num_microbatches=len(batches),
        seq_length=SEQ_LENGTH,
        micro_batch_size=ROWS_PER_MICROBATCH,
        forward_only=False,
    )

    # Parameters replicated over TP ranks (norm weights) must end with identical gradients on
    # every rank: computed redundantly without SP, summed over TP by finalize_model_grads with SP.
    replica_diff = torch.zeros(())
    for name, param in (item for module in modules for item in module.named_parameters()):
        assert param.main_grad.abs().sum() > 0, f"{name} got no gradient"
        if tp > 1 and not getattr(param, "tensor_model_parallel", False):
            assert getattr(param, "sequence_parallel", False) == sp, name
            first = param.main_grad.clone()
            torch.distributed.broadcast(first, parallel_state.get_tensor_model_parallel_src_rank(), group=tp_group)
            replica_diff = torch.maximum(replica_diff, (param.main_grad - first).abs().max())
    torch.distributed.all_reduce(replica_diff, op=torch.distributed.ReduceOp.MAX)

    with torch.no_grad():
        for param in (param for module in modules for param in module.parameters()):
            param.copy_(param.main_grad)
    grads_dir = os.path.join(out_dir, "grads")
    os.makedirs(grads_dir, exist_ok=True)
    dist_checkpointing.save(sharded_state_dict(), grads_dir)

    if parallel_state.is_pipeline_last_stage():
        assert len(losses) == len(batches)
        dp_group = parallel_state.get_data_parallel_group()
        local_pairs = {m: d["topr_loss"].double() for m, d in zip(mine, losses)}
        gathered = [None] * dp
        torch.distributed.all_gather_object(gathered, local_pairs, group=dp_group)
        by_microbatch = {m: pair for part in gathered for m, pair in part.items()}
        pairs = torch.stack([by_microbatch[m] for m in range(len(global_batch))])
        # Bridge sums each [numerator, count] pair over micro-batches, then all-reduces it over DP
        metrics = {name: torch.stack([d[name] for d in losses]).double().sum(0)
                   for name in losses[0] if name != "topr_loss"}
        for pair in metrics.values():
            torch.distributed.all_reduce(pair, group=dp_group)
        if parallel_state.get_tensor_model_parallel_rank() == 0 and dp_rank == 0:
            torch.save({
                "tp": tp, "pp": pp, "dp": dp, "sp": sp, "vp": vp,
                "loss_pairs": pairs,
                "total_loss": (pairs[:, 0].sum() / pairs[:, 1].sum()).item(),
                "metrics": metrics,
                "logprobs": logprobs,
                "output_rows": model.output_layer.weight.shape[0],
                "local_layers": sum(len(module.decoder.layers) for module in modules),
                "replica_grad_max_abs_diff": replica_diff.item(),
                "microbatches_per_dp_rank": len(batches),
                "num_sequences": sum(len(b["rewards"]) for b in global_batch),
                "num_rows": sum(b["tokens"].shape[0] for b in global_batch),
            }, os.path.join(out_dir, "result.pt"))
    torch.distributed.barrier()


def main(root: str, names: list[str]) -> None:
    from megatron.core import parallel_state

    from nemo_topr.model import cpu_runtime

    cpu_runtime.enable_cpu_runtime()
    for name in names:
        print(f"[topr_step_parallel] layout {name}", flush=True)
        out_dir = os.path.join(root, name)
        if name == "ledger":
            from ledger_virtual_pipeline import record_ledger

            record_ledger(out_dir)
        else:
            tp, pp, dp, sp, vp, layers = LAYOUTS[name]
            take_step("load", tp, pp, dp, sp, vp, layers, os.path.join(root, f"ckpt{layers}"), out_dir)
        parallel_state.destroy_model_parallel()
        if torch.distributed.get_rank() == 0:  # every rank has finished the layout (its closing barrier)
            open(os.path.join(out_dir, "done"), "w").close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
