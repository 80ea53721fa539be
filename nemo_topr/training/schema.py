"""The schema check of a run config: each key against the dataclass it lands on.

A run config's sections land on Megatron-Bridge's dataclasses (``ConfigContainer``'s, with
``GPTModelProvider`` for ``model`` and ``ToprDatasetConfig`` for ``dataset``), ``objective`` on
`nemo_topr.objective.ObjectiveConfig`. Every key is checked against its dataclass (its name, a
scalar value's type, the bounds of a size or a rate); a typo is an error naming the key and the
closest valid names, never a silently ignored setting. Bridge's classes are read as
`nemo_topr.training.bridge_schema` keeps them, without importing Bridge.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from nemo_topr.errors import nearest, suggestion
from nemo_topr.objective import ObjectiveConfig
from nemo_topr.training.bridge_schema import dataclass_in, load
from nemo_topr.training.config_error import ConfigError

OUR_KEYS = ("base_model", "resume_from_base", "run_dir", "objective", "device")


OUR_VALUES = tuple(key for key in OUR_KEYS if key != "objective")  # the rest of a config is sections


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


# Optional in Bridge's dataclasses (None: derived elsewhere), yet values this recipe cannot go
# without: `train.global_batch_size=null` ended `train` in a TypeError traceback (the optimizer's
# after the run directory was written), and `plan` planned its own default batch instead.
NEEDS_A_VALUE = ("train.global_batch_size", "train.micro_batch_size", "optimizer.lr", "optimizer.min_lr")


def section_classes() -> dict[str, type | None]:
    """The dataclass each top-level section lands on in `build_training_run` (Bridge's, as
    `nemo_topr.training.bridge_schema` keeps them)."""
    return load().sections


def admits_none(hint: Any) -> bool:
    """Whether a type annotation takes None (`X | None`, `Optional[X]`, `Any`)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(admits_none(member) for member in typing.get_args(hint))
    return hint is type(None) or hint is Any


def matches(value: Any, hint: Any) -> bool:
    """Whether a YAML/override value fits a field annotation. Only the plain scalar types are
    judged; anything else (dtypes, enums, callables, containers) Bridge's setter converts."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, member) for member in typing.get_args(hint))
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


def expected(hint: Any) -> str:
    """An annotation as a user reads it: `float`, `int or None`, `'error' or 'drop' or None`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(expected(member) for member in typing.get_args(hint))
    if origin is typing.Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def check_section(target: type, values: dict[str, Any], path: str) -> None:
    """Raise ConfigError for a key `target` (a dataclass) does not have, a value of the wrong
    type, or a value below its bound in LOWER_BOUNDS."""
    hints = typing.get_type_hints(target)
    names = {f.name for f in dataclasses.fields(target) if not f.name.startswith("_")}
    for key, value in values.items():
        dotted = f"{path}.{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {dotted} ({target.__name__})"
                              f"{near_keys(key, [f'{path}.{name}' for name in names])}", key=f"{dotted}.unknown",
                              where=dotted)
        nested = dataclass_in(hints[key])
        if isinstance(value, dict) and nested is not None and "_target_" not in value:
            check_section(nested, value, dotted)
        else:
            check_value(dotted, value, hints[key])


def check_value(dotted: str, value: Any, hint: Any) -> None:
    if not matches(value, hint):
        raise ConfigError(f"{dotted}={value!r} is not a valid value: expected {expected(hint)}",
                          key=f"{dotted}.wrong_type", where=dotted)
    if isinstance(value, str):
        check_bridge_name(dotted, value, hint)
    if isinstance(value, float) and not math.isfinite(value) and (math.isnan(value) or dotted in LOWER_BOUNDS):
        # NaN passes every comparison: a NaN rate queued, then torch's Adam refused it at set-up (a
        # traceback) and Transformer Engine's FusedAdam (GPUs) checks none
        raise ConfigError(f"{dotted}={value} must be a finite number", key=f"{dotted}.not_finite", where=dotted)
    if dotted in LOWER_BOUNDS and value is not None and value < LOWER_BOUNDS[dotted]:
        raise ConfigError(f"{dotted}={value} must be at least {LOWER_BOUNDS[dotted]}", key=f"{dotted}.below_bound",
                          where=dotted)
    if dotted in UPPER_BOUNDS and value >= UPPER_BOUNDS[dotted]:
        raise ConfigError(f"{dotted}={value} must be below {UPPER_BOUNDS[dotted]}", key=f"{dotted}.above_bound",
                          where=dotted)


