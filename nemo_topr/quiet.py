"""The one place that silences start-up noise known to be harmless; `NEMO_TOPR_VERBOSE=1` (or
`nemo-topr --verbose VERB`) shows everything.

Importing Megatron-Core and Megatron-Bridge on a machine without Transformer Engine or Apex
prints a dozen UserWarnings about fallbacks (the CPU runtime uses the local implementations on
purpose: `nemo_topr.cpu_runtime`), a logged traceback for an optional FP8 import, a note on
Gemma 2's attention, and torch's note that no CUDA runtime was found; building a model adds
Megatron-Core 0.19's notes that GPTModel and its own default CUDA-graph scope are deprecated,
and transformers' note on the `torch_dtype` keyword Bridge still passes it; `train` adds Bridge's
notes that finetune() is experimental and its own tokenizer call deprecated and, in a plain
process without a launcher, Megatron's notes that it takes rank 0 of 1; reading a checkpoint in
one process (export, score-logprobs) adds torch's notes on Megatron's calls and Megatron's on the
run config's sections it does not resolve; composing a user's YAML
adds Hydra's and multistorageclient's note that msc:// configs are not set up. None of it is
something a user can act on, and it buried the first useful line of every verb. Only these exact messages are filtered; any other warning or
log line still shows. What is not Python's cannot be filtered here: Gloo's "[Gloo] Rank N is
connected to ..." lines are printed by C++ on stdout (one per rank and process group on CPU runs).
"""

from __future__ import annotations

import logging
import os
import re
import warnings

VERBOSE_ENV = "NEMO_TOPR_VERBOSE"

# Python warnings, by the start of their message
HARMLESS_WARNINGS = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"Only transformer-engine>=\S+ supports MoE experts",
    r"MimoModelConfig is experimental",
    r"provider=msc-universal, path=\S* is not available",  # Hydra, composing a user's YAML (below)
    # Megatron-Core 0.19's own default cuda_graph_modules="full" warns in every TransformerConfig
    # (megatron/core/transformer/transformer_config.py); CUDA graphs are off in every preset
    r"full scope is deprecated\. Use empty cuda_graph_modules",
    # `nemo-topr train` as a plain process (no torchrun or srun): Megatron falls back to rank 0 of
    # 1, local rank 0 (core/_rank_utils.py, training/utils/common_utils.py), as nemo-topr does
    # (nemo_topr.distributed.launcher_rank)
    r"Could not determine (rank|world size|local rank) from ",
    # Bridge marks its own entry points so (bridge/utils/decorators.py); nemo-topr pins Bridge's version
    r"Function '(finetune|pretrain)' is experimental",
    # Bridge's own call (bridge/training/tokenizers/tokenizer.py)
    r"`build_tokenizer` is deprecated and will be removed soon",
    # reading a checkpoint in one process (export, score-logprobs): torch's notes on Megatron's own
    # calls of torch.distributed.checkpoint and ShardedTensor (a FutureWarning)
    r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a single",
    r"The argument order of load has been changed",
    r"Please use DTensor instead and we are deprecating ShardedTensor",
)
# logger name -> the start of the messages dropped from it
HARMLESS_LOG_LINES = {
    "megatron.bridge.utils.import_utils": r"Import of \w+ from megatron\.core\.extensions\.transformer_engine failed",
    "torch.utils.cpp_extension": r"No CUDA runtime is found",
    "megatron.bridge.models.gemma.gemma2_provider": r"Gemma2: ",  # a model family nemo-topr does not build
    # Bridge's Llama provider builds Megatron-Core's GPTModel, which 0.19 calls deprecated at every build
    "megatron.core.models.gpt.gpt_model": r"GPTModel IS DEPRECATED",
    # Bridge still uses transformers 5's old name: config.torch_dtype (conversion/model_bridge.py),
    # from_pretrained(torch_dtype=...) (hf_pretrained/causal_lm.py)
    "transformers.configuration_utils": r"`torch_dtype` is deprecated! Use `dtype` instead!",
    "transformers.modeling_utils": r"`torch_dtype` is deprecated! Use `dtype` instead!",
    # multistorageclient's Hydra plugin (msc:// config URLs, unused here) logs a traceback when a
    # config adds a search path (a user's YAML naming our presets: nemo_topr.training.config.compose)
    "multistorageclient.contrib.hydra": r"MSC config source not available",
    # a run's run_config.yaml read back for its model config: the dataset section names our class,
    # the optimizer section a Bridge default Megatron-Core 0.19 no longer has; neither is used
    "megatron.training.config.utils": (
        r"(Target 'nemo_topr\.training\.data\.ToprDatasetConfig' is not in the allowlist"
        r"|Could not resolve target 'megatron\.core\.optimizer\.optimizer\.MegatronOptimizer\.scale_loss')"),
}


class _DropMatching(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def quiet_known_noise(environ=os.environ) -> bool:
    """Install the filters unless NEMO_TOPR_VERBOSE=1; returns whether they were installed."""
    if environ.get(VERBOSE_ENV) == "1":
        return False
    for message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message)  # UserWarning, one FutureWarning
    for name, pattern in HARMLESS_LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMatching) for f in logger.filters):
            logger.addFilter(_DropMatching(pattern))
    return True
