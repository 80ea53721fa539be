"""Shared-prefix packing: the layout by hand, its mask, and exactness against the unshared layout.

Exactness (per-sequence log pi from score-logprobs' forward, the TOPR loss and its gradients,
shared vs unshared on the same weights) runs at TP=1, TP=2 and PP=2 through Megatron's own
schedule (tests/workers/shared_prefix_step.py, every case in one launch of 2 ranks). Tolerance:
1e-6 relative. The objective is fp64, the model fp32 on CPU; what differs between the layouts is
the order of fp32 reductions (different row lengths in the attention softmax sums, gradients
summed over other rows) and RoPE angles taken at the position ids rather than at row positions:
measured at most 8e-8 for log pi and the loss and 4e-7 for gradients (norm-relative, per tensor)
at TP=1, TP=2 and PP=2.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from tests.conftest import launched_runs
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_topr.data.packing import PackingError, TokenizedSequence, collate_packed
from nemo_topr.data.shared_prefix import (
    block_length,
    collate_shared,
    pack_shared,
    shared_padding_share,
    unpack_shared,
)
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.step import packed_attention_mask

PAD = 0
RTOL = 1e-6


def _seq(prompt: list[int], completion: list[int], sample_id: int, prompt_id: int = 0) -> TokenizedSequence:
    return TokenizedSequence(prompt + completion, [0] * len(prompt) + [1] * len(completion),
                             reward=1.0 if sample_id % 2 else -1.0, behavior_logprob=-1.0 - sample_id,
                             prompt_id=prompt_id, sample_id=sample_id)


def _example():
    """Prompt [1, 2, 3] with completions [4, 5] and [6]; prompt [7, 8] with completion [9, 9, 9]."""
    return [_seq([1, 2, 3], [4, 5], 0), _seq([1, 2, 3], [6], 1), _seq([7, 8], [9, 9, 9], 2, prompt_id=1)]


def test_one_row_by_hand():
    seqs = _example()
    rows = pack_shared(seqs, 12)
    assert rows == [[[0, 1], [2]]]  # the longest group first, then the single completion behind it
    batch = collate_shared(seqs, rows, 12, PAD)
    # shared [1 2] | segment [3 4 5] | segment [3 6] | today's layout of [7 8 9 9 9]
    assert batch["tokens"].tolist() == [[1, 2, 3, 4, 5, 3, 6, 7, 8, 9, 9, 9]]
    assert batch["labels"].tolist() == [[2, 3, 4, 5, PAD, 6, PAD, 8, 9, 9, 9, PAD]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3, 4]]
    assert batch["seq_index"].tolist() == [[-1, -1, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2]]
    assert batch["prefix_index"].tolist() == [[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]
    assert batch["seq_start"].tolist() == [2, 5, 7] and batch["seq_len"].tolist() == [5, 4, 5]
    assert batch["prefix_start"].tolist() == [0, 0, 7] and batch["prefix_len"].tolist() == [2, 2, 0]
    assert batch["num_completion_tokens"].tolist() == [2, 1, 3]
    assert batch["sample_ids"].tolist() == [0, 1, 2] and batch["behavior_logprobs"].tolist() == [-1.0, -2.0, -3.0]
    visible = (~packed_attention_mask(batch)[0, 0]).int().tolist()
    expected = [
        # 1  2  3  4  5  3  6  7  8  9  9  9    (key)
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 1  shared: causal among the shared part
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 2
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 3  segment of completion 0: prompt + itself
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # 4
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # 5
        [1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],  # 3  segment of completion 1: prompt, not completion 0
        [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0],  # 6
        [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],  # 7  a block of one: plain causal, nothing before it
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0],  # 8
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0],  # 9
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0],  # 9
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1],  # 9
    ]
    assert visible == expected


def test_blocks_of_one_are_todays_packed_layout():
    seqs = [_seq([1, 2, 3], [4, 5], 0), _seq([7, 8], [9, 9, 9], 1, prompt_id=1), _seq([5], [6], 2, prompt_id=2)]
    shared = collate_shared(seqs, [[[0], [1]], [[2]]], 11, PAD)
    packed = collate_packed(seqs, [[0, 1], [2]], 11, PAD)
    assert set(shared) - set(packed) == {"prefix_index", "prefix_start", "prefix_len"}
    torch.testing.assert_close({k: shared[k] for k in packed}, packed, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(packed_attention_mask(shared), packed_attention_mask(packed))
    assert shared["prefix_len"].tolist() == [0, 0, 0]


def test_unshared_batches_keep_todays_mask():
    """Without `prefix_index` the mask is the block-diagonal causal mask it always was: same
    sequence (padding counting as one) and causal, written out independently here."""
    seqs = [_seq([1, 2], [3], 0), _seq([4], [5, 6], 1), _seq([7, 8, 9], [1], 2)]
    batch = collate_packed(seqs, [[0, 1], [2]], 8, PAD)
    owner = batch["seq_index"]
    expected = torch.zeros(2, 8, 8, dtype=torch.bool)
    for r in range(2):
        for q in range(8):
            for k in range(q + 1):
                expected[r, q, k] = owner[r, q] == owner[r, k]
    assert torch.equal(~packed_attention_mask(batch)[:, 0], expected)


def test_padding_rows_attend_only_to_padding():
    seqs = _example()
    batch = collate_shared(seqs, [[[0, 1]], []], 9, PAD)
    visible = ~packed_attention_mask(batch)[:, 0]
    assert batch["seq_index"][0, 7:].tolist() == [-1, -1] and batch["prefix_index"][0, 7:].tolist() == [-1, -1]
    assert not visible[0, 7:, :7].any() and not visible[0, :7, 7:].any()  # padding and blocks never meet
    assert visible[1].equal(torch.ones(9, 9, dtype=torch.bool).tril())  # a filler row: causal padding


def test_a_group_too_large_for_a_row_is_split_with_the_prompt_repeated():
    prompt = [11, 12, 13, 14]
    seqs = [_seq(prompt, [20 + k] * 3, k) for k in range(5)]  # block: 3 + 5 * 4 = 23 positions
    rows = pack_shared(seqs, 16)
    assert rows == [[[0, 1, 2]], [[3, 4]]]  # 3 + 3 * 4 = 15 <= 16; then the rest behind a copy
    batch = collate_shared(seqs, rows, 16, PAD)
    assert batch["tokens"][1, :3].tolist() == [11, 12, 13] and batch["prefix_start"].tolist() == [0, 0, 0, 16, 16]
    assert shared_padding_share(seqs, rows, 16) == pytest.approx(1 - (15 + 11) / 32)


def test_a_group_fills_the_rest_of_a_row_split_or_whole():
    big = [_seq([1, 2, 3], [4] * 7, 0), _seq([1, 2, 3], [5] * 7, 1)]  # 2 + 8 + 8 = 18
    small = [_seq([6, 7], [8, 8], 2, prompt_id=1), _seq([6, 7], [9], 3, prompt_id=1)]  # 1 + 3 + 2 = 6
    assert pack_shared(big + small, 24) == [[[0, 1], [2, 3]]]  # exactly full: no padding
    assert shared_padding_share(big + small, [[[0, 1], [2, 3]]], 24) == 0.0
    # with 4 positions less the small group no longer fits whole: its longest completion fills
    # the rest (1 + 3 = 4), the other goes to a new row behind a copy of the prompt
    assert pack_shared(big + small, 22) == [[[0, 1], [2]], [[3]]]


def test_sequences_without_one_prompt_then_one_completion_are_refused():
    two_turns = TokenizedSequence([1, 2, 3, 4], [0, 1, 0, 1], 1.0, -1.0, 0, 7)
    with pytest.raises(PackingError) as two_completions:
        pack_shared([two_turns], 8)
    assert (two_completions.value.key, two_completions.value.where) == (
        "shared_prefix.sequence.not_prompt_then_completion", "sequence 0")
    with pytest.raises(PackingError) as too_long:
        pack_shared(_example(), 3)
    assert too_long.value.key == "sequence.longer_than_seq_length"


@settings(max_examples=40, deadline=None)
@given(groups=st.lists(st.tuples(st.integers(1, 6), st.lists(st.integers(1, 6), min_size=1, max_size=6)),
                       min_size=1, max_size=6),
       seq_length=st.integers(12, 24))
def test_every_sequence_once_rows_fit_and_unpack_inverts(groups, seq_length):
    seqs = []
    for g, (prompt_length, completions) in enumerate(groups):
        prompt = [100 * (g + 1) + t for t in range(prompt_length)]
        for n in completions:
            seqs.append(_seq(prompt, [1000 + len(seqs)] * n, len(seqs), prompt_id=g))
    rows = pack_shared(seqs, seq_length)
    order = [i for row in rows for block in row for i in block]
    assert sorted(order) == list(range(len(seqs)))
    assert all(sum(block_length(seqs, block) for block in row) <= seq_length for row in rows)
    assert all(len({seqs[i].prompt_id for i in block}) == 1 for row in rows for block in row)
    batch = collate_shared(seqs, rows, seq_length, PAD)
    for got, k in zip(unpack_shared(batch), order):
        assert (got.input_ids, got.loss_mask, got.sample_id) == (seqs[k].input_ids, seqs[k].loss_mask, k)
    # completion tokens sit at their unshared positions: label t of sequence i is token t + 1
    for k, i in enumerate(order):
        where = (batch["seq_index"] == k) & (batch["loss_mask"] > 0)
        positions, labels = batch["position_ids"][where].tolist(), batch["labels"][where].tolist()
        assert labels == [seqs[i].input_ids[t + 1] for t in positions]


def test_transformer_engine_path_without_flex_attention_refuses_shared_batches():
    from nemo_topr.training.step import forward_packed

    batch = collate_shared(_example(), [[[0, 1], [2]]], 12, PAD)
    config = types.SimpleNamespace(transformer_impl="transformer_engine")
    with pytest.raises(NotImplementedError, match="model.transformer_impl=local or FlexCoreAttention"):
        forward_packed(torch.nn.Linear(1, 1), batch, config)


def test_without_rope_at_position_ids_the_shared_layout_would_be_wrong(megatron_world, monkeypatch):
    """The control for the exactness tests: Megatron's RoPE at row positions breaks the second
    segment of a block (its distance to the prompt changes), so the position-id RoPE is needed."""
    import contextlib

    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.training import step

    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=512, seq_length=32)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0].eval()
    prompt = list(range(10, 22))
    seqs = [_seq(prompt, [30 + k, 40 + k, 50 + k], k) for k in range(3)]
    shared = collate_shared(seqs, [[[0, 1, 2]]], 32, PAD)
    packed = collate_packed(seqs, [[0], [1], [2]], 32, PAD)

    def completion_logprobs(batch):
        with torch.no_grad():
            ce = step.forward_packed(model, batch, model.config).reshape(batch["loss_mask"].shape)
        return step.sequence_table(-ce.double() * batch["loss_mask"], batch, 15).sum(-1)

    reference = completion_logprobs(packed)
    torch.testing.assert_close(completion_logprobs(shared), reference, rtol=RTOL, atol=0)
    monkeypatch.setattr(step, "rotary_at_position_ids", lambda model, ids: contextlib.nullcontext())
    wrong = completion_logprobs(shared)
    assert wrong[0] == pytest.approx(reference[0].item(), rel=RTOL)  # contiguous with its prompt: fine
    # a random tiny model barely depends on distance (measured 5e-5 relative): 10x the tolerance
    assert ((wrong[1:] - reference[1:]) / reference[1:]).abs().min() > 10 * RTOL


# every layout x attention of the exactness test, run in turn by one torchrun launch of 2 ranks
EXACTNESS_CASES = tuple(f"{layout}-{attention}" for attention in ("local", "flex") for layout in ("tp1", "tp2", "pp2"))


@pytest.fixture(scope="module")
def exactness_runs(tmp_path_factory):
    """The directory of a case's run (tests/workers/shared_prefix_step.py), all cases from one
    launch, started when a test first needs it. A case the launch did not finish fails its test
    with the launch's output."""
    return launched_runs("shared_prefix_step.py", tmp_path_factory.mktemp("shared_prefix"), {2: EXACTNESS_CASES})


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("attention", ["local", "flex"])
@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2"])
def test_shared_layout_gives_the_unshared_logprobs_loss_and_gradients(exactness_runs, layout, attention):
    """`flex`: both layouts run FlexCoreAttention (TP2 with sequence parallelism)."""
    from tests.workers.shared_prefix_step import LAYOUTS, SEQ_LENGTH, build_sequences

    tp, pp = LAYOUTS[layout]
    run = exactness_runs(f"{layout}-{attention}")
    result = torch.load(run / "result.pt", weights_only=False)
    assert (result["tp"], result["pp"]) == (tp, pp)

    # the plan holds every edge case
    seqs, rows = build_sequences(), result["shared_rows"]
    blocks = [block for row in rows for block in row]
    by_prompt = {}
    for block in blocks:
        by_prompt.setdefault(seqs[block[0]].prompt_id, []).append(block)
    assert any(len(parts) > 1 for parts in by_prompt.values())  # a group split across rows
    assert any(len(parts) == 1 and len(parts[0]) == 1 for parts in by_prompt.values())  # a single completion
    assert len({len(block) for block in blocks}) >= 3  # mixed group sizes in one batch
    full = [row for row in rows if sum(block_length(seqs, b) for b in row) == SEQ_LENGTH]
    assert full and len(full[0][-1]) > 1  # a shared block's last completion fills the rest of a row
    assert len(rows) < result["unshared_rows"]

    unshared, shared = result["logprobs"]["unshared"], result["logprobs"]["shared"]
    assert sorted(shared) == sorted(unshared) == list(range(len(seqs)))
    worst = max(abs(shared[k] - unshared[k]) / abs(unshared[k]) for k in unshared)
    assert worst <= RTOL, f"log pi differs by {worst:.2e} relative"
    assert math.isclose(result["loss_shared"], result["loss_unshared"], rel_tol=RTOL)

    grad_errors = {}
    for rank in range(tp * pp):
        for name, (expected, got) in torch.load(run / f"rank{rank}.pt").items():
            assert expected.abs().max() > 0, f"rank {rank}: {name} got no gradient"
            grad_errors[f"{rank}:{name}"] = ((got - expected).norm() / expected.norm()).item()
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())
    assert max(grad_errors.values()) <= RTOL, max(grad_errors.items(), key=lambda kv: kv[1])
    print(f"{layout} {attention}: log pi {worst:.1e}, loss {abs(result['loss_shared'] / result['loss_unshared'] - 1):.1e}, "
          f"gradients {max(grad_errors.values()):.1e} (relative)")


