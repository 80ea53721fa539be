"""The TOPR training step is invariant to the parallel layout and to packing.

* TP=2, PP=2, DP=2, TP=2 with sequence parallelism, and DP=2 x TP=2 with SP (gloo, torchrun,
  Megatron's own schedules, DDP and finalize_model_grads as in Bridge's training step) give the
  TP=PP=DP=1 loss, logged metrics, log-probs and gradients on the same weights and global batch,
  to 1e-5 relative.
* A packed batch gives the loss and gradients of the same sequences padded one per row.
* At step 0, with behaviour log-probs scored by the model itself, rho = 1.

Gradients are compared as global tensors: each layout's worker saves its gradients as a Megatron
distributed checkpoint (see tests/workers/topr_step_parallel.py), which
`dist_checkpointing.load_plain_tensors` reads back in the TP=1 layout whatever layout wrote it.
The TP=PP=DP=1 reference steps run in the test's own world of one; the layouts of each world
size run in turn in one torchrun launch (Megatron's parallel state made again for each).
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from tests.conftest import REPO, launched_runs
from tests.workers.topr_step_parallel import (
    LAYOUTS,
    MICROBATCH_LENGTHS,
    OFFSETS,
    PAD_ID,
    SEQ_LENGTH,
    VOCAB,
    build_sequences,
    sequence_logprobs,
)

if str(REPO) not in sys.path:  # bench/ is not an installed package
    sys.path.insert(0, str(REPO))

# The acceptance bound for every layout: 1e-5 relative. The objective runs in fp64 (the step's
# per-sequence tables), the model in fp32 on CPU, so what differs between layouts is the order
# of fp32 reductions (TP splits matmuls, DP sums gradients over ranks before dividing, SP
# reduce-scatters): measured differences are 1e-7 to 1e-6 (printed by the test).
RTOL = 1e-5
# Element-wise slack for gradient entries near zero: they are sums of many terms that cancel,
# so their own relative error is unbounded, while each term's rounding (fp32 eps ~6e-8, times
# reductions over up to 344 features / 128 positions / 22 sequences in a different order under
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
# TP=2 / PP=2 / DP=2 / SP / PP=2 x VP=2 vs TP=PP=DP=1 (torchrun, gloo)
# --------------------------------------------------------------------------------------------


# The layouts each torchrun launch runs in turn, by world size ("ledger": the sample ledger's
# interleaved pipeline, tested below); every other layout is one test, which names it.
LAUNCHES = {2: ("tp2", "pp2", "dp2", "tp2_sp", "pp2_vp2", "ledger"), 4: ("dp2_tp2_sp", "tp2_pp2_sp")}


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, megatron_world):
    """The directory of a layout's run: ROOT/NAME. ROOT holds the TP=PP=DP=1 reference steps of a
    2- and a 4-layer model (ROOT/reference2, ROOT/reference4, from the weights in ROOT/ckpt2 and
    ROOT/ckpt4), taken in this process's world of one, and the runs of one torchrun launch per
    world size, started when a test first needs one of its layouts. A layout the launch did not
    finish fails its test with the launch's output."""
    from tests.workers.topr_step_parallel import take_step

    root = tmp_path_factory.mktemp("topr_step")
    for layers in (2, 4):
        take_step("save", 1, 1, 1, False, 1, layers, str(root / f"ckpt{layers}"), str(root / f"reference{layers}"))
    return launched_runs("topr_step_parallel.py", root, LAUNCHES)


