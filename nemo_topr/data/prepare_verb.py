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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nemo_topr.data.prepared import PrepareSpec

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
    prepare = verbs.add_parser("prepare", help="tokenize and pack a training config's data once, for every start",
                               description=__doc__.split("\n\n")[0] + "\n\n" + WHERE,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    prepare.add_argument("--config-name", default="topr", help="the training config, as `nemo-topr train` takes it")
    prepare.add_argument("--config-path", default=None, help="config directory (default: the repository's conf/)")
    prepare.add_argument("overrides", nargs="*", help="key=value overrides, as `nemo-topr train` takes them")
    prepare.set_defaults(run=run_prepare)


def spec_of_config(raw) -> tuple[PrepareSpec, Path]:  # noqa: ANN001
    """(what `train` with config `raw` prepares, the directory it keeps sets in), as
    `build_training_run` sets up `ToprDatasetConfig`, without importing Megatron."""
    from nemo_topr.model import source as model_source
    from nemo_topr.data.prepared import PrepareSpec  # noqa: F811 (torch loads with it)
    from nemo_topr.data.records import SOURCE_OPTIONS
    from nemo_topr.training.config import ConfigError, check_config

    values, base_model, _ = check_config(raw)
    dataset = values.get("dataset") or {}
    if not dataset.get("train_path"):
        raise ConfigError("dataset.train_path is not set")
    settings = {name: dataset[name] for name in ("seq_length", "strict", "too_long", *SOURCE_OPTIONS)
                if dataset.get(name) is not None}
    spec = PrepareSpec(train_path=str(dataset["train_path"]),
                       tokenizer_dir=str(dataset.get("tokenizer_dir") or base_model.hf_dir),
                       model_context=dataset.get("model_context") or model_source.context_length(base_model.hf_dir),
                       **settings)
    run_dir = Path(values["run_dir"]).resolve()
    return spec, Path(dataset.get("prepared_dir") or default_prepared_dir(run_dir))


def run_prepare(args: argparse.Namespace) -> int:
    from nemo_topr.data.prepared import find_or_prepare
    from nemo_topr.training.config import ConfigError, compose

    try:
        spec, prepared_dir = spec_of_config(compose(args.config_name, args.overrides, args.config_path))
    except ConfigError as error:
        raise ValueError(str(error)) from None
    prepared, written = find_or_prepare(spec, prepared_dir)
    manifest = prepared.manifest
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    print(f"{'wrote' if written else 'found'} {prepared.path}: {manifest['sequences']} sequences, "
          f"{manifest['tokens']} tokens, {size / 1e6:.1f} MB")
    if prepared.report.dropped:
        print(prepared.report.format())
    return 0
