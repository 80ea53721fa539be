"""The driver config of `nemo-topr iterate` (`IterateConfig`, plain YAML read with OmegaConf): its
keys, their types and defaults, and reading a file with `key=value` overrides into it. The rules
between its keys are `validation`'s."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from nemo_topr.errors import UserError, did_you_mean
from nemo_topr.utils.arguments import dotted_keys

BENCHMARK_TASKS = {"gsm8k": "gsm8k", "math500": "math"}  # eval.benchmark -> the grader of its prompt file


class IterateError(UserError):
    """A driver problem: bad config, failed stage, or a finished stage whose arguments changed."""


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


def read_config(source: str, overrides: list[str] = ()) -> IterateConfig:
    """The driver config at path `source` (or conf/SOURCE.yaml), then `key=value` overrides: its
    keys and their types checked, not yet the rules between them (`validation.load_config`)."""
    import yaml

    from nemo_topr.training.config import unparsed_yaml
    from nemo_topr.utils.arguments import CONF_DIR

    path = Path(source)
    if not path.is_file():
        path = CONF_DIR / f"{source}.yaml"
    if not path.is_file():
        raise IterateError(f"{source}: no such driver config (a YAML path, or a name in {CONF_DIR})",
                           key="config.not_found", where="config")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise IterateError(unparsed_yaml(str(path), error), key="config.not_yaml", where="config") from None
    if {"defaults", "objective", "dataset"} & set(loaded):  # e.g. tiny_cpu for iterate_tiny_cpu
        raise IterateError(f"{path}: a training config (for `nemo-topr train`); iterate takes a driver config, such "
                           "as iterate_tiny_cpu, whose train.config_name names the training config",
                           key="config.a_training_config", where="config")
    check_driver_overrides(overrides)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(IterateConfig), loaded, OmegaConf.from_dotlist(list(overrides)))
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise IterateError(f"{path}{' with overrides' if overrides else ''}: {_key_problem(error)}",
                           key="config.key_refused", where=getattr(error, "full_key", None) or "config") from None
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
    from nemo_topr.training.schema import admits_none

    for item in overrides:
        key, equals, value = item.partition("=")
        hint = _driver_type(key)  # None for a key the config lacks
        is_list = typing.get_origin(hint) is list
        if equals and not value:
            none = (f", or {key}=[] for none" if is_list else
                    f", or {key}=null for none" if admits_none(hint) else "")
            raise IterateError(f"{item}: an empty value (an unset shell variable?); give one{none}",
                               key="overrides.empty_value", where=key)
        if is_list and equals and value in ("null", "~"):
            raise IterateError(f"{item}: {key} is a list; for none write {key}=[]", key="overrides.list_set_to_null",
                               where=key)
        if is_list and equals and not value.startswith("["):
            raise IterateError(f"{item}: {key} is a list; write it in brackets, one item per comma: "
                               f"{key}=[{','.join(value.split())}] (quoted for the shell)",
                               key="overrides.list_without_brackets", where=key)


def _key_problem(error: OmegaConfBaseException) -> str:
    """OmegaConf's error in one line, naming the dotted key; an unknown key with the closest ones."""
    from nemo_topr.training.config import omegaconf_problem

    key = getattr(error, "full_key", None) or ""
    if not isinstance(error, ConfigKeyError) or not key:
        return omegaconf_problem(error)
    parent, _, name = key.rpartition(".")
    section = _driver_type(parent)
    known = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else []
    close = did_you_mean(name, known, prefix=f"{parent}." if parent else "")
    return f"unknown key {key}{close or '; keys: ' + ', '.join(known)}"


def sampling_flags(options: SamplingOptions, seed: int) -> list[str]:
    """`options` as `generate`'s or `eval`'s command-line options, sampling with `seed`."""
    limit = [] if options.limit is None else ["--limit", str(options.limit)]
    return [*limit, "--num-samples", str(options.num_samples), "--max-new-tokens", str(options.max_new_tokens),
            "--seed", str(seed), *options.args]