def _load_run(out_dir):
    from megatron.core import dist_checkpointing

    return torch.load(out_dir / "result.pt"), dist_checkpointing.load_plain_tensors(str(out_dir / "grads"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2", "tp2_sp", "dp2_tp2_sp", "tp2_pp2_sp"])
def test_parallel_layout_gives_the_reference_loss_metrics_and_gradients(layout_runs, layout):
    tp, pp, dp, sp, vp, layers = LAYOUTS[layout]
    _check_layout_against_reference(layout_runs(layout), (tp, pp, dp, sp, vp), layers)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_interleaved_pipeline_gives_the_reference_loss_metrics_and_gradients(layout_runs):
    """PP=2 with VP=2 chunks per rank, the 70B preset's kind of layout (conf/llama31_70b_bf16.yaml:
    PP=4, VP=5): Megatron's interleaved schedule, one data iterator per chunk as Bridge's loop
    gives them. A 4-layer model, one layer per chunk, against its TP=PP=DP=1 step."""
    assert LAYOUTS["pp2_vp2"] == (1, 2, 1, False, 2, 4)
    _check_layout_against_reference(layout_runs("pp2_vp2"), (1, 2, 1, False, 2), layers=4)


def _check_layout_against_reference(run, split: tuple, layers: int) -> None:
    """The run in `run` (ROOT/LAYOUT) took the step of the `layers`-layer reference (ROOT/reference{layers}):
    same loss per micro-batch, metrics and gradients, and the layout really was `split` (TP, PP, DP, SP, VP)."""
    tp, pp, dp, sp, vp = split
    layout = run.name
    ref, ref_grads = _load_run(run.parent / f"reference{layers}")
    got, grads = _load_run(run)

    # The reference batch is what the acceptance needs: packed, several micro-batches, and
    # negatives on both sides of the truncation (log rho > 0 -> weight 1, log rho < 0 -> rho).
    assert ref["num_rows"] < ref["num_sequences"] and len(ref["loss_pairs"]) == len(MICROBATCH_LENGTHS) == 4
    truncated, negatives = ref["metrics"]["negative_truncated_share"].tolist()
    assert 0 < truncated < negatives
    # ... and the layout really is split.
    assert (got["tp"], got["pp"], got["dp"], got["sp"], got["vp"]) == split
    if tp == 2:
        assert got["output_rows"] == ref["output_rows"] // 2  # vocab-parallel output layer
        assert got["replica_grad_max_abs_diff"] == 0.0  # TP-replicated norm weights agree across ranks
    if pp == 2:
        assert ref["local_layers"] == layers
        assert got["local_layers"] == layers // 2  # the last stage holds half the layers (in its VP chunks)
    assert got["microbatches_per_dp_rank"] == len(MICROBATCH_LENGTHS) // dp  # each DP rank its half

    # Same log-probs before the step (the sequence-parallel forward against TP=1's).
    if pp == 1:
        torch.testing.assert_close(got["logprobs"], ref["logprobs"], rtol=RTOL, atol=0)
    # Same loss: per micro-batch (sum, denominator) and the total sum / sum.
    assert torch.equal(got["loss_pairs"][:, 1], ref["loss_pairs"][:, 1])
    torch.testing.assert_close(got["loss_pairs"], ref["loss_pairs"], rtol=RTOL, atol=0)
    assert math.isclose(got["total_loss"], ref["total_loss"], rel_tol=RTOL)
    # Same logged metrics: [numerator, count] pairs summed over micro-batches and DP ranks.
    assert sorted(got["metrics"]) == sorted(ref["metrics"])
    for name, pair in ref["metrics"].items():
        torch.testing.assert_close(got["metrics"][name], pair, rtol=RTOL, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

    # Same gradients of the global-batch loss, tensor by tensor in the global layout (layers
    # stacked on axis 0).
    assert len(ref_grads) == 9  # embedding, `layers` x (norm, QKV, proj, norm, fc1, fc2), final norm, output
    for name, grad in ref_grads.items():  # every layer of every stacked tensor gets a gradient
        parts = grad.unbind(0) if name.startswith("decoder.layers.") else [grad]
        assert len(parts) in (1, layers) and all(part.abs().sum() > 0 for part in parts), name
    measured = _assert_tensors_close(grads, ref_grads, f"{layout} gradients")
    print(f"{layout}: loss rel diff {abs(got['total_loss'] / ref['total_loss'] - 1):.2e}, "
          f"max grad rel diff {max(measured.values()):.2e}")


# --------------------------------------------------------------------------------------------
# In-process (world of one): packed vs padded, step 0
# --------------------------------------------------------------------------------------------


def _tiny_model():
    from nemo_topr.model.providers import tiny_llama_provider

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


@pytest.mark.slow
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


# --------------------------------------------------------------------------------------------
# Item: whole-group baselines (AsymRE and record baselines) survive packing, micro-batches and
# data-parallel ranks
# --------------------------------------------------------------------------------------------

# prompt -> rewards of its samples, in file order. Hand-computed whole-group means: p0 7 correct
# of 8: 0.75; p1 1 of 4: -0.5; p2 alone: 1.0. One more p1 record is malformed and dropped
# (non-strict): dropped records are not trained on and do not count in the group mean.
GROUP_REWARDS = {"p0": [1, 1, -1, 1, 1, 1, 1, 1], "p1": [-1, 1, -1, -1], "p2": [1]}
GROUP_MEANS = {"p0": 0.75, "p1": -0.5, "p2": 1.0}


def _grouped_records(with_baseline: bool) -> list[dict]:
    """Records interleaved across prompts; `baseline` (when asked) is the leave-one-out mean of
    the other samples' rewards, by hand: p0 wrong answer -> 7/7 = 1, p0 right -> 5/7, ..."""
    records = []
    for k in range(max(len(r) for r in GROUP_REWARDS.values())):
        for prompt, rewards in GROUP_REWARDS.items():
            if k < len(rewards):
                record = {"prompt": f"Question {prompt}: what is it?", "prompt_id": prompt,
                          "completion": f"The answer is {k} because {prompt} says so.", "reward": rewards[k],
                          "behavior_logprob": -1000.0}  # log rho = s - log mu > 0: TOPR weight 1
                if with_baseline:
                    others = rewards[:k] + rewards[k + 1:]
                    record["baseline"] = sum(others) / len(others) if others else 0.0
                records.append(record)
    records.insert(3, {"prompt": "Question p1: what is it?", "prompt_id": "p1", "completion": "x",
                       "reward": "wrong type", "behavior_logprob": -1.0})  # dropped in non-strict mode
    return records


def _provider_batches(tmp_path, records, dp_size=2, **dataset):
    """Batches exactly as Bridge hands them to each DP rank: ToprDatasetConfig.prepare (whole
    dataset), Bridge's MegatronPretrainingSampler (micro-batch of 1 row per DP rank), collate.
    `dataset`: more of ToprDatasetConfig's settings. Returns the batches, the prompt keys, the
    sequences by sample id and the PreparedData."""
    import json

    from megatron.bridge.data.samplers import MegatronPretrainingSampler

    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.data import ToprDatasetConfig

    tokenizer_dir = tmp_path / "tokenizer"
    build_tiny_tokenizer(tokenizer_dir)
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    provider = ToprDatasetConfig(train_path=str(data), tokenizer_dir=str(tokenizer_dir), seq_length=128,
                                 strict=False, shuffle_seed=3, **dataset)
    prepared = provider.prepare(global_batch_size=dp_size)
    assert prepared.dataset.report.dropped == {"wrong_type": 1}
    dataset = provider.build_datasets(None)[0]
    keys = prepared.dataset.prompt_keys
    batches = {}  # (dp_rank, micro-batch) -> batch
    for rank in range(dp_size):
        sampler = MegatronPretrainingSampler(len(dataset), 0, 1, rank, dp_size)
        for step, rows in enumerate(sampler):
            batches[rank, step] = dataset.collate_fn([dataset[i] for i in rows])
    return batches, keys, {seq.sample_id: seq for seq in prepared.dataset.sequences}, prepared


@pytest.mark.slow
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_prepared_data_trains_on_the_in_memory_rows_batches_ledger_and_losses(tmp_path, megatron_world, packed):
    """A prepared set, written then found again, gives what the in-memory path gives: the rows
    (against `pack_sequences` and the per-epoch shuffle, recomputed here), every micro-batch of
    every DP rank bit for bit (so the ledger's sample ids), the run fingerprint and the tiny
    model's loss on each micro-batch."""
    import random

    from nemo_topr.data.packing import pack_sequences

    records = _grouped_records(with_baseline=False)
    memory, keys, seqs, in_memory = _provider_batches(tmp_path, records, epochs=2, packed=packed)
    for attempt in ("written", "found"):
        batches, prepared_keys, _, prepared = _provider_batches(tmp_path, records, epochs=2, packed=packed,
                                                                prepared_dir=str(tmp_path / "sets"))
        assert prepared.written is (attempt == "written")
    epoch = pack_sequences(in_memory.dataset.sequences, 128, 0) if packed else [[i] for i in range(13)]
    rows = []
    for seed in (3, 4):  # shuffle_seed + epoch
        shuffled = list(epoch)
        random.Random(seed).shuffle(shuffled)
        rows += shuffled
    rows += [[]] * (-len(rows) % 2)
    assert list(in_memory.rows) == list(prepared.rows) == rows
    assert prepared_keys == keys and prepared.summary() | {"prepared_set": None, "prepared_set_written": None} == \
        in_memory.summary() | {"prepared_set": None, "prepared_set_written": None}
    assert prepared.data_fingerprint() == in_memory.data_fingerprint()
    assert batches.keys() == memory.keys() and len(memory) == len(rows)  # one row a micro-batch
    model = _tiny_model()
    for where, batch in memory.items():
        assert batch.keys() == batches[where].keys()
        for name, tensor in batch.items():
            assert tensor.dtype == batches[where][name].dtype and torch.equal(
                tensor.nan_to_num(-7.0), batches[where][name].nan_to_num(-7.0)), (where, name)
        if len(batch["rewards"]):
            loss, _ = _loss_and_grads(model, batch)
            assert loss == _loss_and_grads(model, batches[where])[0], where
    ledger = sorted(i for batch in batches.values() for i in batch["sample_ids"].tolist())
    assert ledger == sorted(2 * [seq for seq in seqs])  # every used record once an epoch


def _token_ce(batch) -> torch.Tensor:
    """Per-token CE that differs per token and so per sequence: 0.5 + (predicted token id) / 1000."""
    return 0.5 + batch["labels"].to(torch.float64) / 1000


def _completion_ce_mean(seq) -> float:
    """-s_i / n_i under `_token_ce`, from the sequence's own tokens (not from the batch layout)."""
    completion = [0.5 + token / 1000 for token, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m]
    return math.fsum(completion) / len(completion)


@pytest.mark.guards_baselines
def test_whole_group_baselines_survive_rows_microbatches_and_dp_ranks(tmp_path, megatron_world):
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, topr_loss

    batches, keys, seqs, _ = _provider_batches(tmp_path, _grouped_records(with_baseline=False))
    # the split this test is about: p0's samples sit in several rows, micro-batches and both DP ranks
    where = {}
    for (rank, step), batch in batches.items():
        for prompt_id in batch["prompt_ids"].tolist():
            where.setdefault(keys[prompt_id], set()).add((rank, step))
    assert len(where["p0"]) >= 3 and {rank for rank, _ in where["p0"]} == {0, 1}
    assert sum(len(b["rewards"]) for b in batches.values()) == 13  # every used record once

    asymre = ObjectiveConfig(variant="asymre")
    for batch in batches.values():
        expected_means = [GROUP_MEANS[keys[p]] for p in batch["prompt_ids"].tolist()]
        assert batch["group_mean_rewards"].tolist() == expected_means  # exact: no rounding beyond float64
        summary = check_batch(batch, asymre)
        if summary.num_sequences == 0:
            continue
        # asymre's weights are 1, so loss_sum = sum_i (R_i - c_i) (-s_i / n_i) with c_i = whole-group
        # mean + deltaV (= -0.1); -s_i / n_i differs per sequence, so a misattributed one shows
        loss_sum, denominator, _ = topr_loss(_token_ce(batch), batch, asymre, summary)
        expected = math.fsum((r - (m - 0.1)) * _completion_ce_mean(seqs[i]) for r, m, i in
                             zip(batch["rewards"].tolist(), expected_means, batch["sample_ids"].tolist(), strict=True))
        assert int(denominator) == summary.num_sequences
        assert math.isclose(loss_sum.item(), expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.guards_baselines
@pytest.mark.parametrize("variant, delta_v", [("topr", 0.0), ("asymre", -0.1)])
def test_record_baselines_take_precedence_over_group_means(tmp_path, megatron_world, variant, delta_v):
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch, topr_loss

    batches, keys, seqs, _ = _provider_batches(tmp_path, _grouped_records(with_baseline=True))
    objective = ObjectiveConfig(variant=variant)
    seen = 0
    for batch in batches.values():
        summary = check_batch(batch, objective)
        if summary.num_sequences == 0:
            continue
        assert summary.record_baselines
        loss_sum, _, _ = topr_loss(_token_ce(batch), batch, objective, summary)
        # every weight is 1 (asymre; TOPR with log rho > 0), so loss_sum = sum_i (R_i - b_i - deltaV) (-s_i / n_i)
        expected = math.fsum((r - b - delta_v) * _completion_ce_mean(seqs[i]) for r, b, i in
                             zip(batch["rewards"].tolist(), batch["baselines"].tolist(), batch["sample_ids"].tolist(),
                                 strict=True))
        assert math.isclose(loss_sum.item(), expected, rel_tol=1e-12, abs_tol=1e-12)
        seen += summary.num_sequences
    assert seen == 13
    # the hand-computed leave-one-out value of p0's only wrong answer: its 7 siblings are all correct
    baselines = {(keys[p], r): b for batch in batches.values()
                 for p, r, b in zip(batch["prompt_ids"].tolist(), batch["rewards"].tolist(), batch["baselines"].tolist())}
    assert baselines["p0", -1.0] == 1.0 and baselines["p2", 1.0] == 0.0


def test_host_check_names_the_samples_of_a_bad_batch():
    from nemo_topr.data.packing import collate_padded
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import BatchError, check_batch

    seqs = build_sequences([20, 30, 25], seed=1)  # no behaviour log-probs, no group means
    batch = collate_padded(seqs, range(3), SEQ_LENGTH, PAD_ID)
    def refusal(objective: ObjectiveConfig) -> tuple[str, str]:
        with pytest.raises(BatchError) as refused:
            check_batch(batch, objective)
        return refused.value.key, refused.value.where

    assert refusal(ObjectiveConfig()) == ("record.behavior_logprob.missing",
                                          "sample_ids [0, 1, 2] (3 of 3): behavior_logprob")
    batch["behavior_logprobs"] = torch.full((3,), -5.0, dtype=torch.float64)
    assert refusal(ObjectiveConfig(variant="asymre")) == ("record.group_mean_reward.missing_for_asymre",
                                                          "sample_ids [0, 1, 2] (3 of 3): group_mean_reward")
    batch["baselines"] = torch.tensor([0.5, math.nan, 0.1], dtype=torch.float64)
    assert refusal(ObjectiveConfig()) == ("record.baseline.on_some_records", "sample_ids [1] (1 of 3): baseline")
    batch["baselines"] = torch.tensor([0.5, 0.2, 0.1], dtype=torch.float64)
    assert refusal(ObjectiveConfig(baseline=0.3)) == ("objective.baseline.with_record_baselines", "objective.baseline")
    assert check_batch(batch, ObjectiveConfig()).record_baselines


# --------------------------------------------------------------------------------------------
# Item: host-device synchronisations in the loss, counted on CPU (bench/syncs.py)
# --------------------------------------------------------------------------------------------


def test_sync_counter_counts_what_would_synchronise_a_gpu():
    from bench.syncs import SyncCounter

    x, index = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0, 2])
    counter = SyncCounter()
    with counter:
        x.sum().item()  # read back
        _ = x[x > 0]  # boolean mask: the output size depends on the values
        if x.any():  # __bool__
            pass
        torch.tensor([1.0, 2.0])  # Python data copied to the device
        torch.nonzero(x)
        y = x * 2 + x.abs().max()  # device-only work: not counted
        z = x[index]  # indexing with a long tensor of a known size: no sync either
    assert counter.total == 5, counter.calls
    assert y.shape == (3,) and z.shape == (2,)


def test_topr_loss_makes_at_most_one_sync_more_than_bridges_sft_loss(megatron_world):
    """Counted by the same SyncCounter on forward + backward of each loss alone. Bridge's SFT loss
    makes 2 per micro-batch: its NaN and Inf checks (`if rejection_func(result)`,
    megatron/bridge/training/losses.py:73-86 via megatron/core/rerun_state_machine.py), the
    count bench/results/gpu_h100_development.json measured with torch.cuda.set_sync_debug_mode."""
    from bench.syncs import count_syncs, nonfinite_check_call, sft_loss_call, topr_loss_call
    from nemo_topr.data.packing import PackedBatches
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import check_batch

    seqs = build_sequences([*MICROBATCH_LENGTHS[0], *MICROBATCH_LENGTHS[2]], seed=2,
                           behavior={k: -40.0 - k for k in range(10)})
    plan = PackedBatches(seqs, SEQ_LENGTH, 2, PAD_ID, seed=0)  # sets whole-group mean rewards
    generator = torch.Generator().manual_seed(0)
    for variant in ("topr", "asymre"):
        objective = ObjectiveConfig(variant=variant)
        microbatches = [(batch, 6 * torch.rand(batch["loss_mask"].shape, generator=generator),
                         check_batch(batch, objective)) for batch in plan]
        assert len(microbatches) >= 2
        sft = count_syncs(sft_loss_call, microbatches)
        topr = count_syncs(topr_loss_call(objective), microbatches)
        assert sft["per_microbatch"] == 2, sft
        assert topr["per_microbatch"] <= sft["per_microbatch"] + 1, topr["where"]
    # the non-finite check that replaces Bridge's per-micro-batch one runs once per iteration, on
    # the loss Bridge reduced over its micro-batches: one sync per iteration, none per micro-batch
    check = count_syncs(nonfinite_check_call, [torch.tensor(0.5)])
    assert check["total"] == 1 and all("training/nonfinite.py" in where for where in check["where"]), check


# --------------------------------------------------------------------------------------------
# Item: the sample ledger has one line per micro-batch and DP rank, whatever the virtual pipeline
# --------------------------------------------------------------------------------------------


@pytest.mark.guards_sample_ledger
def test_sample_ledger_has_one_line_per_microbatch_with_virtual_pipeline(tmp_path, megatron_world):
    """Megatron's interleaved schedule runs every micro-batch through every model chunk of a
    pipeline rank, in the order of `get_schedule_table` (core/pipeline_parallel/schedules.py:962),
    calling ``forward_step_func(data_iterator[model_chunk_id], model[model_chunk_id])``
    (schedules.py:1366-1369); each chunk is a GPTModel whose `vp_stage` is its chunk id. The
    chunks here are stand-ins exposing just that attribute; the step logs before any forward."""
    import json

    from megatron.core.pipeline_parallel.schedules import get_schedule_table

    from nemo_topr.data.packing import collate_padded
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    num_microbatches, num_chunks = 4, 2  # e.g. PP=2, VP=2: groups of PP micro-batches
    seqs = build_sequences([10] * num_microbatches, seed=4)
    batches = [collate_padded(seqs, [m], SEQ_LENGTH, PAD_ID) for m in range(num_microbatches)]
    chunks = [types.SimpleNamespace(vp_stage=k) for k in range(num_chunks)]
    state = types.SimpleNamespace(train_state=types.SimpleNamespace(step=7))
    step = ToprForwardStep(ObjectiveConfig(), sample_log_dir=tmp_path)
    schedule = get_schedule_table(num_microbatches, num_chunks, microbatch_group_size_per_vp_stage=2)
    assert len(schedule) == num_microbatches * num_chunks
    for microbatch, chunk in schedule:
        step._record_samples(state, batches[microbatch], chunks[chunk])
    lines = [json.loads(line) for line in (tmp_path / "samples_dp0.jsonl").read_text().splitlines()]
    assert lines == [{"iteration": 7, "sample_ids": [m]} for m in range(num_microbatches)]
    assert step.iteration_sample_ids == list(range(num_microbatches))  # what a non-finite loss names
    step._record_samples(state, batches[0], types.SimpleNamespace(vp_stage=None))  # no virtual pipeline
    assert len((tmp_path / "samples_dp0.jsonl").read_text().splitlines()) == num_microbatches + 1


@pytest.mark.slow
@pytest.mark.distributed
def test_sample_ledger_under_a_real_interleaved_pipeline(layout_runs):
    """PP=2, VP=2 on gloo: Megatron's interleaved schedule with Bridge's per-chunk iterators runs
    every micro-batch through both chunks of each pipeline rank; the ledger still has one line
    per micro-batch, in order, and the step remembers each sample once."""
    import json

    run = layout_runs("ledger")  # tests/workers/ledger_virtual_pipeline.py in the launch of 2 ranks
    first_stage = json.loads((run / "calls_pp0.json").read_text())
    expected = first_stage["expected_sample_ids"]
    for chunk in (0, 1):  # the situation of the bug: each chunk took every micro-batch
        assert [c["sample_ids"] for c in first_stage["calls"] if c["chunk"] == chunk] == expected
    lines = [json.loads(line) for line in (run / "samples_dp0.jsonl").read_text().splitlines()]
    assert lines == [{"iteration": 5, "sample_ids": ids} for ids in expected]
    # what a non-finite loss names: each of the iteration's samples once, on every pipeline rank,
    # not once per chunk
    for rank in (0, 1):
        calls = json.loads((run / f"calls_pp{rank}.json").read_text())
        assert calls["remembered_sample_ids"] == [i for ids in expected for i in ids], rank


# --------------------------------------------------------------------------------------------
# Item: a non-finite loss or gradient norm stops the run, naming the iteration and its samples
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss, grad_norm, named", [(math.inf, 1.0, "loss"), (math.nan, 1.0, "loss"),
                                                    (0.5, math.nan, "grad_norm"), (0.5, math.inf, "grad_norm")])
