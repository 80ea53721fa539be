"""Tensor parallelism over gloo on CPU: TP=2 reproduces TP=1's per-token log-probs; a layout
the launched processes cannot hold is named before Megatron starts."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import REPO, checkout_env, run_distributed
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.scoring import check_scoring_world


@pytest.mark.slow
@pytest.mark.distributed
def test_tp2_logprobs_match_tp1(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_distributed("tp_logprobs.py", 1, "1", str(ckpt), str(tmp_path / "tp1.pt"))
    run_distributed("tp_logprobs.py", 2, "2", str(ckpt), str(tmp_path / "tp2.pt"))
    tp1 = torch.load(tmp_path / "tp1.pt")
    tp2 = torch.load(tmp_path / "tp2.pt")

    assert tp2["vocab_shard"] == tp1["vocab_shard"] // 2  # the output layer really is split
    assert torch.isfinite(tp1["token_logprobs"]).all() and (tp1["token_logprobs"] < 0).all()
    torch.testing.assert_close(tp2["token_logprobs"], tp1["token_logprobs"], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_layout_the_launched_processes_cannot_hold_is_named_before_megatron_starts(tmp_path):
    """`score-logprobs --tp 2` in one process ended in Megatron's RuntimeError traceback
    (initialize_model_parallel: world_size (1) is not divisible by 2)."""
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    def layout(tp, pp):
        return SimpleNamespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)

    check_scoring_world(layout(2, 2), 8, None)  # two TP x PP groups
    with pytest.raises(ConfigError, match=r"^--train-config llama31_70b_bf16's TP x PP = 4 x 2 = 8 ranks per model, "
                                          r"but WORLD_SIZE is 4: launch a multiple of 8 processes \(torchrun "):
        check_scoring_world(layout(4, 2), 4, "llama31_70b_bf16")
    with pytest.raises(ConfigError, match=r"^--tp x --pp must be at least 1 each; got 0 x 1$"):
        check_scoring_world(layout(0, 1), 1, None)

    model = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())
    data = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
    env = {key: value for key, value in checkout_env().items() if key not in ("WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "score-logprobs", "--model", str(model), "--data",
                           str(data), "--out", str(tmp_path / "out" / "s.jsonl"), "--device", "cpu", "--tp", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith("nemo-topr score-logprobs: --tp x --pp = 2 x 1 = 2 ranks per model, but "
                                         "WORLD_SIZE is 1: launch a multiple of 2 processes (torchrun "
                                         "--nproc_per_node 2 -m nemo_topr.cli score-logprobs ...)")
    assert not (tmp_path / "out").exists()
