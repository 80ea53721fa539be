"""`nemo-topr doctor`'s "te attention" check (CUDA and Transformer Engine only): one forward and
backward of TE's DotProductAttention as the TOPR step calls it (BF16, Llama 3 heads: 32 query heads
in 8 groups of 128 dimensions, two packed sequences as THD with cu_seqlens, causal within each),
with TE choosing the backend. Run in its own process by the doctor; prints its result line.

Why a check of its own: on an H200 (2026-11-26, bench/README.md) TE 2.17.1 from PyPI ran the
forward and failed every backward with `CUDNN_ATTR_OPERATION_RESHAPE_MODE ... CUDNN_STATUS_BAD_PARAM`
(an attribute of cuDNN 9.22, loaded 9.19): `train` would fail at its first backward, far from the cause.
With cuDNN 9.28.1.4 on the same H200 it passed (bench/results/gpu_verbs_h200_2026-11-26_d17baf8_te.json).
"""

from __future__ import annotations

import sys

import torch

from nemo_topr.doctor.runner import report_result

HEADS, GROUPS, HEAD_DIM = 32, 8, 128
LENGTHS = (1000, 3096)  # one 4,096-token row holding two sequences


def main() -> int:
    import transformer_engine
    import transformer_engine.pytorch as te

    attention = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="padding_causal",
                                       qkv_format="thd").cuda()
    total = sum(LENGTHS)
    generator = torch.Generator(device="cuda").manual_seed(0)

    def tensor(heads: int) -> torch.Tensor:
        return torch.randn(total, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           generator=generator).requires_grad_()

    query, key, value = tensor(HEADS), tensor(GROUPS), tensor(GROUPS)
    bounds = torch.tensor([0, LENGTHS[0], total], device="cuda", dtype=torch.int32)
    try:
        out = attention(query, key, value, cu_seqlens_q=bounds, cu_seqlens_kv=bounds, max_seqlen_q=max(LENGTHS),
                        max_seqlen_kv=max(LENGTHS))
        out.float().square().mean().backward()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - the doctor reads this line and names the fix
        print(f"FAILED: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", flush=True)
        return 1
    grads = [t.grad for t in (query, key, value)]
    if not all(g is not None and bool(torch.isfinite(g).all()) for g in grads):
        print("FAILED: non-finite or missing gradients", flush=True)
        return 1
    report_result(f"TE {transformer_engine.__version__}, cuDNN {torch.backends.cudnn.version()}: forward and "
                  f"backward on THD ({'+'.join(map(str, LENGTHS))} tokens, {HEADS}/{GROUPS} heads), finite gradients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