def check_bridge_name(dotted: str, value: str, hint: Any) -> None:
    """A dtype or an activation given by name, which Bridge converts by its own tables: an unknown
    one (`model.params_dtype=bf17`) was kept as the string and failed in arithmetic, or (an
    activation) raised on every rank after the run directory was written."""
    import torch

    dtype = torch.dtype in (hint, *typing.get_args(hint))
    if not dtype and not dotted.endswith(".activation_func"):
        return
    table = load().dtype_names if dtype else load().activation_names
    if value not in table:
        known = ", ".join(sorted(name for name in table if "." not in name))
        what = "a dtype" if dtype else "an activation function"
        raise ConfigError(f"{dotted}={value!r} is not {what} Bridge knows: {known}", key=f"{dotted}.unknown_name",
                          where=dotted)


def near_keys(key: str, names: list[str]) -> str:
    """"; did you mean A, B?" naming up to three of the dotted `names` nearest `key`, compared by
    their last part (`lr` finds optimizer.lr, `epochs` dataset.epochs); "" where none is near."""
    by_leaf: dict[str, list[str]] = {}
    for name in names:
        by_leaf.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    close = [name for leaf in nearest(key.rsplit(".", 1)[-1], by_leaf, n=3) for name in by_leaf[leaf]]
    return suggestion(close[:3], joiner=", ")


def top_level_names(classes: dict[str, type | None]) -> list[str]:
    """What a top-level key may be meant as: one of ours, a section, or a key of one (but those of
    NOT_SETTINGS, which are refused)."""
    sections = {**classes, "objective": ObjectiveConfig}
    refused = {section: keys or {} for section, keys in NOT_SETTINGS.items()}
    keys = [f"{section}.{field.name}" for section, target in sections.items()
            if target is not None and NOT_SETTINGS.get(section, {}) is not None
            for field in dataclasses.fields(target)
            if not field.name.startswith("_") and field.name not in refused.get(section, {})]
    return [*OUR_KEYS, *classes, *keys]


def check_sections(values: dict[str, Any]) -> None:
    """Every top-level key but our four values is a section. `train=5` replaced a whole section: a
    TypeError or AttributeError traceback from the checks, or (logger=abc) from Bridge's override
    code after the data was prepared. A value for a name that is no section (`epochs=2`, `lr=0.1`)
    is an unknown key, with the keys it may mean."""
    for section, section_values in values.items():
        if section not in OUR_VALUES and section_values is not None and not isinstance(section_values, dict):
            classes = section_classes()
            if section not in classes and section != "objective":
                raise ConfigError(f"unknown config key {section}{near_keys(section, top_level_names(classes))}",
                                  key=f"{section}.unknown", where=section)
            raise ConfigError(f"{section}={section_values!r}: {section} is a section; set its keys, as "
                              f"{section}.KEY=VALUE", key=f"{section}.not_a_section_value", where=section)


def takes_null(dotted: str) -> bool:
    """Whether `dotted=null` is a value the checks accept: its field's annotation admits None, and it
    is no NEEDS_A_VALUE key. Our own values and keys no section has take none (`dataset.packed=null`
    was offered, then refused)."""
    section, *keys = dotted.split(".")
    if not keys or section in OUR_VALUES or dotted in NEEDS_A_VALUE:
        return False
    target = ObjectiveConfig if section == "objective" else section_classes().get(section)
    for key in keys:
        hints = typing.get_type_hints(target) if target is not None else {}
        if key not in hints:
            return False
        hint, target = hints[key], dataclass_in(hints[key])
    return admits_none(hint)



def check_schema(values: dict[str, Any]) -> None:
    """Bridge's sections of a composed config, each against the dataclass it lands on (names,
    scalar types, finite floats, the bounds). Builds no model."""
    classes = section_classes()
    # `model` first: the presets' dataset.seq_length interpolates model.seq_length, and a bad value
    # is named as it was written (`model.seq_length=abc`)
    for section, section_values in sorted(values.items(), key=lambda item: item[0] != "model"):
        if section in OUR_KEYS:
            continue
        if section not in classes:
            raise ConfigError(f"unknown config section {section!r}{near_keys(section, [*classes, *OUR_KEYS])}",
                              key=f"{section}.unknown", where=section)

        if isinstance(section_values, dict) and classes[section] is not None:
            check_section(classes[section], section_values, section)
