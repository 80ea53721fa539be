"""`nemo-topr data validate|stats --tokenizer T --max-seq-length N` through the prepared form: the
set `train` prepares for the same settings is found or written (`prepared.find_or_prepare`), and
the report's drops, packing rows and padding share, or stats' token lengths, are read from its
manifest and arrays, never from token lists held in one process.

The set is the one `train` reads where its key's parts agree (docs/data.md, "Prepared data sets"):
the same data files and tokenizer files, --max-seq-length as dataset.seq_length, --tokenizer's
model context (none for a bare tokenizer directory, whose set `train` therefore never finds), the
same too-long policy, strictness and source options.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from nemo_topr.data.prepare_verb import PREPARED_DIR_ENV
from nemo_topr.data.prepared import PreparedSet, PrepareSpec
from nemo_topr.data.records import RecordSet
from nemo_topr.data.sequence_table import padding_share_of
from nemo_topr.data.sources import HUB_PREFIX, ColumnMapping


def prepared_spec(args: argparse.Namespace, records: RecordSet, model_context: int | None) -> PrepareSpec | None:
    """The set `train` would prepare for `validate`'s or `stats`' settings, or None where the prepared form does
    not apply and `--prepared-dir` was not given: no --max-seq-length (no packing length), not one
    local data path, or records without behavior_logprob (a set holds scored records alone). With
    --prepared-dir the set is prepared whatever the data, and refused as `data prepare` refuses it."""
    if args.max_seq_length is None:
        return None
    explicit = args.prepared_dir is not None
    if not explicit and (len(args.paths) != 1 or args.paths[0].startswith(HUB_PREFIX) or not records.records
                         or records.records[0].behavior_logprob is None):
        return None
    mapping = ColumnMapping.parse(args.columns, extra_columns=args.extra_columns)  # train's config holds a dict
    return PrepareSpec(train_path=args.paths[0], tokenizer_dir=str(args.tokenizer), seq_length=args.max_seq_length,
                       strict=args.strict, too_long=args.too_long, model_context=model_context,
                       columns=mapping.columns, split=args.split, extra_columns=args.extra_columns,
                       rendered_prompts=args.rendered_prompts)


@contextmanager
def prepared_dir(option: Path | None) -> Iterator[Path]:
    """--prepared-dir, else $NEMO_TOPR_PREPARED_DIR, else a temporary directory removed on leaving."""
    chosen = option or os.environ.get(PREPARED_DIR_ENV)
    if chosen:
        yield Path(chosen)
        return
    with tempfile.TemporaryDirectory(prefix="nemo-topr-prepared-") as temporary:
        yield Path(temporary)


def packing_of(prepared: PreparedSet) -> tuple[int, float]:
    """(rows of one epoch, their share of padding positions), from the set's offsets and row offsets."""
    rows = len(prepared.row_offsets) - 1  # every sequence sits in one row
    return rows, padding_share_of(int(prepared.table.offsets[-1]), rows, prepared.manifest["key"]["seq_length"])


def token_lengths_of(prepared: PreparedSet) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, completion) token counts of each sequence, from the set's prompt lengths and offsets
    (a completion's count includes its EOS), copied out of the memory maps."""
    prompt = np.array(prepared.table.prompt_lengths, np.int64)
    return prompt, np.diff(prepared.table.offsets) - prompt
