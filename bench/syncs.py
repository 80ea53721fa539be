"""Host-device synchronisations per micro-batch in the loss: TOPR's `topr_loss` against Bridge's
SFT loss (`megatron/bridge/training/losses.py:masked_next_token_loss`, through
`gpt_step._create_loss_function` with Bridge's default NaN/Inf check), counted the same way.

`torch.cuda.set_sync_debug_mode` needs CUDA (bench/gpu.py uses it there). On CPU,
`SyncCounter` (a `TorchFunctionMode`) counts every torch call made while it is active that, on a
CUDA tensor, makes the host wait for the device:

* reading values back: ``item``, ``tolist``, ``__bool__``/``__int__``/``__float__``/``__index__``
  (``if t:``, ``int(t)``, ...), ``numpy``, ``cpu``, ``equal``, ``allclose``, ``is_nonzero``;
* output sizes that depend on values: ``nonzero``/``argwhere``, ``masked_select``, ``unique``,
  ``repeat_interleave`` without ``output_size``, and indexing with a boolean mask;
* host-to-device copies of Python data: ``torch.tensor``/``as_tensor``/``new_tensor``.

It sees Python-level calls: the loss's forward, and the backward of autograd functions written
in Python. Backward kernels of built-in ops run in C++ and are not seen; neither loss indexes
with boolean masks (whose backward would sync), so none of theirs does.

The `flex_attention` entry counts what the FlexCoreAttention path adds per micro-batch (its block
mask and one attention forward + backward; target: none). ``python -m bench.syncs --out
bench/results/syncs.json`` writes the committed result;
``make bench`` runs it as its `syncs` section.
"""

from __future__ import annotations

import argparse
import json
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

_READS_BACK = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu,
               torch.Tensor.equal, torch.equal, torch.Tensor.allclose, torch.allclose,
               torch.Tensor.is_nonzero, torch.is_nonzero}
_VALUE_DEPENDENT_SIZE = {torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere,
                         torch.masked_select, torch.Tensor.masked_select, torch.unique, torch.Tensor.unique,
                         torch.unique_consecutive, torch.Tensor.unique_consecutive}
_FROM_PYTHON_DATA = {torch.tensor, torch.as_tensor, torch.Tensor.new_tensor}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put, torch.Tensor.index_put_}


def _has_boolean_mask(index) -> bool:  # noqa: ANN001
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts)


def _caller() -> str:
    """file:line of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("bench/syncs.py"):
            parts = frame.filename.split("/")
            return f"{'/'.join(parts[-3:])}:{frame.lineno}"
    return "?"


class SyncCounter(TorchFunctionMode):
    """Counts the calls that synchronise host and device on CUDA (module docstring), by kind and
    by the caller's file:line."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        kind = None
        if func in _READS_BACK or func in _VALUE_DEPENDENT_SIZE:
            kind = func.__name__
        elif func is torch.repeat_interleave or func is torch.Tensor.repeat_interleave:
            kind = None if "output_size" in kwargs else "repeat_interleave"
        elif func in _FROM_PYTHON_DATA:
            data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data"))
            kind = None if isinstance(data, torch.Tensor) else f"{func.__name__} (host-to-device copy)"
        elif func in _INDEXING and len(args) > 1 and _has_boolean_mask(args[1]):
            kind = f"{func.__name__} with a boolean mask"
        if kind is not None:
            self.calls[f"{kind} at {_caller()}"] += 1
        return func(*args, **kwargs)


def count_syncs(loss_call, microbatches: list) -> dict:  # noqa: ANN001
    """Run ``loss_call(mb)`` (forward + backward) for each micro-batch under one SyncCounter."""
    counter = SyncCounter()
    with counter:
        for microbatch in microbatches:
            loss_call(microbatch)
    return {"per_microbatch": counter.total / len(microbatches), "total": counter.total,
            "where": dict(sorted(counter.calls.items()))}


def sft_loss_call(microbatch) -> None:  # noqa: ANN001
    """Bridge's SFT loss as Bridge's gpt_step builds it (NaN/Inf check on, spiky-loss check off:
    RerunStateMachineConfig's defaults), forward + backward."""
    from megatron.bridge.training.gpt_step import _create_loss_function

    batch, ce, _ = microbatch
    ce = ce.clone().requires_grad_()
    loss, _, _ = _create_loss_function(batch["loss_mask"], check_for_nan_in_loss=True,
                                       check_for_spiky_loss=False)(ce)
    loss.backward()


