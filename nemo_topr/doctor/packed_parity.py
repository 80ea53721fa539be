"""`nemo-topr doctor`'s packed-attention parity check (CUDA and Transformer Engine only).

The same weights through Transformer Engine layers (rows as one THD stream with cu_seqlens) and
through Megatron's local layers (rows with the dense block mask) must give the same per-token
cross-entropy, the same per-sequence log pi and the same TOPR gradients on packed rows: if TE
dropped the boundaries, its tokens would attend across sequences and the two would disagree. The
batch has positives and negatives, two negatives' ratios below 1 and one truncated at 1, so the
gradient goes through both of TOPR's weights. Run in its own process by the doctor; prints
its result line.

On an H200 with TE 2.17.1 (2026-11-26, bench/results/gpu_verbs_h200_2026-11-26_f0673b4_te.json)
the per-token comparison passed: max |CE difference| 2.01e-03 on 235 packed tokens. The
per-sequence log pi and gradient comparisons came after it; they passed on the same H200 with TE's
unfused attention (bench/results/gpu_parity_h200_2026-11-26_5e86852_unfused.json) and have not run
through TE's cuDNN fused attention, the default.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from nemo_topr.utils.arguments import Parser

SEQ_LENGTH = 128
LENGTHS = ([40, 30, 50], [70, 45])  # two rows, each with several sequences and a padding tail
REWARDS = (1.0, -1.0, 1.0, -1.0, -1.0)  # in the order of LENGTHS, flattened
# log mu - log pi of each sequence: the negatives' ratios are e^0.5 (truncated to 1) and e^-0.5 twice
BEHAVIOR_OFFSETS = (0.0, -0.5, 0.0, 0.5, 0.5)
# BF16 bounds, calibrated on CPU (local layers in BF16 against the same weights in fp32, TOPR batch
# above; TE against local compares two BF16 runs): cross-entropy per token, log pi per sequence
# (exp(0.1): rho within 11 %), gradient relative, ||g_te - g_local|| / ||g_local|| over all weights
BOUNDS = {"per-token CE": 0.05, "per-sequence log pi": 0.1, "TOPR gradient": 0.05}


def _packed_batch():
    from nemo_topr.data.packing import TokenizedSequence, collate_packed

    generator = torch.Generator().manual_seed(0)
    seqs, rows = [], []
    for row_lengths in LENGTHS:
        rows.append([])
        for n in row_lengths:
            ids = torch.randint(1, 500, (n,), generator=generator).tolist()
            rows[-1].append(len(seqs))
            seqs.append(TokenizedSequence(ids, [0] * 5 + [1] * (n - 5), REWARDS[len(seqs)], 0.0, len(seqs),
                                          len(seqs)))
    return collate_packed(seqs, rows, SEQ_LENGTH, 0)


def _build(transformer_impl: str, attention_backend: str):
    from megatron.core.transformer.enums import AttnBackend

    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.model.settings import device_model_settings

    provider = tiny_llama_provider(seq_length=SEQ_LENGTH)
    provider.transformer_impl = transformer_impl
    # the same for both models: building one sets TE's NVTE_*_ATTN variables from it, and the next
    # build refuses other values (megatron/core/models/common/language_module/language_module.py:108-142)
    provider.attention_backend = AttnBackend[attention_backend]
    provider.bf16, provider.params_dtype, provider.pipeline_dtype = True, torch.bfloat16, torch.bfloat16
    device_model_settings(provider, wrapped_in_ddp=False)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False)[0]
    return model.eval()


# local-spec norm weights -> where the TE spec keeps them (fused into the following linear layer)
_TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _as_te_state(local_state: dict) -> dict:
    renamed = {}
    for key, value in local_state.items():
        suffix = next((s for s in _TE_NAMES if key.endswith(s)), None)
        renamed[key[: -len(suffix)] + _TE_NAMES[suffix] if suffix else key] = value
    return renamed


def _local_name(te_name: str) -> str:
    for local, te in _TE_NAMES.items():
        if te_name.endswith(te):
            return te_name[: -len(te)] + local
    return te_name


@dataclass
class Measured:
    """One model's pass over the batch: per-token CE [R, L] (0 on padding), per-sequence
    log pi [N] and the TOPR loss's gradient per weight, named as in the local layer spec."""

    cross_entropy: torch.Tensor
    log_pi: torch.Tensor
    gradients: dict[str, torch.Tensor]


