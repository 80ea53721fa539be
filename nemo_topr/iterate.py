"""`nemo-topr iterate CONFIG`: rounds of generate -> curate -> score mu -> train -> export -> eval.

    nemo-topr iterate conf/iterate_tiny_cpu.yaml base_model=DIR out=runs/iterate [rounds=3] [--dry-run]

Round r works in OUT/round_r/ and starts from round r-1's Megatron checkpoint (round 0 from
`base_model`: a Hugging Face directory, a Megatron checkpoint or a run, as `nemo-topr train`
takes it): `score` and `train` read that checkpoint directly, weights only (fresh optimizer,
iteration count and data order), so nothing is converted between rounds. Each round is still
exported to Hugging Face (OUT/round_r/model) for `eval` and for the next round's `generate`,
which sample with transformers; a Megatron base model is exported once too, to OUT/start/model.
OUT must be new, empty or an earlier `iterate`'s (its `.nemo-topr-output` mark): nothing in it is
deleted, but a stage that is rerun replaces its outputs (it runs with --overwrite).
The starting model is evaluated too, in OUT/start/. Each stage runs the
user-facing `nemo-topr` command in a subprocess (`generate` samples and grades in one command).
A stage that succeeds leaves a done-marker, STAGE.done.json, holding its arguments, outputs and
duration; a rerun skips marked stages, so an interrupted run resumes where it stopped (a failed
stage leaves no marker, and `train` itself resumes from its checkpoints). A marked stage whose
arguments have since changed is an error: its outputs fed the later stages. `--dry-run` lists
every stage as done or to run, and runs nothing.

Each run ends with OUT/summary.md and OUT/summary.json (per round: samples by grade, training
records, p and p~, pass@1, maj@k, invalid rate) and OUT/rounds.png (`nemo-topr eval --plot`).
With `verifier.model`, each evaluation's samples are scored by that verifier (`verifier score`)
and evaluated again (`eval --records`), adding the verifier-weighted vote, weighted_maj@k.

CONFIG is a driver config (`IterateConfig`, plain YAML, a path or a name in conf/), not a
training config: it names the training config (`train.config_name`) and holds each stage's
options; `key=value` arguments override it. Its `device` (cuda, or cpu as in iterate_tiny_cpu)
goes to every stage: `--device` of generate, score-logprobs, export and eval, `device=` of train.
Its `nproc_per_node` (default 1) runs score-logprobs and train under torchrun on this node; with
`nodes=N` (N > 1, the driver inside a Slurm allocation of N nodes) they run under srun across the
allocation instead, `nproc_per_node` ranks on each node (slurm/task.sh, as training jobs start).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import typing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from nemo_topr.model import source as model_source
from nemo_topr.utils.arguments import Parser, documented, dotted_keys
from nemo_topr.data.records import Record, is_positive
from nemo_topr.data.tokenization import too_long_policy
from nemo_topr.model.device import DEVICES
from nemo_topr.utils.distributed import standalone_torchrun
from nemo_topr.utils.outputs import OutputError, claimed_output_dir, write_whole

CURATION_MODES = ("anna_karenina", "target_p", "target_p_tilde", "none")
SUBSAMPLING_MODES = ("target_p", "target_p_tilde")  # they need positives and negatives
BENCHMARK_TASKS = {"gsm8k": "gsm8k", "math500": "math"}  # eval.benchmark -> the grader of its prompt file


class IterateError(RuntimeError):
    """A driver problem: bad config, failed stage, or a finished stage whose arguments changed."""


# ---------------------------------------------------------------------------------------------
# Config


@dataclass
class SamplingOptions:
    """Options of `generate` and `eval`; `args` holds any other option of the command."""

    limit: int | None = None  # only the first K problems
    num_samples: int = 16
    max_new_tokens: int = 512
    seed: int = 0  # generation uses seed + r in round r, so rounds draw different samples
    args: list[str] = field(default_factory=list)


@dataclass
class GenerateOptions(SamplingOptions):
    prompts: str = "gsm8k-train"  # a benchmark of `nemo-topr generate`, or a JSONL prompt file
    task: str | None = None  # grader of a prompt file (gsm8k | math)
    zero_shot: bool = False  # GSM8K benchmark: "Question: q\nAnswer:" prompts, not the 8-shot prompt
    # a prompt file of prompts rendered already (chat template written out): sampled as written, and
    # the records tokenized so by score-logprobs and train (dataset.rendered_prompts)
    rendered_prompts: bool = False


@dataclass
class CurateOptions:
    mode: str = "anna_karenina"  # anna_karenina | target_p | target_p_tilde | none (dedup only)
    target: float | None = None  # the share target_p / target_p_tilde aims at
    baseline: float | None = None  # c of target_p_tilde: the training's objective.baseline (another is refused)
    per_prompt: bool = False
    seed: int = 0


@dataclass
class TrainOptions:
    config_name: str = "topr"  # training config in conf/
    overrides: list[str] = field(default_factory=list)  # base_model, run_dir, dataset.train_path: set per round


@dataclass
class EvalOptions(SamplingOptions):
    benchmark: str = "gsm8k"  # gsm8k (test, 8-shot) | math500: the problems, their grader and, by default, prompt
    # the benchmark's problems in the prompt form training sees, not the benchmark's own prompt:
    zero_shot: bool = False  # gsm8k: the test split's "Question: q\nAnswer:" prompts (as generate.zero_shot)
    prompts: str | None = None  # or a JSONL prompt file of them (e.g. chat-rendered), graded as the benchmark
    rendered_prompts: bool = False  # that file's prompts are rendered already (as generate.rendered_prompts)

    def prompt_flags(self, zero_shot_file: str) -> list[str]:
        """`eval`'s options that choose the prompts; `zero_shot_file`: the test split's zero-shot prompts."""
        if self.zero_shot:
            return ["--prompts", zero_shot_file, "--task", "gsm8k"]
        if self.prompts:
            return ["--prompts", self.prompts, "--task", BENCHMARK_TASKS[self.benchmark],
                    *(["--rendered-prompts"] if self.rendered_prompts else [])]
        return ["--benchmark", self.benchmark]


@dataclass
class VerifierOptions:
    # a trained verifier (`nemo-topr verifier`, exported to Hugging Face): it scores every evaluation's
    # samples (`verifier score`), which are evaluated again with the verifier-weighted vote
    model: str | None = None
    args: list[str] = field(default_factory=list)  # other options of `verifier score`, e.g. [--batch-size, "16"]


@dataclass
class IterateConfig:
    base_model: str = MISSING  # what round 0 starts from: HF directory, Megatron checkpoint, run, RUN@ITERATION
    out: str = MISSING
    rounds: int = 1
    device: str = "cuda"  # cuda | cpu, passed to every stage (`nemo_topr.model.device`): no silent fallback
    # ranks of the score and train stages: above 1 they run under torchrun --standalone on this node
    # (one rank per GPU; gloo ranks on cpu); generate and eval stay one process (vLLM splits a model itself)
    nproc_per_node: int = 1
    # above 1: score and train run under srun on this many nodes of the driver's Slurm allocation,
    # nproc_per_node ranks on each; every other stage stays on the driver's node
    nodes: int = 1
    generate: GenerateOptions = field(default_factory=GenerateOptions)
    curate: CurateOptions = field(default_factory=CurateOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    eval: EvalOptions = field(default_factory=EvalOptions)
    verifier: VerifierOptions = field(default_factory=VerifierOptions)


def load_config(source: str, overrides: list[str] = ()) -> IterateConfig:
    """The driver config at path `source` (or conf/SOURCE.yaml), then `key=value` overrides."""
    import yaml

    from nemo_topr.training.config import CONF_DIR, unparsed_yaml

    path = Path(source)
    if not path.is_file():
        path = CONF_DIR / f"{source}.yaml"
    if not path.is_file():
        raise IterateError(f"{source}: no such driver config (a YAML path, or a name in {CONF_DIR})")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise IterateError(unparsed_yaml(str(path), error)) from None
    if {"defaults", "objective", "dataset"} & set(loaded):  # e.g. tiny_cpu for iterate_tiny_cpu
        raise IterateError(f"{path}: a training config (for `nemo-topr train`); iterate takes a driver config, such "
                           "as iterate_tiny_cpu, whose train.config_name names the training config")
    check_driver_overrides(overrides)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(IterateConfig), loaded, OmegaConf.from_dotlist(list(overrides)))
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise IterateError(f"{path}{' with overrides' if overrides else ''}: {_key_problem(error)}") from None
    check_config(config)
    return config


def driver_settings() -> list[str]:
    """The driver config's dotted keys (`arguments.Parser`: `--rounds 3` is rounds=3)."""
    return dotted_keys(OmegaConf.to_container(OmegaConf.structured(IterateConfig)))