# --------------------------------------------------------------------------------------------
# The switches: dataset.shared_prefix (training) and score-logprobs --shared-prefix
# --------------------------------------------------------------------------------------------


def _group_records(path):
    """3 prompts with 5, 2 and 1 completions (varied lengths), as JSONL records with mu set."""
    import json

    completions = {"p0": 5, "p1": 2, "p2": 1}
    records = [{"prompt": f"Question {prompt}: how many apples are there in the basket?", "prompt_id": prompt,
                "completion": "There are " + " and ".join(["two"] * (k + 1)) + " apples.",
                "reward": 1.0 if k % 2 else -1.0, "behavior_logprob": -40.0}
               for prompt, count in completions.items() for k in range(count)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory, megatron_world):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", build_tiny_tokenizer())


def test_dataset_switch_trains_on_shared_rows(tiny_hf, tmp_path):
    from nemo_topr.training.data import ToprDatasetConfig

    data = _group_records(tmp_path / "records.jsonl")
    options = dict(train_path=str(data), tokenizer_dir=str(tiny_hf), seq_length=256, shuffle_seed=3)
    plain = ToprDatasetConfig(**options).prepare(global_batch_size=2)
    config = ToprDatasetConfig(**options, shared_prefix=True)
    prepared = config.prepare(global_batch_size=2)
    assert prepared.summary()["shared_prefix"] and not plain.summary()["shared_prefix"]
    sequences = prepared.dataset.sequences
    dataset = config.build_datasets(None)[0]
    batch = dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    assert "prefix_index" in batch and (batch["prefix_len"] > 0).any()  # some prompt really is shared
    got = {seq.sample_id: seq for seq in unpack_shared(batch)}
    assert sorted(got) == list(range(len(sequences)))
    assert all(got[seq.sample_id].input_ids == seq.input_ids for seq in sequences)
    # the group statistics are the whole dataset's, as without the switch
    assert batch["group_mean_rewards"].tolist() == [sequences[k].group_mean_reward for k in batch["sample_ids"]]
    used = int((batch["prefix_index"] >= 0).sum())
    assert used < sum(len(seq.input_ids) for seq in sequences)  # fewer tokens than unshared
    with pytest.raises(ConfigError) as unpacked:
        ToprDatasetConfig(**options, shared_prefix=True, packed=False).prepare(global_batch_size=2)
    assert (unpacked.value.key, unpacked.value.where) == ("dataset.shared_prefix.unpacked", "dataset.shared_prefix")


