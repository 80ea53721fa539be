"""Sections 1 and 4: the TOPR training step against Bridge's SFT step, and forward-only
log-mu scoring against training, on the same Megatron model and packed GSM8K batches.

Every step goes through Megatron's own schedule (`get_forward_backward_func`) as Bridge's
``finetune()`` calls it (``calculate_per_token_loss=True``, no DDP wrapper, no optimizer), and
both sides of a ratio share the model, the batches and the forward (`forward_packed`: packed
rows, block-diagonal causal mask), so a ratio isolates what differs:

* step cost: TOPR's loss (`ToprForwardStep` -> `topr_loss` -> `policy_loss`) against Bridge's
  masked next-token loss (`megatron.bridge.training.gpt_step._create_loss_function`, i.e.
  `losses.masked_next_token_loss` with Bridge's default NaN check);
* scoring: `score-logprobs`' own forward step (`nemo_topr.training.scoring.scoring_forward_step`;
  eval mode, no_grad, forward_only) against the TOPR forward+backward.

Runs in-process (world of one) for TP=1, or under torchrun for TP>1 (`python -m bench.step`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
from pathlib import Path

import torch

from bench.common import gsm8k_sequences, interleaved, tiny_tokenizer

# name -> tiny_llama_provider shape, row length, rows per micro-batch, micro-batches per step
MODELS = {
    "tiny": dict(shape=dict(num_layers=2, hidden_size=64, ffn_hidden_size=172, num_attention_heads=4,
                            num_query_groups=2, vocab_size=512), seq_length=512, rows=2, microbatches=2),
    "small": dict(shape=dict(num_layers=4, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8,
                             num_query_groups=4, vocab_size=8192), seq_length=512, rows=1, microbatches=2),
}


def build_model(shape: dict, seq_length: int, tp: int = 1, flex: bool = False):
    """A Llama-shaped Megatron GPT (local spec, fp32) at tensor-parallel size `tp`; `flex`: its
    core attention is FlexCoreAttention (same weights: the same seed)."""
    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.training.flex_attention import use_flex_attention

    torch.manual_seed(1234)
    provider = tiny_llama_provider(seq_length=seq_length, **shape)
    if flex:
        use_flex_attention(provider)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = 1
    provider.pipeline_dtype = torch.float32
    provider.finalize()
    chunks = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    chunks[0].config.calculate_per_token_loss = True  # as nemo_topr/training/config.py sets it
    return chunks


def packed_microbatches(seq_length: int, rows: int, microbatches: int) -> list[dict[str, torch.Tensor]]:
    """The first `microbatches` batches of the project's shuffled packed plan (`PackedBatches`)
    of 400 GSM8K train sequences (tiny tokenizer): typical rows, not only the longest."""
    from nemo_topr.data.packing import PackedBatches
    from nemo_topr.data.tokenization import pad_id_of

    tokenizer = tiny_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        data = gsm8k_sequences(tokenizer, Path(tmp), limit=400, max_seq_length=seq_length)
    plan = PackedBatches(data.sequences, seq_length, rows, pad_id_of(tokenizer), shuffle=True, seed=0)
    return [plan[m] for m in range(microbatches)]


def sft_forward_step(data_iterator, model):
    """Bridge's SFT loss on the same forward: masked next-token CE summed over completion tokens."""
    from megatron.bridge.training.gpt_step import _create_loss_function
    from megatron.core.utils import get_attr_wrapped_model

    from nemo_topr.training.step import forward_packed, to_device, with_thd_boundaries

    config = get_attr_wrapped_model(model, "config")
    batch = to_device(with_thd_boundaries(next(data_iterator), config))  # as ToprForwardStep does
    output = forward_packed(model, batch, config)
    return output, _create_loss_function(batch["loss_mask"], check_for_nan_in_loss=True, check_for_spiky_loss=False)


