"""The one place that silences start-up noise known to be harmless; `NEMO_TOPR_VERBOSE=1` (or
`nemo-topr --verbose VERB`) shows everything.

Importing Megatron-Core and Megatron-Bridge on a machine without Transformer Engine or Apex
prints a dozen UserWarnings about fallbacks (the CPU runtime uses the local implementations on
purpose: `nemo_topr.model.cpu_runtime`), a logged traceback for an optional FP8 import, a note on
Gemma 2's attention, and torch's note that no CUDA runtime was found; building a model adds
Megatron-Core 0.19's notes that GPTModel and its own default CUDA-graph scope are deprecated,
and transformers' note on the `torch_dtype` keyword Bridge still passes it; `train` adds Bridge's
notes that finetune() is experimental and its own tokenizer call deprecated and, in a plain
process without a launcher, Megatron's notes that it takes rank 0 of 1; reading a checkpoint in
one process (export, score-logprobs) adds torch's notes on Megatron's calls and Megatron's on the
run config's sections it does not resolve; composing a user's YAML
adds Hydra's and multistorageclient's note that msc:// configs are not set up. None of it is
something a user can act on, and it buried the first useful line of every verb. Only these exact messages are filtered; any other warning or
log line still shows. What is not Python's passes the warning and logging filters: Gloo's "[Gloo]
Rank N is connected to ..." lines, printed by C++ on stdout (one per rank and process group on
CPU runs). Where a verb's stdout is its result, `stdout_to_stderr` drops those and Megatron's
known prints, and sends the rest to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator

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
    # (nemo_topr.utils.distributed.launcher_rank)
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
    # the default of every provider Bridge builds; device_model_settings then sets the fusion from
    # what this machine has (plan's architecture check builds one from config.json on a login node)
    "megatron.bridge.utils.fusions": r"gradient_accumulation_fusion requires either TransformerEngine",
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

# what reading a checkpoint in one process writes to stdout (export, score-logprobs): C++ and prints
HARMLESS_STDOUT_LINES = re.compile("|".join((
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks",  # torch's Gloo, per rank and process group
    r"Broadcasting config from rank 0 to all \d+ ranks",  # Megatron-Bridge reading the run's config
    r"Loading checkpoint directly from iteration directory ",  # the verbs name the checkpoint themselves
    r" > number of parameters on \(tensor, ",
    r"sharded_state_dict metadata loaded from the checkpoint: ",
)))


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


# Written on the pipe after this process's own output, so that the forwarder can say it has passed
# all of it on: a child started inside (the checkpoint writer's multiprocessing manager and its
# resource tracker, spawned by `import`) inherits descriptor 1 and keeps the pipe open for its
# life, so the pipe's end is no sign of it.
_END_OF_OURS = b"\x00nemo_topr.model.quiet: end of this process's output\x00\n"
FORWARDED_WITHIN = 10.0  # seconds: a forwarder stuck on a full stderr does not hold the verb for good


@contextlib.contextmanager
def stdout_to_stderr(environ=os.environ) -> Iterator[None]:
    """What is written to file descriptor 1 inside goes to stderr, less HARMLESS_STDOUT_LINES
    (unless NEMO_TOPR_VERBOSE=1): Python's prints and logging, and what C++ writes there (Gloo's
    lines, 24 in one CPU export), so a verb's stdout holds only its result (score-logprobs' JSON
    summary for `| jq`, export's lines) and its stderr only what a user may act on."""
    verbose = environ.get(VERBOSE_ENV) == "1"
    sys.stdout.flush()
    kept = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)

    ours_forwarded = threading.Event()

    def forward() -> None:  # until the pipe closes: what a child writes later goes on to stderr too
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if line.endswith(_END_OF_OURS):
                    line = line[:-len(_END_OF_OURS)]  # a child's unfinished line may come before it
                    ours_forwarded.set()
                if line and (verbose or not HARMLESS_STDOUT_LINES.match(line.decode("utf-8", "replace"))):
                    os.write(2, line)

    threading.Thread(target=forward, name="stdout-to-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stdout.flush()
        ctypes.CDLL(None).fflush(None)  # C stdio's buffer for descriptor 1, into the pipe
        os.write(1, _END_OF_OURS)
        os.dup2(kept, 1)
        os.close(kept)
        ours_forwarded.wait(FORWARDED_WITHIN)
