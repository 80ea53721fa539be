"""TOPR run configuration: Hydra/OmegaConf YAML in ``conf/`` -> Megatron-Bridge ``ConfigContainer``.

A run config has Bridge's sections (``model``, ``train``, ``optimizer``, ``scheduler``,
``checkpoint``, ``logger``, ``ddp``, ``dist``, ``rng``, ``dataset``, ...) plus ours:

    base_model: the starting model: a Hugging Face directory, a Megatron checkpoint or a nemo-topr
                run (`nemo_topr.model.source`); `hf_model` is accepted as an alias
    run_dir:    where checkpoints, TensorBoard logs, the resolved config and reports go
    objective:  `nemo_topr.objective.ObjectiveConfig` fields
    device:     cuda | cpu, never a silent fallback (`nemo_topr.model.device`)
    resume_from_base: false (default): a Megatron base model gives its weights only (fresh optimizer,
                iteration count and data order); true: continue its training state too

Overrides come last, as in Bridge recipes: defaults in code (:func:`default_container`), then the
YAML files (Hydra defaults lists), then ``key=value`` from the command line. Every key is
checked against the dataclass it lands on; a typo is an error naming the key and the closest
valid names, never a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_topr.model import source as model_source
from nemo_topr.model.device import DEVICES, DeviceError, resolve_device
from nemo_topr.model.settings import (CUDNN_922_FIX, device_model_settings, fused_adam_available,
                                      te_attention_cudnn_problem)
from nemo_topr.model.source import ModelSource
from nemo_topr.objective import ObjectiveConfig
from nemo_topr.utils.outputs import nearest_existing
from nemo_topr.training.checkpoints import latest_iteration
from nemo_topr.training.host_memory import available_bytes, check_cpu_attention
from nemo_topr.training.run_state import START_CONFIGS_DIR, entries_of_others

CONF_DIR = Path(os.environ.get("NEMO_TOPR_CONF_DIR", Path(__file__).resolve().parents[2] / "conf"))
OUR_KEYS = ("base_model", "resume_from_base", "run_dir", "objective", "device")
OUR_VALUES = tuple(key for key in OUR_KEYS if key != "objective")  # the rest of a config is sections


class ConfigError(ValueError):
    """A configuration problem, with the dotted key that caused it."""


def compose(config_name: str, overrides: list[str] = (), config_dir: str | Path | None = None, *,
            whole_run: bool = True) -> DictConfig:
    """Compose ``config_dir/config_name.yaml`` (with its defaults list), then apply ``key=value``
    overrides. Any field of the target dataclasses may be overridden, whether or not the YAML
    mentions it; unknown keys are rejected later, against the dataclasses themselves.

    `config_name` may also be the path of a YAML file of the user's (`my_runs/exp1.yaml`): its
    defaults list may name a file beside it or one of this repository's presets (`topr`,
    `llama31_8b_bf16`), which are searched after the user's directory. `whole_run`: it configures a
    run, so it must compose conf/topr.yaml (False: a file read for one section, as score-logprobs
    reads --train-config's model section)."""
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    config_dir, config_name = config_location(config_name, config_dir)
    presets = [] if config_dir == CONF_DIR.resolve() else [f"hydra.searchpath=[file://{CONF_DIR.resolve()}]"]
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=presets)
    except MissingConfigException as error:
        available = sorted(p.stem for p in config_dir.glob("*.yaml"))
        if error.missing_cfg_file not in (None, config_name):  # a name in its defaults list
            searched = " nor in ".join(str(d) for d in dict.fromkeys([config_dir, CONF_DIR.resolve()]))
            raise ConfigError(f"config {config_dir / config_name}.yaml: its defaults name {error.missing_cfg_file!r}, "
                              f"found neither in {searched}; the presets: "
                              f"{sorted(p.stem for p in CONF_DIR.glob('*.yaml'))}") from None
        raise ConfigError(f"no config {config_name!r} in {config_dir}; available: {available}") from None
    except yaml.YAMLError as error:  # the mark names the file (the user's, or one its defaults name) and line
        raise ConfigError(unparsed_yaml(f"config {config_dir / config_name}.yaml", error)) from None
    if whole_run and "resume_from_base" not in cfg:  # conf/topr.yaml's key alone: the first missing one was named
        raise ConfigError(f"config {config_dir / config_name}.yaml composes nothing from conf/topr.yaml, the "
                          "recipe's settings (device, objective, run_dir, ...): begin it with a defaults list naming "
                          "topr or a preset, as `defaults: [topr, _self_]` or `defaults: [llama31_8b_bf16, _self_]`")
    malformed = [item for item in overrides if "=" not in item]
    if malformed:
        raise ConfigError(f"overrides must be key=value; got {malformed}")
    check_overrides(overrides)
    OmegaConf.set_struct(cfg, False)
    try:
        model_source.fold_alias(cfg)
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([model_source.alias_override(o) for o in overrides]))
        OmegaConf.to_container(cfg, resolve=True)  # a failing interpolation named by its key, as resolve() does not
        OmegaConf.resolve(cfg)
    except model_source.ModelSourceError as error:
        raise ConfigError(str(error)) from None
    except OmegaConfBaseException as error:  # an override that does not parse, an interpolation that fails
        raise ConfigError(f"config {config_dir / config_name}.yaml{' with overrides' if overrides else ''}: "
                          f"{omegaconf_problem(error)}") from None
    return cfg


def check_overrides(overrides: list[str]) -> None:
    """Each override with a value, and the model named once. OmegaConf reads `KEY=` (an unset shell
    variable) as null: `plan` then planned its own default batch size, `train` ended in a TypeError
    on every rank after writing the run directory. A key given twice keeps the last value (Hydra's
    rule, which appending to a command relies on), but `hf_model=B` with `base_model=A` is the
    alias: which model trains hung on their order, where a YAML holding both is refused."""
    models: dict[str, str] = {}  # the last of each, as OmegaConf keeps it
    for item in overrides:
        key, value = item.split("=", 1)
        if key.startswith(("+", "~")):  # Hydra's add / delete: read as a section named "+optimizer"
            raise ConfigError(f"{item}: Hydra's + and ~ prefixes are not read here; set any key of the config "
                              f"as is ({key.lstrip('+~')}=VALUE: an unknown key is refused by name), or null it "
                              f"({key.lstrip('+~')}=null)")
        if value == "":
            none = f", or {key}=null for none" if _takes_null(key) else ""
            raise ConfigError(f"{item}: an empty value (an unset shell variable?); give one{none}")
        if key in ("base_model", "hf_model"):
            models[key] = value
    if len(models) == 2 and models["base_model"] != models["hf_model"]:
        raise ConfigError(f"base_model={models['base_model']} and hf_model={models['hf_model']} disagree; hf_model "
                          "is an alias of base_model: set one")


