"""`nemo-topr data prepare`: write a training config's prepared data set before the job runs.

    nemo-topr data prepare --config-name llama31_8b_bf16 base_model=/models/llama run_dir=runs/a \\
        dataset.train_path=/data/scored.jsonl

Prepares the set exactly as `nemo-topr train` with the same config finds it (same data files,
tokenizer, sequence length, model context, too-long policy and column mapping), so that every
rank of every start memory-maps it instead of tokenizing. Where sets live, what they cost on disk
and how to remove them: `--help`, and docs/data.md ("Prepared data sets").
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

PREPARED_DIR_ENV = "NEMO_TOPR_PREPARED_DIR"
DEFAULT_SUBDIR = "prepared_data"  # beside the run directory: RUN_DIR/../prepared_data


def default_prepared_dir(run_dir: Path) -> str:
    """Where a run keeps prepared sets unless `dataset.prepared_dir` says: $NEMO_TOPR_PREPARED_DIR,
    else prepared_data/ beside the run directory, where the runs beside it find them too."""
    return os.environ.get(PREPARED_DIR_ENV) or str(Path(run_dir).parent / DEFAULT_SUBDIR)


WHERE = f"""where sets live: dataset.prepared_dir when the config sets it, else ${PREPARED_DIR_ENV}, else
{DEFAULT_SUBDIR}/ beside the run directory (RUN_DIR/../{DEFAULT_SUBDIR}), one directory a set, named by
a hash of the data files' content, the tokenizer's files, the sequence length, the model's
context, the too-long policy and how the source is read. Put them on the shared filesystem every
node of the job reads (the run directory's is).

disk: 4 bytes a token plus about 80 bytes a sequence (token ids as uint32, one float64 or int64 a
per-sequence column, the packing), about 1.4 GB for 1 M records of 320 tokens.

remove: `rm -r PREPARED_DIR/KEY` when no job reads it (the next start prepares it again);
`.KEY.partial-*` directories are preparations that were killed, safe to remove when none runs."""


def add_prepare_parser(verbs) -> None:  # noqa: ANN001
    """`data prepare`'s options, listed by `nemo-topr data --help`. It reads a training config, so
    `nemo_topr.cli` runs it from `nemo_topr.training.prepare`, which parses them here."""
    prepare = verbs.add_parser("prepare", help="tokenize and pack a training config's data once, for every start",
                               description=__doc__.split("\n\n")[0] + "\n\n" + WHERE,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    prepare.add_argument("--config-name", default="topr", help="the training config, as `nemo-topr train` takes it")
    prepare.add_argument("--config-path", default=None, help="config directory (default: the repository's conf/)")
    prepare.add_argument("overrides", nargs="*", help="key=value overrides, as `nemo-topr train` takes them")
