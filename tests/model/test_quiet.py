"""Start-up noise: the known-harmless warnings and log lines are filtered in one place
(nemo_topr/model/quiet.py), everything else still shows, and NEMO_TOPR_VERBOSE=1 shows it all."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

from tests.conftest import REPO
from nemo_topr.model.quiet import quiet_known_noise


def _shown(environ: dict[str, str]) -> tuple[list[str], list[str]]:
    """(warnings shown, log messages kept) for two known-harmless and one other of each."""
    logger = logging.getLogger("megatron.bridge.utils.import_utils")
    saved_filters = list(logger.filters)
    logger.filters[:] = []  # an earlier test's in-process CLI call may have installed the filter
    kept: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            kept.append(record.getMessage())

    handler = Collect(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_known_noise(environ)
            warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning)
            warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
            warnings.warn("lr warmup is longer than the run", UserWarning)
        logger.warning("Import of FP8GlobalStateManager from megatron.core.extensions.transformer_engine failed with: ...")
        logger.warning("Import of something_else failed")
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved_filters
    return [str(w.message) for w in caught], kept


def test_only_the_known_harmless_lines_are_dropped():
    shown, kept = _shown({})
    assert shown == ["lr warmup is longer than the run"]
    assert kept == ["Import of something_else failed"]


def test_verbose_shows_everything():
    shown, kept = _shown({"NEMO_TOPR_VERBOSE": "1"})
    assert len(shown) == 3 and len(kept) == 2


@pytest.mark.parametrize("environ, shown", [({}, False), ({"NEMO_TOPR_VERBOSE": "1"}, True)])
def test_building_a_model_says_nothing_of_the_libraries_own_deprecations(megatron_world, environ, shown):
    """Every model build printed Megatron-Core 0.19's 'GPTModel IS DEPRECATED', its warning on its
    own default CUDA-graph scope ('full scope is deprecated') and transformers' note on the
    `torch_dtype` name Bridge reads: the real messages, from a real TransformerConfig, GPTModel and
    LlamaConfig."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from transformers import LlamaConfig
    from transformers.utils.logging import warning_once

    loggers = [logging.getLogger(name) for name in ("megatron.core.models.gpt.gpt_model",
                                                     "transformers.configuration_utils")]
    saved_filters, kept = [list(logger.filters) for logger in loggers], []

    class Collect(logging.Handler):
        def emit(self, record):
            kept.append(record.getMessage())

    handler = Collect(level=logging.DEBUG)
    for logger in loggers:
        logger.filters[:] = []
        logger.addHandler(handler)
    warning_once.cache_clear()  # transformers says it once per process
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_known_noise(environ)
            config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, use_cpu_initialization=True)
            GPTModel(config, get_gpt_layer_local_spec(), vocab_size=16, max_sequence_length=8)
            _ = LlamaConfig().torch_dtype  # as Bridge's model_bridge.py reads it
    finally:
        for logger, filters in zip(loggers, saved_filters):
            logger.removeHandler(handler)
            logger.filters[:] = filters
    said = [str(w.message) for w in caught] + kept
    for message in ("full scope is deprecated", "GPTModel IS DEPRECATED", "`torch_dtype` is deprecated"):
        assert any(m.startswith(message) for m in said) is shown, (message, said)


TINY_LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                     "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024}


@pytest.mark.slow  # two Bridge imports in subprocesses, ~15 s each
def test_plan_prints_no_start_up_noise_or_fusion_warning_unless_verbose(tmp_path):
    """On a user's YAML extending a preset, which also makes Hydra ask multistorageclient's
    plugin whether msc:// configs are set up (a logged traceback and a warning when not). Its
    architecture key, checked against the base model, builds a provider from the model's
    config.json, whose default gradient-accumulation fusion Bridge warns about on a machine
    without TE or Apex (a login node): a WARNING line on plan's stdout."""
    from tests.conftest import placeholder_hf_model

    model = placeholder_hf_model(tmp_path / "model", TINY_LLAMA_CONFIG)
    (tmp_path / "my_tiny.yaml").write_text(f"defaults:\n  - tiny_cpu\n  - _self_\nbase_model: {model}\n")
    command = [sys.executable, "-m", "nemo_topr.cli", "plan", str(tmp_path / "my_tiny.yaml"), "--gpus-per-node", "1",
               "model.num_layers=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fusion = "gradient_accumulation_fusion requires either TransformerEngine"
    quiet = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stdout.startswith("nemo-topr plan: my_tiny"), quiet.stderr
    assert quiet.stderr == f"nemo-topr plan: checking {tmp_path / 'my_tiny.yaml'} as train would\n"
    assert fusion not in quiet.stdout
    verbose = subprocess.run([*command[:3], "--verbose", *command[3:]], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=300)
    assert verbose.returncode == 0 and "Apex is not installed" in verbose.stderr
    assert "Import of FP8GlobalStateManager" in verbose.stderr and "MSC config source not available" in verbose.stderr
    assert fusion in verbose.stdout + verbose.stderr


STDOUT_WRITERS = r'''
import ctypes, os, sys
from nemo_topr.model.quiet import stdout_to_stderr
print("before", flush=True)
with stdout_to_stderr():
    os.write(1, b"[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0\n")
    ctypes.CDLL(None).printf(b"from C, unflushed\n")  # C stdio buffers it: a pipe is not a terminal
    print("sharded_state_dict metadata loaded from the checkpoint: {}")  # a Megatron print, buffered too
    print("a line a user may act on")
print("the result")
'''


# A child started inside holds the pipe until the parent lets it go, after the redirection; with
# no time limit on the wait, a redirection that waited for the pipe to close would never end.
HELD_BY_A_CHILD = r'''
import subprocess
from nemo_topr.model import quiet
quiet.FORWARDED_WITHIN = None
with quiet.stdout_to_stderr():
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE)  # its stdout: the pipe
    print("a line a user may act on")
    print("unfinished", end="")
print("the result", flush=True)
child.stdin.close()
child.wait()
'''


def test_a_child_holding_the_pipe_does_not_hold_the_verb():
    """A child started inside (as `import` spawns the checkpoint writer's manager) holds the pipe for
    its life: the redirection ends once this process's own output is passed on, in order."""
    proc = subprocess.run([sys.executable, "-c", HELD_BY_A_CHILD], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "the result\n"
    assert proc.stderr == "a line a user may act on\nunfinished"  # everything written inside, in order


@pytest.mark.parametrize("verbose", [False, True])
def test_a_verbs_stdout_holds_its_result_and_the_rest_goes_to_stderr_less_known_noise(verbose):
    """`score-logprobs ... | jq` failed on Gloo's 24 lines and Megatron's prints before the JSON."""
    env = {**os.environ, "NEMO_TOPR_VERBOSE": "1" if verbose else "0"}
    proc = subprocess.run([sys.executable, "-c", STDOUT_WRITERS], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before\nthe result\n"
    noise = ["[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0",
             "sharded_state_dict metadata loaded from the checkpoint: {}"]
    shown = proc.stderr.splitlines()
    assert sorted(shown) == sorted(["from C, unflushed", "a line a user may act on"] + (noise if verbose else []))