def run_step(chunks, forward_step, batches, *, forward_only: bool = False) -> list:
    """One step through Megatron's schedule; returns what each micro-batch's loss reported."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.train(not forward_only)
    if not forward_only:
        for param in chunks[0].parameters():
            param.grad = None
    with torch.set_grad_enabled(not forward_only):
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches), model=chunks,
            num_microbatches=len(batches), seq_length=batches[0]["tokens"].shape[1],
            micro_batch_size=batches[0]["tokens"].shape[0], forward_only=forward_only)


def first_step_numbers(chunks, forward_step, batches) -> dict:
    """One TOPR step from the model as it is: its loss (the micro-batches' reported sums over
    their denominators, as Bridge reduces `topr_loss`) and the norm of the gradient it leaves.
    Two precisions built from the same seed are compared on these (bench/gpu.py)."""
    stored = run_step(chunks, forward_step, batches)
    loss_sum, denominator = torch.stack([out["topr_loss"].double().cpu() for out in stored]).sum(0).tolist()
    squares = sum(float(p.grad.double().pow(2).sum()) for chunk in chunks for p in chunk.parameters()
                  if p.grad is not None)
    return {"topr_loss": loss_sum / denominator, "grad_norm": squares ** 0.5}


def batch_shape(batches) -> dict:
    tokens = sum(b["tokens"].numel() for b in batches)
    used = sum(int((b["seq_index"] >= 0).sum()) for b in batches)
    return {"microbatches": len(batches), "rows_per_microbatch": batches[0]["tokens"].shape[0],
            "seq_length": batches[0]["tokens"].shape[1], "positions": tokens, "sequence_tokens": used,
            "sequences": sum(len(b["rewards"]) for b in batches),
            "completion_tokens": sum(int(b["loss_mask"].sum()) for b in batches)}


def loss_only(batches, chunks, reps: int) -> dict:
    """The two loss functions alone (forward + backward from a per-token CE tensor), many
    repetitions: the precise part of the step difference, since the model is shared."""
    from megatron.bridge.training.gpt_step import _create_loss_function

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, forward_packed, topr_loss

    config, objective = chunks[0].config, ObjectiveConfig()
    summaries = [check_batch(batch, objective) for batch in batches]
    with torch.no_grad():
        ces = [forward_packed(chunks[0], batch, config).detach() for batch in batches]

    def sft():
        for batch, ce in zip(batches, ces):
            ce = ce.clone().requires_grad_()
            loss, _, _ = _create_loss_function(batch["loss_mask"], True, False)(ce)
            loss.backward()

    def topr():
        for batch, summary, ce in zip(batches, summaries, ces):
            ce = ce.clone().requires_grad_()
            loss, _, _ = topr_loss(ce.reshape(batch["loss_mask"].shape), batch, objective, summary)
            loss.backward()

    return interleaved(sft, topr, reps, warmup=3)


def measure(name: str, reps: int, tp: int = 1, model_spec: dict | None = None) -> dict:
    """Both ratios for one model: TOPR step / SFT step, and scoring tokens/s / training tokens/s."""
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.scoring import scoring_forward_step
    from nemo_topr.training.step import ToprForwardStep

    spec = model_spec or MODELS[name]
    chunks = build_model(spec["shape"], spec["seq_length"], tp)
    batches = packed_microbatches(spec["seq_length"], spec["rows"], spec["microbatches"])
    topr = functools.partial(ToprForwardStep(ObjectiveConfig()), None)
    scores: dict = {}
    train_topr = functools.partial(run_step, chunks, topr, batches)
    train_sft = functools.partial(run_step, chunks, sft_forward_step, batches)
    score = functools.partial(run_step, chunks, scoring_forward_step(scores, chunks[0].config), batches,
                              forward_only=True)
    step_cost = interleaved(train_sft, train_topr, reps)
    control = interleaved(train_sft, train_sft, reps, warmup=0)  # A/A: the noise floor of a paired ratio
    losses = loss_only(batches, chunks, 20 * reps)
    scoring = interleaved(score, train_topr, reps)
    shape = batch_shape(batches)
    sft_step = step_cost["cpu"]["a"]["median"]
    loss_difference = losses["cpu"]["b_minus_a"]["median"]
    return {
        "model": name, "tp": tp, **spec["shape"],
        "parameters": sum(p.numel() for p in chunks[0].parameters()), "batch": shape,
        "step_cost": {**step_cost, "loss_only": losses, "sft_over_sft_control": control["cpu"]["ratio_b_over_a"],
                      "decomposed_ratio": 1.0 + loss_difference / sft_step},
        "scoring": {**scoring, "scoring_tokens_per_cpu_s": shape["positions"] / scoring["cpu"]["a"]["median"],
                    "training_tokens_per_cpu_s": shape["positions"] / scoring["cpu"]["b"]["median"],
                    "scored_sequences": len(scores)},
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.step --models tiny,small --out FILE`` (TP=1), or under
    ``torch.distributed.run --nproc_per_node=TP`` with ``--tp TP``; rank 0 writes FILE (a list)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--models", default="tiny", help="comma-separated names of MODELS")
    parser.add_argument("--model-spec", default=None, help="JSON spec used for every model instead of MODELS")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from nemo_topr.model.device import use_device
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel

    use_device("cpu", where="bench.step")  # a CPU benchmark, by choice
    initialize_model_parallel(args.tp, 1)
    spec = json.loads(args.model_spec) if args.model_spec else None
    results = [measure(name, args.reps, args.tp, spec) for name in args.models.split(",")]
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps(results))
    destroy_model_parallel()


if __name__ == "__main__":
    main()
