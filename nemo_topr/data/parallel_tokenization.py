"""A record set tokenized on every core given: chunks of records tokenized in forked worker
processes, each chunk's sequences coming back as a `SequenceTable`, taken in the records' order.

A worker runs `tokenization.tokenize_chunk` on its chunk as one process would, with prompt ids
and a list of drops of its own; the parent numbers the chunk's prompts in their order of first
appearance and replays its drops (`ValidationReport.reject`, which raises the first one strict
mode refuses), chunk after chunk. The sequences, dense prompt ids, report and refusal are
therefore those of one process tokenizing the same chunks in turn, whatever the number of
processes; a chunk's size decides only which of several refusals comes first (within a chunk the
special-token checks run before the length checks).

Workers are forked: they inherit the records and the tokenizer, a chunk is sent as its bounds,
and it comes back as a few arrays rather than Python lists of token ids.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from nemo_topr.errors import UserError
from nemo_topr.data.records import RecordSet
from nemo_topr.data.sequence_table import SequenceTable
from nemo_topr.data.tokenization import TooLong, check_tokenizable, count_used, special_token_text, tokenize_chunk

_inherited: dict[str, Any] = {}  # a worker's records, tokenizer and settings, set by `_start_worker`


def cores_given() -> int:
    """The cores this process may run on (its affinity, as Slurm and taskset set it)."""
    return len(os.sched_getaffinity(0))


def tokenized_tables(records: RecordSet, tokenizer, prompt_keys: dict[str, int], *, chunk_size: int,
                     processes: int, max_seq_length: int | None = None, strict: bool = True,
                     too_long: TooLong | None = None, model_context: int | None = None) -> Iterator[SequenceTable]:
    """The sequences of `records` (`tokenization.tokenize_records`' rules), `chunk_size` records
    at a time, in order, tokenized by up to `processes` processes. `prompt_keys` (prompt key ->
    dense prompt_id) fills as prompts first appear; the tables' group_mean_rewards are not set.
    The report's records_used is set after the last chunk, which raises when no record was kept."""
    too_long = check_tokenizable(records, tokenizer, too_long, strict)
    settings = (special_token_text(tokenizer), strict, too_long, (max_seq_length, model_context))
    count = len(records.records)
    bounds = [(start, min(start + chunk_size, count)) for start in range(0, count, chunk_size)]
    used = 0
    with _chunk_results(bounds, min(processes, len(bounds)), (records, tokenizer, settings)) as results:
        for table, chunk_keys, drops, error in results:
            for reason, drop, raised in drops:
                records.report.reject(reason, _restored(drop), raised)
            if error is not None:
                raise _restored(error)
            dense = np.asarray([prompt_keys.setdefault(key, len(prompt_keys)) for key in chunk_keys], np.int64)
            table.prompt_ids = dense[table.prompt_ids] if len(table) else table.prompt_ids
            used += len(table)
            yield table
    count_used(records.report, used)


@contextmanager
def _chunk_results(bounds: list[tuple[int, int]], processes: int, work: tuple) -> Iterator[Iterator[tuple]]:
    if processes <= 1:
        yield (_tokenized_range(chunk, *work) for chunk in bounds)
        return
    # fork: the workers share the parent's records and tokenizer as they are, nothing is sent
    with multiprocessing.get_context("fork").Pool(processes, initializer=_start_worker, initargs=work) as pool:
        yield pool.imap(_tokenized_range_in_worker, bounds)


def _start_worker(records: RecordSet, tokenizer, settings: tuple) -> None:
    # The pool ends its workers with SIGTERM. A Python handler forked from the parent (a run's
    # stop handler) would run and let a worker wait on for a task, and the pool's exit for it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # a process a core: no encoding threads of its own
    _inherited.update(records=records, tokenizer=tokenizer, settings=settings)


def _tokenized_range_in_worker(chunk: tuple[int, int]) -> tuple:
    return _tokenized_range(chunk, _inherited["records"], _inherited["tokenizer"], _inherited["settings"])


class _Drops:
    """A chunk's `ValidationReport.reject` calls, kept to be replayed in the parent."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def reject(self, reason: str, error: UserError, strict: bool) -> None:
        self.calls.append((reason, _portable(error), strict))


def _tokenized_range(chunk: tuple[int, int], records: RecordSet, tokenizer, settings: tuple) -> tuple:
    """(the chunk's table with prompt ids dense within the chunk, the chunk's prompt keys in that
    order, its drops, the user error it raised or None)."""
    pattern, strict, too_long, limits = settings
    chunk_keys: dict[str, int] = {}
    drops = _Drops()
    try:
        sequences = tokenize_chunk(records.records[chunk[0]:chunk[1]], tokenizer, chunk_keys, pattern, drops,
                                   strict=strict, too_long=too_long, limits=limits)
    except UserError as error:
        return None, [], drops.calls, _portable(error)
    return SequenceTable.from_sequences(sequences), list(chunk_keys), drops.calls, None


def _portable(error: UserError) -> tuple:
    """`error` as a worker can send it: a subclass's own __init__ (DataError's path, line, ...)
    cannot be called again from the message alone, as unpickling an exception would."""
    return type(error), str(error), dict(vars(error))


def _restored(portable: tuple) -> UserError:
    kind, message, state = portable
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error