def topr_loss_call(objective):  # noqa: ANN001
    """TOPR's loss as `ToprForwardStep` runs it: `check_batch` ran on the host before (not
    counted: the batch is still on the CPU there), then `topr_loss`, forward + backward."""
    from nemo_topr.training.step import topr_loss

    def call(microbatch) -> None:  # noqa: ANN001
        batch, ce, summary = microbatch
        ce = ce.clone().requires_grad_()
        loss, _, _ = topr_loss(ce, batch, objective, summary)
        loss.backward()

    return call


def nonfinite_check_call(iteration_loss) -> None:  # noqa: ANN001
    """The per-iteration non-finite check (`nemo_topr.training.nonfinite.check_finite`) on a loss
    reduced over an iteration's micro-batches, as Bridge's on_train_step_end hands it over."""
    from nemo_topr.training.nonfinite import check_finite

    check_finite(1, iteration_loss, 1.0, [0, 1])


def flex_attention_call():  # noqa: ANN201
    """What shared-prefix / FlexCoreAttention adds per micro-batch: `segment_block_mask` (built once
    per micro-batch in forward_packed) and one FlexCoreAttention forward + backward (4 heads, GQA 2;
    the module is built outside the count, as the model is)."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from nemo_topr.training.flex_attention import FlexCoreAttention, segment_block_mask

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               attention_dropout=0.0)
    attention = FlexCoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")

    def call(microbatch) -> None:  # noqa: ANN001
        batch = microbatch[0]
        length, rows = batch["tokens"].shape[1], batch["tokens"].shape[0]
        query = torch.randn(length, rows, 4, 16, requires_grad=True)
        key, value = torch.randn(length, rows, 2, 16), torch.randn(length, rows, 2, 16)
        attention(query, key, value, segment_block_mask(batch)).sum().backward()

    return call


def microbatches(objective, seq_length: int, rows: int, count: int) -> list:  # noqa: ANN001
    """Packed GSM8K micro-batches (bench.step's plan) with a random per-token CE [R, L]."""
    from bench.step import packed_microbatches
    from nemo_topr.training.step import check_batch

    generator = torch.Generator().manual_seed(0)
    return [(batch, 6 * torch.rand(batch["loss_mask"].shape, generator=generator), check_batch(batch, objective))
            for batch in packed_microbatches(seq_length, rows, count)]


def measure(seq_length: int = 512, rows: int = 2, count: int = 4) -> dict:
    from nemo_topr.model import cpu_runtime
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel
    from nemo_topr.objective import ObjectiveConfig

    cpu_runtime.import_bridge()
    results = {"method": "bench.syncs.SyncCounter (TorchFunctionMode), forward + backward of the loss alone",
               "microbatches": count, "seq_length": seq_length, "rows_per_microbatch": rows}
    batches = {}
    for variant in ("topr", "asymre"):
        objective = ObjectiveConfig(variant=variant)
        batches[variant] = microbatches(objective, seq_length, rows, count)
        results[variant] = count_syncs(topr_loss_call(objective), batches[variant])
    results["sft"] = count_syncs(sft_loss_call, batches["topr"])
    # once per iteration, whatever its number of micro-batches (nemo_topr/training/nonfinite.py)
    results["nonfinite_check_per_iteration"] = count_syncs(nonfinite_check_call, [torch.tensor(0.5)])["total"]
    initialize_model_parallel(1, 1)  # FlexCoreAttention reads the tensor-parallel size
    results["flex_attention"] = count_syncs(flex_attention_call(), batches["topr"])
    destroy_model_parallel()
    worst = max(results["topr"]["per_microbatch"], results["asymre"]["per_microbatch"])
    results["target"] = "TOPR <= SFT + 1 per micro-batch; FlexCoreAttention path adds none"
    results["met"] = worst <= results["sft"]["per_microbatch"] + 1 and results["flex_attention"]["total"] == 0
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from bench.common import environment

    env = environment()
    result = {**measure(args.seq_length, args.rows, args.microbatches),
              "environment": {key: env[key] for key in ("date_utc", "git_commit", "git_dirty_tracked_files", "torch",
                                                        "megatron_core", "megatron_bridge", "cuda_available")}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("topr", "asymre", "sft", "nonfinite_check_per_iteration",
                                             "flex_attention", "met")}, indent=2))


if __name__ == "__main__":
    main()
