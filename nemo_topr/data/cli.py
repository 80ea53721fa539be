"""`nemo-topr data {validate,stats,curate,prepare}`: check, describe, curate and prepare pre-scored datasets.

Exit status: 0 on success; 1 when the data, the tokenizer or the settings have a problem (data
problems print `path:line: field: problem` to stderr); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.utils.arguments import Parser, UsageError, at_least_one, finite, non_negative, share
from nemo_topr.data.prepare_verb import PREPARED_DIR_ENV, add_prepare_parser
from nemo_topr.data.records import SOURCE_OPTIONS, RecordSet, load_records
from nemo_topr.data.sources import open_sources
from nemo_topr.utils.outputs import (OutputError, add_overwrite_argument, distinct_outputs, writable_output_file,
                                    writable_records_file)

if TYPE_CHECKING:
    from nemo_topr.data.curation import Curation
    from nemo_topr.data.prepared import PreparedSet, PrepareSpec
    from nemo_topr.data.report import ValidationReport

T = TypeVar("T")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Options saying how to read a source in another shape (see `nemo_topr.data.sources`)."""
    parser.add_argument("--columns", action="append", default=[], metavar="FIELD=COLUMN,...",
                        help="map our fields to the data's columns, e.g. prompt=question,completion=response,"
                             "reward=score")
    parser.add_argument("--column", action="append", dest="columns", metavar="FIELD=COLUMN",
                        help="one field=column pair (repeatable); adds to --columns")
    parser.add_argument("--split", help="split of a saved DatasetDict or a hub dataset")
    parser.add_argument("--extra-columns", choices=("error", "meta"), default="error",
                        help="columns that are no field: an error (default) or carried under meta")
    parser.add_argument("--rendered-prompts", action="store_true",
                        help="prompts are rendered already, as the sampler read them (chat template and special "
                             "tokens written out): tokenized as written, nothing added")


def source_options(args: argparse.Namespace) -> dict:
    """`load_records` keyword arguments from `add_source_arguments`' options."""
    return {name: getattr(args, name) for name in SOURCE_OPTIONS}


def _add_input_arguments(
    parser: argparse.ArgumentParser, *, tokenizer: bool = False, length_limit: bool = False
) -> None:
    parser.add_argument("paths", nargs="+", help="JSONL/Parquet/Arrow files, directories, glob patterns, a "
                        "save_to_disk directory, or hub:OWNER/NAME for a Hugging Face hub dataset (downloaded)")
    add_source_arguments(parser)
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                        help="stop at the first bad record (default) or drop and count bad records")
    if tokenizer:
        parser.add_argument("--tokenizer", type=Path, help="the model whose tokenizer counts the tokens: a local "
                            "tokenizer or Hugging Face directory, or a Megatron checkpoint or run (as base_model=)")
    if length_limit:
        parser.add_argument("--max-seq-length", type=at_least_one, help="limit on prompt + completion + EOS tokens")
        parser.add_argument("--too-long", choices=("error", "drop"),
                            help="what to do with sequences over the limit (default: error if strict, else drop)")
        parser.add_argument("--prepared-dir", type=Path,
                            help="with --max-seq-length, the records are tokenized and packed once into the prepared "
                                 "set `train` reads for the same data, tokenizer and settings, and the report (stats: "
                                 "the token lengths) read from it: kept in this directory for `train` to find (keyed "
                                 f"as `data prepare` keys it); default ${PREPARED_DIR_ENV} when set, else a temporary "
                                 "directory removed at the end")


def _load(args: argparse.Namespace) -> RecordSet:
    return load_records(args.paths, strict=args.strict, **source_options(args))


def _tokenize(args: argparse.Namespace, records: RecordSet, **limits):
    """(tokenizer, TokenizedDataset); `limits`: max_seq_length, too_long and model_context."""
    from nemo_topr.data.tokenization import load_tokenizer, tokenize_records

    tokenizer = load_tokenizer(args.tokenizer)
    return tokenizer, tokenize_records(records, tokenizer, strict=args.strict, **limits)