def _driver_type(dotted: str) -> Any:
    """The type of the driver config's field at `dotted` ("" for the whole config); None for no field."""
    section: Any = IterateConfig
    for part in filter(None, dotted.split(".")):
        section = get_type_hints(section).get(part) if dataclasses.is_dataclass(section) else None
    return section


def check_driver_overrides(overrides: list[str]) -> None:
    """An empty value (`out=`, an unset shell variable: OmegaConf's "Incompatible value 'None'"),
    and a list key given a plain value (`generate.args=--top-k 50`: "AnyNode is not a ListConfig"),
    each in a line saying what to write."""
    from nemo_topr.training.config import admits_none

    for item in overrides:
        key, equals, value = item.partition("=")
        hint = _driver_type(key)  # None for a key the config lacks
        is_list = typing.get_origin(hint) is list
        if equals and not value:
            none = (f", or {key}=[] for none" if is_list else
                    f", or {key}=null for none" if admits_none(hint) else "")
            raise IterateError(f"{item}: an empty value (an unset shell variable?); give one{none}")
        if is_list and equals and value in ("null", "~"):
            raise IterateError(f"{item}: {key} is a list; for none write {key}=[]")
        if is_list and equals and not value.startswith("["):
            raise IterateError(f"{item}: {key} is a list; write it in brackets, one item per comma: "
                               f"{key}=[{','.join(value.split())}] (quoted for the shell)")


def _key_problem(error: OmegaConfBaseException) -> str:
    """OmegaConf's error in one line, naming the dotted key; an unknown key with the closest ones."""
    from nemo_topr.training.config import omegaconf_problem

    key = getattr(error, "full_key", None) or ""
    if not isinstance(error, ConfigKeyError) or not key:
        return omegaconf_problem(error)
    parent, _, name = key.rpartition(".")
    section = _driver_type(parent)
    known = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else []
    close = difflib.get_close_matches(name, known, n=1)
    prefix = f"{parent}." if parent else ""
    return f"unknown key {key}; " + (f"did you mean {prefix}{close[0]}?" if close else f"keys: {', '.join(known)}")


def check_config(config: IterateConfig) -> None:
    from nemo_topr.evaluation.evaluate import EVAL_BENCHMARKS

    problems = []
    if config.rounds < 1:
        problems.append(f"rounds must be at least 1; got {config.rounds}")
    for name in ("nproc_per_node", "nodes"):
        if getattr(config, name) < 1:
            problems.append(f"{name} must be at least 1; got {getattr(config, name)}")
    if config.device not in DEVICES:
        problems.append(f"device must be one of {', '.join(DEVICES)}; got {config.device!r}")
    if config.curate.mode not in CURATION_MODES:
        problems.append(f"curate.mode must be one of {CURATION_MODES}; got {config.curate.mode!r}")
    if (config.curate.mode in SUBSAMPLING_MODES) != (config.curate.target is not None):
        problems.append("curate.target is needed by, and only by, curate.mode target_p / target_p_tilde")
    if config.curate.target is not None and not 0 <= config.curate.target <= 1:  # NaN too
        problems.append(f"curate.target must be a share in [0, 1]; got {config.curate.target}")
    if config.curate.per_prompt and config.curate.mode not in SUBSAMPLING_MODES:
        problems.append("curate.per_prompt spreads the sub-sampling of curate.mode target_p / target_p_tilde over "
                        f"the prompts; curate.mode {config.curate.mode} has none")
    if config.generate.zero_shot and config.generate.prompts not in ("gsm8k-train", "gsm8k-test"):
        problems.append(f"generate.zero_shot needs GSM8K benchmark prompts; got {config.generate.prompts!r}")
    if config.eval.benchmark not in EVAL_BENCHMARKS:
        problems.append(f"eval.benchmark must be one of {sorted(EVAL_BENCHMARKS)}; got {config.eval.benchmark!r}")
    if config.eval.zero_shot and config.eval.prompts:
        problems.append("eval.zero_shot and eval.prompts both choose eval's prompts: set eval.zero_shot=false to "
                        "sample eval.prompts")
    elif config.eval.zero_shot and config.eval.benchmark != "gsm8k":
        problems.append("eval.zero_shot writes GSM8K's test questions zero-shot: it needs eval.benchmark gsm8k; got "
                        f"{config.eval.benchmark!r}")
    if config.eval.rendered_prompts and not config.eval.prompts:
        problems.append("eval.rendered_prompts is for eval.prompts, a prompt file of rendered prompts")
    problems += sampling_problems(config, eval_benchmark_known=config.eval.benchmark in EVAL_BENCHMARKS)
    problems += verifier_problems(config)
    try:
        root = model_root(model_source.resolve(config.base_model))
        if Path(config.out).resolve().is_relative_to(root):
            problems.append(f"out={config.out} is inside base_model's {root}: a rerun would read the rounds as files "
                            "of the model, changed since it started, and refuse to resume; choose an out outside it")
    except model_source.ModelSourceError as error:
        problems.append(str(error))
    try:
        problems += curation_problems(config.curate, training_config(config.train, Ranks.of(config).total)[1])
    except IterateError as error:
        problems.append(str(error))
    if problems:
        raise IterateError("; ".join(problems))


