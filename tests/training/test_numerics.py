"""Numerics through the real model and step: extreme behaviour log-probs, all-negative
batches and long completions keep the TOPR loss and gradients finite, and the telemetry shows
the extremes."""

from __future__ import annotations

import pytest
import torch

from tests.workers.topr_step_parallel import PAD_ID, VOCAB, build_sequences, sequence_logprobs


@pytest.fixture(scope="module")
def model(megatron_world):
    from nemo_topr.model.providers import tiny_llama_provider

    torch.manual_seed(0)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=1024)
    provider.finalize()
    return provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0]


def _collate(seqs, seq_length):
    from nemo_topr.data.packing import collate_packed, pack_sequences

    return collate_packed(seqs, pack_sequences(seqs, seq_length, PAD_ID), seq_length, PAD_ID)


def _score_with_model(model, seqs, seq_length) -> None:
    """behavior_logprob := the model's own log-likelihood (rho = 1), as score-logprobs does."""
    batch = _collate(seqs, seq_length)
    scores = dict(zip(batch["sample_ids"].tolist(), sequence_logprobs(model, batch).tolist()))
    for seq in seqs:
        seq.behavior_logprob = scores[seq.sample_id]


def _loss_and_grads(model, seqs, seq_length):
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, forward_packed, topr_loss

    batch = _collate(seqs, seq_length)
    model.zero_grad(set_to_none=True)
    ce = forward_packed(model, batch, model.config).reshape(batch["loss_mask"].shape)
    loss_sum, denominator, metrics = topr_loss(ce, batch, ObjectiveConfig(), check_batch(batch, ObjectiveConfig()))
    loss_sum.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return loss_sum, denominator, metrics, grads


@pytest.mark.parametrize("case", ["extreme_behavior", "all_negative", "long_completions"])
def test_loss_and_gradients_stay_finite(model, case):
    lengths = [900, 700] if case == "long_completions" else [40, 60, 80, 50]
    seqs = build_sequences(lengths, seed=3)
    _score_with_model(model, seqs, 1024)
    if case == "extreme_behavior":  # log mu = -1e4: |log rho| ~ 1e4 (mu > 0 caps the other side)
        for seq in seqs:
            seq.behavior_logprob = -1.0e4
    if case == "all_negative":
        for seq in seqs:
            seq.reward = -1.0
    loss_sum, denominator, metrics, grads = _loss_and_grads(model, seqs, 1024)
    assert torch.isfinite(loss_sum) and int(denominator) == len(seqs)
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    log_ratio_max = metrics["log_ratio_abs_max"]  # [value, count] pairs as Bridge aggregates them
    if case == "extreme_behavior":
        assert log_ratio_max[0] > 5e3  # the telemetry shows the extreme ratio
        assert metrics["negative_truncated_share"][0] == 0.0  # rho >> 1: negatives at full weight 1
    if case == "all_negative":
        assert metrics["positive_share"][0] == 0.0 and metrics["negative_weight_mean"][1] == len(seqs)