def _takes_null(dotted: str) -> bool:
    """Whether `dotted=null` is a value the checks accept: its field's annotation admits None, and it
    is no NEEDS_A_VALUE key. Our own values and keys no section has take none. Imports Bridge for
    its sections' classes, on this error path alone (`dataset.packed=null` was offered, then refused)."""
    section, *keys = dotted.split(".")
    if not keys or section in OUR_VALUES or dotted in NEEDS_A_VALUE:
        return False
    target = ObjectiveConfig if section == "objective" else _section_classes().get(section)
    for key in keys:
        hints = typing.get_type_hints(target) if target is not None else {}
        if key not in hints:
            return False
        hint, target = hints[key], _dataclass_in(hints[key])
    return admits_none(hint)


def admits_none(hint: Any) -> bool:
    """Whether a type annotation takes None (`X | None`, `Optional[X]`, `Any`)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(admits_none(member) for member in typing.get_args(hint))
    return hint is type(None) or hint is Any


def unparsed_yaml(what: str, error: Exception) -> str:
    """One line for a YAML file that does not parse; the parser's marks name the file, line and column."""
    return f"{what} does not parse as YAML: {' '.join(str(error).split())}"


def omegaconf_problem(error: Exception) -> str:
    """OmegaConf's error in one line, naming the dotted key where it has one."""
    key, message = getattr(error, "full_key", None) or "", str(getattr(error, "msg", None) or error).splitlines()[0]
    return f"{key}: {message}" if key else message


def config_location(config: str, config_dir: str | Path | None = None) -> tuple[Path, str]:
    """(directory, name) of a config given as a name in `config_dir` (default: conf/) or as the
    path of a YAML file; a path that names no file is an error, not a name to search for."""
    path = Path(config)
    if path.suffix == ".yml":
        raise ConfigError(f"config {config}: Hydra reads configs only from .yaml files; rename it "
                          f"{path.with_suffix('.yaml')}")
    directory = Path(config_dir or CONF_DIR).resolve()
    if path.suffix == ".yaml" and (path.is_file() or len(path.parts) > 1):
        if not path.is_file():
            raise ConfigError(f"config {config}: no such file")
        return path.resolve().parent, path.stem
    if path.suffix == ".yaml" and not (directory / path.name).is_file():  # a file meant here, not a preset
        raise ConfigError(f"config {config}: no such file, here ({Path.cwd()}) or among the configs in {directory}")
    return directory, path.name.removesuffix(".yaml")


# Keys whose value must be at least this (sizes, counts, intervals): a 0 passes Bridge's setter
# and fails later in arithmetic or in a division, after the job queued and the imports ran.
LOWER_BOUNDS = {
    **{f"model.{key}": 1 for key in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "num_layers",
        "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels")},
    "model.seq_length": 2,
    "train.global_batch_size": 1, "train.micro_batch_size": 1,
    "rng.seed": 1,  # Bridge asserts a positive seed at set-up (training/initialize.py), after the data
    "dataset.epochs": 1,  # dataset.seq_length must equal model.seq_length (build_training_run)
    "checkpoint.save_interval": 1, "logger.log_interval": 1,
    "optimizer.lr": 0, "optimizer.min_lr": 0, "optimizer.weight_decay": 0, "optimizer.clip_grad": 0,
    "optimizer.adam_beta1": 0, "optimizer.adam_beta2": 0, "optimizer.adam_eps": 0,
    "scheduler.lr_warmup_iters": 0, "scheduler.lr_warmup_init": 0,
}
# ... and below this: Adam's decay rates. torch's Adam refuses others only when the optimizer is
# built (after the imports and the data), Transformer Engine's FusedAdam on GPUs not at all.
UPPER_BOUNDS = {"optimizer.adam_beta1": 1, "optimizer.adam_beta2": 1}


def _section_classes() -> dict[str, type]:
    """The dataclass each top-level section lands on in `build_training_run`."""
    from nemo_topr.model import cpu_runtime

    cpu_runtime.import_bridge()
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import ConfigContainer

    from nemo_topr.training.data import ToprDatasetConfig

    classes = {name: _dataclass_in(hint) for name, hint in typing.get_type_hints(ConfigContainer).items()
               if not name.startswith("_")}
    return {**classes, "model": GPTModelProvider, "dataset": ToprDatasetConfig}


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass an annotation names (alone, or in an Optional/Union), else None."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return next((m for m in members if isinstance(m, type) and dataclasses.is_dataclass(m)), None)


def _matches(value: Any, hint: Any) -> bool:
    """Whether a YAML/override value fits a field annotation. Only the plain scalar types are
    judged; anything else (dtypes, enums, callables, containers) Bridge's setter converts."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, member) for member in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def _expected(hint: Any) -> str:
    """An annotation as a user reads it: `float`, `int or None`, `'error' or 'drop' or None`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(member) for member in typing.get_args(hint))
    if origin is typing.Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _check_section(target: type, values: dict[str, Any], path: str) -> None:
    """Raise ConfigError for a key `target` (a dataclass) does not have, a value of the wrong
    type, or a value below its bound in LOWER_BOUNDS."""
    hints = typing.get_type_hints(target)
    names = {f.name for f in dataclasses.fields(target) if not f.name.startswith("_")}
    for key, value in values.items():
        dotted = f"{path}.{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {dotted} ({target.__name__})"
                              f"{did_you_mean(key, [f'{path}.{name}' for name in names])}")
        nested = _dataclass_in(hints[key])
        if isinstance(value, dict) and nested is not None and "_target_" not in value:
            _check_section(nested, value, dotted)
        else:
            _check_value(dotted, value, hints[key])


