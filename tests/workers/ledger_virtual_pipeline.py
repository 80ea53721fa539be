"""One TOPR training step at PP=2 with 2 virtual-pipeline chunks per rank, writing the ledger.

`record_ledger(OUT_DIR)`, run by topr_step_parallel.py's launch of 2 ranks as its layout "ledger".
As Bridge's training loop runs it: a 4-layer tiny Llama split into PP x VP = 4 chunks,
Megatron's interleaved schedule (`get_forward_backward_func`), one data iterator per model chunk
over the same micro-batches (Bridge's `make_data_iterator_list`, bridge/training/train.py:896-901),
and `ToprForwardStep` with a sample ledger in OUT_DIR. Every call of the step is also recorded
(pipeline rank, chunk, sample ids) in OUT_DIR/calls_pp{rank}.json, so the test can see that each
chunk really took every micro-batch, with the sample ids the step remembered for the iteration
(what a non-finite loss names).
"""

from __future__ import annotations

import json
import math
import os
import types

import torch

from topr_step_parallel import (MICROBATCH_LENGTHS, PAD_ID, ROWS_PER_MICROBATCH, SEQ_LENGTH, VOCAB, build_sequences,
                                initialize_world)


def record_ledger(out_dir: str) -> None:
    """The step, its ledger and its calls in OUT_DIR, in a world of 2 with no parallel state yet
    (the CPU runtime on)."""
    os.makedirs(out_dir, exist_ok=True)
    initialize_world(tp=1, pp=2, vp=2)
    from megatron.bridge.data.iterator_utils import make_data_iterator_list
    from megatron.bridge.training.utils.flop_utils import get_model_chunk_vp_stage
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nemo_topr.data.packing import collate_packed, pack_sequences
    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH, num_layers=4)
    provider.pipeline_model_parallel_size = 2
    provider.virtual_pipeline_model_parallel_size = 2
    provider.pipeline_dtype = torch.float32
    provider.calculate_per_token_loss = True
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    assert len(chunks) == 2 and [get_model_chunk_vp_stage(c) for c in chunks] == [0, 1]

    batches, first = [], 0
    for m, lengths in enumerate(MICROBATCH_LENGTHS):
        seqs = build_sequences(lengths, seed=100 + m, first_sample_id=first,
                               behavior={first + k: -3.0 * n for k, n in enumerate(lengths)})
        batches.append(collate_packed(seqs, pack_sequences(seqs, SEQ_LENGTH, PAD_ID), SEQ_LENGTH, PAD_ID))
        first += len(lengths)

    step = ToprForwardStep(ObjectiveConfig(), sample_log_dir=out_dir)
    state = types.SimpleNamespace(train_state=types.SimpleNamespace(step=5))
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    calls = []

    def forward_step(data_iterator, model):
        recording = types.SimpleNamespace(batch=None)

        def recorded():
            recording.batch = next(data_iterator)
            return recording.batch

        result = step(state, iter([recorded()]), model)
        calls.append({"pp": pp_rank, "chunk": get_model_chunk_vp_stage(model),
                      "sample_ids": recording.batch["sample_ids"].tolist()})
        return result

    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=make_data_iterator_list(model=chunks, data_iterator=iter(batches)),
        model=chunks,
        num_microbatches=len(batches),
        seq_length=SEQ_LENGTH,
        micro_batch_size=ROWS_PER_MICROBATCH,
        forward_only=False,
    )
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        assert len(losses) == len(batches) and all(math.isfinite(d["topr_loss"][0].item()) for d in losses)
    with open(os.path.join(out_dir, f"calls_pp{pp_rank}.json"), "w") as out:
        json.dump({"calls": calls, "expected_sample_ids": [b["sample_ids"].tolist() for b in batches],
                   "remembered_sample_ids": step.iteration_sample_ids}, out)
    torch.distributed.barrier()
