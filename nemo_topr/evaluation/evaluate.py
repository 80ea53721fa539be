"""`nemo-topr eval`: benchmark metrics of a model or of graded records, and per-round plots.

Four modes:

    nemo-topr eval --model DIR --benchmark gsm8k|math500 [--limit K] [--num-samples N] --out r1.json
        samples N completions per problem (as `nemo-topr generate`), grades them and reports
    nemo-topr eval --model DIR --prompts test_prompts.jsonl --task gsm8k|math [--rendered-prompts] --out r1.json
        the same on a prompt file, as `generate --prompts` reads it: a benchmark's problems in the
        prompt form the model was trained on (zero-shot, or chat-rendered), not the benchmark's own
    nemo-topr eval --records graded.jsonl [--task gsm8k|math] --out r1.json
        re-grades records written by `generate` (meta.reference_answer; meta.verifier_score,
        when every record has one, adds the verifier-weighted vote)
    nemo-topr eval --plot r1.json r2.json ... [--metrics all | NAME ...] --out rounds.png
        one line per headline metric across rounds (the result files, in the order given)

Results are a JSON file and a Markdown table next to it (same name, `.md`). Metrics and vote
rules are documented in `nemo_topr.evaluation.metrics`.

A sample the grader failed on (grade "error": math-verify raised or timed out) is neither right
nor wrong: it is left out of every metric, counted in `grader_errors` and reported as
`grader_error_rate` (`invalid_rate` stays the model's share of answers without a parseable
answer); above `--max-grader-error-rate` (default 0.01) the command fails. `--benchmark` and
`--prompts` sample as `nemo-topr generate` does: into OUT.samples as each prompt finishes,
resumed from it after a crash, kept when the grader fails (`nemo_topr.evaluation.sample_log`),
with progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nemo_topr.data.sources import open_sources
from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.utils.arguments import Parser, UsageError, documented
from nemo_topr.data.records import DataError, Record, is_number, load_records, write_jsonl
from nemo_topr.evaluation.logged_sampling import logged_sample_and_grade
from nemo_topr.evaluation.problems import (BENCHMARKS, check_limit, check_prompt_source, check_prompts, load_problems,
                                           prompt_problems, prompt_source)
from nemo_topr.evaluation.samples import GradedCompletion, graded_records, no_record_note
from nemo_topr.evaluation.sampling_options import add_sampling_arguments, check_sampling_args
from nemo_topr.evaluation.metrics import SampleOutcome, benchmark_metrics, scored_voters
from nemo_topr.evaluation.sample_log import log_path
from nemo_topr.model.source import require_hugging_face
from nemo_topr.grading import TASKS, check_grader_errors, graded_answer, reference_problem, same_answer
from nemo_topr.utils.outputs import (add_overwrite_argument, distinct_outputs, writable_output_file, writable_records_file,
                               write_whole)


class EvalError(UserError, ValueError):
    """What `eval` cannot do with the results or samples it is given (a k beyond the samples, results
    that do not plot together)."""


EVAL_BENCHMARKS = {"gsm8k": "gsm8k-test", "math500": "math500"}


def default_ks(num_samples: int) -> list[int]:
    """1, 2, 4, ... up to `num_samples`, plus `num_samples` itself."""
    ks = [1]
    while ks[-1] * 2 <= num_samples:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == num_samples else [*ks, num_samples]


def benchmark_results(problems: Sequence[Sequence[SampleOutcome]], task: str, ks: Sequence[int] | None,
                      grader_errors: dict[str, Any] | None = None, **details: Any) -> dict[str, Any]:
    """The results document: counts, metrics (see `benchmark_metrics`; plus `grader_error_rate`
    from `grader_errors`, a `check_grader_errors` report, when given) and `details`."""
    if not problems:
        raise EvalError("no problems to evaluate", key="problems.none", where="problems")
    fewest = min(len(samples) for samples in problems)
    ks = list(ks or default_ks(fewest))
    if max(ks) > fewest:
        raise EvalError(f"k = {max(ks)} exceeds the {fewest} samples of some problem",
                        key="--k.above_samples", where="--k")
    metrics = benchmark_metrics(problems, ks, same=partial(same_answer, task))
    if grader_errors is not None:
        metrics["grader_error_rate"] = grader_errors["grader_error_rate"]
        details["grader_errors"] = grader_errors
    return {**details, "task": task, "num_problems": len(problems),
            "num_samples": sum(map(len, problems)), "samples_per_problem": fewest, "ks": ks, "metrics": metrics}


def outcomes_of_completions(graded: Sequence[Sequence[GradedCompletion]]) -> list[list[SampleOutcome]]:
    """The samples' outcomes, without grader errors (`grader_error_report` counts those; a
    problem left with no sample is left out)."""
    outcomes = [[SampleOutcome(s.answer, s.grade == "correct") for s in samples if s.grade != "error"]
                for samples in graded]
    return [samples for samples in outcomes if samples]


def _at(record: Record, field: str) -> str:
    """A record's field as a refusal's `where` names it: FILE:LINE: FIELD."""
    return f"{record.path}:{record.line}: {field}"


def outcomes_of_records(records: Sequence[Record], task: str | None, max_grader_error_rate: float
                        ) -> tuple[str, list[list[SampleOutcome]], dict[str, Any]]:
    """(task, samples per prompt in file order, grader-error report), re-graded from
    `meta.reference_answer`; samples the grader failed on are left out and counted.

    The task is the records' `meta.task`, else `task` (one that contradicts a record's is an
    error: the samples were graded for their own task). The empty completions `generate`
    names in `meta.empty_sample_ids` (no records) are invalid samples at their places in sample
    order, as `eval --benchmark` counts them; a prompt with no record at all is not in the file
    (`samples.no_record_note` says so when the records are written).
    """
    by_prompt: dict[str, list[tuple[Any, SampleOutcome]]] = {}
    first_of_prompt: dict[str, tuple[str, Record]] = {}  # prompt_key -> (reference answer, first record)
    empty_ids: dict[str, set[int]] = {}
    tasks, results = set(), []
    for record in records:
        meta = record.meta or {}
        if task and meta.get("task") not in (None, task):  # another grader than the one it was graded with
            raise record.error("meta.task", f"is {meta['task']!r} but --task is {task!r}: --task is for records "
                                            "without a task; drop it, or evaluate records of that task",
                               key="record.meta.task.not_--task", where=_at(record, "meta.task"))
        record_task = task or meta.get("task")
        if record_task not in TASKS or "reference_answer" not in meta:
            raise record.error("meta", f"needs reference_answer and a task ({'|'.join(TASKS)}; or pass --task)",
                               key="record.meta.unset", where=_at(record, "meta"))
        reference = str(meta["reference_answer"])
        if problem := reference_problem(record_task, reference):
            raise record.error("meta.reference_answer", problem,
                               key="record.meta.reference_answer.invalid", where=_at(record, "meta.reference_answer"))
        # one problem has one answer: grading each sample against its own would score two problems as one
        first_reference, first = first_of_prompt.setdefault(record.prompt_key, (reference, record))
        if reference != first_reference:
            raise record.error("meta.reference_answer", f"{reference!r}, but {first_reference!r} for prompt "
                                                        f"{record.prompt_name!r} at {first.path}:{first.line}",
                               key="record.meta.reference_answer.differs_within_prompt",
                               where=_at(record, "meta.reference_answer"))
        score = meta.get("verifier_score")
        if score is not None and not (is_number(score) and 0 <= score < math.inf):  # NaN lost every comparison
            raise record.error("meta.verifier_score", f"expected a finite number >= 0, the sample's weight in the "
                                                      f"vote (`nemo-topr verifier score` writes P(Yes)); got {score!r}",
                               key="record.meta.verifier_score.not_a_weight", where=_at(record, "meta.verifier_score"))
        result = graded_answer(record_task, record.completion, reference)
        results.append(result)
        samples = by_prompt.setdefault(record.prompt_key, [])
        if result.grade != "error":
            samples.append((record.sample_id, SampleOutcome(result.answer, result.grade == "correct", score)))
        empty = meta.get("empty_sample_ids", [])
        if not (isinstance(empty, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in empty)
                and (not empty or isinstance(record.sample_id, int))):
            raise record.error("meta.empty_sample_ids", "expected a list of the prompt's integer sample ids, on a "
                                                        "record with an integer sample_id (as `generate` writes)",
                               key="record.meta.empty_sample_ids.invalid", where=_at(record, "meta.empty_sample_ids"))
        empty_ids.setdefault(record.prompt_key, set()).update(empty)
        tasks.add(record_task)
    if len(tasks) > 1:
        raise DataError(records[0].path, 0, "meta.task", f"mixes tasks {sorted(tasks)}; evaluate them separately",
                        key="records.meta.task.mixed", where=str(records[0].path))
    report = check_grader_errors(results, max_grader_error_rate)
    outcomes = []
    for key, samples in by_prompt.items():
        if empty_ids[key]:
            samples = sorted([*samples, *((i, SampleOutcome(None, False)) for i in empty_ids[key])],
                             key=lambda sample: sample[0])
        outcomes.append([outcome for _, outcome in samples])
    return tasks.pop(), [samples for samples in outcomes if samples], report


def results_markdown(results: dict[str, Any]) -> str:
    """A Markdown table of the metrics, titled with the label and counts."""
    problems, samples, fewest = results["num_problems"], results["num_samples"], results["samples_per_problem"]
    # uneven counts (grader errors left out, prompts sampled unevenly): pass@k reads all of each problem's samples
    counts = f"{fewest} samples each" if samples == problems * fewest else f"{samples} samples, at least {fewest} each"
    title = f"**{results['label']}** ({results['task']}): {problems} problems, {counts}"
    rows = [f"| {name} | {100 * value:.2f} |" for name, value in results["metrics"].items()]
    return "\n".join([title, "", "| metric | % |", "|---|---|", *rows]) + "\n"


def write_results(results: dict[str, Any], out: Path) -> Path:
    """Write `out` (JSON) and its Markdown table (`out` with `.md`); returns the Markdown path."""
    write_whole(out, json.dumps(results, indent=2) + "\n")
    markdown = out.with_suffix(".md")
    write_whole(markdown, results_markdown(results))
    return markdown


PLOT_FORMATS = ("png", "pdf", "svg")


def common_metrics(results: Sequence[dict[str, Any]]) -> list[str]:
    return [name for name in results[0]["metrics"] if all(name in result["metrics"] for result in results)]


def plotted_metrics(results: Sequence[dict[str, Any]], paths: Sequence[Path], chosen: Sequence[str] | None
                    ) -> list[str]:
    """What `--plot` draws: by default (`chosen` None) the headline metrics every result has, pass@1,
    maj@k and weighted_maj@k at the largest k they all have and invalid_rate (with 16 samples the
    rest are 9 more lines); `["all"]`: every metric they all have; else the names given, each
    one in every result."""
    common = common_metrics(results)
    if chosen is None:
        k = max((int(name.removeprefix("maj@")) for name in common if name.startswith("maj@")), default=None)
        names = [name for name in ("pass@1", f"maj@{k}", f"weighted_maj@{k}", "invalid_rate") if name in common]
        if not names:
            raise EvalError("--plot: no headline metric (pass@1, maj@k, invalid_rate) is in every result: "
                            "--metrics all draws the ones they share", key="--plot.no_headline_metric", where="--plot")
        return names
    if list(chosen) == ["all"]:
        return common
    for name in chosen:
        for path, result in zip(paths, results):
            if name not in result["metrics"]:
                raise EvalError(f"--metrics {name}: not a metric of {path} (it has {', '.join(result['metrics'])})",
                                key="--metrics.not_in_result", where="--metrics")
    return list(dict.fromkeys(chosen))


def read_round_results(result_paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The results `eval` wrote, one per round, checked to plot as one line per metric: each a
    JSON object with a task and metrics, all of one task, with a metric in common. Anything else
    is an error naming the file, not a traceback or a plot that mixes benchmarks."""
    results = []
    for path in map(Path, result_paths):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise EvalError(f"{path}: cannot be read ({error.strerror})",
                            key="--plot.unreadable", where=str(path)) from None
        except json.JSONDecodeError as error:
            raise EvalError(f"{path}: not JSON ({error}): give the results JSON `nemo-topr eval --out` "
                            "wrote", key="--plot.not_json", where=str(path)) from None
        if not (isinstance(result, dict) and isinstance(result.get("metrics"), dict) and "task" in result):
            raise EvalError(f"{path}: not a result of `nemo-topr eval` (no task and metrics): give the results "
                            "JSON its --out wrote", key="--plot.not_a_result", where=str(path))
        if result["task"] not in TASKS:
            raise EvalError(f"{path}: task: {result['task']!r} is no task of `nemo-topr eval` ({'|'.join(TASKS)})",
                            key="--plot.task.unknown", where=f"{path}: task")
        for name, value in result["metrics"].items():  # a null or a string ended in a TypeError, or was drawn
            if not (is_number(value) and 0 <= value <= 1):
                raise EvalError(f"{path}: metrics.{name}: {value!r} is no rate in [0, 1] as `nemo-topr eval` writes",
                                key="--plot.metrics.not_a_rate", where=f"{path}: metrics.{name}")
        results.append(result)
    if len({result["task"] for result in results}) > 1:
        raise EvalError("--plot: the results are of different tasks (" + ", ".join(
            f"{path}: {result['task']}" for path, result in zip(result_paths, results)) + "): plot each task apart",
                        key="--plot.tasks.mixed", where="--plot")
    if not common_metrics(results):
        raise EvalError(f"--plot: no metric is in every result ({', '.join(map(str, result_paths))}): nothing to draw",
                        key="--plot.no_common_metric", where="--plot")
    return results