def did_you_mean(key: str, names: list[str]) -> str:
    """"; did you mean A, B?" naming up to three of the dotted `names` nearest `key`, compared by
    their last part (`lr` finds optimizer.lr, `epochs` dataset.epochs); "" where none is near."""
    by_leaf: dict[str, list[str]] = {}
    for name in names:
        by_leaf.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    close = [name for leaf in difflib.get_close_matches(key.rsplit(".", 1)[-1], by_leaf, n=3) for name in by_leaf[leaf]]
    return f"; did you mean {', '.join(close[:3])}?" if close else ""


def _top_level_names(classes: dict[str, type | None]) -> list[str]:
    """What a top-level key may be meant as: one of ours, a section, or a key of one (but those of
    NOT_SETTINGS, which are refused)."""
    sections = {**classes, "objective": ObjectiveConfig}
    refused = {section: keys or {} for section, keys in NOT_SETTINGS.items()}
    keys = [f"{section}.{field.name}" for section, target in sections.items()
            if target is not None and NOT_SETTINGS.get(section, {}) is not None
            for field in dataclasses.fields(target)
            if not field.name.startswith("_") and field.name not in refused.get(section, {})]
    return [*OUR_KEYS, *classes, *keys]


def _check_value(dotted: str, value: Any, hint: Any) -> None:
    if not _matches(value, hint):
        raise ConfigError(f"{dotted}={value!r} is not a valid value: expected {_expected(hint)}")
    if isinstance(value, str):
        _check_bridge_name(dotted, value, hint)
    if isinstance(value, float) and not math.isfinite(value) and (math.isnan(value) or dotted in LOWER_BOUNDS):
        # NaN passes every comparison: a NaN rate queued, then torch's Adam refused it at set-up (a
        # traceback) and Transformer Engine's FusedAdam (GPUs) checks none
        raise ConfigError(f"{dotted}={value} must be a finite number")
    if dotted in LOWER_BOUNDS and value is not None and value < LOWER_BOUNDS[dotted]:
        raise ConfigError(f"{dotted}={value} must be at least {LOWER_BOUNDS[dotted]}")
    if dotted in UPPER_BOUNDS and value >= UPPER_BOUNDS[dotted]:
        raise ConfigError(f"{dotted}={value} must be below {UPPER_BOUNDS[dotted]}")


def _check_bridge_name(dotted: str, value: str, hint: Any) -> None:
    """A dtype or an activation given by name, which Bridge converts by its own tables: an unknown
    one (`model.params_dtype=bf17`) was kept as the string and failed in arithmetic, or (an
    activation) raised on every rank after the run directory was written. Only Bridge's sections
    hold these, checked once `_section_classes` has imported Bridge (the objective's, before it)."""
    import torch

    dtype = torch.dtype in (hint, *typing.get_args(hint))
    if not dtype and not dotted.endswith(".activation_func"):
        return
    from megatron.bridge.utils.activation_map import ACTIVATION_FUNC_MAP, DTYPE_MAP

    table = DTYPE_MAP if dtype else ACTIVATION_FUNC_MAP
    if value not in table:
        known = ", ".join(sorted(name for name in table if "." not in name))
        what = "a dtype" if dtype else "an activation function"
        raise ConfigError(f"{dotted}={value!r} is not {what} Bridge knows: {known}")


ITERATIONS_FOLLOW_THE_DATA = ("is not a setting: a run trains on each of its records dataset.epochs times, and its "
                              "iterations follow from that (packed rows x epochs / train.global_batch_size). Use "
                              "dataset.epochs, or train on fewer records; to stop early and resume later, send the "
                              "exit signal (docs/training.md)")
SET_BY_RUN_DIR = ("is not a setting: run_dir sets it (RUN_DIR/checkpoints, RUN_DIR/tensorboard), where the resume "
                  "checks, the lock and export look; choose run_dir instead")
NO_VALIDATION = ("is not a setting: nemo-topr train has no validation data, so it would evaluate nothing (skip_train: "
                 "train nothing and report a stop); measure a run's checkpoints with `nemo-topr export` and "
                 "`nemo-topr eval`")
# Bridge keys the recipe sets itself, or that would do nothing or something else here: refused by train, plan and
# submit. Honoured, checkpoint.save wrote over another run's checkpoints past every resume check, and
# train.skip_train ended "stopped with a checkpoint saved" with none, a job requeueing itself for ever.
NOT_SETTINGS = {
    "train": {"train_iters": ITERATIONS_FOLLOW_THE_DATA, "train_samples": ITERATIONS_FOLLOW_THE_DATA,
              "num_epochs": ITERATIONS_FOLLOW_THE_DATA, "skip_train": NO_VALIDATION, "eval_iters": NO_VALIDATION,
              "eval_interval": NO_VALIDATION},
    "validation": None,  # every key: NO_VALIDATION
    "checkpoint": {"save": SET_BY_RUN_DIR, "load": SET_BY_RUN_DIR,
                   "pretrained_checkpoint": "is not a setting: base_model sets it (the weights the run starts from)"},
    "logger": {"tensorboard_dir": SET_BY_RUN_DIR},
}


def check_no_recipe_keys(values: dict[str, Any]) -> None:
    """Refuse the keys of `NOT_SETTINGS`, naming what to use instead: `plan` and `submit` passed
    train.train_iters, and the job failed at its start, after the queue wait."""
    for section, keys in NOT_SETTINGS.items():
        given = values.get(section) or {}
        for key in sorted(given) if isinstance(given, dict) else ():
            if keys is None or key in keys:
                why = NO_VALIDATION if keys is None else keys[key]
                raise ConfigError(f"{section}.{key}={given[key]!r} {why}")


def check_values(values: dict[str, Any], base_model: ModelSource | None = None) -> ObjectiveConfig:
    """Every key and value of a composed config, as `nemo-topr train` applies them: each section
    against the Bridge dataclass it lands on (names, scalar types, finite floats, the bounds), the objective
    through ObjectiveConfig's own checks, the architecture keys against `base_model`
    (`check_architecture_overrides`). `plan` and `submit` call this too, so what they pass `train`
    accepts. Imports Bridge (the classes); builds no model."""
    check_sections(values)
    check_no_recipe_keys(values)
    check_own_values(values)
    classes = _section_classes()
    # `model` first: the presets' dataset.seq_length interpolates model.seq_length, and a bad value
    # is named as it was written (`model.seq_length=abc`)
    for section, section_values in sorted(values.items(), key=lambda item: item[0] != "model"):
        if section in OUR_KEYS:
            continue
        if section not in classes:
            raise ConfigError(f"unknown config section {section!r}{did_you_mean(section, [*classes, *OUR_KEYS])}")
        if isinstance(section_values, dict) and classes[section] is not None:
            _check_section(classes[section], section_values, section)
    _check_lr_range(values.get("optimizer") or {})
    weight_decay_schedule(values)
    _check_model_choices(values.get("model") or {})
    check_architecture_overrides(values, base_model)
    return objective_from(values.get("objective") or {})