@dataclass(frozen=True)
class DataSpec:
    """What `data validate`, `stats` or `curate` (`verb`) will do: read the records at `paths`, write `out`
    (stats: a directory; curate: a JSONL file and its stats); `options`, the command line as parsed, is
    what the reader, the tokenizer and the curation take. `data prepare` has its own (`PrepareSpec`)."""

    verb: str
    paths: tuple[str, ...]
    out: Path | None
    overwrite: bool
    options: argparse.Namespace

    @classmethod
    def of(cls, args: argparse.Namespace) -> DataSpec:
        return cls(args.verb, tuple(args.paths), getattr(args, "out", None), getattr(args, "overwrite", False), args)


def validate(spec: DataSpec) -> list[UserError]:
    """Every problem of `spec` before a record is read, nothing written: options that need another
    (alone when given: exit 2, as argparse's), curate's settings, the records' files, and the outputs
    (none of them an input, each writable). The records are checked as they are read."""
    args, problems = spec.options, Problems()
    for option, value in (("--max-seq-length", getattr(args, "max_seq_length", None)),
                          ("--too-long", getattr(args, "too_long", None))):
        with problems.check():
            if value is not None and args.tokenizer is None:  # --too-long alone was ignored without a word
                raise UsageError(f"{option} needs --tokenizer (lengths are counted in tokens)",
                                 key=f"{option}.without_tokenizer", where=option)
    with problems.check():
        _check_prepared_dir(args)
    if problems:
        return problems
    if spec.verb == "curate":
        with problems.check():
            curation_of(args)
    inputs = []
    with problems.check():
        inputs = [source.name for source in open_sources(list(spec.paths), split=args.split)[0]]
    with problems.check():
        if spec.verb == "stats" and spec.out is not None:
            if spec.out.exists() and not spec.out.is_dir():
                raise OutputError(f"--out {spec.out} is a file; `data stats` writes stats.json and stats.png into a "
                                  "directory", key="--out.is_a_file", where="--out")
            for name in ("stats.json", "stats.png"):
                writable_output_file(spec.out / name, "--out", inputs=inputs, overwrite=spec.overwrite)
        if spec.verb == "curate":
            writable_records_file(spec.out, inputs=inputs, overwrite=spec.overwrite)
            distinct_outputs({"--out": spec.out, "--stats": args.stats})
            writable_output_file(curation_stats(args), "--stats" if args.stats else "--out's stats", inputs=inputs,
                                 overwrite=spec.overwrite)
    return problems


def _check_prepared_dir(args: argparse.Namespace) -> None:
    """--prepared-dir names where one set of one data path, packed at --max-seq-length, is kept."""
    if getattr(args, "prepared_dir", None) is None:
        return
    if args.max_seq_length is None:
        raise UsageError("--prepared-dir needs --max-seq-length (a prepared set is packed at that length)",
                         key="--prepared-dir.without_max_seq_length", where="--prepared-dir")
    if args.prepared_dir.exists() and not args.prepared_dir.is_dir():
        raise UsageError(f"--prepared-dir {args.prepared_dir} is a file; give a directory (made when missing)",
                         key="--prepared-dir.is_a_file", where="--prepared-dir")
    if len(args.paths) != 1:
        raise UsageError(f"--prepared-dir prepares one data path (a file, directory or glob pattern); got "
                         f"{len(args.paths)}", key="--prepared-dir.several_paths", where="--prepared-dir")


def curation_stats(args: argparse.Namespace) -> Path:
    """Where `data curate` writes its stats: --stats, or OUT with suffix .stats.json."""
    return args.stats or args.out.with_suffix(".stats.json")


def _validate(args: argparse.Namespace) -> int:
    records = _load(args)
    report = records.report
    if args.tokenizer is not None:
        _say_loading("validate", f"{len(records.records)} records read; loading {args.tokenizer}'s tokenizer to "
                                 "count their tokens")
        from nemo_topr.data.prepared_validation import packing_of, prepared_spec
        from nemo_topr.model.source import context_of

        # a record beyond the model's context is refused by score-logprobs and train: found here first
        model_context = context_of(args.tokenizer)
        if (spec := prepared_spec(args, records, model_context)) is not None:
            report, (rows, share) = _read_prepared(args, spec, records, packing_of)
            report.notes.append(_packing_note(rows, share, args.max_seq_length))
        else:
            _validated_in_memory(args, records, model_context)
    print(report.format())
    _warn_of_the_baseline(records.records, args.baseline)
    return 0


