"""The parallel layout of a run (parallelism, batch, precision, recompute) as a composed run
config and the node count give it (`nemo-topr plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """What the planner needs from a run config (parallelism, batch, recompute, precision), plus
    the cluster size. Field defaults are those of a GPU run whose config is silent."""

    nodes: int = 1
    gpus_per_node: int = 8
    tp: int = 1
    pp: int = 1
    vp: int | None = None
    cp: int = 1
    sequence_parallel: bool = False
    seq_length: int = 2048
    micro_batch: int = 1
    global_batch: int = 8
    recompute: str | None = None  # None | "selective" | "full"
    recompute_method: str | None = None  # full only: "uniform" | "block"
    recompute_num_layers: int | None = None
    fused_attention: bool = True  # TE flash/cuDNN attention: the a·s² scores are never stored
    half_precision_weights: bool = True  # model.bf16 or model.fp16: 2 B/param, else fp32
    grad_reduce_in_fp32: bool = True
    distributed_optimizer: bool = True
    fp8: str | None = None
    fp8_recipe: str = "delayed"
    first_last_layers_bf16: bool = False
    bf16_layers_at_start: int = 1
    bf16_layers_at_end: int = 1
    batched_p2p: bool = False  # model.batch_p2p_comm=true set; the recipe's own choice for interleaving is false

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel size (world // TP*PP*CP; at least 1 so the estimate still runs when the
        world-size check fails)."""
        return max(1, self.world_size // self.model_parallel)

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (the virtual pipeline size, 1 without interleaving)."""
        return self.vp or 1

    @property
    def micro_batches(self) -> int:
        """Micro-batches per optimizer step on each DP rank: GBS / (MBS * DP)."""
        return max(1, self.global_batch // (self.micro_batch * self.dp))

    @property
    def weight_bytes(self) -> int:
        return 2 if self.half_precision_weights else 4

    @property
    def sp_divisor(self) -> int:
        """Sequence parallelism splits the sequence dimension over TP."""
        return self.tp if self.sequence_parallel else 1

    def describe(self) -> str:
        vp = f"VP={self.vp}" if self.vp else "VP off"
        dp = (f"DP={self.dp}" if self.world_size % self.model_parallel == 0 else
              f"DP={self.dp} (estimated: {self.world_size} GPUs do not divide into TP·PP·CP = {self.model_parallel})")
        return (f"TP={self.tp} PP={self.pp} CP={self.cp} {dp} ({vp}, SP "
                f"{'on' if self.sequence_parallel else 'off'}); seq {self.seq_length} x micro-batch "
                f"{self.micro_batch}, global batch {self.global_batch} = {self.micro_batches} "
                f"micro-batches per DP rank")


def layout_from_config(cfg: dict[str, Any], nodes: int, gpus_per_node: int) -> Layout:
    """The layout of a composed run config. What it leaves out is what a GPU run gets:
    `default_container` (nemo_topr/training/config.py: distributed optimizer, fp32 gradient
    reduction, global batch 8) and Megatron-Core's TransformerConfig (delayed FP8 scaling, one BF16
    layer at each end). Weights are FP32 unless ``model.bf16`` (or fp16) is set, because the HF
    provider is built in FP32. Attention is fused unless ``model.transformer_impl`` or
    ``model.attention_backend`` says "local"/"unfused": the TOPR step hands Transformer Engine
    packed THD streams, which TE gives to flash or cuDNN fused attention; TE 2.17.1's
    UnfusedDotProductAttention takes them too, but pads every sequence to the longest and holds the
    scores (an 8B-shaped model at 4,096 tokens ran out of an H200's 140 GiB at 4 layers, 2026-11-26)."""
    model, train = cfg.get("model") or {}, cfg.get("train") or {}
    optimizer, ddp = cfg.get("optimizer") or {}, cfg.get("ddp") or {}
    defaults = Layout()

    def get(section: dict[str, Any], key: str, default: Any) -> Any:
        value = section.get(key)
        return default if value is None else value

    # Bridge turns the distributed optimizer on for both when either asks for it
    # (bridge/training/config.py, _validate_and_sync_distributed_optimizer_settings).
    dist_opt_keys = [section["use_distributed_optimizer"] for section in (optimizer, ddp)
                     if section.get("use_distributed_optimizer") is not None]
    return Layout(
        nodes=nodes, gpus_per_node=gpus_per_node,
        tp=get(model, "tensor_model_parallel_size", defaults.tp),
        pp=get(model, "pipeline_model_parallel_size", defaults.pp),
        vp=model.get("virtual_pipeline_model_parallel_size"),
        cp=get(model, "context_parallel_size", defaults.cp),
        sequence_parallel=bool(model.get("sequence_parallel")),
        seq_length=get(model, "seq_length", defaults.seq_length),
        micro_batch=get(train, "micro_batch_size", defaults.micro_batch),
        global_batch=get(train, "global_batch_size", defaults.global_batch),
        recompute=model.get("recompute_granularity"),
        recompute_method=model.get("recompute_method"),
        recompute_num_layers=model.get("recompute_num_layers"),
        fused_attention=(model.get("transformer_impl") != "local"
                         and str(model.get("attention_backend")).split(".")[-1] not in ("local", "unfused")),
        half_precision_weights=bool(model.get("bf16") or model.get("fp16")),
        grad_reduce_in_fp32=get(ddp, "grad_reduce_in_fp32", defaults.grad_reduce_in_fp32),
        distributed_optimizer=any(dist_opt_keys) if dist_opt_keys else defaults.distributed_optimizer,
        fp8=model.get("fp8"),
        fp8_recipe=get(model, "fp8_recipe", defaults.fp8_recipe),
        first_last_layers_bf16=bool(model.get("first_last_layers_bf16")),
        bf16_layers_at_start=get(model, "num_layers_at_start_in_bf16", defaults.bf16_layers_at_start),
        bf16_layers_at_end=get(model, "num_layers_at_end_in_bf16", defaults.bf16_layers_at_end),
        batched_p2p=bool(model.get("batch_p2p_comm")),
    )
