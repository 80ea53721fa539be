"""`nemo-topr doctor`'s packed-attention parity check (CUDA and Transformer Engine only).

The same weights through Transformer Engine layers (rows as one THD stream with cu_seqlens) and
through Megatron's local layers (rows with the dense block mask) must give the same per-token
cross-entropy on packed rows: if TE dropped the boundaries, its tokens would attend across
sequences and the two would disagree. Run in its own process by the doctor; prints one line.

On an H200 with TE 2.17.1 (2026-11-26) it stopped before comparing: the BF16 wrapper's
load_state_dict returns nothing. Now the weights load into the unwrapped model; on CPU, with TE
2.17.1's real layer spec built under mocked CUDA, every local weight maps (no missing or unexpected
key). The comparison itself has not run on a GPU yet.
"""

from __future__ import annotations

import sys

import torch

SEQ_LENGTH = 128
LENGTHS = ([40, 30, 50], [70, 45])  # two rows, each with several sequences and a padding tail
# bf16 activations: per-token cross-entropy of a random model agrees to a few hundredths
BOUND = 0.05


def _packed_batch():
    from nemo_topr.data.packing import TokenizedSequence, collate_packed

    generator = torch.Generator().manual_seed(0)
    seqs, rows = [], []
    for row_lengths in LENGTHS:
        rows.append([])
        for n in row_lengths:
            ids = torch.randint(1, 500, (n,), generator=generator).tolist()
            rows[-1].append(len(seqs))
            seqs.append(TokenizedSequence(ids, [0] * 5 + [1] * (n - 5), 1.0, 0.0, len(seqs), len(seqs)))
    return collate_packed(seqs, rows, SEQ_LENGTH, 0)


def _build(transformer_impl: str):
    from nemo_topr.model import tiny_llama_provider
    from nemo_topr.model_settings import device_model_settings

    provider = tiny_llama_provider(seq_length=SEQ_LENGTH)
    provider.transformer_impl = transformer_impl
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


def main() -> None:
    from megatron.core.utils import unwrap_model

    from nemo_topr.device import use_device
    from nemo_topr.distributed import initialize_model_parallel
    from nemo_topr.training.step import forward_packed, to_device, with_thd_boundaries

    use_device("cuda", where="doctor --device")
    initialize_model_parallel(1, 1)
    local, te = _build("local"), _build("transformer_engine")
    state = {k: v for k, v in local.state_dict().items() if not k.endswith("_extra_state")}
    # the BF16 wrapper's load_state_dict returns nothing (core/transformer/module.py:535-538)
    missing, unexpected = unwrap_model(te).load_state_dict(_as_te_state(state), strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        sys.exit(f"weights do not map between the local and TE layer specs: missing {missing[:4]}, "
                 f"unexpected {unexpected[:4]}")
    batch = _packed_batch()
    real = batch["seq_index"] >= 0
    with torch.no_grad():
        ce = {}
        for name, model in (("local", local), ("te", te)):
            device_batch = to_device(with_thd_boundaries(batch, model.config))
            ce[name] = forward_packed(model, device_batch, model.config).float().reshape(batch["tokens"].shape).cpu()
    difference = float((ce["local"] - ce["te"])[real].abs().max())
    if not difference <= BOUND:
        sys.exit(f"TE THD and local attention differ by {difference:.3g} per token (bound {BOUND})")
    print(f"TE THD vs local layers on {int(real.sum())} packed tokens: max |CE difference| {difference:.2e} "
          f"(bound {BOUND})")


if __name__ == "__main__":
    main()