def _read_prepared(args: argparse.Namespace, spec: PrepareSpec, records: RecordSet,
                   read: Callable[[PreparedSet], T]) -> tuple[ValidationReport, T]:
    """(the report, `read` of the set) of the prepared set for `spec`, found or written in the
    prepared directory; a set found holds the drops that tokenizing it counted."""
    from nemo_topr.data.prepared import find_or_prepare
    from nemo_topr.data.prepared_validation import prepared_dir

    with prepared_dir(args.prepared_dir) as directory:
        prepared, _ = find_or_prepare(spec, directory, records=records)
        result = prepared.report, read(prepared)
        del prepared  # its memory maps, before a temporary directory is removed
    return result


def _validated_in_memory(args: argparse.Namespace, records: RecordSet, model_context: int | None) -> None:
    tokenizer, tokenized = _tokenize(args, records, max_seq_length=args.max_seq_length, too_long=args.too_long,
                                     model_context=model_context)
    if args.max_seq_length is not None:
        from nemo_topr.data.packing import pack_sequences, padding_share
        from nemo_topr.data.tokenization import pad_id_of

        rows = pack_sequences(tokenized.sequences, args.max_seq_length, pad_id_of(tokenizer))
        share = padding_share(tokenized.sequences, rows, args.max_seq_length)
        records.report.notes.append(_packing_note(len(rows), share, args.max_seq_length))


def _packing_note(rows: int, share: float, seq_length: int) -> str:
    return f"packed into {rows} rows of {seq_length} tokens, padding share {share:.2%}"


def _print_drops(report: ValidationReport) -> None:
    """`validate`'s report where `--no-strict` dropped records, so that no drop goes unsaid on the console."""
    if report.dropped:
        print(report.format())


def _warn_of_the_baseline(records, baseline: float) -> None:
    from nemo_topr.data.positives import (
        NO_ADVANTAGE, every_advantage_zero, no_negatives_warning, sign_flipping_baseline,
    )

    rewards = [record.reward for record in records]
    own_baselines = any(record.baseline is not None for record in records)  # then c is not what they get
    if not own_baselines and (warning := no_negatives_warning(rewards, baseline)):
        print(f"warning: {warning}", file=sys.stderr)
    if own_baselines and baseline != 0.0:
        print(f"note: --baseline {baseline:g} is not the records' c: they carry their own baseline field, which "
              "training uses in place of objective.baseline, and so does p~ here", file=sys.stderr)
    if problem := sign_flipping_baseline(rewards, baseline):
        print(f"warning: {problem}; `train` refuses this baseline", file=sys.stderr)
    if every_advantage_zero(rewards, [baseline if record.baseline is None else record.baseline for record in records]):
        print(f"warning: {NO_ADVANTAGE}; `train` refuses these records", file=sys.stderr)


def _say_loading(verb: str, what: str) -> None:
    """One line on stderr before the seconds torch and transformers take to import."""
    print(f"nemo-topr data {verb}: {what}", file=sys.stderr, flush=True)


def _stats(args: argparse.Namespace) -> int:
    records = _load(args)
    _say_loading("stats", f"{len(records.records)} records read; computing their statistics")
    from nemo_topr.data.stats import plot_summary, summarize, write_summary

    report, lengths = records.report, None
    if args.tokenizer is not None:
        from nemo_topr.data.prepared_validation import prepared_spec, token_lengths_of
        from nemo_topr.data.stats import sequence_token_lengths

        model_context = None
        if args.max_seq_length is not None:  # as validate checks lengths; without, every length is counted
            from nemo_topr.model.source import context_of

            model_context = context_of(args.tokenizer)
        if (spec := prepared_spec(args, records, model_context)) is not None:
            report, lengths = _read_prepared(args, spec, records, token_lengths_of)
        else:
            tokenized = _tokenize(args, records, max_seq_length=args.max_seq_length, too_long=args.too_long,
                                  model_context=model_context)[1]
            lengths = sequence_token_lengths(tokenized.sequences)
    summary = summarize(records.records, baseline=args.baseline, token_lengths=lengths)
    _warn_of_the_baseline(records.records, args.baseline)
    summary["validation"] = report.to_dict()
    _print_drops(report)  # after tokenizing, which drops too
    print(json.dumps(summary["composition"], indent=2))
    if args.out is not None:
        write_summary(summary, args.out / "stats.json")
        plot_summary(summary, args.out / "stats.png")
        print(f"wrote {args.out / 'stats.json'} and {args.out / 'stats.png'}")
    return 0


