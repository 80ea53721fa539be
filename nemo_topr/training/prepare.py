"""`nemo-topr data prepare`'s work: the prepared data set a training config's run reads.

The command's options and help are the `data` verb's (`nemo_topr.data.prepare_verb`); it reads a
training config, so `nemo_topr.cli` runs it from here, above both.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nemo_topr.data.prepare_verb import default_prepared_dir

if TYPE_CHECKING:
    from nemo_topr.data.prepared import PrepareSpec


def spec_of_config(raw) -> tuple[PrepareSpec, Path]:  # noqa: ANN001
    """(what `train` with config `raw` prepares, the directory it keeps sets in), as
    `build_training_run` sets up `ToprDatasetConfig`, without importing Megatron."""
    from nemo_topr.data.prepared import PrepareSpec  # noqa: F811 (torch loads with it)
    from nemo_topr.data.records import SOURCE_OPTIONS
    from nemo_topr.model import source as model_source
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.validation import check_config

    values, base_model, _ = check_config(raw)
    dataset = values.get("dataset") or {}
    if not dataset.get("train_path"):
        raise ConfigError("dataset.train_path is not set", key="dataset.train_path.unset", where="dataset.train_path")
    settings = {name: dataset[name] for name in ("seq_length", "strict", "too_long", *SOURCE_OPTIONS)
                if dataset.get(name) is not None}
    spec = PrepareSpec(train_path=str(dataset["train_path"]),
                       tokenizer_dir=str(dataset.get("tokenizer_dir") or base_model.hf_dir),
                       model_context=dataset.get("model_context") or model_source.context_length(base_model.hf_dir),
                       **settings)
    run_dir = Path(values["run_dir"]).resolve()
    return spec, Path(dataset.get("prepared_dir") or default_prepared_dir(run_dir))


def main(argv: list[str]) -> int:
    """`nemo-topr data prepare [options] [key=value ...]`, parsed by the `data` verb's parser."""
    from nemo_topr.data.cli import build_parser
    from nemo_topr.data.prepared import find_or_prepare
    from nemo_topr.training.config import compose

    args = build_parser().parse_args(["prepare", *argv])
    spec, prepared_dir = spec_of_config(compose(args.config_name, args.overrides, args.config_path))
    prepared, written = find_or_prepare(spec, prepared_dir)
    manifest = prepared.manifest
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    print(f"{'wrote' if written else 'found'} {prepared.path}: {manifest['sequences']} sequences, "
          f"{manifest['tokens']} tokens, {size / 1e6:.1f} MB")
    if prepared.report.dropped:
        print(prepared.report.format())
    return 0
