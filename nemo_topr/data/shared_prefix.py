"""Shared-prefix packing: a prompt is computed once for all of its completions in a row.

A row holds *blocks*; a block is one prompt's shared part followed by the segments of several
of its completions (several blocks may share a row). For a prompt of P tokens and a completion
y_1..y_n (EOS included):

    shared part  prompt[:-1]                   positions 0 .. P-2
    segment      [prompt[-1], y_1, .., y_n]    positions P-1 .. P-1+n

Each segment repeats the last prompt token, so every completion's first token y_1 is predicted
from its own copy of prompt[-1] (whose attention reads the shared part and itself: exactly the
unshared computation). A segment token attends to its block's shared part and causally to its
own segment, nothing else; position ids continue from the prompt as if the completion followed
it alone (`nemo_topr.training.step.packed_attention_mask`, and RoPE at these position ids).
A block costs P - 1 + sum(n_i + 1) positions; a block of one completion is today's layout of
that sequence (P + n positions, the sequence owning all of them).

Batch layout: that of `nemo_topr.data.packing`, with these differences and additions:

    seq_index     long [R, L]  -1 on a shared part of two or more completions (no single
                               sequence owns it) as well as in padding
    prefix_index  long [R, L]  the block owning the position (numbered in the batch), -1 in padding
    seq_start     long [N]     flat offset of the sequence's own tokens (its segment; the whole
                               sequence in a block of one)
    seq_len       long [N]     the sequence's full length P + n (the width its tables need)
    prefix_start  long [N]     flat offset of its block's shared part
    prefix_len    long [N]     tokens it reads from that shared part (P - 1; 0 in a block of one)

Labels and loss mask sit on the segment positions (the copied prompt[-1] predicts y_1), so the
per-sequence tables (`sequence_table`, indexed by seq_index and position id) hold every
completion token at the same column as in the unshared layout.

Rows are lists of blocks, a block a list of sequence indices with one prompt (`pack_shared`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from nemo_topr.data.packing import PackingError, TokenizedSequence, _check_lengths, collate_packed, padding_rows

Block = list[int]  # sequence indices with one prompt, in segment order
Row = list[Block]


def prompt_length(seq: TokenizedSequence, index: int) -> int:
    """P: the tokens before the first completion token. The loss mask must be 0...0 1...1
    (one prompt, one completion) with P >= 1, else the sequence cannot share its prompt."""
    mask = seq.loss_mask
    if 1 not in mask:
        raise PackingError(f"sequence {index} (sample_id {seq.sample_id}) has no completion token",
                           key="shared_prefix.sequence.no_completion_token", where=f"sequence {index}")
    start = mask.index(1)
    if start == 0 or 0 in mask[start:]:
        raise PackingError(f"sequence {index} (sample_id {seq.sample_id}): shared-prefix packing needs a "
                           "prompt then one completion (loss mask 0...0 1...1 with at least one prompt token)",
                           key="shared_prefix.sequence.not_prompt_then_completion", where=f"sequence {index}")
    return start


def prompt_groups(seqs: Sequence[TokenizedSequence]) -> list[list[int]]:
    """Sequence indices grouped by identical prompt tokens, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, seq in enumerate(seqs):
        groups.setdefault(tuple(seq.input_ids[:prompt_length(seq, i)]), []).append(i)
    return list(groups.values())


def block_length(seqs: Sequence[TokenizedSequence], block: Sequence[int]) -> int:
    """Positions a block takes: P - 1 + sum(n_i + 1); len(input_ids) for a block of one."""
    prompt = prompt_length(seqs[block[0]], block[0])
    return prompt - 1 + sum(len(seqs[i].input_ids) - prompt + 1 for i in block)


def pack_shared(seqs: Sequence[TokenizedSequence], seq_length: int) -> list[Row]:
    """Rows of blocks, each row's blocks summing to at most `seq_length` positions.

    Groups go longest first (ties by first index), completions within a group longest first.
    A group that fits whole in an open row goes to the fullest such row (best fit). One that
    does not is split: the open row with the most room takes as many of its completions as fit
    behind a copy of the prompt (first fit, longest first), or a new row does when no open row
    can take the prompt and one completion; the rest of the group goes round again. Padding is
    thus left only where no remaining completion fits behind its prompt; each split repeats the
    prompt once. Deterministic.
    """
    _check_lengths(seqs, seq_length)
    groups = [sorted(group, key=lambda i: (-len(seqs[i].input_ids), i)) for group in prompt_groups(seqs)]
    groups.sort(key=lambda group: (-block_length(seqs, group), min(group)))
    rows: list[Row] = []
    room_and_row: list[tuple[int, int]] = []  # open rows by free space

    def place(block: Block, slot: int | None) -> None:
        if slot is None:
            room, row = seq_length, len(rows)
            rows.append([])
        else:
            room, row = room_and_row.pop(slot)
        rows[row].append(block)
        room -= block_length(seqs, block)
        if room > 0:
            bisect.insort(room_and_row, (room, row))

    for group in groups:
        remaining = group
        while remaining:
            need = block_length(seqs, remaining)
            slot = bisect.bisect_left(room_and_row, (need, -1))
            if slot < len(room_and_row):  # fits whole: best fit
                place(remaining, slot)
                break
            slot = len(room_and_row) - 1 if room_and_row else None
            room = room_and_row[slot][0] if slot is not None else seq_length
            part = _fill(seqs, remaining, room)
            if not part:  # not even the prompt and one completion fit the roomiest row
                slot, part = None, _fill(seqs, remaining, seq_length)
            place(part, slot)
            taken = set(part)
            remaining = [i for i in remaining if i not in taken]
    return rows


