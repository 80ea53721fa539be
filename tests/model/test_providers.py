"""A tiny Llama built through Bridge's GPTModelProvider runs on CPU, and its labels path
returns exactly the per-token cross-entropy of its own logits."""

import torch


def test_tiny_llama_forward_backward_and_labels_path(megatron_world):
    from nemo_topr.model.providers import tiny_llama_provider

    torch.manual_seed(0)
    provider = tiny_llama_provider(vocab_size=300, seq_length=32)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0]

    # Llama anatomy: RMSNorm, SwiGLU (gated fc1 = 2 x ffn), GQA (q + 2 kv groups), no biases.
    layer = model.decoder.layers[0]
    head_dim = provider.hidden_size // provider.num_attention_heads
    assert type(layer.input_layernorm).__name__ == "RMSNorm"
    assert layer.mlp.linear_fc1.weight.shape == (2 * provider.ffn_hidden_size, provider.hidden_size)
    assert layer.self_attention.linear_qkv.weight.shape[0] == (
        provider.num_attention_heads + 2 * provider.num_query_groups) * head_dim
    assert not any("bias" in name for name, _ in model.named_parameters())
    assert model.position_embedding_type == "rope"

    tokens = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, dims=1)
    position_ids = torch.arange(24).expand(2, 24)

    logits = model(tokens, position_ids, None)
    assert logits.shape == (2, 24, 300)
    per_token_ce = model(tokens, position_ids, None, labels=labels)
    assert per_token_ce.shape == (2, 24)

    # hand computation: CE_t = logsumexp(z_t) - z_t[label_t]
    z = logits.double()
    expected = torch.logsumexp(z, dim=-1) - z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(per_token_ce.double(), expected, rtol=0, atol=1e-5)

    per_token_ce.mean().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())
