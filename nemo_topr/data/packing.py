"""Packing tokenized sequences into fixed-length rows, and collating rows into batches.

Batch layout (the contract with the training step; a padded batch is a packed batch with one
sequence per row). R rows of L tokens, N sequences numbered in row-major order of appearance:

    tokens        long  [R, L]  input ids, pad_id in padding
    labels        long  [R, L]  the next token of the same sequence; pad_id at a sequence's last
                                position and in padding (never the next packed sequence's token)
    loss_mask     float [R, L]  1.0 where labels[r, t] is a completion token of that sequence
    position_ids  long  [R, L]  restart at 0 at each sequence start, 0 in padding
    seq_index     long  [R, L]  the sequence owning the position, -1 in padding
    seq_start     long  [N]     flat offset r * L + start of each sequence
    seq_len       long  [N]     its length in tokens
    rewards float32, behavior_logprobs float64 (NaN when absent)   [N]
    group_mean_rewards float64 [N]  mean reward of the sequence's whole prompt group in the dataset
                                    (`set_group_mean_rewards`; NaN when not computed)
    baselines          float64 [N]  the record's own `baseline` field (NaN when the data has none)
    prompt_ids, sample_ids, num_completion_tokens  long    [N]

Per-prompt statistics come from the whole dataset, never from the batch: packing and shuffling
scatter a prompt's samples over rows, micro-batches and data-parallel ranks.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from nemo_topr.errors import UserError


class PackingError(UserError, ValueError):
    """Sequences that cannot be packed or batched as they are (longer than a row, no completion)."""


@dataclass
class TokenizedSequence:
    """One record as tokens: prompt ids + completion ids + EOS."""

    input_ids: list[int]
    loss_mask: list[int]  # 0 on prompt tokens, 1 on completion tokens including the EOS
    reward: float
    behavior_logprob: float  # NaN when the record has none
    prompt_id: int  # dense id, see TokenizedDataset.prompt_keys
    sample_id: int  # dense id, unique within the dataset: the record's index
    baseline: float = math.nan  # the record's own `baseline` field; NaN when it has none
    group_mean_reward: float = math.nan  # set by `set_group_mean_rewards`


def set_group_mean_rewards(seqs: Sequence[TokenizedSequence]) -> None:
    """Set each sequence's `group_mean_reward`: the mean reward of all of `seqs` with its prompt_id.

    `seqs` must be the whole training set (what is trained on: records dropped by validation or
    for length are not in it and do not count). Exact sums (math.fsum), stored as float64.
    """
    means = group_mean_rewards([seq.prompt_id for seq in seqs], [seq.reward for seq in seqs])
    for seq, mean in zip(seqs, means):
        seq.group_mean_reward = mean


def group_mean_rewards(prompt_ids: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Each sequence's group mean reward (`set_group_mean_rewards`), from its columns."""
    groups: dict[int, list[float]] = {}
    for prompt_id, reward in zip(prompt_ids, rewards):
        groups.setdefault(prompt_id, []).append(reward)
    means = {prompt_id: math.fsum(values) / len(values) for prompt_id, values in groups.items()}
    return [means[prompt_id] for prompt_id in prompt_ids]


def _check_lengths(seqs: Sequence[TokenizedSequence], seq_length: int) -> None:
    too_long = [i for i, seq in enumerate(seqs) if len(seq.input_ids) > seq_length]
    if too_long:
        raise PackingError(
            f"{len(too_long)} sequences exceed seq_length {seq_length} (first: index {too_long[0]}, "
            f"{len(seqs[too_long[0]].input_ids)} tokens); validate with max_seq_length to drop or reject them",
            key="sequence.longer_than_seq_length", where="seq_length")


def pack_sequences(seqs: Sequence[TokenizedSequence], seq_length: int, pad_id: int) -> list[list[int]]:
    """Rows of sequence indices, each row's lengths summing to at most `seq_length`.

    Best-fit decreasing (at least as tight as first-fit decreasing): longest sequence first,
    each into the fullest row that still has room. Deterministic: ties go by index. `pad_id`
    plays no part (lengths decide); it keeps the signature of the collate functions.
    """
    _check_lengths(seqs, seq_length)
    return best_fit_rows([len(seq.input_ids) for seq in seqs], seq_length)


def best_fit_rows(lengths: Sequence[int], seq_length: int) -> list[list[int]]:
    """`pack_sequences` on the sequences' lengths alone."""
    rows: list[list[int]] = []
    room_and_row: list[tuple[int, int]] = []  # rows with free space, sorted by free space
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = bisect.bisect_left(room_and_row, (lengths[i], -1))
        if slot < len(room_and_row):
            room, row = room_and_row.pop(slot)
        else:
            room, row = seq_length, len(rows)
            rows.append([])
        rows[row].append(i)
        if room > lengths[i]:
            bisect.insort(room_and_row, (room - lengths[i], row))
    return rows


def padding_share(seqs: Sequence[TokenizedSequence], rows: Sequence[Sequence[int]], seq_length: int) -> float:
    """Share of the rows' positions that hold padding."""
    used = sum(len(seqs[i].input_ids) for row in rows for i in row)
    return 1.0 - used / (len(rows) * seq_length) if rows else 0.0


