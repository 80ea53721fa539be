"""Tokenized sequences as flat arrays, and the training order of packed rows as arrays.

`SequenceTable` holds what `TokenizedSequence`s hold, one array per field: the token ids of all
sequences end to end, their offsets, each prompt's length (the loss mask is 0 on the prompt, 1 on
the completion and its EOS) and the per-sequence numbers. Arrays held in memory or memory-mapped
from a prepared set (`nemo_topr.data.prepared`) are read the same way, and `sequence(i)` gives
the very `TokenizedSequence` the in-memory path holds, so the collate functions of
`nemo_topr.data.packing` build the same batches from either.

`RowOrder` is the rows of all epochs in training order as arrays (the packing of one epoch, a
permutation per epoch, the filler rows): indexable as the list of rows it stands for.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import chain

import numpy as np
import torch

from nemo_topr.data.packing import TokenizedSequence, best_fit_rows

BLOCK_ROWS = 1 << 13  # rows a start reads at a time where it walks all epochs' rows (rows_digest)
TOKEN_DTYPE = np.uint32  # 4 bytes an id: any vocabulary up to 4 G entries (Llama 3: 128 k)
# the per-sequence columns: name -> dtype (float64 keeps every reward and log mu exactly as read)
COLUMNS = {"prompt_lengths": np.int32, "rewards": np.float64, "behavior_logprobs": np.float64,
           "baselines": np.float64, "group_mean_rewards": np.float64, "prompt_ids": np.int64,
           "sample_ids": np.int64}


@dataclass
class SequenceTable:
    tokens: np.ndarray  # TOKEN_DTYPE [total tokens]
    offsets: np.ndarray  # int64 [N + 1]: sequence i is tokens[offsets[i]:offsets[i + 1]]
    prompt_lengths: np.ndarray
    rewards: np.ndarray
    behavior_logprobs: np.ndarray  # NaN where the record has none
    baselines: np.ndarray  # NaN where the record has none
    group_mean_rewards: np.ndarray
    prompt_ids: np.ndarray
    sample_ids: np.ndarray

    @classmethod
    def from_sequences(cls, sequences: Sequence[TokenizedSequence]) -> SequenceTable:
        """The table of `sequences` (their group_mean_reward set already)."""
        lengths = np.fromiter((len(seq.input_ids) for seq in sequences), np.int64, len(sequences))
        offsets = np.zeros(len(sequences) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter(chain.from_iterable(seq.input_ids for seq in sequences), TOKEN_DTYPE, int(offsets[-1]))
        columns = {"prompt_lengths": [seq.loss_mask.index(1) if 1 in seq.loss_mask else len(seq.loss_mask)
                                      for seq in sequences],
                   "rewards": [seq.reward for seq in sequences],
                   "behavior_logprobs": [seq.behavior_logprob for seq in sequences],
                   "baselines": [seq.baseline for seq in sequences],
                   "group_mean_rewards": [seq.group_mean_reward for seq in sequences],
                   "prompt_ids": [seq.prompt_id for seq in sequences],
                   "sample_ids": [seq.sample_id for seq in sequences]}
        return cls(tokens, offsets, **{name: np.asarray(values, COLUMNS[name]) for name, values in columns.items()})

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sequence(self, i: int) -> TokenizedSequence:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        prompt = int(self.prompt_lengths[i])
        return TokenizedSequence(input_ids=self.tokens[start:end].tolist(),
                                 loss_mask=[0] * prompt + [1] * (end - start - prompt),
                                 reward=float(self.rewards[i]), behavior_logprob=float(self.behavior_logprobs[i]),
                                 prompt_id=int(self.prompt_ids[i]), sample_id=int(self.sample_ids[i]),
                                 baseline=float(self.baselines[i]),
                                 group_mean_reward=float(self.group_mean_rewards[i]))

    def columns(self) -> dict[str, torch.Tensor]:
        """The per-sequence columns of a batch over the whole table (`packing.sequence_columns`)."""
        return {"rewards": torch.from_numpy(np.asarray(self.rewards, np.float32)),
                "behavior_logprobs": torch.from_numpy(np.array(self.behavior_logprobs)),
                "group_mean_rewards": torch.from_numpy(np.array(self.group_mean_rewards)),
                "baselines": torch.from_numpy(np.array(self.baselines)),
                "prompt_ids": torch.from_numpy(np.array(self.prompt_ids)),
                "sample_ids": torch.from_numpy(np.array(self.sample_ids))}

    def digest(self) -> str:
        """sha256 over every array, named, in field order: the data part of the run fingerprint."""
        digest = hashlib.sha256(b"nemo-topr sequence table 1")
        for field in fields(self):
            array = np.ascontiguousarray(getattr(self, field.name))
            digest.update(f"{field.name}:{array.dtype.str}:{array.size};".encode())
            digest.update(memoryview(array).cast("B"))
        return digest.hexdigest()


class TableSequences(Sequence):
    """The table's sequences as `TokenizedSequence`s, built when indexed (a batch's few)."""

    def __init__(self, table: SequenceTable):
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):  # noqa: ANN001
        if isinstance(i, slice):
            return [self.table.sequence(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.table.sequence(i)


def pack_rows(lengths: np.ndarray, seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(row_offsets, members) of `packing.pack_sequences`' rows for sequences of these lengths:
    row r holds the sequences members[row_offsets[r]:row_offsets[r + 1]]."""
    return rows_to_arrays(best_fit_rows(lengths.tolist(), seq_length))


