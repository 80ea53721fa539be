"""FlexCoreAttention against Megatron's local DotProductAttention, and the spec swap."""

from __future__ import annotations

import pytest
import torch

from nemo_topr.data.packing import TokenizedSequence, collate_packed
from nemo_topr.data.shared_prefix import collate_shared
from nemo_topr.training.step import packed_attention_mask


def _config(heads: int, groups: int):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=16 * heads, num_attention_heads=heads, num_query_groups=groups,
                             attention_dropout=0.0, masked_softmax_fusion=False)


def _seq(ids, prompt):
    return TokenizedSequence(input_ids=ids, loss_mask=[0] * prompt + [1] * (len(ids) - prompt), reward=1.0,
                             behavior_logprob=-1.0, prompt_id=0, sample_id=0)


def _batches():
    """Ordinary packed rows (with padding and a padding-only row) and shared-prefix rows."""
    seqs = [_seq(list(range(1, 8)), 3), _seq(list(range(1, 4)) + [9, 9], 3), _seq([5, 6, 7, 8], 2)]
    packed = collate_packed(seqs, [[0, 2], [1], []], 16, 0)
    shared = collate_shared(seqs, [[[0, 1], [2]], []], 16, 0)
    return {"packed": packed, "shared": shared}


@pytest.mark.parametrize("layout", ["packed", "shared"])
@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2)])
def test_flex_equals_local_attention_with_the_dense_mask(megatron_world, layout, heads, groups):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from nemo_topr.training.flex_attention import FlexCoreAttention, segment_block_mask

    batch = _batches()[layout]
    config = _config(heads, groups)
    kwargs = dict(layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    local, flex = DotProductAttention(config, **kwargs), FlexCoreAttention(config, **kwargs)
    rows, length = batch["tokens"].shape
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(length, rows, heads, 16, generator=generator, requires_grad=True)
    k, v = (torch.randn(length, rows, groups, 16, generator=generator, requires_grad=True) for _ in range(2))
    expected = local(q, k, v, packed_attention_mask(batch))
    got = flex(q, k, v, segment_block_mask(batch))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    weights = torch.randn(expected.shape, generator=generator)
    grads_expected = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
    for g, e in zip(grads_got, grads_expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5 * e.abs().max().item())


def test_flex_attention_refuses_a_dense_mask_and_dropout(megatron_world):
    from megatron.core.transformer.enums import AttnMaskType

    from nemo_topr.training.flex_attention import FlexCoreAttention

    kwargs = dict(layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    flex = FlexCoreAttention(_config(2, 2), **kwargs)
    q = torch.zeros(4, 1, 2, 16)
    with pytest.raises(ValueError, match="segment_block_mask"):
        flex(q, q, q, torch.zeros(1, 1, 4, 4, dtype=torch.bool))
    config = _config(2, 2)
    config.attention_dropout = 0.1
    with pytest.raises(ValueError, match="attention_dropout 0.1"):
        FlexCoreAttention(config, **kwargs)


def test_spec_swap_replaces_only_the_core_attention(megatron_world):
    """Local spec (the TE spec needs transformer_engine, absent here; its self-attention has the
    same SelfAttentionSubmodules.core_attention slot: gpt_layer_specs.py)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from nemo_topr.training.flex_attention import FlexCoreAttention, with_flex_attention

    spec = get_gpt_layer_local_spec()
    swapped = with_flex_attention(spec)
    attention, original = swapped.submodules.self_attention.submodules, spec.submodules.self_attention.submodules
    assert attention.core_attention is FlexCoreAttention
    assert original.core_attention is DotProductAttention  # the given spec is untouched
    assert (attention.linear_qkv, attention.linear_proj) == (original.linear_qkv, original.linear_proj)
    assert swapped.submodules.input_layernorm is spec.submodules.input_layernorm
