"""Tensor parallelism over gloo on CPU: TP=2 reproduces TP=1's per-token log-probs."""

import pytest
import torch

from conftest import run_distributed


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
