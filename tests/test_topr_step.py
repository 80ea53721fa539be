"""The TOPR training step is invariant to the parallel layout and to packing.

* TP=2 and PP=2 (gloo, torchrun, Megatron's own schedules) give the TP=1/PP=1 loss and
  gradients on the same weights and micro-batches, to 1e-5 relative.
* A packed batch gives the loss and gradients of the same sequences padded one per row.
* At step 0, with behaviour log-probs scored by the model itself, rho = 1.

Gradients are compared as global tensors: each layout's worker saves its gradients as a Megatron
distributed checkpoint (see tests/workers/topr_step_parallel.py), which
`dist_checkpointing.load_plain_tensors` reads back in the TP=1 layout whatever layout wrote it.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import run_distributed
from workers.topr_step_parallel import (
    MICROBATCH_LENGTHS,
    OFFSETS,
    PAD_ID,
    SEQ_LENGTH,
    VOCAB,
    build_sequences,
    sequence_logprobs,
)

RTOL = 1e-5  # the acceptance bound: 1e-5 relative, fp32 on CPU
# Element-wise slack for gradient entries near zero: they are sums of many terms that cancel,
# so their own relative error is unbounded, while each term's rounding (fp32 eps ~6e-8, times
# reductions over up to 344 features / 128 positions / 17 sequences in a different order under
# TP or packing) stays ~1e-7 of the largest entry of the tensor; 1e-6 of it leaves a 5x margin
# over the worst case measured (2e-7 beyond RTOL |e|, TP=2 and packed) and is 10x tighter than RTOL.
ATOL_OF_MAX = 1e-6


def _assert_tensors_close(actual: dict, expected: dict, what: str) -> dict[str, float]:
    """Per tensor: ||a - e|| / ||e|| <= RTOL, and element-wise |a - e| <= RTOL |e| + ATOL_OF_MAX
    max|e|. Returns the measured relative norms."""
    assert sorted(actual) == sorted(expected), f"{what}: different tensors"
    measured = {}
    for name, exp in expected.items():
        act = actual[name]
        assert act.shape == exp.shape, f"{what}: {name} {tuple(act.shape)} != {tuple(exp.shape)}"
        assert torch.isfinite(exp).all() and exp.abs().max() > 0, f"{what}: reference {name} is zero or not finite"
        measured[name] = ((act - exp).norm() / exp.norm()).item()
        assert measured[name] <= RTOL, f"{what}: {name} differs by {measured[name]:.2e} relative"
        torch.testing.assert_close(act, exp, rtol=RTOL, atol=ATOL_OF_MAX * exp.abs().max().item(),
                                   msg=lambda m, name=name: f"{what}: {name}: {m}")
    return measured


# --------------------------------------------------------------------------------------------
# TP=2 / PP=2 vs TP=1, PP=1 (torchrun, gloo)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One TP=1/PP=1 run, shared by the TP=2 and PP=2 comparisons: saves the weights and the
    behaviour log-probs, then takes the step."""
    root = tmp_path_factory.mktemp("topr_step")
    run_distributed("topr_step_parallel.py", 1, "save", "1", "1", str(root / "ckpt"), str(root / "tp1_pp1"))
    return root