# The model keys that set which weights exist and their shapes. The base model's weights have its
# own values: another value (model.num_layers=1 from 2 layers) trained a model without some of
# them, which export then refused, or ended a Megatron base's load in a shape-mismatch traceback.
SHAPE_KEYS = (*model_source.ARCHITECTURE_KEYS.values(), "kv_channels", "should_pad_vocab",
              "share_embeddings_and_output_weights", "gated_linear_unit", "add_bias_linear", "add_qkv_bias",
              "normalization", "qk_layernorm", "position_embedding_type", "attention_output_gate",
              "multi_latent_attention", "num_moe_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "moe_layer_freq", "mtp_num_layers")


def _visible_base_model(values: dict[str, Any]) -> ModelSource | None:
    """The config's base model, for `plan` and `submit`: None where it is unset, not visible on this
    machine, or broken (each verb refuses a broken one in its own words: `load_route`)."""
    try:
        return model_source.load_route(values, must_exist=False)[0]
    except model_source.ModelSourceError:
        return None


def check_architecture_overrides(values: dict[str, Any], base_model: ModelSource | None) -> None:
    """Refuse a `model.` value of a SHAPE_KEYS key other than that of `base_model` (None: the
    config's own, where this machine sees it)."""
    model = values.get("model") or {}
    if not any(key in model for key in SHAPE_KEYS):
        return
    base_model = base_model or _visible_base_model(values)
    if base_model is None:  # not on this machine: plan takes the keys as the architecture to plan for
        return
    from nemo_topr.model.providers import hf_llama_provider

    _, provider = hf_llama_provider(base_model.hf_dir, load_weights=False)  # config.json only
    if changed := shape_changes(model, provider, "the base model"):
        raise ConfigError(f"{changed} ({base_model.describe()}): a run trains "
                          "the base model's weights, whose shapes these keys set, so it would drop or misshape some "
                          "of them; drop the override (the architecture comes from base_model)")


def shape_changes(model: dict[str, Any], provider, whose: str) -> str | None:
    """"model.KEY=V differs from WHOSE's KEY=W" for the SHAPE_KEYS values of a model section other
    than those of `provider` (built from the weights' own config), or None."""
    changed = {key: model[key] for key in SHAPE_KEYS if key in model and model[key] != getattr(provider, key)}
    if not changed:
        return None
    ours = ", ".join(f"model.{key}={value}" for key, value in changed.items())
    theirs = ", ".join(f"{key}={getattr(provider, key)}" for key in changed)
    return f"{ours} {'differs' if len(changed) == 1 else 'differ'} from {whose}'s {theirs}"


def check_sections(values: dict[str, Any]) -> None:
    """Every top-level key but our four values is a section. `train=5` replaced a whole section: a
    TypeError or AttributeError traceback from the checks, or (logger=abc) from Bridge's override
    code after the data was prepared. A value for a name that is no section (`epochs=2`, `lr=0.1`)
    is an unknown key, with the keys it may mean (imports Bridge for its sections, on this path alone)."""
    for section, section_values in values.items():
        if section not in OUR_VALUES and section_values is not None and not isinstance(section_values, dict):
            classes = _section_classes()
            if section not in classes and section != "objective":
                raise ConfigError(f"unknown config key {section}{did_you_mean(section, _top_level_names(classes))}")
            raise ConfigError(f"{section}={section_values!r}: {section} is a section; set its keys, as "
                              f"{section}.KEY=VALUE")


# Optional in Bridge's dataclasses (None: derived elsewhere), yet values this recipe cannot go
# without: `train.global_batch_size=null` ended `train` in a TypeError traceback (the optimizer's
# after the run directory was written), and `plan` planned its own default batch instead.
NEEDS_A_VALUE = ("train.global_batch_size", "train.micro_batch_size", "optimizer.lr", "optimizer.min_lr")


def check_own_values(values: dict[str, Any]) -> None:
    """Our keys' values and the rules across keys, which `plan` and `submit` passed and `train`
    refused: resume_from_base, device, dataset.seq_length against model.seq_length,
    dataset.shared_prefix against dataset.packed; and NEEDS_A_VALUE, in the sections the config has."""
    for dotted in NEEDS_A_VALUE:
        section, key = dotted.split(".")
        if isinstance(values.get(section), dict) and values[section].get(key) is None:
            raise ConfigError(f"{dotted} is unset (null): a run needs a value; set {dotted}=VALUE")
    if not isinstance(values.get("resume_from_base", False), bool):  # "maybe" and 'false' were taken for true
        raise ConfigError(f"resume_from_base={values['resume_from_base']!r} must be true or false")
    # the value only: whether this machine has CUDA is checked where the process starts
    # (`use_device` in `nemo-topr train`), so a GPU preset still builds on a login node (plan, tests)
    try:  # where set: `score-logprobs --train-config` checks a model section alone
        if "device" in values:
            resolve_device(values["device"], cuda_available=True, where="device", choices=DEVICES)
    except DeviceError as error:
        raise ConfigError(str(error)) from None
    dataset, model = values.get("dataset") or {}, values.get("model") or {}
    if "seq_length" in dataset and "seq_length" in model:
        check_sequence_lengths(dataset["seq_length"], model["seq_length"])
    # ToprDatasetConfig.prepare refuses it too, after Megatron's import and the data, in a traceback
    if dataset.get("shared_prefix") is True and dataset.get("packed") is False:
        raise ConfigError("dataset.shared_prefix=true packs each row with a prompt and several of its completions; "
                          "it cannot be combined with dataset.packed=false (one sequence per row): drop one of them")


def check_sequence_lengths(dataset_length: int, model_length: int) -> None:
    """From the config's values (plan, submit) and again on the container, where a length the config
    leaves unset comes from the base model."""
    if dataset_length != model_length:
        raise ConfigError(f"dataset.seq_length ({dataset_length}) must equal model.seq_length ({model_length})")


def _check_model_choices(model: dict[str, Any]) -> None:
    """Megatron's TransformerConfig.__post_init__ rules a preset override can break, checked here:
    they raised on every rank after the run directory was written (`plan` passed them)."""
    if model.get("fp16") and model.get("bf16"):
        raise ConfigError("model.fp16 and model.bf16 are both true: choose one (set the other false)")
    if model.get("recompute_granularity") == "full" and model.get("recompute_method") not in ("block", "uniform"):
        raise ConfigError(f"model.recompute_granularity=full needs model.recompute_method=block or uniform (and "
                          f"model.recompute_num_layers); got recompute_method={model.get('recompute_method')!r}")


def _check_lr_range(optimizer: dict[str, Any]) -> None:
    """Megatron's scheduler asserts max_lr >= min_lr when it is built, after the data is prepared
    (megatron/core/optimizer_param_scheduler.py): a traceback on every rank, after the queue."""
    lr, min_lr = optimizer.get("lr"), optimizer.get("min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and lr < min_lr:
        raise ConfigError(f"optimizer.lr={lr} is below optimizer.min_lr={min_lr}, where the schedule decays to; "
                          f"set optimizer.min_lr={lr} too for a constant rate (the presets' choice), or lower")


def weight_decay_schedule(values: dict[str, Any]) -> tuple[float, float]:
    """(start, end) weight decay for Megatron's parameter scheduler, which sets each parameter
    group's decay from scheduler.start_weight_decay and end_weight_decay at every step
    (megatron/core/optimizer_param_scheduler.py, get_wd) and never reads optimizer.weight_decay:
    our defaults set both to 0, so optimizer.weight_decay=0.1 trained with none. As Megatron-LM's
    arguments do, a constant style (the default) takes optimizer.weight_decay, and a linear or
    cosine one needs both ends. Runs after the sections' type checks (`check_values`)."""
    optimizer, scheduler = values.get("optimizer") or {}, values.get("scheduler") or {}
    weight_decay = optimizer.get("weight_decay", 0.0)
    ends = {key: scheduler.get(key) for key in ("start_weight_decay", "end_weight_decay")}
    if scheduler.get("weight_decay_incr_style", "constant") == "constant":
        if other := [f"scheduler.{key}={value}" for key, value in ends.items()
                     if value is not None and value != weight_decay]:
            raise ConfigError(f"{', '.join(other)} with scheduler.weight_decay_incr_style=constant: a constant weight "
                              f"decay is optimizer.weight_decay ({weight_decay}); set that, or "
                              "weight_decay_incr_style=linear (or cosine) for a schedule from start to end")
        return weight_decay, weight_decay
    if missing := [f"scheduler.{key}" for key, value in ends.items() if value is None]:
        raise ConfigError(f"scheduler.weight_decay_incr_style={scheduler['weight_decay_incr_style']} schedules the "
                          f"weight decay from start to end: set {' and '.join(missing)}")
    return ends["start_weight_decay"], ends["end_weight_decay"]


def apply_section(target: Any, values: dict[str, Any]) -> None:
    """Apply a section checked by `check_values` onto a Bridge config dataclass (Bridge's own
    setter handles dtype strings and activation-function names)."""
    from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

    apply_overrides(target, values, {})


def check_batch_division(values: dict[str, Any], world_size: int) -> None:
    """Megatron's two divisibility rules for `world_size` ranks (WORLD_SIZE): ranks = TP*PP*CP*DP,
    and the global batch a whole number of micro-batches on every DP rank. Bridge asserts them only
    inside finetune(), after the run directory is set up, as a traceback (`nemo-topr plan` checks
    the same for a planned cluster)."""
    model, train = values.get("model") or {}, values.get("train") or {}
    sizes = {key: _count(model, "model", key, 1) for key in ("tensor_model_parallel_size",
                                                           "pipeline_model_parallel_size", "context_parallel_size")}
    model_parallel = math.prod(sizes.values())
    if world_size % model_parallel:
        spelled = " x ".join(f"model.{key}={size}" for key, size in sizes.items())
        raise ConfigError(f"WORLD_SIZE {world_size} (ranks launched) is not a multiple of {spelled} = "
                          f"{model_parallel}: launch a multiple of it, or change the model-parallel sizes")
    data_parallel = world_size // model_parallel
    global_batch = _count(train, "train", "global_batch_size", 8)
    micro_batch = _count(train, "train", "micro_batch_size", 1)
    step = micro_batch * data_parallel
    if global_batch % step:
        below = global_batch - global_batch % step
        near = " or ".join(str(size) for size in (below, below + step) if size >= step)
        raise ConfigError(f"train.global_batch_size={global_batch} is not a multiple of train.micro_batch_size x "
                          f"data-parallel size = {micro_batch} x {data_parallel} = {step} (data-parallel size = "
                          f"WORLD_SIZE {world_size} / TP*PP*CP {model_parallel}): use a multiple, e.g. {near}")


def _count(section: dict[str, Any], name: str, key: str, default: int) -> int:
    """A size `check_batch_division` divides by, checked as `check_values` would: it runs before
    Bridge's classes are imported, so a string there was a TypeError traceback."""
    value = section.get(key)
    if value is None:
        return default
    _check_value(f"{name}.{key}", value, int)
    return value


def objective_from(values: dict[str, Any]) -> ObjectiveConfig:
    """The run's objective; `ratio_level=token` is refused here, not at the first step: it needs
    log mu of every completion token, and records carry one sum per completion (behavior_logprob)."""
    _check_section(ObjectiveConfig, values, "objective")
    try:
        objective = ObjectiveConfig(**values)
    except ValueError as error:
        raise ConfigError(f"objective: {error}") from None
    if objective.ratio_level == "token":
        raise ConfigError("objective.ratio_level=token needs log mu of every completion token, and records carry one "
                          "behavior_logprob per completion (its sum), so training offers sequence (the paper's "
                          "ratio) and geometric_mean; the per-token ratio is nemo_topr.objective.policy_loss's, "
                          "for callers that have per-token log mu (docs/objective.md)")
    return objective


def default_container(provider: Any, dataset: Any):
    """Bridge ConfigContainer with TOPR's fixed choices; YAML overrides go on top."""
    from megatron.bridge.training.config import (
        CheckpointConfig, ConfigContainer, DistributedDataParallelConfig, DistributedInitConfig, LoggerConfig,
        OptimizerConfig, RNGConfig, SchedulerConfig, TrainingConfig, ValidationConfig,
    )
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    on_gpu = torch.cuda.is_available()
    distributed_optimizer = on_gpu and fused_adam_available()  # `_check_distributed_optimizer`
    # The step returns (sum, denominator): Megatron divides by the global denominator.
    provider.calculate_per_token_loss = True
    if on_gpu:  # AutoBridge builds fp32 providers; train in bf16 unless the YAML says otherwise
        provider.bf16, provider.params_dtype, provider.pipeline_dtype = True, torch.bfloat16, torch.bfloat16
    return ConfigContainer(
        model=provider,
        train=TrainingConfig(train_iters=1, global_batch_size=8, micro_batch_size=1,
                             exit_signal_handler=True),
        validation=ValidationConfig(eval_iters=0, eval_interval=None),
        optimizer=OptimizerConfig(optimizer="adam", lr=5e-7, min_lr=5e-7, weight_decay=0.0, clip_grad=1.0,
                                  bf16=on_gpu, fp16=False,
                                  params_dtype=torch.bfloat16 if on_gpu else torch.float32,
                                  use_distributed_optimizer=distributed_optimizer),
        scheduler=SchedulerConfig(lr_decay_style="constant", lr_warmup_iters=0, start_weight_decay=0.0,
                                  end_weight_decay=0.0, weight_decay_incr_style="constant"),
        ddp=DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer, grad_reduce_in_fp32=True,
                                          overlap_grad_reduce=on_gpu, overlap_param_gather=on_gpu,
                                          average_in_collective=False),  # required by per-token loss
        dataset=dataset,
        logger=LoggerConfig(log_interval=1),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=provider.vocab_size),
        # load_rng: on CPU the tensor-parallel RNG tracker is never seeded (no CUDA generator), and
        # Bridge refuses to restore an empty tracker (bridge/training/checkpointing.py:3156);
        # the CPU generator state is not needed to resume (dropout is off, data order comes
        # from the consumed-sample count).
        checkpoint=CheckpointConfig(save_interval=100, ckpt_format="torch_dist", async_save=False,
                                    fully_parallel_save=on_gpu, fully_parallel_load=on_gpu, load_rng=on_gpu),
        dist=DistributedInitConfig(distributed_backend="nccl" if on_gpu else "gloo",
                                   use_gloo_process_groups=True),
        rng=RNGConfig(seed=1234),
    )


