"""The model side of `nemo-topr plan`: a Llama architecture and its parameter count, from a
Hugging Face config.json or a built-in reference (Llama 3.1 8B / 70B)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_topr.errors import UserError


@dataclass(frozen=True)
class Architecture:
    """A Llama-style decoder; field names are Megatron-Core's (``model.*`` keys)."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    kv_channels: int  # head dim
    share_embeddings_and_output_weights: bool = False

    @property
    def query_width(self) -> int:
        """heads * head_dim: the width of Q and of the attention output projection's input."""
        return self.num_attention_heads * self.kv_channels

    @property
    def key_value_width(self) -> int:
        """query_groups * head_dim: the width of K and of V (grouped-query attention)."""
        return self.num_query_groups * self.kv_channels

    @property
    def attention_gemm_params(self) -> int:
        """QKV projection h*(q + 2kv) plus output projection q*h (no biases)."""
        h = self.hidden_size
        return h * (self.query_width + 2 * self.key_value_width) + self.query_width * h

    @property
    def mlp_gemm_params(self) -> int:
        """SwiGLU: gate and up projections h*ffn each, down projection ffn*h."""
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def layer_norm_params(self) -> int:
        """Two RMSNorm weight vectors per layer (before attention, before the MLP)."""
        return 2 * self.hidden_size

    @property
    def layer_params(self) -> int:
        return self.attention_gemm_params + self.mlp_gemm_params + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def output_layer_params(self) -> int:
        """V*h for an untied output layer; 0 when it shares the embedding."""
        return 0 if self.share_embeddings_and_output_weights else self.embedding_params

    @property
    def total_params(self) -> int:
        """embedding + L * layer + final RMSNorm + output layer."""
        return (self.embedding_params + self.num_layers * self.layer_params + self.hidden_size
                + self.output_layer_params)

    def describe(self) -> str:
        tying = "tied" if self.share_embeddings_and_output_weights else "untied"
        return (f"L={self.num_layers} h={self.hidden_size} ffn={self.ffn_hidden_size} "
                f"heads={self.num_attention_heads} query groups={self.num_query_groups} "
                f"head dim={self.kv_channels} vocab={self.vocab_size}, {tying} embeddings")

    def params_breakdown(self) -> str:
        return (f"embedding {self.embedding_params:,} + {self.num_layers} layers x {self.layer_params:,} "
                f"(attention {self.attention_gemm_params:,} + MLP {self.mlp_gemm_params:,} + 2 RMSNorm "
                f"{self.layer_norm_params:,}) + final norm {self.hidden_size:,} + output layer "
                f"{self.output_layer_params:,} = {self.total_params:,}")


def _llama31(name: str, layers: int, hidden: int, ffn: int, heads: int) -> Architecture:
    return Architecture(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
                        num_attention_heads=heads, num_query_groups=8, vocab_size=128256,
                        kv_channels=hidden // heads, share_embeddings_and_output_weights=False)


# Published Llama 3.1 configs (config.json of meta-llama/Llama-3.1-8B and -70B).
REFERENCE_ARCHITECTURES: dict[str, Architecture] = {
    "llama31_8b": _llama31("Llama 3.1 8B", layers=32, hidden=4096, ffn=14336, heads=32),
    "llama31_70b": _llama31("Llama 3.1 70B", layers=80, hidden=8192, ffn=28672, heads=64),
}

# Hugging Face LlamaConfig key -> Architecture field.
HF_CONFIG_KEYS = {
    "num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_query_groups",
    "vocab_size": "vocab_size", "head_dim": "kv_channels",
    "tie_word_embeddings": "share_embeddings_and_output_weights",
}

HF_CONFIG_DEFAULTED = ("num_key_value_heads", "head_dim", "tie_word_embeddings")  # LlamaConfig's defaults apply


class ArchitectureError(UserError, ValueError):
    """A config.json without a Llama's sizes, or with one that is no positive integer."""


def architecture_from_hf_config(config_json: Path, name: str) -> Architecture:
    """Architecture of a local HF Llama ``config.json`` (GQA and head_dim defaults as in HF); one
    without a size, or with one that is no positive integer, is an error naming the keys."""
    config = json.loads(config_json.read_text())
    given = {key: value for key, value in config.items() if key in HF_CONFIG_KEYS and value is not None}
    missing = [key for key in HF_CONFIG_KEYS if key not in given and key not in HF_CONFIG_DEFAULTED]
    wrong = [f"{key}={value!r}" for key, value in given.items() if key != "tie_word_embeddings"
             and (isinstance(value, bool) or not isinstance(value, int) or value < 1)]
    problems = ([f"no {', '.join(missing)}"] if missing else []) + (
        [f"{', '.join(wrong)}: not a positive integer"] if wrong else [])
    if problems:
        raise ArchitectureError(f"{config_json}: {'; '.join(problems)} (a Llama's config.json has them)",
                                key=f"model.config_json.sizes.{'missing' if missing else 'not_positive_integers'}",
                                where=str(config_json))
    values = {HF_CONFIG_KEYS[key]: value for key, value in given.items()}
    values.setdefault("num_query_groups", values["num_attention_heads"])
    values.setdefault("kv_channels", values["hidden_size"] // values["num_attention_heads"])
    values.setdefault("share_embeddings_and_output_weights", False)  # LlamaConfig's default
    return Architecture(name=name, **values)


def with_model_overrides(arch: Architecture, model: dict[str, Any]) -> Architecture:
    """Apply ``model.*`` architecture keys from the run config: the model planned for where the base
    model is not readable here (where it is, check_values refuses keys other than its own)."""
    names = {f.name for f in dataclasses.fields(Architecture)} - {"name"}
    overrides = {key: value for key, value in model.items() if key in names and value is not None}
    return dataclasses.replace(arch, **overrides) if overrides else arch