def curation_of(args: argparse.Namespace) -> Curation:
    """`data curate`'s settings, checked (CurationError)."""
    from nemo_topr.data.curation import Curation

    return Curation(dedup=args.dedup, target_p=args.target_p, target_p_tilde=args.target_p_tilde,
                    baseline=args.baseline, anna_karenina=args.anna_karenina, per_prompt=args.per_prompt,
                    seed=args.seed)


def _curate(args: argparse.Namespace) -> int:
    from nemo_topr.data.curation import curate
    from nemo_topr.data.records import write_jsonl
    from nemo_topr.data.stats import write_summary

    curation = curation_of(args)
    records = _load(args)
    if args.anna_karenina:
        from nemo_topr.data.positives import require_signed_grades

        require_signed_grades(records, "--anna-karenina keeps every negative (reward < 0) and one positive per "
                                       "prompt, so it would keep each prompt's first record, right or wrong")
    stats_path = curation_stats(args)
    result = curate(records.records, curation)
    result.stats["validation"] = records.report.to_dict()
    write_jsonl(result.records, args.out)
    write_summary(result.stats, stats_path)
    _print_drops(records.report)
    print(json.dumps({key: result.stats[key] for key in ("records_in", "records_out", "dropped", "after")}, indent=2))
    print(f"wrote {args.out} and {stats_path}")
    _warn_of_the_baseline(records.records, args.baseline)
    return 0


def _add_baseline_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=finite, default=0.0,
                        help="baseline c you train with (objective.baseline): p~, and the 0/1-grades warning (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nemo-topr data", description="Validate, inspect, curate and prepare pre-scored datasets.")
    verbs = parser.add_subparsers(dest="verb", required=True)

    validate = verbs.add_parser("validate", help="check a dataset and print the report")
    _add_input_arguments(validate, tokenizer=True, length_limit=True)
    _add_baseline_argument(validate)
    validate.set_defaults(run=_validate)

    stats = verbs.add_parser("stats", help="counts, p, p~, per-prompt positives, lengths, rewards")
    _add_input_arguments(stats, tokenizer=True, length_limit=True)
    _add_baseline_argument(stats)
    stats.add_argument("--out", type=Path, help="directory for stats.json and stats.png")
    add_overwrite_argument(stats)
    stats.set_defaults(run=_stats)

    curate = verbs.add_parser("curate", help="sub-sample and de-duplicate into a new JSONL dataset")
    _add_input_arguments(curate)
    mode = curate.add_mutually_exclusive_group()
    mode.add_argument("--target-p", type=share, help="share of positives to reach")
    mode.add_argument("--target-p-tilde", type=share, help="effective share of positives to reach at --baseline")
    mode.add_argument("--anna-karenina", action="store_true", help="per prompt, the first positive plus all negatives")
    _add_baseline_argument(curate)
    curate.add_argument("--per-prompt", action="store_true", help="spread the sub-sampling evenly over prompts")
    curate.add_argument("--dedup", action=argparse.BooleanOptionalAction, default=True,
                        help="drop exact duplicate (prompt, completion) pairs first (default on)")
    # >= 0: Python's random.Random seeds with |seed|, so --seed -1 drew what --seed 1 draws
    curate.add_argument("--seed", type=non_negative, default=0, help="seed of the sub-sampling (default: 0)")
    curate.add_argument("--out", type=Path, required=True, help="output JSONL file")
    curate.add_argument("--stats", type=Path, help="stats JSON (default: OUT with suffix .stats.json)")
    add_overwrite_argument(curate)
    curate.set_defaults(run=_curate)
    add_prepare_parser(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verb != "prepare":  # prepare decides with its own PrepareSpec
        refuse(validate(DataSpec.of(args)), key="data.several_problems")
    return args.run(args)