def rows_to_arrays(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    row_offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(row) for row in rows], out=row_offsets[1:])
    members = np.fromiter((i for row in rows for i in row), np.int64, int(row_offsets[-1]))
    return row_offsets, members


def epoch_orders(epoch_rows: int, epochs: int, seed: int) -> np.ndarray:
    """One epoch's row positions in training order, every epoch end to end: epoch e in the order
    `random.Random(seed + e).shuffle` gives a list of `epoch_rows` rows (shuffle permutes positions
    alone: the rows' values play no part)."""
    orders = []
    for epoch in range(epochs):
        order = list(range(epoch_rows))
        random.Random(seed + epoch).shuffle(order)
        orders.append(np.asarray(order, np.int64))
    return np.concatenate(orders) if orders else np.zeros(0, np.int64)


class RowOrder(Sequence):
    """The rows of all epochs, in training order, then `filler` empty rows: epoch e is the rows of
    one epoch (`row_offsets`, `members`) in the order `random.Random(seed + e).shuffle` gives a
    list of them, as `ToprDatasetConfig.prepare` shuffles."""

    def __init__(self, row_offsets: np.ndarray, members: np.ndarray, *, epochs: int, seed: int, filler: int = 0):
        self.row_offsets, self.members, self.filler = row_offsets, members, filler
        self.order = epoch_orders(len(row_offsets) - 1, epochs, seed)

    @classmethod
    def padded(cls, sequences: int, **order) -> RowOrder:
        """One sequence per row (`dataset.packed=false`)."""
        return cls(np.arange(sequences + 1, dtype=np.int64), np.arange(sequences, dtype=np.int64), **order)

    def __len__(self) -> int:
        return len(self.order) + self.filler

    def __getitem__(self, k):  # noqa: ANN001
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        if k >= len(self.order):
            return []
        row = int(self.order[k])
        return self.members[self.row_offsets[row]:self.row_offsets[row + 1]].tolist()

    def __eq__(self, other) -> bool:  # noqa: ANN001
        return isinstance(other, Sequence) and len(self) == len(other) and all(
            list(a) == list(b) for a, b in zip(self, other))

    __hash__ = None

    def epoch_rows(self) -> int:
        return len(self.row_offsets) - 1

    def ordered_sizes(self) -> Iterator[np.ndarray]:
        """Each row's size in training order (filler rows 0), `BLOCK_ROWS` rows at a time."""
        for start in range(0, len(self.order), BLOCK_ROWS):
            rows = self.order[start:start + BLOCK_ROWS]
            yield self.row_offsets[rows + 1] - self.row_offsets[rows]
        if self.filler:
            yield np.zeros(self.filler, np.int64)

    def ordered_members(self) -> Iterator[np.ndarray]:
        """The rows' members in training order, end to end, `BLOCK_ROWS` rows at a time."""
        for start in range(0, len(self.order), BLOCK_ROWS):
            rows = self.order[start:start + BLOCK_ROWS]
            begins = self.row_offsets[rows]
            sizes = self.row_offsets[rows + 1] - begins
            first = np.cumsum(sizes) - sizes  # where each row begins in this block's members
            yield self.members[np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(begins - first, sizes)]


def rows_digest(rows: Sequence) -> str:
    """sha256 of the rows in training order: each row's size, then all members (int64), for flat
    rows (a `RowOrder` or a list of lists of sequence indices); the JSON of rows of blocks
    (shared-prefix rows, `nemo_topr.data.shared_prefix`)."""
    digest = hashlib.sha256(b"nemo-topr rows 1")
    if isinstance(rows, RowOrder):  # block by block: no array as long as the data set at a start
        blocks = chain(rows.ordered_sizes(), rows.ordered_members())
    elif all(isinstance(i, int) for row in rows for i in row):
        sizes = np.asarray([len(row) for row in rows], np.int64)
        blocks = iter((sizes, np.fromiter((i for row in rows for i in row), np.int64, int(sizes.sum()))))
    else:
        import json

        digest.update(json.dumps(list(rows)).encode())
        return digest.hexdigest()
    for block in blocks:
        digest.update(block.astype("<i8").tobytes())
    return digest.hexdigest()


def padding_share_of(tokens: int, epoch_rows: int, seq_length: int) -> float:
    """Share of one epoch's `epoch_rows` rows' positions that hold padding (`packing.padding_share`),
    for `tokens` tokens in all."""
    return 1.0 - float(tokens) / (epoch_rows * seq_length) if epoch_rows else 0.0