def _load_run(out_dir):
    from megatron.core import dist_checkpointing

    return torch.load(out_dir / "result.pt"), dist_checkpointing.load_plain_tensors(str(out_dir / "grads"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_parallel_layout_gives_tp1_pp1_loss_and_gradients(reference, megatron_world, tp, pp):
    out = reference / f"tp{tp}_pp{pp}"
    run_distributed("topr_step_parallel.py", tp * pp, "load", str(tp), str(pp), str(reference / "ckpt"), str(out))
    ref, ref_grads = _load_run(reference / "tp1_pp1")
    got, grads = _load_run(out)

    # The reference batch is what the acceptance needs: packed, several micro-batches, and
    # negatives on both sides of the truncation (log rho > 0 -> weight 1, log rho < 0 -> rho).
    assert ref["num_rows"] < ref["num_sequences"] and len(ref["loss_pairs"]) == len(MICROBATCH_LENGTHS) >= 2
    truncated, negatives = ref["metrics"]["negative_truncated_share"].tolist()
    assert 0 < truncated < negatives
    # ... and the layout really is split.
    if tp == 2:
        assert got["output_rows"] == ref["output_rows"] // 2  # vocab-parallel output layer
        assert got["replica_grad_max_abs_diff"] == 0.0  # TP-replicated norm weights agree across ranks
    if pp == 2:
        assert got["local_layers"] == ref["local_layers"] // 2  # the last stage holds half the layers

    # Same loss: per micro-batch (sum, denominator) and the total sum / sum.
    assert torch.equal(got["loss_pairs"][:, 1], ref["loss_pairs"][:, 1])
    torch.testing.assert_close(got["loss_pairs"], ref["loss_pairs"], rtol=RTOL, atol=0)
    assert math.isclose(got["total_loss"], ref["total_loss"], rel_tol=RTOL)
    assert sorted(got["metrics"]) == sorted(ref["metrics"])
    for name, pair in ref["metrics"].items():  # [numerator, count] pairs summed over micro-batches
        torch.testing.assert_close(got["metrics"][name], pair, rtol=RTOL, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

    # Same gradients, tensor by tensor in the global layout (layers stacked on axis 0).
    assert len(ref_grads) == 9  # embedding, 2 x (norm, QKV, proj, norm, fc1, fc2), final norm, output
    for name, grad in ref_grads.items():  # every layer of every stacked tensor gets a gradient
        parts = grad.unbind(0) if name.startswith("decoder.layers.") else [grad]
        assert len(parts) in (1, 2) and all(part.abs().sum() > 0 for part in parts), name
    measured = _assert_tensors_close(grads, ref_grads, f"TP={tp} PP={pp} gradients")
    print(f"TP={tp} PP={pp}: loss rel diff {abs(got['total_loss'] / ref['total_loss'] - 1):.2e}, "
          f"max grad rel diff {max(measured.values()):.2e}")


# --------------------------------------------------------------------------------------------
# In-process (world of one): packed vs padded, step 0
# --------------------------------------------------------------------------------------------


def _tiny_model():
    from nemo_topr.model import tiny_llama_provider

    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0]
    model.config.calculate_per_token_loss = True
    return model


def _scored_sequences(model, lengths, seed):
    """Sequences with behaviour log-probs = the model's own score + OFFSETS (log rho = -offset)."""
    from nemo_topr.data.packing import collate_padded

    seqs = build_sequences(lengths, seed=seed)
    batch = collate_padded(seqs, range(len(seqs)), SEQ_LENGTH, PAD_ID)
    scores = dict(zip(batch["sample_ids"].tolist(), sequence_logprobs(model, batch).tolist()))
    return seqs, scores


def _loss_and_grads(model, batch):
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, forward_packed, topr_loss

    model.zero_grad(set_to_none=True)
    ce = forward_packed(model, batch, model.config)
    loss_sum, denominator, _ = topr_loss(ce.reshape(batch["loss_mask"].shape), batch, ObjectiveConfig(),
                                         check_batch(batch, ObjectiveConfig()))
    loss_sum.backward()
    loss = (loss_sum / denominator).item()
    grads = {name: (param.grad / denominator).clone() for name, param in model.named_parameters()}
    return loss, grads


def test_packed_and_padded_batches_give_the_same_loss_and_gradients(megatron_world):
    from nemo_topr.data.packing import collate_packed, collate_padded, pack_sequences

    model = _tiny_model()
    lengths = [*MICROBATCH_LENGTHS[0], *MICROBATCH_LENGTHS[2]]
    seqs, scores = _scored_sequences(model, lengths, seed=5)
    for seq in seqs:
        seq.behavior_logprob = scores[seq.sample_id] + OFFSETS[seq.sample_id % len(OFFSETS)]
    assert {seq.reward for seq in seqs} == {1.0, -1.0}

    rows = pack_sequences(seqs, SEQ_LENGTH, PAD_ID)
    packed = collate_packed(seqs, rows, SEQ_LENGTH, PAD_ID)
    padded = collate_padded(seqs, range(len(seqs)), SEQ_LENGTH, PAD_ID)
    assert packed["tokens"].shape[0] < padded["tokens"].shape[0] == len(seqs)  # really packed
    assert max(len(row) for row in rows) >= 3  # and some row holds several sequences

    packed_loss, packed_grads = _loss_and_grads(model, packed)
    padded_loss, padded_grads = _loss_and_grads(model, padded)
    assert math.isclose(packed_loss, padded_loss, rel_tol=RTOL)
    measured = _assert_tensors_close(packed_grads, padded_grads, "packed vs padded gradients")
    print(f"packed vs padded: loss rel diff {abs(packed_loss / padded_loss - 1):.2e}, "
          f"max grad rel diff {max(measured.values()):.2e}")


def test_step_zero_with_self_scored_behaviour_has_unit_ratio(megatron_world):
    from nemo_topr.data.packing import collate_packed, pack_sequences
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    model = _tiny_model()
    seqs, scores = _scored_sequences(model, MICROBATCH_LENGTHS[1], seed=9)
    for seq in seqs:
        seq.behavior_logprob = scores[seq.sample_id]
    batch = collate_packed(seqs, pack_sequences(seqs, SEQ_LENGTH, PAD_ID), SEQ_LENGTH, PAD_ID)
    assert batch["tokens"].shape[0] < len(seqs)

    output, loss_func = ToprForwardStep(ObjectiveConfig())(None, iter([batch]), model)
    loss_sum, denominator, metrics = loss_func(output)
    max_abs_log_ratio = (metrics["log_ratio_abs_max"][0] / metrics["log_ratio_abs_max"][1]).item()
    # log mu is stored in fp32 (|log mu| ~ 300 has an ulp of 3e-5), so rho = 1 up to ~1e-5.
    assert max_abs_log_ratio < 1e-4
    weight, negatives = metrics["negative_weight_mean"].tolist()
    assert negatives > 0 and abs(weight / negatives - 1) < 1e-4
    # With every weight 1, TOPR is on-policy REINFORCE: -(1/B) sum_i R_i s_i / n_i.
    rewards = batch["rewards"].double()
    s = batch["behavior_logprobs"].double()
    n = batch["num_completion_tokens"].double()
    expected = -(rewards * s / n).mean().item()
    assert int(denominator) == len(seqs)
    assert math.isclose(loss_sum.item() / int(denominator), expected, rel_tol=1e-4)