def test_a_non_finite_loss_or_gradient_norm_names_the_iteration_and_its_samples(loss, grad_norm, named):
    from nemo_topr.training.nonfinite import NonFiniteTrainingError, check_finite

    with pytest.raises(NonFiniteTrainingError) as stopped:
        check_finite(7, torch.tensor(loss), grad_norm, [3, 14, 15])
    assert (stopped.value.key, stopped.value.where) == (f"iteration.{named}.not_finite", "iteration 7")
    assert "[3, 14, 15]" in str(stopped.value)  # the samples it trained on
    check_finite(7, torch.tensor(0.5), 1.0, [3, 14, 15])  # finite: goes on


def test_the_step_remembers_the_sample_ids_of_the_current_iteration_only(tmp_path):
    from types import SimpleNamespace

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    step = ToprForwardStep(ObjectiveConfig())
    state = SimpleNamespace(train_state=SimpleNamespace(step=4))
    for ids in ([1, 2], [5]):  # two micro-batches of iteration 4
        step._remember_samples(state, {"sample_ids": torch.tensor(ids)})
    assert step.iteration_sample_ids == [1, 2, 5]
    state.train_state.step = 5
    step._remember_samples(state, {"sample_ids": torch.tensor([9])})
    assert step.iteration_sample_ids == [9]
