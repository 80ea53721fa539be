"""Whether the attention that will run honours the packed-sequence boundaries the step gives it.

The TOPR step (`nemo_topr.training.step.forward_packed`) hands attention one of two things:

    "mask"  rows [R, L] with a dense [R, 1, L, L] block mask (model.transformer_impl=local)
    "thd"   the rows as one packed stream with cu_seqlens (Transformer Engine)
    "flex"  rows [R, L] with the batch's FlexAttention block mask (a layer spec built with
            `nemo_topr.training.flex_attention.FlexCoreAttention`, local or TE)

An attention that ignores what it is given attends across sequences silently: Transformer Engine
with mask type causal drops a dense mask (it reads one only for padding/arbitrary types), Megatron's
fused causal softmax drops it too (megatron/core/fusions/fused_softmax.py:285-291), and Megatron's
local attention takes no cu_seqlens at all. :func:`check_attention` refuses those combinations
with an error naming what to set; the step calls :func:`check_model_attention` on the model it
runs, and tests call it on the layer spec a provider would build.

:data:`ATTENTION_KINDS` is the table of core-attention classes known to honour an input; a new
kind (e.g. a shared-prefix attention for TE layers) is one more :func:`register_attention` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from nemo_topr.errors import UserError

MASK, THD, FLEX = "mask", "thd", "flex"


class AttentionError(UserError, ValueError):
    """The attention that would run cannot honour the packed layout it is given."""


@dataclass(frozen=True)
class AttentionKind:
    """A core-attention class and what it honours. `refuses(config, mask_type)` returns why a
    particular configuration of it would still ignore the mask, or None."""

    class_name: str  # module-qualified: TE has its own class named DotProductAttention
    routes: frozenset[str]
    shared_prefix: bool  # honours the shared-prefix mask (a segment sees its block's prompt)
    refuses: Callable[[Any, Any], str | None] = lambda config, mask_type: None


ATTENTION_KINDS: dict[str, AttentionKind] = {}


def register_attention(kind: AttentionKind) -> None:
    ATTENTION_KINDS[kind.class_name] = kind


def _local_softmax_refusal(config: Any, mask_type: Any) -> str | None:
    if getattr(config, "masked_softmax_fusion", False) and getattr(mask_type, "name", mask_type) == "causal":
        return ("its fused causal softmax kernel ignores the packed mask (megatron/core/fusions/fused_softmax.py:"
                "285-291); set model.masked_softmax_fusion=false")
    return None


register_attention(AttentionKind("megatron.core.transformer.dot_product_attention.DotProductAttention",
                                 frozenset({MASK}), shared_prefix=True, refuses=_local_softmax_refusal))
register_attention(AttentionKind("megatron.core.extensions.transformer_engine.TEDotProductAttention",
                                 frozenset({THD}), shared_prefix=False))


def route_of(config: Any) -> str:
    """What `forward_packed` hands the attention for this model config (a provider whose layer spec
    came from `use_flex_attention` carries the mark `flex_attention`)."""
    if getattr(getattr(config, "transformer_layer_spec", None), "flex_attention", False):
        return FLEX
    return MASK if config.transformer_impl == "local" else THD


def check_attention(attention_class: type | str, mask_type: Any, config: Any, *, shared_prefix: bool) -> str:
    """The route when `attention_class` (a core attention's class or its module-qualified name,
    with its attn_mask_type) honours what the step gives it under `config`; else AttentionError."""
    name = (attention_class if isinstance(attention_class, str)
            else f"{attention_class.__module__}.{attention_class.__qualname__}")
    route = route_of(config)
    kind = ATTENTION_KINDS.get(name)
    where = f"model.transformer_impl={config.transformer_impl!r} with core attention {name}"
    if kind is None:
        raise AttentionError(f"{where}: not known to honour packed-sequence boundaries (known: "
                             f"{sorted(ATTENTION_KINDS)}); use Bridge's layer spec for the transformer_impl",
                             key="attention.unknown", where="model.transformer_impl")
    if route not in kind.routes:
        given = {MASK: "a dense block mask", THD: "cu_seqlens", FLEX: "a FlexAttention block mask"}[route]
        fix = ("build the provider's layer spec with nemo_topr.training.flex_attention.use_flex_attention"
               if FLEX in kind.routes else
               f"set model.transformer_impl={'local' if MASK in kind.routes else 'transformer_engine'}")
        raise AttentionError(f"{where}: the step gives it {given}, which it does not read, so tokens would attend "
                             f"across sequences (or it fails); the layer spec must follow the setting "
                             f"(nemo_topr.model.settings), or {fix}",
                             key="attention.mask_not_read", where="model.transformer_impl")
    if shared_prefix and not kind.shared_prefix:
        raise AttentionError(f"{where}: shared-prefix rows need an attention that reads the shared-prefix mask; "
                             "build the layers with FlexCoreAttention (nemo_topr.training.flex_attention."
                             "prepare_shared_prefix_attention, which dataset.shared_prefix=true runs), or set "
                             "model.transformer_impl=local",
                             key="attention.shared_prefix_mask_not_read", where="model.transformer_impl")
    reason = kind.refuses(config, mask_type)
    if reason:
        raise AttentionError(f"{where}: {reason}", key="attention.refused", where="model.transformer_impl")
    return route


def core_attention_of_spec(layer_spec: Any) -> tuple[Any, Any]:
    """(core-attention class, attn_mask_type) of a transformer-layer ModuleSpec."""
    attention = layer_spec.submodules.self_attention
    return attention.submodules.core_attention, attention.params.get("attn_mask_type")


def check_model_attention(model: Any, config: Any, *, shared_prefix: bool) -> None:
    """:func:`check_attention` for every core attention in a built model (once per model)."""
    checked = model.__dict__.setdefault("_topr_attention_checked", set())
    if shared_prefix in checked:
        return
    for module in model.modules():
        core = getattr(module, "core_attention", None)
        if core is not None:
            check_attention(type(core), getattr(core, "attn_mask_type", None), config, shared_prefix=shared_prefix)
    checked.add(shared_prefix)