def test_config_puts_flex_attention_into_the_transformer_engine_spec_for_shared_prefix(tiny_hf, tmp_path):
    from megatron.core.transformer.enums import AttnBackend

    from nemo_topr.training.config import build_training_run, compose
    from nemo_topr.training.flex_attention import prepare_shared_prefix_attention

    overrides = [f"hf_model={tiny_hf}", f"run_dir={tmp_path}", "dataset.shared_prefix=true"]
    local = build_training_run(compose("tiny_cpu", overrides)).container.model
    assert not getattr(local.transformer_layer_spec, "flex_attention", False)  # the local spec keeps its attention
    te = build_training_run(compose("tiny_cpu", [*overrides, "model.transformer_impl=transformer_engine"]))
    assert te.container.model.transformer_layer_spec.flex_attention and not te.container.model.apply_rope_fusion
    unshared = build_training_run(compose("tiny_cpu", [f"hf_model={tiny_hf}", f"run_dir={tmp_path}",
                                                       "model.transformer_impl=transformer_engine"]))
    assert not getattr(unshared.container.model.transformer_layer_spec, "flex_attention", False)
    # attention_backend=local would make Bridge put DotProductAttention back under TE's layers
    provider = types.SimpleNamespace(transformer_impl="transformer_engine", attention_backend=AttnBackend.local,
                                     apply_rope_fusion=True, transformer_layer_spec=lambda config: None)
    with pytest.raises(ValueError) as refused:
        prepare_shared_prefix_attention(provider)
    assert refused.value.key == "model.attention_backend.local_under_flex"


def test_score_logprobs_switch_gives_the_same_scores(tiny_hf, tmp_path, capsys):
    import json
    import re

    from nemo_topr.training.scoring import score_logprobs

    data = _group_records(tmp_path / "records.jsonl")
    scores = {}
    for shared in (False, True):
        out = tmp_path / f"scored_{shared}.jsonl"
        summary = score_logprobs(tiny_hf, data, out, seq_length=256, rows_per_batch=1, device="cpu",
                                 shared_prefix=shared)
        assert summary["records_scored"] == 8
        # progress: the last line counts every micro-batch
        progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[nemo-topr score-logprobs]")]
        assert re.fullmatch(r"\[nemo-topr score-logprobs\] (\d+)/\1 micro-batches \(100.0%\), [\d.]+ micro-batches/s, "
                            r"done in \d+s", progress[-1]), progress
        scores[shared] = [json.loads(line)["behavior_logprob"] for line in out.read_text().splitlines()]
    assert all(s < 0 for s in scores[False])
    torch.testing.assert_close(scores[True], scores[False], rtol=RTOL, atol=0)