def _check_packed_stream_pipeline(container: Any) -> None:
    """The TOPR step's micro-batch rule (`nemo_topr.training.step.single_row_micro_batches`)."""
    from nemo_topr.training.step import single_row_micro_batches

    model, train = container.model, container.train
    if train.micro_batch_size > 1 and single_row_micro_batches(model):
        raise ConfigError(f"train.micro_batch_size={train.micro_batch_size} with model.pipeline_model_parallel_size="
                          f"{model.pipeline_model_parallel_size}: the TOPR step sends each micro-batch through "
                          "Transformer Engine as one packed stream, which pipeline stages would receive in "
                          "[seq_length, micro_batch_size, hidden] order. Use train.micro_batch_size=1 (a packed "
                          "row already holds many sequences; raise train.global_batch_size for more per step)")


def check_virtual_pipeline(model: Any) -> None:
    """Virtual stages split a pipeline stage into chunks: 2 or more, and only with PP > 1. Megatron
    takes VP = 1 for its interleaved schedule, which then asserts at the first step that each model
    chunk has a data iterator (Bridge hands a one-chunk model its iterator bare:
    megatron/bridge/data/iterator_utils.py); VP at PP = 1 stops when the parallel groups are set up
    (megatron/core/parallel_state.py). Both after the data is prepared; refused here before it."""
    vp, pp = model.virtual_pipeline_model_parallel_size, model.pipeline_model_parallel_size
    if vp is None:
        return
    if vp < 2:
        raise ConfigError(f"model.virtual_pipeline_model_parallel_size={vp}: one chunk per pipeline stage is no "
                          "interleaving, yet Megatron would run its interleaved schedule and fail at the first step; "
                          "leave it unset (null) or use 2 or more")
    if pp == 1:
        raise ConfigError(f"model.virtual_pipeline_model_parallel_size={vp} with model.pipeline_model_parallel_size=1: "
                          "virtual stages interleave pipeline stages, and Megatron refuses them without a pipeline; "
                          "set model.pipeline_model_parallel_size to 2 or more, or leave VP unset (null)")


