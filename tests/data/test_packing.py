"""Packing and collation: the batch layout contract with the training step."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_topr.data.packing import (
    PackedBatches,
    PackingError,
    TokenizedSequence,
    collate_packed,
    collate_padded,
    pack_sequences,
    padding_share,
    unpack,
)
from nemo_topr.data.prompts import gsm8k_gold_completion, load_gsm8k
from nemo_topr.data.records import Record, RecordSet, ValidationReport
from nemo_topr.data.tokenization import tokenize_records
from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

PAD = 0


def _seq(n_prompt: int, n_completion: int, k: int, logprob: float = -1.5) -> TokenizedSequence:
    return TokenizedSequence(
        input_ids=[100 * (k + 1) + t for t in range(n_prompt + n_completion)],
        loss_mask=[0] * n_prompt + [1] * n_completion,
        reward=1.0 if k % 2 else -1.0,
        behavior_logprob=logprob,
        prompt_id=k // 2,
        sample_id=k,
    )


def _same(a: TokenizedSequence, b: TokenizedSequence) -> bool:
    both_nan = math.isnan(a.behavior_logprob) and math.isnan(b.behavior_logprob)
    return (a.input_ids, a.loss_mask, a.reward, a.prompt_id, a.sample_id) == (
        b.input_ids, b.loss_mask, b.reward, b.prompt_id, b.sample_id
    ) and (both_nan or a.behavior_logprob == b.behavior_logprob)


@pytest.mark.guards_packing
def test_collated_layout_of_two_packed_sequences():
    seqs = [_seq(2, 2, 0), _seq(1, 2, 1, logprob=math.nan)]
    batch = collate_packed(seqs, [[0, 1]], seq_length=9, pad_id=PAD)
    assert batch["tokens"].tolist() == [[100, 101, 102, 103, 200, 201, 202, PAD, PAD]]
    assert batch["labels"].tolist() == [[101, 102, 103, PAD, 201, 202, PAD, PAD, PAD]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0, 1, 1, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 0]]
    assert batch["seq_index"].tolist() == [[0, 0, 0, 0, 1, 1, 1, -1, -1]]
    assert batch["seq_start"].tolist() == [0, 4] and batch["seq_len"].tolist() == [4, 3]
    assert batch["rewards"].tolist() == [-1.0, 1.0]
    assert batch["behavior_logprobs"][0].item() == -1.5 and math.isnan(batch["behavior_logprobs"][1].item())
    assert batch["prompt_ids"].tolist() == [0, 0] and batch["sample_ids"].tolist() == [0, 1]
    assert batch["num_completion_tokens"].tolist() == [2, 2]
    assert {k: v.dtype for k, v in batch.items()} == {
        "tokens": torch.long, "labels": torch.long, "loss_mask": torch.float32, "position_ids": torch.long,
        "seq_index": torch.long, "seq_start": torch.long, "seq_len": torch.long, "rewards": torch.float32,
        "behavior_logprobs": torch.float64, "prompt_ids": torch.long, "sample_ids": torch.long,
        "num_completion_tokens": torch.long, "group_mean_rewards": torch.float64, "baselines": torch.float64,
    }


def test_padded_batches_are_packed_batches_with_one_sequence_per_row():
    seqs = [_seq(2, 2, 0), _seq(1, 2, 1)]
    padded = collate_padded(seqs, [1, 0], seq_length=5, pad_id=PAD)
    packed = collate_packed(seqs, [[1], [0]], seq_length=5, pad_id=PAD)
    assert padded.keys() == packed.keys()
    torch.testing.assert_close(padded, packed, rtol=0, atol=0, equal_nan=True)  # NaN: no baseline field
    assert padded["seq_start"].tolist() == [0, 5]


def test_empty_rows_are_all_padding():
    """Filler rows (the training provider completes the last global batch with them)."""
    seqs = [_seq(2, 2, 0)]
    batch = collate_packed(seqs, [[0], []], seq_length=6, pad_id=PAD)
    assert batch["tokens"][1].tolist() == [PAD] * 6 and batch["seq_index"][1].tolist() == [-1] * 6
    assert batch["loss_mask"][1].sum() == 0 and batch["seq_start"].tolist() == [0]
    only_filler = collate_packed(seqs, [[], []], seq_length=6, pad_id=PAD)
    assert only_filler["rewards"].shape == (0,) and only_filler["sample_ids"].dtype == torch.long
    assert unpack(only_filler) == []


sequence_shapes = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=40)


@pytest.mark.guards_packing
@settings(max_examples=60, deadline=None)
@given(shapes=sequence_shapes, seq_length=st.integers(40, 64), rows_per_batch=st.integers(1, 4))
def test_unpacking_returns_exactly_the_original_sequences(shapes, seq_length, rows_per_batch):
    seqs = [_seq(p, c, k, logprob=math.nan if k % 3 == 0 else -0.5 * k) for k, (p, c) in enumerate(shapes)]
    rows = pack_sequences(seqs, seq_length, PAD)
    assert sorted(i for row in rows for i in row) == list(range(len(seqs)))
    assert all(sum(len(seqs[i].input_ids) for i in row) <= seq_length for row in rows)
    for b in range(0, len(rows), rows_per_batch):
        batch_rows = rows[b : b + rows_per_batch]
        batch = collate_packed(seqs, batch_rows, seq_length, PAD)
        originals = [seqs[i] for row in batch_rows for i in row]
        unpacked = unpack(batch)
        assert len(unpacked) == len(originals) and all(map(_same, unpacked, originals))
        owner = batch["seq_index"]
        # labels stay within their sequence: a label is real only where the next position has the same owner
        same_next = torch.zeros_like(owner, dtype=torch.bool)
        same_next[:, :-1] = (owner[:, 1:] == owner[:, :-1]) & (owner[:, :-1] >= 0)
        assert torch.all(batch["labels"][~same_next] == PAD)
        assert torch.equal(batch["labels"][:, :-1][same_next[:, :-1]], batch["tokens"][:, 1:][same_next[:, :-1]])
        assert torch.all(batch["loss_mask"][~same_next] == 0)
        assert batch["num_completion_tokens"].tolist() == [sum(s.loss_mask) for s in originals]


def test_too_long_sequences_are_never_truncated():
    seqs = [_seq(5, 6, 0)]
    for pack in (lambda: pack_sequences(seqs, 10, PAD), lambda: PackedBatches(seqs, 10, 1, PAD, packed=False)):
        with pytest.raises(PackingError) as refused:
            pack()
        assert (refused.value.key, refused.value.where) == ("sequence.longer_than_seq_length", "seq_length")


def test_sequences_must_start_with_a_prompt_token():
    with pytest.raises(ValueError, match="starts with a completion token"):
        collate_packed([_seq(0, 3, 0)], [[0]], 8, PAD)


@pytest.fixture(scope="module")
def gsm8k_sequences():
    """Real GSM8K train question + gold answer, tokenized by the pipeline with the tiny tokenizer."""
    rows = load_gsm8k("train")
    records = [
        Record(prompt=f"Question: {row['question']}\nAnswer:", completion=gsm8k_gold_completion(row["answer"]), reward=1.0, index=i)
        for i, row in enumerate(rows)
    ]
    report = ValidationReport(records_in=len(records), records_used=len(records))
    return tokenize_records(RecordSet(records, report), build_tiny_tokenizer(chat_template=False)).sequences


@pytest.mark.slow
def test_padding_share_on_gsm8k_at_2048_is_at_most_3_percent(gsm8k_sequences):
    rows = pack_sequences(gsm8k_sequences, 2048, PAD)
    share = padding_share(gsm8k_sequences, rows, 2048)
    print(f"GSM8K train ({len(gsm8k_sequences)} sequences) at 2048: {len(rows)} rows, padding share {share:.2%}")
    assert share <= 0.03


def test_packed_batches_are_deterministic_and_cover_every_sample_once(gsm8k_sequences):
    seqs = gsm8k_sequences[:300]
    batches = PackedBatches(seqs, 1024, rows_per_batch=4, pad_id=PAD, seed=7)
    again = PackedBatches(seqs, 1024, rows_per_batch=4, pad_id=PAD, seed=7)
    other = PackedBatches(seqs, 1024, rows_per_batch=4, pad_id=PAD, seed=8)
    ids = [batches.sample_ids(b) for b in range(len(batches))]
    assert ids == [again.sample_ids(b) for b in range(len(again))]
    assert ids != [other.sample_ids(b) for b in range(len(other))]
    assert sorted(i for batch in ids for i in batch) == [s.sample_id for s in seqs]
    assert batches.padding_share == pytest.approx(1 - sum(len(s.input_ids) for s in seqs) / (sum(len(r) for r in batches.batch_rows) * 1024))
    for b, batch in enumerate(batches):
        assert batch["sample_ids"].tolist() == ids[b]
        assert batch["tokens"].shape[1] == 1024 and batch["tokens"].shape[0] <= 4
    assert torch.equal(batches[2]["tokens"], again[2]["tokens"])  # resumable: any batch by index


def test_unpacked_batches_hold_one_sequence_per_row(gsm8k_sequences):
    seqs = gsm8k_sequences[:10]
    batches = PackedBatches(seqs, 1024, rows_per_batch=4, pad_id=PAD, packed=False, shuffle=False)
    assert [batches.sample_ids(b) for b in range(len(batches))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0]["tokens"].shape == (4, 1024)
    assert batches.padding_share > 0.5
