"""Model providers: a tiny Llama for CPU tests and demos, real Llamas from local HF directories.

Both return Megatron-Bridge ``GPTModelProvider`` objects (Bridge's model config + factory), so the
rest of the recipe never cares which one it got. Both go through :func:`nemo_topr.model.settings.device_model_settings`. Call :func:`nemo_topr.model.cpu_runtime.import_bridge`
(or ``enable_cpu_runtime``) before using this module on a machine without Transformer Engine.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from nemo_topr.errors import UserError
from nemo_topr.model.settings import device_model_settings
from nemo_topr.model.source import ModelSource


class ModelDirectoryError(UserError, FileNotFoundError):
    """A Hugging Face model directory without its config.json."""


def tiny_llama_provider(
    *,
    vocab_size: int = 512,
    seq_length: int = 256,
    num_layers: int = 2,
    hidden_size: int = 64,
    ffn_hidden_size: int = 172,
    num_attention_heads: int = 4,
    num_query_groups: int = 2,
):
    """A Llama-shaped GPT (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied output layer)
    small enough to train on two CPU cores."""
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    provider = GPTModelProvider(
        num_layers=num_layers,
        hidden_size=hidden_size,
        ffn_hidden_size=ffn_hidden_size,
        num_attention_heads=num_attention_heads,
        num_query_groups=num_query_groups,
        vocab_size=vocab_size,
        seq_length=seq_length,
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,
        activation_func=F.silu,
        gated_linear_unit=True,
        position_embedding_type="rope",
        rotary_base=500_000,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
    )
    return device_model_settings(provider)


def hf_llama_provider(hf_dir: str | Path, *, load_weights: bool = True, seq_length: int | None = None):
    """Provider for a Llama checkpoint in a local Hugging Face directory (no hub access).

    Returns ``(auto_bridge, provider)``; keep the bridge to export trained weights back to HF.
    With ``load_weights=False`` only config.json is read (an `hf_artifacts/` directory will do).
    """
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise ModelDirectoryError(f"{hf_dir}: not a Hugging Face model directory (no config.json)",
                                  key="model.config_json.missing", where=str(hf_dir))
    from megatron.bridge import AutoBridge

    if load_weights:
        bridge = AutoBridge.from_hf_pretrained(str(hf_dir), torch_dtype=torch.float32, local_files_only=True)
    else:
        bridge = config_only_bridge(hf_dir)
    provider = bridge.to_megatron_provider(load_weights=load_weights)
    if seq_length is not None:
        provider.seq_length = seq_length
    return bridge, device_model_settings(provider)


def config_only_bridge(hf_dir: str | Path):
    """AutoBridge from config.json alone: what export and Megatron-checkpoint starts need (the
    weights come from the checkpoint; Bridge never opens a safetensors file)."""
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    bridge = AutoBridge.from_hf_config(config)
    bridge.hf_model_id = str(hf_dir)  # where save_hf_pretrained copies tokenizer/generation files from
    return bridge


def source_provider(source: ModelSource, *, seq_length: int | None = None):
    """``(bridge, provider)`` for a resolved starting model. HF weights are hooked into the
    provider for an HF source; a Megatron source's weights are loaded by :func:`load_model`
    (inference) or by Bridge's ``checkpoint.pretrained_checkpoint`` (training)."""
    return hf_llama_provider(source.hf_dir, load_weights=not source.is_megatron, seq_length=seq_length)


def load_model(source: ModelSource, provider, *, cpu_init: bool = True) -> list:
    """Build the (finalized) provider's model chunks at its TP/PP layout with the source's weights
    (`cpu_init=False`: built on the current CUDA device, as `score-logprobs --device cuda` does; run on one
    H200 without Transformer Engine, bench/results/gpu_verbs_h200_2026-11-26_0e4bf37.json).

    A Megatron checkpoint goes through Bridge's ``build_and_load_model``: the distributed
    checkpoint reshards to this layout on load, whatever layout it was saved at."""
    if not source.is_megatron:
        return provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=cpu_init)
    from megatron.bridge.training.model_load_save import build_and_load_model

    model = build_and_load_model(str(source.checkpoint), provider, use_cpu_init=cpu_init, skip_temp_dist_context=True)
    return model if isinstance(model, list) else [model]


def build_tiny_hf_llama(out_dir: str | Path, tokenizer, *, seed: int = 0, num_layers: int = 2,
                        hidden_size: int = 64, intermediate_size: int = 172, num_heads: int = 4,
                        num_kv_heads: int = 2, max_position_embeddings: int = 1024) -> Path:
    """Write a randomly initialised Llama (Hugging Face format) plus `tokenizer` to `out_dir`.

    This is how tests and the demo get a "pretrained" model offline: every later stage reads it
    exactly as it would read a real Llama 3 directory.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5, rope_theta=500_000.0,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0,
                     top_p=1.0, top_k=500, max_new_tokens=512).save_pretrained(out_dir)
    return out_dir