def choose_pipeline_p2p(model: Any, set_by_config: set[str]) -> None:
    """The interleaved schedule's point-to-point mode (PP > 1 with virtual pipeline stages).

    Megatron's batched p2p (`batch_p2p_comm`, its config default) posts a stage's send to the
    previous and to the next stage in one batch. At PP = 2 both are the same rank, whose receives
    take them crossed: activations as gradients and back, of equal shapes, without an error
    (NVIDIA/Megatron-LM#750, #1450). A PP=2 x VP=2 step so gave other losses than
    one rank's (tests/test_topr_step.py). Megatron-LM's default for interleaving, and Bridge's
    CommOverlapConfig for VP > 1, is unbatched, overlapped p2p; so is the recipe's, unless the
    config sets a key itself (`set_by_config`: the model section's keys), and batched p2p at PP = 2
    is refused."""
    if model.pipeline_model_parallel_size == 1 or (model.virtual_pipeline_model_parallel_size or 1) < 2:
        return
    if "batch_p2p_comm" not in set_by_config:
        model.batch_p2p_comm = False
    if "overlap_p2p_comm" not in set_by_config:
        model.overlap_p2p_comm = not model.batch_p2p_comm
    if model.pipeline_model_parallel_size == 2 and model.batch_p2p_comm:
        raise ConfigError("model.batch_p2p_comm=true with model.pipeline_model_parallel_size=2 and virtual pipeline "
                          "stages: Megatron's batched p2p crosses activations and gradients when the previous and "
                          "the next stage are one rank (NVIDIA/Megatron-LM#750), so losses and gradients would be "
                          "silently wrong; leave model.batch_p2p_comm unset (the recipe uses overlapped p2p)")