def sampling_problems(config: IterateConfig, *, eval_benchmark_known: bool) -> list[str]:
    """`generate`'s and `eval`'s options (the config's and `args`) and generate's prompts, read by
    those commands' own parsers and checks, at the start: a typo in `args`, a count of 0 or a missing
    prompt file would otherwise fail the round's `generate` after the starting model's evaluation, or
    `eval` after the round's training."""
    from nemo_topr.evaluation import evaluate, generate

    options = config.generate
    prompts = ["--prompts", options.prompts, *(["--task", options.task] if options.task else []),
               *(["--rendered-prompts"] if options.rendered_prompts else [])]
    commands = [("generate", generate.build_parser(), prompts, read_prompts)]
    if eval_benchmark_known:  # zero-shot prompts are written when the driver starts: checked as the benchmark's
        prompt_flags = dataclasses.replace(config.eval, zero_shot=False).prompt_flags("")
        commands.append(("eval", evaluate.build_parser(), prompt_flags,
                         lambda args: evaluate.usage_problem(args) or (read_prompts(args) if args.prompts else None)))
    problems = []
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
                generate.check_sampling_args(args)
                problem = more_checks(args)  # a problem, or None; a ValueError from generate's
        except (OSError, ValueError) as error:
            problem = str(error)
        if problem:
            problems.append(f"{section}: {problem} ({section}'s options and {section}.args)")
    return problems


# Options of generate and eval the driver sets for every round: in `args` they came after its own,
# and argparse keeps the last, so `--model M` sampled every round from M, not the round's model.
DRIVER_SET = ("model", "prompts", "task", "rendered_prompts", "benchmark", "records", "plot", "limit",
              "num_samples", "max_new_tokens", "seed", "device", "out", "samples_out", "label", "overwrite")


def driver_set_in_args(section: str, parser: argparse.ArgumentParser, sampling: SamplingOptions) -> list[str]:
    """A problem for each option in `SECTION.args` that the driver sets, naming the key that sets it."""
    problems = []
    for token in (token for token in sampling.args if token.startswith("--")):
        name = token.split("=", 1)[0]
        # the option argparse would take it for: its own, or the one option it abbreviates
        actions = parser._actions
        dests = ({action.dest for action in actions if name in action.option_strings}
                 or {action.dest for action in actions if any(o.startswith(name) for o in action.option_strings)})
        if len(dests) > 1 and dests & set(DRIVER_SET):
            options = sorted(o for a in actions if a.dest in dests for o in a.option_strings if o.startswith(name))
            problems.append(f"{section}.args holds {name}, which abbreviates {' and '.join(options)}: write one in full")
            continue
        dest = dests.pop() if len(dests) == 1 else None
        if dest not in DRIVER_SET:
            continue
        remedy = (f"set {section}.{dest} instead" if hasattr(sampling, dest) else "set device instead"
                  if dest == "device" else "the rounds sample base_model, then each round's export"
                  if dest == "model" else "it names the round's own files")
        problems.append(f"{section}.args holds {name}, which the driver sets for every round: {remedy}")
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


def verifier_problems(config: IterateConfig) -> list[str]:
    """`verifier.model` and `verifier.args` as `verifier score` reads them, at the start rather
    than after the starting model's evaluation."""
    from nemo_topr.evaluation import verifier

    if config.verifier.model is None:
        return [f"verifier.args {config.verifier.args} are options of `verifier score`, which runs only with "
                "verifier.model"] if config.verifier.args else []
    try:
        model_source.require_hugging_face(config.verifier.model, named="verifier.model=")
    except ValueError as error:  # ModelSourceError
        return [str(error)]
    _, problem = parsed_or_usage_error(verifier.build_parser(), [
        "score", "--model", config.verifier.model, "--records", "R", "--out", "O", *config.verifier.args,
        "--device", config.device])
    return [f"verifier: {problem} (verifier.args)"] if problem else []


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
    from nemo_topr.training.config import ConfigError, check_batch_division, objective_from

    # these come before the driver's own on train's command line, whose value then won without a word
    if set_here := [item for item in train.overrides if item.split("=", 1)[0] in ROUND_KEYS]:
        raise IterateError(f"train.overrides holds {set_here[0]}, which the driver sets for every round (the round's "
                           "model, run directory and data; device is the driver's device key): remove it")
    try:
        values, _ = compose_config(train.config_name, list(train.overrides), None)  # with check_values
        check_batch_division(values, max(ranks, 1))
        if values.get("resume_from_base"):  # round 0 starts from base_model, later rounds on new data
            raise IterateError("train: resume_from_base=true continues one run on its own data, and each round "
                               "trains a new run on new samples from the previous round's model (round 0's from a "
                               "Hugging Face base_model, which has no optimizer state): remove it")
        return values, objective_from(values.get("objective") or {})
    except ConfigError as error:
        raise IterateError(f"train ({train.config_name} with train.overrides): {error}") from None