def measure(model, batch: dict[str, torch.Tensor]) -> Measured:  # noqa: ANN001
    """Forward and backward through the training step itself (`ToprForwardStep`, the default
    objective), outside Bridge's loop."""
    from megatron.core.utils import unwrap_model

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep, completion_logprob_table

    model.zero_grad(set_to_none=True)
    output, loss_func = ToprForwardStep(ObjectiveConfig())(None, iter([batch]), model)
    loss_sum, denominator, _ = loss_func(output)
    (loss_sum / denominator).backward()
    ce = output.detach().cpu().reshape(batch["tokens"].shape)
    table, _ = completion_logprob_table(ce, batch, int(batch["seq_len"].max()))
    gradients = {_local_name(name): param.grad.float().cpu()
                 for name, param in unwrap_model(model).named_parameters() if param.grad is not None}
    real = batch["seq_index"] >= 0
    return Measured(torch.where(real, ce.float(), 0.0), table.sum(1), gradients)


def compare(reference: Measured, candidate: Measured) -> dict[str, float | str]:
    """The differences BOUNDS bounds, and the weight whose gradient differs most (relatively)."""
    if reference.gradients.keys() != candidate.gradients.keys():
        missing = sorted(reference.gradients.keys() ^ candidate.gradients.keys())
        raise ValueError(f"the two models' gradients are not of the same weights: {missing[:4]}")
    names = sorted(reference.gradients)
    apart = [float((reference.gradients[n] - candidate.gradients[n]).norm()) for n in names]
    size = [float(reference.gradients[n].norm()) for n in names]
    relative = [a / max(s, 1e-30) for a, s in zip(apart, size)]
    worst = max(range(len(names)), key=relative.__getitem__)
    return {"per-token CE": float((reference.cross_entropy - candidate.cross_entropy).abs().max()),
            "per-sequence log pi": float((reference.log_pi - candidate.log_pi).abs().max()),
            "TOPR gradient": math.hypot(*apart) / math.hypot(*size),
            "worst weight": f"{names[worst]} {relative[worst]:.2e}"}


def with_behavior(batch: dict[str, torch.Tensor], log_pi: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch with log mu = log pi + BEHAVIOR_OFFSETS (log pi from the reference model)."""
    offsets = torch.tensor(BEHAVIOR_OFFSETS, dtype=torch.float64)
    return {**batch, "behavior_logprobs": (log_pi.to(torch.float64) + offsets).to(batch["behavior_logprobs"].dtype)}


def main(argv: list[str] | None = None) -> None:
    import argparse

    from megatron.core.utils import unwrap_model

    from nemo_topr.model.device import use_device
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel
    from nemo_topr.doctor.runner import report_result

    parser = Parser(prog="python -m nemo_topr.doctor.packed_parity", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention-backend", choices=("auto", "unfused"), default="auto",
                        help="TE's attention: auto (TE chooses; cuDNN fused attention on THD, the doctor's) or "
                             "unfused (no cuDNN attention, for a cuDNN that TE's fused backward refuses)")
    backend = parser.parse_args(argv).attention_backend
    use_device("cuda", where="doctor --device")
    initialize_model_parallel(1, 1)
    local, te = _build("local", backend), _build("transformer_engine", backend)
    state = {k: v for k, v in local.state_dict().items() if not k.endswith("_extra_state")}
    # the BF16 wrapper's load_state_dict returns nothing (core/transformer/module.py:535-538)
    missing, unexpected = unwrap_model(te).load_state_dict(_as_te_state(state), strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        sys.exit(f"weights do not map between the local and TE layer specs: missing {missing[:4]}, "
                 f"unexpected {unexpected[:4]}")
    batch = _packed_batch()
    batch = with_behavior(batch, measure(local, batch).log_pi)  # log mu around the reference's log pi
    differences = compare(measure(local, batch), measure(te, batch))
    destroy_model_parallel()
    found = ", ".join(f"{name} {differences[name]:.2e} (bound {bound})" for name, bound in BOUNDS.items())
    tokens = int((batch["seq_index"] >= 0).sum())
    over = [name for name, bound in BOUNDS.items() if not differences[name] <= bound]
    if over:
        sys.exit(f"TE THD and local layers differ beyond the bounds on {', '.join(over)}: {found}; "
                 f"worst weight {differences['worst weight']}")
    attention = "" if backend == "auto" else f" ({backend} attention)"
    report_result(f"TE THD{attention} vs local layers on {tokens} packed tokens: {found}; "
                  f"worst weight {differences['worst weight']}")


if __name__ == "__main__":
    main()