def idle_schedule_warning(scheduler: Any, min_lr: float, train_iters: int) -> str | None:
    """A decay that ends before the run at a learning rate of 0 leaves the iterations after it
    training nothing (`scheduler.lr_decay_iters=5 optimizer.min_lr=0`, 13 of 18 iterations), with no
    word from Megatron; `lr_decay_iters` is the user's to set (Megatron then holds min_lr), so this
    is a warning, with train_iters known (the data's)."""
    decay = scheduler.lr_decay_iters
    if decay is None or decay >= train_iters or scheduler.lr_decay_style == "constant" or min_lr > 0:
        return None
    return (f"scheduler.lr_decay_iters={decay} of {train_iters} iterations decays to optimizer.min_lr={min_lr:g}: "
            f"iterations {decay + 1} to {train_iters} train at learning rate 0, changing nothing; leave "
            "lr_decay_iters unset to decay over the whole run, or set optimizer.min_lr above 0")


def check_cpu_precision(container: Any) -> None:
    """device=cpu trains in fp32: `model.bf16=true` failed at the first step ("attempting to assign
    a gradient with dtype 'float' to a tensor with dtype 'c10::BFloat16'"), a BF16 preset at the
    optimizer's set-up (Megatron's "Wrapped parameters must be one of torch.cuda.FloatTensor"),
    both tracebacks after the run directory was written."""
    set_lower = [f"{section}.{key}" for section in ("model", "optimizer") for key in ("bf16", "fp16")
                 if getattr(getattr(container, section), key, False)]
    set_lower += [f"{section}.{key}" for section, key in (("model", "params_dtype"), ("optimizer", "params_dtype"),
                                                          ("model", "pipeline_dtype"))
                  if getattr(getattr(container, section), key, None) not in (None, torch.float32)]
    if set_lower:
        fix = " ".join(f"{key}={'false' if key.endswith(('bf16', 'fp16')) else 'fp32'}" for key in set_lower)
        raise ConfigError(f"{', '.join(set_lower)} with device=cpu: the CPU runtime trains in fp32 "
                          f"(docs/cpu_runtime.md); set {fix}")


def _check_distributed_optimizer(container: Any, device: str) -> None:
    """Megatron's distributed optimizer on the machine that trains: it needs CUDA tensors
    (megatron/core/optimizer/distrib_optimizer.py:470-480), and to resume, TE's or Apex's FusedAdam
    (`fused_adam_available`): refused before the first step, not at the first requeue."""
    keys = [f"{section}.use_distributed_optimizer" for section in ("optimizer", "ddp")
            if getattr(container, section).use_distributed_optimizer]
    if not keys:
        return
    turn_off = "optimizer.use_distributed_optimizer=false ddp.use_distributed_optimizer=false"
    if device == "cpu":
        raise ConfigError(f"{keys[0]}=true with device=cpu: Megatron's distributed optimizer needs CUDA "
                          f"tensors; set {turn_off}")
    if not fused_adam_available():
        raise ConfigError(f"{' and '.join(keys)}=true on a GPU without Transformer Engine or Apex: Megatron-Core "
                          "then uses torch's Adam, whose distributed-optimizer checkpoint it cannot load (the run "
                          "could not resume: megatron/core/optimizer/distrib_optimizer.py:839). Install Transformer "
                          f"Engine (requirements-gpu.txt, or the NGC container), or set {turn_off} (Adam state then "
                          "unsharded)")


def check_fp8(model: Any, device: str, *, without_fp8: str = "drop it (model.fp8=null)") -> None:
    """FP8 runs only in Transformer Engine's layers on a GPU; Megatron's local layers (the CPU
    runtime's, and a GPU's without TE) would compute in fp32 or BF16 and ignore model.fp8.
    `without_fp8`: how the calling command goes on without FP8, on purpose."""
    if not model.fp8:
        return
    if device == "cpu":
        raise ConfigError(f"model.fp8={model.fp8} with device=cpu: FP8 runs only in Transformer Engine's layers on a "
                          f"GPU; the CPU runtime trains in fp32 and would ignore it. To train on the CPU, {without_fp8}")
    if model.transformer_impl != "transformer_engine":
        raise ConfigError(f"model.fp8={model.fp8} with model.transformer_impl={model.transformer_impl!r}: FP8 runs only "
                          "in Transformer Engine's layers, which this run does not build (TE not installed, or "
                          f"transformer_impl=local); install Transformer Engine (requirements-gpu.txt) or {without_fp8}")


def _check_te_attention_cudnn(container: Any) -> None:
    """TE's cuDNN attention must be able to run its backward with the cuDNN this process loaded
    (`te_attention_cudnn_problem`): refused at set-up, not after the model loaded, at the first
    backward. Scoring runs only the forward and is not refused."""
    model = container.model
    backend = str(model.attention_backend).split(".")[-1]  # an AttnBackend, or its name from an override
    if model.transformer_impl != "transformer_engine" or backend not in ("auto", "fused"):
        return
    problem = te_attention_cudnn_problem()
    if problem:
        raise ConfigError(f"{problem}. To train with it: {CUDNN_922_FIX}")


def _check_shared_prefix(container: Any) -> None:
    """Shared-prefix rows need an attention that honours their blocks: the local spec's, or
    FlexCoreAttention swapped into any other spec (nemo_topr/training/flex_attention.py)."""
    from nemo_topr.training.flex_attention import prepare_shared_prefix_attention

    if container.dataset.shared_prefix:
        try:
            prepare_shared_prefix_attention(container.model)
        except ValueError as error:
            raise ConfigError(f"dataset.shared_prefix=true: {error}") from None


@dataclass
class TrainingRun:
    """Everything `nemo-topr train` needs, resolved."""

    container: Any  # megatron.bridge.training.config.ConfigContainer
    objective: ObjectiveConfig
    run_dir: Path
    base_model: ModelSource
    raw: DictConfig  # the composed YAML, saved into run_dir


