"""Every rule between the driver config's keys, checked before any stage runs: `validate` returns
each problem, and `load_config` refuses a config with any, all in one message. The training
config, generate's, eval's and `verifier score`'s options are read by those commands' own parsers
and checks, so that a mistake is named at the start, not in a later round. Nothing here writes a
file or imports Megatron."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any

from nemo_topr import errors
from nemo_topr.iterate.base_model import model_root
from nemo_topr.iterate.config import (CurateOptions, IterateConfig, IterateError, SamplingOptions, TrainOptions,
                                      read_config, sampling_flags)
from nemo_topr.iterate.processes import Ranks
from nemo_topr.model import source as model_source
from nemo_topr.model.device import DEVICES

CURATION_MODES = ("anna_karenina", "target_p", "target_p_tilde", "none")
SUBSAMPLING_MODES = ("target_p", "target_p_tilde")  # they need positives and negatives


def load_config(source: str, overrides: list[str] = ()) -> IterateConfig:
    """The driver config (`read_config`) that the run and `--dry-run` start from: a config with any
    problem (`validate`) is refused, every problem in one IterateError."""
    config = read_config(source, overrides)
    errors.refuse(validate(config), key="config.several_problems", separator="; ")
    return config


class Problems(errors.Problems):
    """The problems found, each an IterateError (another error is no config problem: it goes on up)."""

    caught = IterateError


def validate(config: IterateConfig) -> list[IterateError]:
    """Every problem of `config`, in the order of its keys; none: it can run."""
    from nemo_topr.evaluation.evaluate import EVAL_BENCHMARKS

    problems = Problems()
    with problems.check():
        if config.rounds < 1:
            raise IterateError(f"rounds must be at least 1; got {config.rounds}", key="rounds.below_1", where="rounds")
    for name in ("nproc_per_node", "nodes"):
        with problems.check():
            if getattr(config, name) < 1:
                raise IterateError(f"{name} must be at least 1; got {getattr(config, name)}", key=f"{name}.below_1",
                                   where=name)
    with problems.check():
        if config.device not in DEVICES:
            raise IterateError(f"device must be one of {', '.join(DEVICES)}; got {config.device!r}",
                               key="device.invalid", where="device")
    with problems.check():
        if config.curate.mode not in CURATION_MODES:
            raise IterateError(f"curate.mode must be one of {CURATION_MODES}; got {config.curate.mode!r}",
                               key="curate.mode.invalid", where="curate.mode")
    with problems.check():
        if (config.curate.mode in SUBSAMPLING_MODES) != (config.curate.target is not None):
            raise IterateError("curate.target is needed by, and only by, curate.mode target_p / target_p_tilde",
                               key="curate.target.not_for_mode", where="curate.target")
    with problems.check():
        if config.curate.target is not None and not 0 <= config.curate.target <= 1:  # NaN too
            raise IterateError(f"curate.target must be a share in [0, 1]; got {config.curate.target}",
                               key="curate.target.not_a_share", where="curate.target")
    with problems.check():
        if config.curate.per_prompt and config.curate.mode not in SUBSAMPLING_MODES:
            raise IterateError("curate.per_prompt spreads the sub-sampling of curate.mode target_p / target_p_tilde "
                               f"over the prompts; curate.mode {config.curate.mode} has none",
                               key="curate.per_prompt.without_subsampling", where="curate.per_prompt")
    with problems.check():
        if config.generate.zero_shot and config.generate.prompts not in ("gsm8k-train", "gsm8k-test"):
            raise IterateError(f"generate.zero_shot needs GSM8K benchmark prompts; got {config.generate.prompts!r}",
                               key="generate.zero_shot.not_gsm8k", where="generate.zero_shot")
    with problems.check():
        if config.eval.benchmark not in EVAL_BENCHMARKS:
            raise IterateError(f"eval.benchmark must be one of {sorted(EVAL_BENCHMARKS)}; got "
                               f"{config.eval.benchmark!r}", key="eval.benchmark.invalid", where="eval.benchmark")
    with problems.check():
        if config.eval.zero_shot and config.eval.prompts:
            raise IterateError("eval.zero_shot and eval.prompts both choose eval's prompts: set eval.zero_shot=false "
                               "to sample eval.prompts", key="eval.zero_shot.with_prompts", where="eval.zero_shot")
        if config.eval.zero_shot and config.eval.benchmark != "gsm8k":
            raise IterateError("eval.zero_shot writes GSM8K's test questions zero-shot: it needs eval.benchmark gsm8k; "
                               f"got {config.eval.benchmark!r}", key="eval.zero_shot.not_gsm8k", where="eval.zero_shot")
    with problems.check():
        if config.eval.rendered_prompts and not config.eval.prompts:
            raise IterateError("eval.rendered_prompts is for eval.prompts, a prompt file of rendered prompts",
                               key="eval.rendered_prompts.without_prompts", where="eval.rendered_prompts")
    problems += sampling_problems(config, eval_benchmark_known=config.eval.benchmark in EVAL_BENCHMARKS)
    problems += verifier_problems(config)
    with problems.check():
        try:
            root = model_root(model_source.resolve(config.base_model))
        except model_source.ModelSourceError as error:
            raise IterateError(str(error), key="base_model.unusable", where="base_model") from None
        if Path(config.out).resolve().is_relative_to(root):
            raise IterateError(f"out={config.out} is inside base_model's {root}: a rerun would read the rounds as "
                               "files of the model, changed since it started, and refuse to resume; choose an out "
                               "outside it", key="out.inside_base_model", where="out")
    with problems.check():
        problems += curation_problems(config.curate, training_config(config.train, Ranks.of(config).total)[1])
    return problems


def sampling_problems(config: IterateConfig, *, eval_benchmark_known: bool) -> list[IterateError]:
    """`generate`'s and `eval`'s options (the config's and `args`) and generate's prompts, read by
    those commands' own parsers and checks, at the start: a typo in `args`, a count of 0 or a missing
    prompt file would otherwise fail the round's `generate` after the starting model's evaluation, or
    `eval` after the round's training."""
    from nemo_topr.evaluation import evaluate, generate
    from nemo_topr.evaluation.sampling_options import check_sampling_args

    options = config.generate
    prompts = ["--prompts", options.prompts, *(["--task", options.task] if options.task else []),
               *(["--rendered-prompts"] if options.rendered_prompts else [])]
    commands = [("generate", generate.build_parser(), prompts, read_prompts)]
    if eval_benchmark_known:  # zero-shot prompts are written when the driver starts: checked as the benchmark's
        prompt_flags = dataclasses.replace(config.eval, zero_shot=False).prompt_flags("")
        commands.append(("eval", evaluate.build_parser(), prompt_flags,
                         lambda args: evaluate.usage_problem(args) or (read_prompts(args) if args.prompts else None)))
    problems = Problems()
    for section, parser, argv, more_checks in commands:
        sampling = getattr(config, section)
        if driver_set := driver_set_in_args(section, parser, sampling):  # parsed with them, they would clash too
            problems += driver_set
            continue
        argv += [*sampling_flags(sampling, sampling.seed), "--device", config.device, "--model", "MODEL",
                 "--out", "OUT.json"]
        args, problem = parsed_or_usage_error(parser, argv)
        try:
            if args is not None:
                check_sampling_args(args)
                problem = more_checks(args)  # a problem, or None; a ValueError from generate's
        except (OSError, ValueError) as error:
            problem = str(error)
        with problems.check():
            if problem:
                raise IterateError(f"{section}: {problem} ({section}'s options and {section}.args)",
                                   key=f"{section}.options.refused", where=section)
    return problems


# Options of generate and eval the driver sets for every round: in `args` they came after its own,
# and argparse keeps the last, so `--model M` sampled every round from M, not the round's model.
DRIVER_SET = ("model", "prompts", "task", "rendered_prompts", "benchmark", "records", "plot", "limit",
              "num_samples", "max_new_tokens", "seed", "device", "out", "samples_out", "label", "overwrite")


def driver_set_in_args(section: str, parser: argparse.ArgumentParser,
                       sampling: SamplingOptions) -> list[IterateError]:
    """A problem for each option in `SECTION.args` that the driver sets, naming the key that sets it."""
    problems = Problems()
    for token in (token for token in sampling.args if token.startswith("--")):
        name = token.split("=", 1)[0]
        # the option argparse would take it for: its own, or the one option it abbreviates
        actions = parser._actions
        dests = ({action.dest for action in actions if name in action.option_strings}
                 or {action.dest for action in actions if any(o.startswith(name) for o in action.option_strings)})
        dest = dests.pop() if len(dests) == 1 else None
        with problems.check():
            if len(dests) > 1 and dests & set(DRIVER_SET):
                options = sorted(o for a in actions if a.dest in dests for o in a.option_strings if o.startswith(name))
                raise IterateError(f"{section}.args holds {name}, which abbreviates {' and '.join(options)}: write "
                                   "one in full", key=f"{section}.args.ambiguous", where=f"{section}.args")
            if dest in DRIVER_SET:
                remedy = (f"set {section}.{dest} instead" if hasattr(sampling, dest) else "set device instead"
                          if dest == "device" else "the rounds sample base_model, then each round's export"
                          if dest == "model" else "it names the round's own files")
                raise IterateError(f"{section}.args holds {name}, which the driver sets for every round: {remedy}",
                                   key=f"{section}.args.set_by_the_driver", where=f"{section}.args")
    return problems


def eval_prompt_note(config: IterateConfig) -> str | None:
    """A line when the rounds train on zero-shot or rendered prompts but are measured with the
    benchmark's own prompt: a valid choice, but one to say."""
    generate, evaluation = config.generate, config.eval
    if evaluation.zero_shot or evaluation.prompts or not (generate.zero_shot or generate.rendered_prompts):
        return None
    form = "zero-shot" if generate.zero_shot else "rendered"
    own = "8-shot" if evaluation.benchmark == "gsm8k" else "zero-shot, plain text"
    return (f"note: the rounds train on {form} prompts (generate), and eval measures them with "
            f"{evaluation.benchmark}'s own prompt ({own}); to measure them in training's form set "
            "eval.zero_shot=true (GSM8K) or eval.prompts to a prompt file of the benchmark's problems")


def test_split_warning(config: IterateConfig) -> str | None:
    """A line when the rounds sample, and so train on, the problems eval measures them on: a
    legitimate experiment (overfitting on purpose), and a mistake when unsaid."""
    from nemo_topr.evaluation.evaluate import EVAL_BENCHMARKS

    if config.eval.prompts or config.generate.prompts != EVAL_BENCHMARKS.get(config.eval.benchmark):
        return None
    instead = "gsm8k-train" if config.eval.benchmark == "gsm8k" else "a prompt file of MATH's training problems"
    prompts, benchmark = config.generate.prompts, config.eval.benchmark
    return (f"WARNING: generate.prompts={prompts} is the split eval measures ({benchmark}): "
            f"the rounds train on the test problems, so eval's scores say nothing of unseen problems; sample {instead}")


def verifier_problems(config: IterateConfig) -> list[IterateError]:
    """`verifier.model` and `verifier.args` as `verifier score` reads them, at the start rather
    than after the starting model's evaluation."""
    from nemo_topr.evaluation import verifier

    if config.verifier.model is None:
        return [IterateError(f"verifier.args {config.verifier.args} are options of `verifier score`, which runs only "
                             "with verifier.model", key="verifier.args.without_model",
                             where="verifier.args")] if config.verifier.args else []
    try:
        model_source.require_hugging_face(config.verifier.model, named="verifier.model=")
    except ValueError as error:  # ModelSourceError
        return [IterateError(str(error), key="verifier.model.not_hugging_face", where="verifier.model")]
    _, problem = parsed_or_usage_error(verifier.build_parser(), [
        "score", "--model", config.verifier.model, "--records", "R", "--out", "O", *config.verifier.args,
        "--device", config.device])
    return [IterateError(f"verifier: {problem} (verifier.args)", key="verifier.args.refused",
                         where="verifier.args")] if problem else []


def parsed_or_usage_error(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None,
                                                                                     str | None]:
    """(`parser`'s reading of `argv`, None), or (None, its usage error: argparse's last line)."""
    failed = io.StringIO()
    try:
        with contextlib.redirect_stderr(failed):
            return parser.parse_args(argv), None
    except SystemExit:
        return None, failed.getvalue().strip().splitlines()[-1].split(": error: ", 1)[-1]


def read_prompts(args: argparse.Namespace) -> None:
    """`generate`'s (or `eval`'s) prompts read as it reads them (a misspelt benchmark, a missing or malformed
    prompt file), before the starting model's evaluation; generate's own errors (ValueError)."""
    from nemo_topr.evaluation.generate import prompt_problems

    prompt_problems(args)


ROUND_KEYS = ("base_model", "hf_model", "run_dir", "dataset.train_path", "device")  # train's, set by the driver


def training_config(train: TrainOptions, ranks: int) -> tuple[dict[str, Any], Any]:
    """The training config's values and objective (an ObjectiveConfig), after the checks `nemo-topr
    train` runs on its config before the data (keys, types, the objective, the batch's division
    over `ranks` processes): now, not in round 1 after the sampling and scoring."""
    from nemo_topr.cluster.plan import compose_config
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.validation import check_batch_division, objective_from

    # these come before the driver's own on train's command line, whose value then won without a word
    if set_here := [item for item in train.overrides if item.split("=", 1)[0] in ROUND_KEYS]:
        raise IterateError(f"train.overrides holds {set_here[0]}, which the driver sets for every round (the round's "
                           "model, run directory and data; device is the driver's device key): remove it",
                           key="train.overrides.set_by_the_driver", where="train.overrides")
    try:
        values, _ = compose_config(train.config_name, list(train.overrides), None)  # with check_values
        check_batch_division(values, max(ranks, 1))
        if values.get("resume_from_base"):  # round 0 starts from base_model, later rounds on new data
            raise IterateError("train: resume_from_base=true continues one run on its own data, and each round "
                               "trains a new run on new samples from the previous round's model (round 0's from a "
                               "Hugging Face base_model, which has no optimizer state): remove it",
                               key="train.resume_from_base.true", where="train.overrides")
        return values, objective_from(values.get("objective") or {})
    except ConfigError as error:
        raise IterateError(f"train ({train.config_name} with train.overrides): {error}", key="train.config.refused",
                           where="train.overrides") from None


def curation_problems(curate: CurateOptions, objective) -> list[IterateError]:  # noqa: ANN001
    """target_p_tilde curates to p~ at one scalar c: it must be the c training uses."""
    if curate.mode != "target_p_tilde":
        return []
    if objective.variant == "asymre":
        return [IterateError("curate.mode target_p_tilde aims p~ at one baseline c, and asymre's c is each prompt's "
                             "group mean reward + asymre_delta_v: curate with target_p or anna_karenina (the run's "
                             "data_report.json gives the p~ training saw)",
                             key="curate.mode.target_p_tilde_with_asymre", where="curate.mode")]
    if curate.baseline is not None and curate.baseline != objective.baseline:
        return [IterateError(f"curate.baseline={curate.baseline} and the training's objective.baseline="
                             f"{objective.baseline} differ: the curated p~ would not be the one training sees; leave "
                             "curate.baseline out (it is the training's)", key="curate.baseline.differs_from_training",
                             where="curate.baseline")]
    return []