def curation_problems(curate: CurateOptions, objective) -> list[str]:  # noqa: ANN001
    """target_p_tilde curates to p~ at one scalar c: it must be the c training uses."""
    if curate.mode != "target_p_tilde":
        return []
    if objective.variant == "asymre":
        return ["curate.mode target_p_tilde aims p~ at one baseline c, and asymre's c is each prompt's group mean "
                "reward + asymre_delta_v: curate with target_p or anna_karenina (the run's data_report.json gives "
                "the p~ training saw)"]
    if curate.baseline is not None and curate.baseline != objective.baseline:
        return [f"curate.baseline={curate.baseline} and the training's objective.baseline={objective.baseline} differ: "
                "the curated p~ would not be the one training sees; leave curate.baseline out (it is the training's)"]
    return []


def check_launch(config: IterateConfig, environ=os.environ) -> None:  # noqa: B008 - the process environment
    """What score and train need to start, checked before the start's evaluation and generation
    (not in a `--dry-run`, which may run on a login node): on cuda, a GPU of this node per rank
    (the other nodes are assumed alike); one driver, not several srun tasks; with nodes > 1, a
    Slurm allocation of that many nodes, the driver its batch script (not under srun)."""
    import torch

    gpus = torch.cuda.device_count()
    if config.device == "cuda" and config.nproc_per_node > gpus:
        raise IterateError(f"nproc_per_node={config.nproc_per_node}, but torch sees {gpus} GPU(s) on this node: "
                           "score and train run one rank per GPU")
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks > 1:
        raise IterateError(f"this driver is one of the {tasks} tasks of an srun step, each of which would run every "
                           "stage into the same out: run it once, as the batch script (not under srun) or in a shell")
    if config.nodes == 1:
        return
    if "SLURM_STEP_ID" in environ:  # the stages' srun would wait for this step's own resources
        raise IterateError(f"nodes={config.nodes} runs score and train as srun steps of the allocation, and this driver "
                           f"runs under srun itself (step {environ['SLURM_STEP_ID']}), whose resources those steps "
                           "would wait for: run it as the batch script")
    allocated = environ.get("SLURM_JOB_NUM_NODES")
    if "SLURM_JOB_ID" not in environ or allocated is None:
        raise IterateError(f"nodes={config.nodes} runs score and train under srun across a Slurm allocation, and "
                           "this driver is not in one (no SLURM_JOB_ID): run it in an sbatch script of "
                           f"#SBATCH --nodes={config.nodes} (docs/verifier_iterate.md)")
    if int(allocated) < config.nodes:
        raise IterateError(f"nodes={config.nodes}, but this Slurm allocation (job {environ['SLURM_JOB_ID']}) has "
                           f"{allocated} node(s)")
    if not TASK_SCRIPT.is_file():
        raise IterateError(f"nodes={config.nodes} starts each rank with {TASK_SCRIPT}, which is missing: run the "
                           "driver from a checkout of nemo_topr")


# ---------------------------------------------------------------------------------------------
# Stages


TASK_SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "task.sh"  # one rank under srun


@dataclass(frozen=True)
class Ranks:
    """The processes of a stage: one; `per_node` under torchrun on this node; or, on several
    nodes, `per_node` on each under srun in the driver's Slurm allocation (as slurm/topr_job.sh
    starts training)."""

    per_node: int = 1
    nodes: int = 1
    cuda: bool = False  # GPU ranks: they get the training job's environment

    @classmethod
    def of(cls, config: IterateConfig) -> Ranks:
        """The score and train stages' ranks."""
        return cls(config.nproc_per_node, config.nodes, cuda=config.device == "cuda")

    @property
    def total(self) -> int:
        return self.per_node * self.nodes

    def command(self, python: str = sys.executable) -> list[str]:
        """The command line that runs `nemo-topr` in these processes."""
        if self.nodes > 1:
            return ["srun", f"--nodes={self.nodes}", f"--ntasks-per-node={self.per_node}", "--kill-on-bad-exit=1",
                    "--label", str(TASK_SCRIPT), python]
        torchrun = standalone_torchrun(self.per_node) if self.per_node > 1 else []
        return [python, *torchrun, "-m", "nemo_topr.cli"]

    def environment(self, environ=os.environ) -> dict[str, str]:  # noqa: B008 - the process environment
        """What these ranks' environment adds to the driver's: on GPUs, a Slurm training job's
        (slurm/environment.sh; a variable set already is kept); under srun, where they meet
        (torchrun makes its own): the allocation's first node, at slurm/topr_job.sh's port
        (NEMO_TOPR_MASTER_PORT, else 29500 + job id mod 10000)."""
        from nemo_topr.cluster.environment import training_environment

        added = {}
        if self.cuda:
            added = {name: value for name, value in training_environment().items() if name not in environ}
        if self.nodes > 1:
            hosts = subprocess.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]],
                                   capture_output=True, text=True, check=True).stdout.split()
            port = environ.get("NEMO_TOPR_MASTER_PORT") or str(29500 + int(environ["SLURM_JOB_ID"]) % 10000)
            added.update(MASTER_ADDR=hosts[0], MASTER_PORT=port, LOCAL_WORLD_SIZE=str(self.per_node))
        return added