def padding_rows(num_rows: int, seq_length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """The per-position tensors of the layout, all padding."""
    shape = (num_rows, seq_length)
    return {
        "tokens": torch.full(shape, pad_id, dtype=torch.long),
        "labels": torch.full(shape, pad_id, dtype=torch.long),
        "loss_mask": torch.zeros(shape, dtype=torch.float32),
        "position_ids": torch.zeros(shape, dtype=torch.long),
        "seq_index": torch.full(shape, -1, dtype=torch.long),
    }


def collate_packed(
    seqs: Sequence[TokenizedSequence], rows: Sequence[Sequence[int]], seq_length: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """One batch in the layout of the module docstring; `rows` from `pack_sequences`."""
    batch = padding_rows(len(rows), seq_length, pad_id)
    seq_start, seq_len, members = [], [], []
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            seq = seqs[i]
            n, end = len(seq.input_ids), start + len(seq.input_ids)
            if end > seq_length:
                raise ValueError(f"row {r} holds {end} tokens > seq_length {seq_length}")
            if seq.loss_mask[0]:  # the shifted mask drops position 0, so it must be a prompt token
                raise ValueError(f"sequence {i} starts with a completion token; it needs a prompt token first")
            ids = torch.tensor(seq.input_ids, dtype=torch.long)
            batch["tokens"][r, start:end] = ids
            batch["labels"][r, start : end - 1] = ids[1:]
            batch["loss_mask"][r, start : end - 1] = torch.tensor(seq.loss_mask[1:], dtype=torch.float32)
            batch["position_ids"][r, start:end] = torch.arange(n)
            batch["seq_index"][r, start:end] = len(members)
            seq_start.append(r * seq_length + start)
            seq_len.append(n)
            members.append(seq)
            start = end
    num_completion_tokens = [sum(seq.loss_mask) for seq in members]
    if 0 in num_completion_tokens:
        raise ValueError("every sequence needs at least one completion token")
    batch.update(
        seq_start=torch.tensor(seq_start, dtype=torch.long),
        seq_len=torch.tensor(seq_len, dtype=torch.long),
        **sequence_columns(members),
        num_completion_tokens=torch.tensor(num_completion_tokens, dtype=torch.long),
    )
    return batch


def sequence_columns(members: Sequence[TokenizedSequence]) -> dict[str, torch.Tensor]:
    """The per-sequence columns of a batch, in the order of `members`."""
    return {
        "rewards": torch.tensor([seq.reward for seq in members], dtype=torch.float32),
        # float64: log mu of a long completion is in the hundreds, where a float32 ulp (6e-5)
        # would already move rho = exp(log pi - log mu) by that much
        "behavior_logprobs": torch.tensor([seq.behavior_logprob for seq in members], dtype=torch.float64),
        "group_mean_rewards": torch.tensor([seq.group_mean_reward for seq in members], dtype=torch.float64),
        "baselines": torch.tensor([seq.baseline for seq in members], dtype=torch.float64),
        "prompt_ids": torch.tensor([seq.prompt_id for seq in members], dtype=torch.long),
        "sample_ids": torch.tensor([seq.sample_id for seq in members], dtype=torch.long),
    }


def collate_padded(
    seqs: Sequence[TokenizedSequence], indices: Sequence[int], seq_length: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """One sequence per row, padded to `seq_length`; same layout as `collate_packed`."""
    return collate_packed(seqs, [[i] for i in indices], seq_length, pad_id)


def unpack(batch: dict[str, torch.Tensor]) -> list[TokenizedSequence]:
    """The sequences of a collated batch, in seq_index order (inverse of the collate functions)."""
    tokens = batch["tokens"].reshape(-1).tolist()
    shifted_mask = batch["loss_mask"].reshape(-1).long().tolist()
    sequences = []
    for k, (start, n) in enumerate(zip(batch["seq_start"].tolist(), batch["seq_len"].tolist())):
        sequences.append(
            TokenizedSequence(
                input_ids=tokens[start : start + n],
                loss_mask=[0] + shifted_mask[start : start + n - 1],
                reward=batch["rewards"][k].item(),
                behavior_logprob=batch["behavior_logprobs"][k].item(),
                prompt_id=int(batch["prompt_ids"][k]),
                sample_id=int(batch["sample_ids"][k]),
                baseline=batch["baselines"][k].item(),
                group_mean_reward=batch["group_mean_rewards"][k].item(),
            )
        )
    return sequences


class PackedBatches:
    """Batches of `rows_per_batch` rows over a whole dataset, deterministic given the seed.

    packed=True: rows from `pack_sequences`; packed=False: one sequence per row (padded).
    Rows are shuffled once with `seed` (when `shuffle`); the last batch may hold fewer rows.
    Indexable, so a resumed run can start at any batch. Sets every sequence's group mean reward
    over `seqs` (`set_group_mean_rewards`).
    """

    def __init__(
        self,
        seqs: Sequence[TokenizedSequence],
        seq_length: int,
        rows_per_batch: int,
        pad_id: int,
        *,
        packed: bool = True,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if rows_per_batch < 1:
            raise PackingError(f"rows_per_batch must be >= 1; got {rows_per_batch}", key="rows_per_batch.below_1",
                               where="rows_per_batch")
        _check_lengths(seqs, seq_length)
        set_group_mean_rewards(seqs)
        self.seqs, self.seq_length, self.pad_id = seqs, seq_length, pad_id
        rows = pack_sequences(seqs, seq_length, pad_id) if packed else [[i] for i in range(len(seqs))]
        if shuffle:
            random.Random(seed).shuffle(rows)
        self.padding_share = padding_share(seqs, rows, seq_length)
        self.batch_rows = [rows[b : b + rows_per_batch] for b in range(0, len(rows), rows_per_batch)]

    def __len__(self) -> int:
        return len(self.batch_rows)

    def __getitem__(self, b: int) -> dict[str, torch.Tensor]:
        return collate_packed(self.seqs, self.batch_rows[b], self.seq_length, self.pad_id)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[b] for b in range(len(self)))

    def sample_ids(self, b: int) -> list[int]:
        """sample_ids of batch `b`, in seq_index order."""
        return [self.seqs[i].sample_id for row in self.batch_rows[b] for i in row]