def check_run_dir(run_dir: Path) -> None:
    """run_dir is where a run writes its checkpoints, configs and ledgers: an existing model
    directory there (a Hugging Face or Megatron checkpoint given as run_dir by mistake, say for
    base_model) is refused before anything is written into it. A run directory is its own resume."""
    if run_dir.is_file():
        raise ConfigError(f"run_dir={run_dir} is a file; a run writes a directory there")
    if not run_dir.is_dir():
        if not (existing := nearest_existing(run_dir.absolute())).is_dir():  # a NotADirectoryError traceback
            raise ConfigError(f"run_dir={run_dir}: {existing} is a file, so no directory can be made under it")
        return
    try:
        found = model_source.resolve(run_dir)
    except model_source.ModelSourceError:  # no model: an empty directory, Slurm's logs, anything a run may share...
        if others := entries_of_others(run_dir):  # ... but not names the run writes
            raise ConfigError(f"run_dir={run_dir} holds {', '.join(others)}, which no start of nemo-topr train wrote "
                              f"there (it has no {START_CONFIGS_DIR}/start_*.yaml); the run writes these names and "
                              f"would replace them: choose a new directory, e.g. run_dir={run_dir / 'run'}") from None
        return
    if found.kind != "run":
        raise ConfigError(f"run_dir={run_dir} is a model, {found.describe()}; a run writes its checkpoints, configs "
                          "and logs into run_dir, so it must be a new directory or a run's (the model goes in "
                          "base_model=)")


def check_config(raw: DictConfig) -> tuple[dict[str, Any], ModelSource, ObjectiveConfig]:
    """The checks that need no Megatron import (a second, not the ~25 s of Bridge's): required
    keys, train.train_iters, `base_model` (with training state to resume if resume_from_base),
    `objective` keys and types, `device`. Returns the
    resolved values, the base model and the objective. `build_training_run` runs it first, then
    `check_values` (Bridge's sections, which need Bridge's classes); `nemo-topr train` runs it
    before importing Megatron and loading the data."""
    values = OmegaConf.to_container(raw, resolve=True)
    examples = {"base_model": "base_model=/path/to/hf_llama_or_checkpoint", "run_dir": "run_dir=runs/my_run",
                "objective": "the objective section of conf/topr.yaml", "device": "device=cuda or device=cpu"}
    missing = [key for key in examples if values.get(key) in (None, "", "???")]
    if missing:
        raise ConfigError(f"config keys {missing} must be set (e.g. {'; '.join(examples[key] for key in missing)})")
    check_sections(values)
    check_no_recipe_keys(values)
    check_own_values(values)
    try:
        base_model = model_source.resolve(values["base_model"])
    except model_source.ModelSourceError as error:
        raise ConfigError(str(error)) from None
    check_run_dir(Path(values["run_dir"]))
    if values.get("resume_from_base"):
        check_resumable(base_model)
    objective = objective_from(values.get("objective") or {})
    return values, base_model, objective


def build_training_run(raw: DictConfig) -> TrainingRun:
    """Map a composed config onto Bridge's ConfigContainer (model from `base_model`)."""
    from nemo_topr.model.providers import source_provider
    from nemo_topr.data.prepare_verb import default_prepared_dir
    from nemo_topr.training.data import ToprDatasetConfig

    values, base_model, objective = check_config(raw)
    check_values(values, base_model)
    if latest_iteration(Path(values["run_dir"]) / "checkpoints") is None:  # the base is loaded, not a resume
        try:
            model_source.check_intact(base_model)  # reads its .metadata with torch: here, not in check_config
        except model_source.ModelSourceError as error:
            raise ConfigError(str(error)) from None
    run_dir = Path(values["run_dir"]).resolve()
    _, provider = source_provider(base_model)
    # pinned host memory only speeds copies to an accelerator; without one torch warns at every loader
    dataset = ToprDatasetConfig(tokenizer_dir=str(base_model.hf_dir), report_path=str(run_dir / "data_report.json"),
                                model_context=model_source.context_length(base_model.hf_dir),
                                prepared_dir=default_prepared_dir(run_dir), pin_memory=values["device"] != "cpu")
    container = default_container(provider, dataset)
    container.checkpoint.save = container.checkpoint.load = str(run_dir / "checkpoints")
    # Bridge loads this only while run_dir has no checkpoint of its own, as a finetune: weights
    # only, iteration 0, no optimizer or RNG state (bridge/training/checkpointing.py:2292-2306, 2998)
    container.checkpoint.pretrained_checkpoint = str(base_model.checkpoint or base_model.path)
    if values.get("resume_from_base"):
        resume_from(container.checkpoint, base_model)
    container.logger.tensorboard_dir = str(run_dir / "tensorboard")
    for section, section_values in values.items():
        if section not in OUR_KEYS:
            apply_section(getattr(container, section), section_values)
    container.scheduler.start_weight_decay, container.scheduler.end_weight_decay = weight_decay_schedule(values)
    if torch.cuda.is_available():  # after the YAML: the layer spec follows model.transformer_impl
        device_model_settings(container.model)
    if not container.model.calculate_per_token_loss:
        raise ConfigError("model.calculate_per_token_loss must stay true: the TOPR step returns (sum, denominator)")
    check_sequence_lengths(container.dataset.seq_length, container.model.seq_length)
    _check_packed_stream_pipeline(container)
    check_virtual_pipeline(container.model)
    choose_pipeline_p2p(container.model, set(values.get("model") or {}))
    _check_shared_prefix(container)
    if values["device"] == "cpu":
        check_cpu_precision(container)
        check_cpu_attention(container.model, container.train.micro_batch_size, available_bytes())
    if values["device"] == "cpu" or torch.cuda.is_available():  # this machine trains; a login node may not
        _check_distributed_optimizer(container, values["device"])
        check_fp8(container.model, values["device"])
    if torch.cuda.is_available():
        _check_te_attention_cudnn(container)
    return TrainingRun(container, objective, run_dir, base_model, raw)


def check_resumable(base_model: ModelSource) -> None:
    """`resume_from_base=true` needs a base with training state to resume (`check_config`)."""
    if not base_model.is_megatron or not base_model.run_config().get("checkpoint", {}).get("save_optim"):
        raise ConfigError(f"resume_from_base=true needs a checkpoint saved by training, with optimizer state; "
                          f"{base_model.describe()} has none (start from it without resume_from_base)")


def resume_from(checkpoint: Any, base_model: ModelSource) -> None:
    """`resume_from_base=true` (checked by `check_resumable`): until this run saves its own
    checkpoint, load the base run's full training state (optimizer, scheduler, iteration, consumed
    samples) as a resume would."""
    if latest_iteration(Path(checkpoint.save)) is None:
        checkpoint.load = str(base_model.checkpoint)