def _fill(seqs: Sequence[TokenizedSequence], members: Sequence[int], room: int) -> Block:
    """First fit, in the given (longest first) order, of members behind one prompt copy."""
    prompt = prompt_length(seqs[members[0]], members[0])
    used, block = prompt - 1, []
    for i in members:
        segment = len(seqs[i].input_ids) - prompt + 1
        if used + segment <= room:
            block.append(i)
            used += segment
    return block


def shared_padding_share(seqs: Sequence[TokenizedSequence], rows: Sequence[Row], seq_length: int) -> float:
    """Share of the rows' positions that hold padding."""
    used = sum(block_length(seqs, block) for row in rows for block in row)
    return 1.0 - used / (len(rows) * seq_length) if rows else 0.0


def shared_positions(seqs: Sequence[TokenizedSequence], rows: Sequence[Row]) -> int:
    """Positions the blocks of `rows` hold (tokens the model processes, padding excluded)."""
    return sum(block_length(seqs, block) for row in rows for block in row)


def collate_shared(seqs: Sequence[TokenizedSequence], rows: Sequence[Row], seq_length: int,
                   pad_id: int) -> dict[str, torch.Tensor]:
    """One batch in the layout of the module docstring; `rows` from `pack_shared`.

    Built as `collate_packed` of the same sequences in block order (which fixes every
    per-sequence column, dtypes and checks), then laid out in blocks."""
    order = [i for row in rows for block in row for i in block]
    flat = collate_packed(seqs, [[i] for i in order], max((len(seqs[i].input_ids) for i in order), default=1),
                          pad_id)
    batch = padding_rows(len(rows), seq_length, pad_id)
    batch["prefix_index"] = torch.full((len(rows), seq_length), -1, dtype=torch.long)
    seq_start, prefix_start, prefix_len = [], [], []
    k = b = 0  # sequence number (= row of `flat`), block number

    def put(r: int, start: int, source: int, first: int, last: int, owner: int) -> int:
        """Copy positions first..last-1 of sequence `source` (a row of `flat`) to row r at start."""
        end = start + last - first
        if end > seq_length:
            raise ValueError(f"row {r} holds more than seq_length {seq_length} tokens")
        for name in ("tokens", "labels", "loss_mask", "position_ids"):
            batch[name][r, start:end] = flat[name][source, first:last]
        batch["seq_index"][r, start:end] = owner
        batch["prefix_index"][r, start:end] = b
        return end

    for r, row in enumerate(rows):
        start = 0
        for block in row:
            if len(block) == 1:  # today's layout: the sequence owns its prompt
                seq_start.append(r * seq_length + start)
                prefix_start.append(r * seq_length + start)
                prefix_len.append(0)
                start = put(r, start, k, 0, len(seqs[block[0]].input_ids), k)
                k, b = k + 1, b + 1
                continue
            prompt = prompt_length(seqs[block[0]], block[0])
            shared_start = r * seq_length + start
            start = put(r, start, k, 0, prompt - 1, -1)
            for i in block:
                if seqs[i].input_ids[:prompt] != seqs[block[0]].input_ids[:prompt]:
                    raise ValueError(f"row {r}: sequences {block[0]} and {i} share a block but not a prompt")
                seq_start.append(r * seq_length + start)
                prefix_start.append(shared_start)
                prefix_len.append(prompt - 1)
                start = put(r, start, k, prompt - 1, len(seqs[i].input_ids), k)
                k += 1
            b += 1
    per_sequence = {name: value for name, value in flat.items() if name not in batch}
    per_sequence["seq_start"] = torch.tensor(seq_start, dtype=torch.long)
    return {**batch, **per_sequence, "prefix_start": torch.tensor(prefix_start, dtype=torch.long),
            "prefix_len": torch.tensor(prefix_len, dtype=torch.long)}


def unpack_shared(batch: dict[str, torch.Tensor]) -> list[TokenizedSequence]:
    """The sequences of a shared-prefix batch, in seq_index order (inverse of `collate_shared`)."""
    tokens = batch["tokens"].reshape(-1).tolist()
    shifted = batch["loss_mask"].reshape(-1).long().tolist()
    sequences = []
    columns = zip(batch["seq_start"].tolist(), batch["seq_len"].tolist(), batch["prefix_start"].tolist(),
                  batch["prefix_len"].tolist())
    for k, (start, n, shared, p) in enumerate(columns):
        own = n - p
        sequences.append(TokenizedSequence(
            input_ids=tokens[shared:shared + p] + tokens[start:start + own],
            loss_mask=[0] + [0] * p + shifted[start:start + own - 1],  # a shared part holds no loss
            reward=batch["rewards"][k].item(), behavior_logprob=batch["behavior_logprobs"][k].item(),
            prompt_id=int(batch["prompt_ids"][k]), sample_id=int(batch["sample_ids"][k]),
            baseline=batch["baselines"][k].item(), group_mean_reward=batch["group_mean_rewards"][k].item()))
    return sequences