@dataclass(frozen=True)
class Stage:
    """One `nemo-topr` command, done once its marker exists with the same arguments."""

    name: str
    directory: Path
    args: tuple[str, ...]  # `nemo-topr` arguments, verb first
    outputs: tuple[Path, ...] = ()
    redo_if_changed: bool = False  # for stages nothing depends on (the plot)
    # the outputs that later stages read, checked unchanged on a rerun (None: all); not a report
    # someone may open in an editor (eval.md), nor samples nothing reads on
    read_later: tuple[Path, ...] | None = None
    # run with --overwrite: a rerun replaces what this stage's failed try left in the driver's own
    # directory. Not recorded in args, so the marker compares only what decides the outputs.
    overwrite: bool = True
    ranks: Ranks = Ranks()  # its processes (not recorded: the outputs mean the same)

    @property
    def marker(self) -> Path:
        return self.directory / f"{self.name}.done.json"

    @property
    def log(self) -> Path:
        return self.directory / "logs" / f"{self.name}.log"

    def is_done(self) -> bool:
        if not self.marker.is_file():
            return False
        marker = json.loads(self.marker.read_text(encoding="utf-8"))
        recorded = marker["args"]
        if recorded == list(self.args) and not (changed := self.outputs_changed(marker.get("stamps"))):
            return True
        if self.redo_if_changed:
            return False
        if recorded == list(self.args):
            raise IterateError(f"{self.marker}: this stage finished, but its output {changed}; later stages use it: "
                               f"put it back, or delete {self.directory} to redo the stages there")
        raise IterateError(f"{self.marker}: this stage finished with other arguments, and later stages used its "
                           f"outputs; use a new `out`, or delete {self.directory} to redo it\n"
                           f"  then: {' '.join(recorded)}\n  now:  {' '.join(self.args)}")

    @property
    def checked_outputs(self) -> tuple[Path, ...]:
        return self.outputs if self.read_later is None else self.read_later

    def output_stamps(self) -> dict[str, list]:
        """{output file later stages read: [size, modification time, SHA-256]}: what the marker
        holds, so that a rerun does not build on an output emptied, edited or replaced since (an
        emptied graded.jsonl was read as "no records", the round skipped). Directories (a run, a
        model) are only checked to exist."""
        return {str(path): [*_size_and_time(path), _sha256(path)] for path in self.checked_outputs if path.is_file()}

    def outputs_changed(self, stamps: dict[str, list] | None) -> str | None:
        """How an output later stages read is gone or changed since the marker's `stamps` (None: a
        marker from before they were kept, where only its presence is checked); None when none is.
        Size and time as recorded mean the same file; else its content decides (`touch`, a copy)."""
        for path in self.checked_outputs:
            if not path.exists():
                return f"{path} is gone"
        for name, (size, mtime, digest) in (stamps or {}).items():
            path = Path(name)
            now = _size_and_time(path)
            if now != [size, mtime] and (now[0] != size or _sha256(path) != digest):
                return f"{path} changed since"
        return None


