"""A core attention that honours packed and shared-prefix rows, inside either layer spec.

`FlexCoreAttention` replaces only the ``core_attention`` submodule of Megatron's self-attention
(local spec or Transformer Engine spec: TE's QKV/projection linears, norms and FP8 GEMMs stay).
It runs torch's FlexAttention with a block mask built from the batch's segments
(`segment_block_mask`): a key is visible when it is earlier in the query's row block and either
in the query's own sequence or in the block's shared prompt part; padding sees only padding.
That is exactly `nemo_topr.training.step.packed_attention_mask`, so on ordinary packed rows it
equals Megatron's local attention, and on shared-prefix rows each completion reads its prompt
and itself. FlexAttention runs eagerly on CPU (tests) and compiled on GPU, where it skips the
fully masked tiles (why FlexAttention and not cuDNN's frontend: docs/performance.md).

The mask is built once per micro-batch by the step (`segment_block_mask`) and reaches every
layer as the forward's ``attention_mask``, Megatron's layers pass it through unchanged.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

from nemo_topr.errors import UserError
from nemo_topr.model.attention_check import FLEX, AttentionKind, register_attention

_compiled_flex_attention = None


class FlexAttentionError(UserError, ValueError):
    """Shared-prefix attention that cannot run as configured (`nemo_topr.training.config` reports it
    as dataset.shared_prefix's problem)."""


def _flex(device: torch.device):
    """Eager on CPU (torch.compile of flex_attention fails there), compiled once on GPU (the
    eager form materialises the scores and is for testing only)."""
    global _compiled_flex_attention
    if device.type == "cpu":
        return flex_attention
    if _compiled_flex_attention is None:
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention


def segment_block_mask(batch: dict[str, torch.Tensor]) -> BlockMask:
    """The block mask of a packed or shared-prefix batch [R, L] (layouts: `nemo_topr.data.packing`,
    `nemo_topr.data.shared_prefix`), broadcast over heads. Built once per micro-batch on the
    batch's device, from `seq_index` and (shared-prefix batches) `prefix_index`."""
    owner = batch["seq_index"]
    block = batch.get("prefix_index", owner)
    rows, length = owner.shape

    def visible(b, h, q, kv):  # noqa: ANN001
        same_block = block[b, q] == block[b, kv]
        own_or_shared = (owner[b, q] == owner[b, kv]) | (owner[b, kv] < 0)
        return same_block & own_or_shared & (kv <= q)

    return create_block_mask(visible, B=rows, H=None, Q_LEN=length, KV_LEN=length, device=owner.device,
                             _compile=owner.device.type != "cpu")


class FlexCoreAttention(MegatronModule):
    """Drop-in for Megatron's DotProductAttention / TE's core attention: query [sq, b, np, hn],
    key and value [sk, b, ng, hn] (heads of this tensor-parallel rank; ng < np is GQA), output
    [sq, b, np * hn]; ``attention_mask`` is the batch's `segment_block_mask`."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        unsupported = {"context_parallel_size > 1": config.context_parallel_size > 1,
                       f"attention_dropout {dropout}": dropout != 0.0,
                       f"softmax_type {config.softmax_type!r}": config.softmax_type != "vanilla",
                       "window attention": config.window_size is not None}
        refused = [name for name, present in unsupported.items() if present]
        if refused:
            raise FlexAttentionError(f"FlexCoreAttention (shared-prefix / segment-masked attention) does not "
                                     f"support {', '.join(refused)}", key="model.flex_attention.unsupported_setting",
                                     where="model")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.layer_number = max(1, layer_number)
        head_dim = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        self.num_heads = divide(config.num_attention_heads, pg_collection.tp.size())
        self.num_query_groups = divide(config.num_query_groups, pg_collection.tp.size())
        # apply_query_key_layer_scaling changes nothing: DotProductAttention divides the scale by
        # the layer number and its softmax multiplies the scores back by it
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: AttnMaskType | None = None, attention_bias: torch.Tensor | None = None,
                packed_seq_params: Any = None) -> torch.Tensor:
        if not isinstance(attention_mask, BlockMask):
            raise FlexAttentionError("FlexCoreAttention needs the batch's segment_block_mask as attention_mask (got "
                                     f"{type(attention_mask).__name__}): run the model through "
                                     "nemo_topr.training.step.forward_packed",
                                     key="flex_attention.attention_mask.not_a_block_mask", where="attention_mask")
        if packed_seq_params is not None or attention_bias is not None:
            raise FlexAttentionError("FlexCoreAttention takes rows [s, b] with a block mask, not THD "
                                     "packed_seq_params or an attention bias",
                                     key="flex_attention.inputs.thd_or_bias", where="packed_seq_params")
        sq, b = query.shape[:2]
        # [s, b, heads, hn] -> [b, heads, s, hn]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = _flex(q.device)(q, k, v, block_mask=attention_mask, scale=self.softmax_scale,
                                  enable_gqa=self.num_heads != self.num_query_groups)
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, -1)



# the step gives it the block mask (route "flex"), shared-prefix rows included
register_attention(AttentionKind(f"{__name__}.FlexCoreAttention", frozenset({FLEX}), shared_prefix=True))

def with_flex_attention(spec: Any) -> Any:
    """A copy of a GPT layer spec (a layer's ModuleSpec, or a block spec with `layer_specs`) whose
    self-attention's core attention is `FlexCoreAttention`; every other submodule is kept."""
    spec = copy.deepcopy(spec)
    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        layer.submodules.self_attention.submodules.core_attention = FlexCoreAttention
    return spec


def use_flex_attention(provider: Any) -> Any:
    """Make a Bridge GPT provider build its layers with `FlexCoreAttention` (its own layer spec,
    TE or local, otherwise unchanged). Returns the provider."""
    base = provider.transformer_layer_spec

    def flex_layer_spec(config: Any, vp_stage: int | None = None) -> Any:
        if not callable(base):
            return with_flex_attention(base)
        import inspect

        takes_vp = "vp_stage" in inspect.signature(base).parameters
        return with_flex_attention(base(config, vp_stage=vp_stage) if takes_vp else base(config))

    flex_layer_spec.flex_attention = True  # read by prepare_shared_prefix_attention and attention_check.route_of
    provider.transformer_layer_spec = flex_layer_spec
    return provider


def prepare_shared_prefix_attention(provider: Any) -> str:
    """Make a provider's layers honour shared-prefix rows, or refuse; returns the attention that
    will run ("local": Megatron's DotProductAttention with the dense mask, "flex": FlexCoreAttention).

    The local spec keeps its attention. Any other spec (Transformer Engine's) gets
    `FlexCoreAttention` in place of its core attention, unless ``attention_backend=local``, with
    which Bridge puts DotProductAttention back into the spec at build time (gpt_provider.py,
    provide) under TE's layers, whose THD path would ignore the blocks: refused (FlexAttentionError).
    RoPE is switched to its unfused form, which takes the angles at each segment's position ids
    (`nemo_topr.training.step.rotary_at_position_ids`; same values, no fused kernel)."""
    from megatron.core.transformer.enums import AttnBackend

    provider.apply_rope_fusion = False
    flex_in_spec = getattr(provider.transformer_layer_spec, "flex_attention", False)
    if provider.transformer_impl == "local" and not flex_in_spec:
        return "local"
    if provider.transformer_impl != "local" and provider.attention_backend == AttnBackend.local:
        raise FlexAttentionError(f"shared-prefix rows with model.transformer_impl={provider.transformer_impl!r} "
                                 "run FlexCoreAttention, which model.attention_backend=local would replace by "
                                 "Megatron's DotProductAttention (whose TE path ignores the blocks); leave "
                                 "attention_backend at auto",
                                 key="model.attention_backend.local_under_flex", where="model.attention_backend")
    if not flex_in_spec:
        use_flex_attention(provider)
    return "flex"
