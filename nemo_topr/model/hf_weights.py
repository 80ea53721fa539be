"""A Hugging Face Llama directory's weights against its config.json, read from the safetensors
headers alone (no tensor is loaded).

Megatron-Bridge converts whatever it finds: a config.json with a layer more than the weights
left that layer uninitialised (NaN scores, exit 0), one with a layer fewer, or with tied
embeddings, dropped weights without a word, and a wrong width ended in a traceback after the
start-up. transformers calls these MISSING and UNEXPECTED in its load report; here they are
refused before Megatron starts. Bridge reads safetensors only, so a directory of
pytorch_model*.bin is refused too.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from nemo_topr.errors import UserError

INDEX = "model.safetensors.index.json"
# Buffers some older Llama checkpoints hold; transformers and Bridge recompute them on load.
IGNORED_SUFFIX = ".rotary_emb.inv_freq"
SHOWN = 3  # names listed per kind of problem


class WeightsError(UserError, ValueError):
    """Weights that are not the model config.json describes, or that cannot be read."""


def llama_weight_shapes(config: dict) -> dict[str, list[int]]:
    """The tensors of a LlamaForCausalLM and their shapes, as config.json describes them
    (transformers' LlamaForCausalLM state dict; Bridge's Llama mapping reads these names)."""
    hidden, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // heads
    query_groups = config.get("num_key_value_heads") or heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [vocab, hidden]
    for index in range(layers):
        layer = f"model.layers.{index}."
        shapes |= {layer + "input_layernorm.weight": [hidden], layer + "post_attention_layernorm.weight": [hidden],
                   layer + "self_attn.q_proj.weight": [heads * head_dim, hidden],
                   layer + "self_attn.k_proj.weight": [query_groups * head_dim, hidden],
                   layer + "self_attn.v_proj.weight": [query_groups * head_dim, hidden],
                   layer + "self_attn.o_proj.weight": [hidden, heads * head_dim],
                   layer + "mlp.gate_proj.weight": [ffn, hidden], layer + "mlp.up_proj.weight": [ffn, hidden],
                   layer + "mlp.down_proj.weight": [hidden, ffn]}
    return shapes


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from one safetensors file's header (an 8-byte little-endian length,
    then that much JSON), checked against the file's size: a shard cut short is named here."""
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
        if length is None or 8 + length > size:
            raise WeightsError(f"{path}: not a safetensors file, or cut short ({size} bytes)",
                               key="weights.not_safetensors", where=str(path))
        try:
            header = json.loads(file.read(length))
            entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
            end = max((entry["data_offsets"][1] for entry in entries.values()), default=0)
            shapes = {name: list(entry["shape"]) for name, entry in entries.items()}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
            raise WeightsError(f"{path}: unreadable safetensors header ({type(error).__name__}: {error})",
                               key="weights.header_unreadable", where=str(path)) from None
    if 8 + length + end > size:
        raise WeightsError(f"{path}: cut short: {size} bytes where its header needs {8 + length + end}; "
                           "copy it again", key="weights.cut_short", where=str(path))
    return shapes


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files Bridge reads: those the index names (each must exist), else every
    *.safetensors in the directory."""
    index = directory / INDEX
    if not index.is_file():
        return sorted(directory.glob("*.safetensors"))
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise WeightsError(f"{index}: unreadable ({type(error).__name__}: {error})",
                           key="weights.index_unreadable", where=str(index)) from None
    if missing := [name for name in names if not (directory / name).is_file()]:
        raise WeightsError(f"{index} names shards that are not there: {_some(missing)}, of {len(names)}",
                           key="weights.shards_missing", where=str(index))
    return [directory / name for name in names]


def _some(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def check_llama_weights(directory: Path, config: dict) -> None:
    """Raise WeightsError unless `directory`'s safetensors hold exactly the tensors `config`
    describes, at its shapes. Messages name files by path, the directory by nothing: the caller
    names it as the user gave it."""
    files = weight_files(directory)
    if not files:
        raise WeightsError("no *.safetensors (pytorch_model*.bin only?); Megatron-Bridge reads "
                           "safetensors only: save the model once with transformers' save_pretrained(DIR), "
                           "which writes safetensors, and give DIR", key="weights.no_safetensors", where=str(directory))
    try:
        expected = llama_weight_shapes(config)
    except KeyError as error:
        raise WeightsError(f"{directory / 'config.json'} has no {error.args[0]!r}, which a Llama config "
                           "holds",
                           key="weights.config_json.incomplete", where=str(directory / "config.json")) from None
    found: dict[str, list[int]] = {}
    for path in files:
        found |= safetensors_shapes(path)
    found = {name: shape for name, shape in found.items() if not name.endswith(IGNORED_SUFFIX)}
    missing = [name for name in expected if name not in found]
    unexpected = sorted(name for name in found if name not in expected)
    reshaped = [f"{name} {found[name]} where config.json gives {expected[name]}"
                for name in expected if name in found and found[name] != expected[name]]
    problems = [f"{what}: {_some(names)}"
                for what, names in (("missing", missing), ("not in config.json's model", unexpected),
                                    ("other shapes", reshaped)) if names]
    if problems:
        layout = ", ".join(f"{key}={config.get(key)}" for key in ("num_hidden_layers", "hidden_size",
                                                                 "intermediate_size", "tie_word_embeddings"))
        raise WeightsError(f"its weights are not the model its config.json describes ({layout}): "
                           f"{'; '.join(problems)}. Is config.json another model's, or a shard missing?",
                           key="weights.not_the_config", where=str(directory))