def _size_and_time(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Stopped(IterateError):
    """The driver was told to stop (Ctrl-C, SIGTERM) while a stage ran; the stage's processes were
    told the same and have ended (`code`: their exit status, Popen's -N for a signal N), or had
    finished their work first (0: marked done)."""

    def __init__(self, signum: int, verb: str, code: int):
        self.signum = signum
        ended = ("it finished first and is marked done: the same command goes on after it" if code == 0 else
                 f"it was stopped too ({f'killed by {signal.Signals(-code).name}' if code < 0 else f'exit {code}'}) "
                 "and is not marked done: the same command resumes")
        super().__init__(f"stopped by {signal.Signals(signum).name} while `nemo-topr {verb}` ran; {ended}")


@contextlib.contextmanager
def forwarding_stops(process: subprocess.Popen) -> Iterator[list[int]]:
    """While `process` runs: Ctrl-C or SIGTERM to the driver goes to its processes' group too, and
    the driver waits for them to end (train saves a checkpoint first). The process has a group of
    its own, so the terminal's Ctrl-C comes once, through here (left to `subprocess.run`, SIGTERM
    would kill the driver alone, its stage running on, and Ctrl-C SIGKILL train 0.25 s later). A
    signal the driver was started ignoring (SIGINT in a background job) stays ignored, as the
    stage inherits it. Yields the signals received."""
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_command(args: tuple[str, ...], log: Path, ranks: Ranks) -> list[int]:
    """`nemo-topr ARGS` in `ranks`' processes, their output in `log`; raises IterateError when it
    fails, Stopped when it did as the driver was told to stop (`forwarding_stops`). Returns the
    stop signals received while it still succeeded."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen([*ranks.command(), *args], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ranks.environment()}, start_new_session=True)
        with forwarding_stops(process) as received:
            code = process.wait()
    if received and code != 0:
        raise Stopped(received[0], args[0], code)
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise IterateError(f"`nemo-topr {args[0]}` failed (exit {code}); full log: {log}\n{tail}")
    return received


def run_stage(stage: Stage, *, dry_run: bool = False) -> None:
    """Run `stage` unless it is done; mark it done only when its command succeeded."""
    where = f"[{stage.directory.name}] {stage.name}"
    if stage.is_done():
        print(f"{where}: done", flush=True)
        return
    command = (*stage.args, "--overwrite") if stage.overwrite else stage.args
    program = stage.ranks.command(python="python")
    print(f"{where}: {'to run' if dry_run else 'running'}: {shlex.join([*program, *command])}", flush=True)
    if dry_run:
        return
    stage.marker.unlink(missing_ok=True)  # a stale marker of other arguments (redo_if_changed)
    started = time.monotonic()
    received = run_command(command, stage.log, stage.ranks)
    seconds = round(time.monotonic() - started, 1)
    write_whole(stage.marker, json.dumps({"stage": stage.name, "args": list(stage.args),
                                               "outputs": [str(p) for p in stage.outputs],
                                               "stamps": stage.output_stamps(),
                                               "log": str(stage.log), "seconds": seconds}, indent=2) + "\n")
    print(f"{where}: finished in {seconds} s", flush=True)
    if received:  # the stage had done its work: kept, then the driver stops as told
        raise Stopped(received[0], stage.args[0], 0)


# ---------------------------------------------------------------------------------------------
# Rounds


def wrote_no_records(path: Path) -> bool:
    """`generate`'s (or eval's `--samples-out`) file is empty: every completion was empty."""
    return not path.read_text(encoding="utf-8").strip()


def read_graded(path: Path) -> list[Record]:
    """The records `generate` wrote: none when every completion was empty (an empty file)."""
    from nemo_topr.data.records import load_records

    if wrote_no_records(path):
        return []
    return load_records(path).records


def curation_flags(options: CurateOptions, records: list[Record] | None,
                   baseline: float) -> tuple[list[str], str | None]:
    """`data curate` options for this round's records (None: not generated yet), and a note when
    a sub-sampling had to go. `baseline` is the training's objective.baseline, target_p_tilde's c.

    Sub-sampling to a target share needs both positives and negatives; a round without one
    side (a weak model's: no correct answer at all) trains on all its records instead.
    """
    if options.mode == "anna_karenina":
        return ["--anna-karenina"], None
    if options.mode == "none":
        return [], None
    if records is not None:
        positives = sum(is_positive(record.reward) for record in records)
        if positives in (0, len(records)):
            return [], (f"curate.mode {options.mode} skipped: {positives} positives and "
                        f"{len(records) - positives} negatives (sub-sampling needs both); trained on every record")
    target = ["--target-p", str(options.target)] if options.mode == "target_p" else [
        "--target-p-tilde", str(options.target), "--baseline", str(baseline)]
    return [*(["--per-prompt"] if options.per_prompt else []), *target], None


def zero_shot_prompts(benchmark: str, path: Path) -> None:
    """A GSM8K split as a prompt file of "Question: q\\nAnswer:" prompts (the benchmark's prompt ids)."""
    from nemo_topr.data.prompts import gsm8k_final_answer, gsm8k_prompt, load_gsm8k

    rows = load_gsm8k(benchmark.removeprefix("gsm8k-"))
    write_whole(path, "".join(
        json.dumps({"prompt": gsm8k_prompt(row["question"], []), "reference_answer": gsm8k_final_answer(row["answer"]),
                    "prompt_id": f"{benchmark}-{index}"}) + "\n" for index, row in enumerate(rows)))


def sampling_flags(options: SamplingOptions, seed: int) -> list[str]:
    limit = [] if options.limit is None else ["--limit", str(options.limit)]
    return [*limit, "--num-samples", str(options.num_samples), "--max-new-tokens", str(options.max_new_tokens),
            "--seed", str(seed), *options.args]


BASE_MODEL_RECORD = "base_model.json"  # in OUT: the files the rounds started from


def model_root(source: model_source.ModelSource) -> Path:
    """The directory holding `source`'s files: a Hugging Face directory, or a Megatron checkpoint's iteration."""
    return (source.checkpoint if source.is_megatron else source.path).resolve()


def model_files(source: model_source.ModelSource) -> list[list]:
    """Name, size and modification time of each file of `source` (`model_root`): the same path
    holding other weights (an `export --overwrite`, a run trained on) is another model. Hashing
    would cost minutes at 70B."""
    root = model_root(source)
    return [[str(path.relative_to(root)), path.stat().st_size, path.stat().st_mtime_ns]
            for path in sorted(root.rglob("*")) if path.is_file()]


def check_same_base_model(record: Path, spec: str, *, write: bool = True) -> None:
    """A rerun resumes OUT's stages by their arguments; base_model's path among them is the same
    when the files there changed, and every stage would count as done on the earlier weights.
    OUT's first start records base_model's files (`model_files`), a rerun compares them."""
    source = model_source.resolve(spec)
    now = {"base_model": str(source.path), "files": model_files(source)}
    if not record.is_file():
        if write:
            write_whole(record, json.dumps(now, indent=1) + "\n")
        return
    then = json.loads(record.read_text(encoding="utf-8"))
    if then != now:
        files_then, files_now = ({name: stat for name, *stat in files} for files in (then["files"], now["files"]))
        changed = sorted(name for name in files_then | files_now if files_then.get(name) != files_now.get(name))
        raise IterateError(f"base_model={spec} is not what {record.parent} started from ({then['base_model']}): "
                           f"{', '.join(changed[:5]) or 'its path'} changed since (size or time; {record}). Its "
                           "stages were built on the earlier model: use a new `out`")


@dataclass(frozen=True)
class RoundFiles:
    """What the stages of a round (or of the start) write in its directory; the summary reads them back."""
    directory: Path

    graded = property(lambda self: self.directory / "graded.jsonl")
    curated = property(lambda self: self.directory / "curated.jsonl")
    scored = property(lambda self: self.directory / "scored.jsonl")
    run_dir = property(lambda self: self.directory / "run")
    model = property(lambda self: self.directory / "model")
    eval_results = property(lambda self: self.directory / "eval.json")
    eval_samples = property(lambda self: self.directory / "eval_samples.jsonl")
    verified_samples = property(lambda self: self.directory / "eval_samples_verified.jsonl")
    verified_results = property(lambda self: self.directory / "eval_verified.json")


@dataclass
class RoundResult:
    label: str
    directory: Path
    model: Path  # the HF model this round produced (its starting model when it had nothing to train on)
    weights: str  # the same model as `base_model` of the next round's training: its run directory
    evaluated: bool = True  # False: nothing to train on, nothing new to evaluate
    note: str | None = None


class Driver:
    """Walks every stage of every round in order, running those not done yet."""

    def __init__(self, config: IterateConfig, *, dry_run: bool = False):
        self.config, self.dry_run = config, dry_run
        self.out = Path(config.out).resolve()
        train = config.train
        # score mu at the training sequence length, so that exactly the sequences training accepts are scored
        values, objective = training_config(train, Ranks.of(config).total)
        self.seq_length, self.baseline = int(values["model"]["seq_length"]), objective.baseline
        # where training drops over-long records, scoring must too, not stop at the first
        dataset = values.get("dataset") or {}
        too_long = too_long_policy(dataset.get("too_long"), dataset.get("strict", True))
        self.score_flags = ["--no-strict"] if too_long == "drop" else []
        self.device_flag = ("--device", config.device)
        # its absolute path, as base_model's, in the verify stages' recorded arguments
        self.verifier_model = (None if config.verifier.model is None
                               else model_source.require_hugging_face(config.verifier.model))

    def run(self) -> list[RoundResult]:
        if not self.dry_run:
            check_launch(self.config)
        claimed_output_dir(self.out, "nemo-topr iterate", make=not self.dry_run)
        check_same_base_model(self.out / BASE_MODEL_RECORD, self.config.base_model, write=not self.dry_run)
        for note in (eval_prompt_note(self.config), test_split_warning(self.config)):
            if note:
                print(note, flush=True)
        start = self.start()
        results = [start]
        for index in range(self.config.rounds):
            results.append(self.run_round(index, results[-1]))
        evaluated = [self.plotted_results(result.directory) for result in results if result.evaluated]
        run_stage(Stage("plot", self.out, ("eval", "--plot", *map(str, evaluated), "--out", str(self.out / "rounds.png")),
                        (self.out / "rounds.png",), redo_if_changed=True), dry_run=self.dry_run)
        if not self.dry_run:
            write_summary(self.out, self.summary_rows(results))
        return results

    def summary_rows(self, results: list[RoundResult]) -> list[dict[str, Any]]:
        return [summary_row(result, verified=self.verifier_model is not None) for result in results]

    def plotted_results(self, directory: Path) -> Path:
        """With a verifier, the verified results (eval's metrics and the weighted vote) when they
        cover eval's problems; else eval's own (see verified_vote)."""
        verified, results = RoundFiles(directory).verified_results, RoundFiles(directory).eval_results
        if self.verifier_model is None:
            return results
        if not verified.is_file():  # not evaluated yet (a dry run), or no sample to score
            return verified if self.dry_run else results
        return verified if num_problems(verified) == num_problems(results) else results

    def start(self) -> RoundResult:
        """The base model, exported to HF first when it is a Megatron checkpoint; evaluated."""
        directory, base = self.out / "start", model_source.resolve(self.config.base_model)
        model, weights = base.path, str(base.checkpoint or base.path)
        if base.is_megatron:
            model = RoundFiles(directory).model
            run_stage(Stage("export", directory, ("export", "--ckpt", weights, "--hf-out", str(model), *self.device_flag),
                            (model,)), dry_run=self.dry_run)
        return RoundResult("start", directory, model, weights, note=self.evaluate(directory, model, "start"))

    def run_round(self, index: int, previous: RoundResult) -> RoundResult:
        model, weights = previous.model, previous.weights
        directory = self.out / f"round_{index}"
        files = RoundFiles(directory)
        graded, curated, scored = files.graded, files.curated, files.scored
        run_dir, exported = files.run_dir, files.model
        generate = self.generate_stage(directory, model, index, graded)
        run_stage(generate, dry_run=self.dry_run)
        records = read_graded(graded) if generate.is_done() else None  # None: not generated yet (dry run)
        if records == []:
            print(f"[{directory.name}] generation wrote no records (every completion empty): nothing to train on; "
                  f"the next round starts from {model} again", flush=True)
            return RoundResult(directory.name, directory, model, weights, evaluated=False,
                               note="no records generated: training skipped")
        flags, note = curation_flags(self.config.curate, records, self.baseline)
        if note:
            print(f"[{directory.name}] {note}", flush=True)
        train, rendered, ranks = self.config.train, self.config.generate.rendered_prompts, Ranks.of(self.config)
        stages = [
            Stage("curate", directory, ("data", "curate", str(graded), *flags, "--seed", str(self.config.curate.seed),
                                        "--out", str(curated)), (curated, curated.with_suffix(".stats.json"))),
            Stage("score", directory, ("score-logprobs", "--model", weights, "--data", str(curated),
                                       "--out", str(scored), "--seq-length", str(self.seq_length), *self.score_flags,
                                       *self.device_flag,
                                       *(["--rendered-prompts"] if rendered else [])), (scored,), ranks=ranks),
            Stage("train", directory, ("train", "--config-name", train.config_name, *train.overrides,
                                       f"base_model={weights}", f"run_dir={run_dir}", f"dataset.train_path={scored}",
                                       *(["dataset.rendered_prompts=true"] if rendered else []),
                                       f"device={self.config.device}"), (run_dir,), overwrite=False, ranks=ranks),
            Stage("export", directory, ("export", "--ckpt", str(run_dir), "--hf-out", str(exported), *self.device_flag),
                  (exported,)),
        ]
        for stage in stages:
            run_stage(stage, dry_run=self.dry_run)
        notes = [note, self.evaluate(directory, exported, directory.name)]
        return RoundResult(directory.name, directory, exported, str(run_dir), note="; ".join(filter(None, notes)) or None)

    def zero_shot_file(self, split: str) -> str:
        """OUT/prompts/SPLIT-zero-shot.jsonl, written once (not in a dry run)."""
        path = self.out / "prompts" / f"{split}-zero-shot.jsonl"
        if not self.dry_run and not path.is_file():
            zero_shot_prompts(split, path)
        return str(path)

    def generate_stage(self, directory: Path, model: Path, index: int, graded: Path) -> Stage:
        options = self.config.generate
        prompts, task = options.prompts, options.task
        if options.zero_shot:
            prompts, task = self.zero_shot_file(options.prompts), "gsm8k"
        prompt_flags = [] if task is None else ["--task", task]
        prompt_flags += ["--rendered-prompts"] if options.rendered_prompts else []
        return Stage("generate", directory, ("generate", "--model", str(model), "--prompts", prompts, *prompt_flags,
                                             *sampling_flags(options, options.seed + index), *self.device_flag,
                                             "--out", str(graded)),
                     (graded,))

    def evaluate(self, directory: Path, model: Path, label: str) -> str | None:
        """`eval` of the model; with a verifier, its samples scored and evaluated again, adding the
        verifier-weighted vote (the same samples, so the other metrics are eval's). Returns a note
        when eval wrote no sample to score (every completion empty)."""
        from nemo_topr.evaluation import evaluate

        stage = self.eval_stage(directory, model, label)
        run_stage(stage, dry_run=self.dry_run)
        if self.verifier_model is None:
            return None
        files = RoundFiles(directory)
        samples, scored, results = files.eval_samples, files.verified_samples, files.verified_results
        if stage.is_done() and samples.is_file() and wrote_no_records(samples):
            note = "verifier: eval wrote no sample to score (every completion empty); weighted maj is 0"
            print(f"[{directory.name}] {note}", flush=True)
            return note
        ks = evaluate.build_parser().parse_args(stage.args[1:]).k  # eval's own --k, if eval.args give one
        for verification in (
                Stage("verify", directory, ("verifier", "score", "--model", str(self.verifier_model), "--records",
                                            str(samples), "--out", str(scored), *self.config.verifier.args,
                                            *self.device_flag), (scored, scored.with_suffix(".report.json")),
                      read_later=(scored,)),
                Stage("eval-verified", directory, ("eval", "--records", str(scored),
                                                   *(["--k", *map(str, ks)] if ks else []), "--label", label,
                                                   "--out", str(results)),
                      (results, results.with_suffix(".md")), read_later=(results,))):
            run_stage(verification, dry_run=self.dry_run)
        return None

    def eval_stage(self, directory: Path, model: Path, label: str) -> Stage:
        options = self.config.eval
        results, samples = RoundFiles(directory).eval_results, RoundFiles(directory).eval_samples
        prompts = options.prompt_flags(self.zero_shot_file("gsm8k-test") if options.zero_shot else "")
        return Stage("eval", directory, ("eval", "--model", str(model), *prompts,
                                         *sampling_flags(options, options.seed), *self.device_flag, "--label", label,
                                         "--samples-out", str(samples), "--out", str(results)),
                     (results, results.with_suffix(".md"), samples),
                     read_later=(results, samples) if self.verifier_model is not None else (results,))


# ---------------------------------------------------------------------------------------------
# Summary


def summary_row(result: RoundResult, *, verified: bool = False) -> dict[str, Any]:
    """What one round did and scored, read back from its stages' outputs."""
    row: dict[str, Any] = {"round": result.label, "model": str(result.model), "note": result.note}
    files = RoundFiles(result.directory)
    if files.graded.is_file():
        row["samples"] = sample_counts(files.graded)
    if (files.run_dir / "data_report.json").is_file():
        row.update(training_composition(files.run_dir))
    if files.eval_results.is_file():
        results = json.loads(files.eval_results.read_text(encoding="utf-8"))
        row["eval"] = headline_metrics(results)
        if verified:
            row["eval"]["weighted_maj@k"] = verified_vote(files.verified_results, results)
    return row


def num_problems(results: Path) -> int:
    return json.loads(results.read_text(encoding="utf-8"))["num_problems"]


def verified_vote(verified: Path, results: dict[str, Any]) -> float | None:
    """weighted_maj@k over eval's problems (`results`). `eval --records` of the scored samples
    (`verified`) has no problem whose samples were all empty: such a problem has no record to score
    (or no file, when all were), and its vote, with no answer, is wrong: a 0 in eval's mean.
    None with one sample per problem (no vote)."""
    k = max(results["ks"])
    if k == 1:
        return None
    if not verified.is_file():
        return 0.0
    vote = json.loads(verified.read_text(encoding="utf-8"))
    return vote["metrics"][f"weighted_maj@{k}"] * vote["num_problems"] / results["num_problems"]


def sample_counts(graded: Path) -> dict[str, int | None]:
    """The round's samples by grade, from `generate`'s sample log: every sample drawn, empty
    completions (invalid samples) and grader errors (no verdict) included, which are no records.
    Without the log (deleted by hand) only the records' grades are known: `drawn` and `error` are None."""
    from nemo_topr.evaluation.sample_log import log_path, logged_samples

    records = read_graded(graded)
    if log_path(graded).is_file():
        grades = Counter(sample.grade for samples in logged_samples(log_path(graded)) for sample in samples)
        drawn, errors = sum(grades.values()), grades["error"]
    else:
        grades, drawn, errors = Counter((record.meta or {}).get("grade") for record in records), None, None
    return {"drawn": drawn, "records": len(records), "correct": grades["correct"], "wrong": grades["wrong"],
            "invalid": grades["invalid"], "error": errors}


def training_composition(run_dir: Path) -> dict[str, Any]:
    """Records training used, their share of positives p, and p~ with the c each record got, as the
    run's data report gives them (asymre's c is its group means, not `objective.baseline`). A report
    without p~ or baselines (an earlier version's) gives None, shown as "—"."""
    report = json.loads((run_dir / "data_report.json").read_text(encoding="utf-8"))
    return {"training_records": report["records_used"], "positives": report["positives"],
            "p": report["positives"] / report["sequences"], "baseline": report.get("baselines"),
            "p_tilde": report.get("p_tilde")}


def headline_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """pass@1, maj@k and weighted_maj@k at the largest k (None with one sample per problem, and
    without a verifier) and the invalid rate."""
    metrics, k = results["metrics"], max(results["ks"])
    return {"pass@1": metrics["pass@1"], "maj_k": k, "maj@k": metrics.get(f"maj@{k}"),
            "weighted_maj@k": metrics.get(f"weighted_maj@{k}"), "invalid_rate": metrics["invalid_rate"]}


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    def number(value: float | None, percent: bool = False) -> str:
        if value is None:
            return "—"
        return f"{100 * value:.1f}" if percent else f"{value:.3f}"

    ks = "/".join(map(str, sorted({row["eval"]["maj_k"] for row in rows if "eval" in row})))
    weighted = any(row.get("eval", {}).get("weighted_maj@k") is not None for row in rows)  # a verifier scored them
    lines = ["| round | samples: correct / wrong / invalid / grader error | training records | p | p̃ | pass@1 % | "
             f"maj@{ks} % |{f' weighted maj@{ks} % |' if weighted else ''} invalid % | note |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if weighted else "")]
    for row in rows:
        samples = row.get("samples")
        evaluation = row.get("eval", {})
        lines.append(" | ".join([
            f"| {row['round']}",
            " / ".join(str(samples[grade]) if samples[grade] is not None else "— (no sample log)"
                       for grade in ("correct", "wrong", "invalid", "error")) if samples else "—",
            str(row.get("training_records", "—")),
            number(row.get("p")), number(row.get("p_tilde")),
            number(evaluation.get("pass@1"), True), number(evaluation.get("maj@k"), True),
            *([number(evaluation.get("weighted_maj@k"), True)] if weighted else []),
            number(evaluation.get("invalid_rate"), True), row["note"] or "",
        ]) + " |")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, rows: list[dict[str, Any]]) -> None:
    markdown = summary_markdown(rows)
    (out / "summary.json").write_text(json.dumps({"rounds": rows, "plot": str(out / "rounds.png")}, indent=2) + "\n",
                                      encoding="utf-8")
    (out / "summary.md").write_text(f"{markdown}\n![rounds](rounds.png)\n", encoding="utf-8")
    print(f"\n{markdown}\nwrote {out / 'summary.md'}, {out / 'summary.json'} and {out / 'rounds.png'}", flush=True)


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="nemo-topr iterate", settings=driver_settings, **documented(__doc__))
    parser.add_argument("config", help="driver config: a YAML path, or a name in conf/ (e.g. iterate_tiny_cpu)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the driver config (dotted keys)")
    parser.add_argument("--dry-run", action="store_true", help="list the stages, done or to run; run nothing")
    args = parser.parse_intermixed_args(argv)  # --dry-run before or after the overrides
    try:
        Driver(load_config(args.config, args.overrides), dry_run=args.dry_run).run()
    except (IterateError, OutputError) as error:
        print(f"nemo-topr iterate: {error}", file=sys.stderr)
        return 128 + error.signum if isinstance(error, Stopped) else 1  # the shell's status for the signal
    return 0