def plot_rounds(result_paths: Sequence[Path], out: Path, metrics: Sequence[str] | None = None) -> None:
    """One line per metric (`plotted_metrics`), one point per result file, in order; the format is
    `out`'s suffix (one of `PLOT_FORMATS`), written whole."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = read_round_results(result_paths)
    names = plotted_metrics(results, result_paths, metrics)
    rounds = range(1, len(results) + 1)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in names:
        axes.plot(rounds, [100 * r["metrics"][name] for r in results], marker="o", label=name)
    axes.set_xticks(list(rounds), [r.get("label", f"round {i}") for i, r in zip(rounds, results)], rotation=20)
    axes.set_ylabel("%")
    axes.set_title(f"{results[0]['task']} across rounds")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format=out.suffix[1:].lower(), dpi=120)  # matplotlib would add ".png" to a name without one
    plt.close(figure)
    write_whole(out, image.getvalue())


# ---------------------------------------------------------------------------------------------
# Command line


def _evaluate_model(args: argparse.Namespace) -> dict[str, Any]:
    if args.benchmark:
        source, problems = args.benchmark, load_problems(EVAL_BENCHMARKS[args.benchmark], task=args.task,
                                                         data_dir=args.data_dir, limit=args.limit,
                                                         shots=args.num_shots)
    else:
        source, problems = prompt_source(args.prompts), prompt_problems(args)
    settings, graded, grader_errors = logged_sample_and_grade(args, problems, source, args.out, "nemo-topr eval")
    if args.samples_out:
        write_jsonl(graded_records(problems, graded), args.samples_out)
        if note := no_record_note(problems, graded):
            print(f"nemo-topr eval: --samples-out: {note}", file=sys.stderr)
    shots = {"num_shots": args.num_shots} if source.startswith("gsm8k") else {}  # GSM8K's prompt form
    return benchmark_results(outcomes_of_completions(graded), problems[0].task, args.k, grader_errors,
                             label=args.label or args.model.name, source=source,
                             model=str(args.model), sampling=asdict(settings), **shots)


def _evaluate_records(args: argparse.Namespace, records: list[Record]) -> dict[str, Any]:
    task, problems, grader_errors = outcomes_of_records(records, args.task, args.max_grader_error_rate)
    problems = problems[: args.limit]
    scored, voters = scored_voters(problems)
    if 0 < scored < voters:
        print(f"nemo-topr eval: weighted_maj@k left out: {scored} of the {voters} samples with an answer have "
              "meta.verifier_score (score them all with `nemo-topr verifier score`)", file=sys.stderr)
    return benchmark_results(problems, task, args.k, grader_errors, label=args.label or Path(args.records[0]).stem,
                             source=[str(path) for path in args.records])


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nemo-topr eval", **documented(__doc__))
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--benchmark", choices=sorted(EVAL_BENCHMARKS), help="sample and grade a model (needs --model)")
    mode.add_argument("--prompts", help="the same on a JSONL file of {prompt, reference_answer, prompt_id} (with "
                                        "--task), or on a split of `generate` (" + " | ".join(BENCHMARKS) + ")")
    mode.add_argument("--records", nargs="+", help="graded records (JSONL/Parquet files, directories, globs)")
    mode.add_argument("--plot", nargs="+", type=Path, help="result JSONs, one per round, in order")
    parser.add_argument("--model", type=Path, help="local Hugging Face checkpoint directory (--benchmark, --prompts)")
    parser.add_argument("--rendered-prompts", action="store_true",
                        help="--prompts: the file's prompts are rendered already (chat template and BOS written "
                             "out): sampled as written")
    add_sampling_arguments(parser, num_samples=1)
    parser.add_argument("--k", type=int, nargs="+", help="k values (default: 1, 2, 4, ... up to the samples)")
    parser.add_argument("--metrics", nargs="+", help="--plot: the metrics drawn, by name, or all (default: pass@1, "
                                                     "maj@k and weighted_maj@k at the largest k, invalid_rate)")
    parser.add_argument("--label", help="name of this result in tables and plots (default: model or file name)")
    parser.add_argument("--samples-out", type=Path,
                        help="also write the graded samples as records (--benchmark, --prompts)")
    parser.add_argument("--out", type=Path, required=True,
                        help=f"results JSON (Markdown next to it), or the plot (.{', .'.join(PLOT_FORMATS)})")
    add_overwrite_argument(parser)
    return parser


# what --records and --plot ignore
SAMPLING_ONLY = ("data_dir", "num_shots", "num_samples", "temperature", "top_p", "top_k", "max_new_tokens", "seed",
                 "stop", "sampler_logprobs", "backend", "device", "tensor_parallel_size")


def sampling_option_given(args: argparse.Namespace) -> str | None:
    """The first sampling option set to other than its default (`--records --temperature 0` was
    accepted and did nothing: the records' samples are what they are)."""
    parser = build_parser()
    for dest in SAMPLING_ONLY:
        if getattr(args, dest) != parser.get_default(dest):
            return "--no-stop" if args.stop == [] else f"--{dest.replace('_', '-')}"
    return None


def check_usage(args: argparse.Namespace) -> None:
    """Refuse options unusable together (UsageError, its key and where the option), before the sampling
    (not after it)."""
    sampled = args.benchmark or args.prompts
    if sampled and args.model is None:
        option = "--benchmark" if args.benchmark else "--prompts"
        raise UsageError(f"{option} needs --model", key="--model.missing", where=option)
    for option, given in (("--model", args.model), ("--samples-out", args.samples_out)):
        if given and not sampled:  # --records and --plot read no model and sample nothing
            raise UsageError(f"{option} is for --benchmark and --prompts, which sample a model",
                             key=f"{option}.without_sampling", where=option)
    if not sampled and (option := sampling_option_given(args)):
        raise UsageError(f"{option} is for --benchmark and --prompts, which sample a model; "
                         f"{'--records grades records sampled already' if args.records else '--plot draws results'}",
                         key="sampling_option.without_sampling", where=option)
    if args.metrics and not args.plot:
        raise UsageError("--metrics is for --plot (results JSONs list every metric)", key="--metrics.without_plot",
                         where="--metrics")
    if args.rendered_prompts and not args.prompts:
        raise UsageError("--rendered-prompts is for --prompts, a prompt file of rendered prompts",
                         key="--rendered-prompts.without_prompts", where="--rendered-prompts")
    if args.plot and args.out.suffix[1:].lower() not in PLOT_FORMATS:
        raise UsageError(f"--out {args.out}: a plot is written as " + ", ".join(f".{f}" for f in PLOT_FORMATS) +
                         " (by its suffix)", key="--out.not_a_plot_format", where="--out")
    if args.k and min(args.k) < 1:
        raise UsageError(f"--k {min(args.k)}: k must be at least 1", key="--k.below_1", where="--k")
    if sampled and args.k and max(args.k) > args.num_samples:
        raise UsageError(f"--k {max(args.k)} exceeds --num-samples {args.num_samples}: pass@k and maj@k need at "
                         "least k samples of each problem", key="--k.above_num_samples", where="--k")


def usage_problem(args: argparse.Namespace) -> str | None:
    """`check_usage`'s refusal as its message (for a driver that collects the problems of several
    commands), or None."""
    try:
        check_usage(args)
    except UsageError as error:
        return str(error)
    return None


MODES = ("benchmark", "prompts", "records", "plot")


@dataclass(frozen=True)
class EvalSpec:
    """What `nemo-topr eval` will do: its mode (one of MODES), what it writes (`out`, its Markdown, the
    samples); `options`, the command line as parsed, is what the sampler, the prompts' reader and the
    grader take."""

    mode: str
    out: Path
    samples_out: Path | None
    overwrite: bool
    options: argparse.Namespace

    @classmethod
    def of(cls, args: argparse.Namespace) -> EvalSpec:
        mode = next(mode for mode in MODES if getattr(args, mode))
        return cls(mode, args.out, args.samples_out, args.overwrite, args)

    @property
    def sampled(self) -> bool:
        return self.mode in ("benchmark", "prompts")


@contextlib.contextmanager
def inputs_read() -> Iterator[None]:
    """A model or file that cannot be read (OSError) and the ValueErrors of the libraries that read them:
    refusals of this command all the same."""
    try:
        yield
    except UserError:
        raise
    except (OSError, ValueError) as error:
        raise EvalError(str(error), key="eval.input_unreadable", where="--model, --records, --prompts") from error


def validate(spec: EvalSpec) -> list[UserError]:
    """Every problem of `spec` before a model, a prompt or a record is read, nothing written: the options'
    combinations (alone when they do not fit: exit 2, as argparse's), then the sampling options and the
    model (sampled modes), the prompts' source, `--limit`, and the outputs (none an input, each writable)."""
    args, problems = spec.options, Problems()
    with problems.check():
        check_usage(args)
    if problems:  # options that do not go together: which of the rest apply is not known
        return problems
    if spec.sampled:
        with problems.check():
            check_sampling_args(args)
        with problems.check():
            require_hugging_face(args.model)
    with problems.check():
        if spec.mode == "benchmark":
            check_prompt_source(EVAL_BENCHMARKS[args.benchmark], task=args.task, limit=args.limit, shots=args.num_shots)
        elif spec.mode == "prompts":
            check_prompts(args)
        elif spec.mode == "records":
            check_limit(args.limit)  # `problems[:-1]` would drop the last problem without a word
    inputs = list(args.plot or ([] if args.prompts in (None, *BENCHMARKS) else [args.prompts]))
    with problems.check(), inputs_read():
        if spec.mode == "records":
            inputs = [source.name for source in open_sources(args.records)[0]]
    with problems.check(), inputs_read():
        writable_output_file(spec.out, inputs=inputs, overwrite=spec.overwrite)
        if spec.mode != "plot":
            markdown = spec.out.with_suffix(".md")
            distinct_outputs({"--out": spec.out, "--out's Markdown": markdown, "--samples-out": spec.samples_out,
                              "the sample log beside --out": log_path(spec.out) if spec.sampled else None})
            writable_output_file(markdown, "--out's Markdown", inputs=inputs, overwrite=spec.overwrite)
            if spec.samples_out:
                writable_records_file(spec.samples_out, "--samples-out", inputs=inputs, overwrite=spec.overwrite)
    return problems


def main(argv: list[str] | None = None) -> int:
    spec = EvalSpec.of(build_parser().parse_args(argv))
    refuse(validate(spec), key="eval.several_problems")
    return run(spec)


def run(spec: EvalSpec) -> int:
    """Plot, or evaluate and write the results of, `spec` (`validate`d)."""
    args = spec.options
    if spec.mode == "plot":
        plot_rounds(args.plot, args.out, args.metrics)
        print(f"wrote {args.out}")
        return 0
    with inputs_read():
        results = _evaluate_records(args, load_records(args.records).records) if args.records else _evaluate_model(args)
    markdown = write_results(results, args.out)
    print(results_markdown(results))
    written = [str(args.out), str(markdown), *([str(args.samples_out)] if args.samples_out else []),
               *([] if args.records else [f"the sample log {log_path(args.out)}"])]
    print(f"wrote {', '.join(written[:-1])} and {written[-1]}")
    return 0
