"""Training's cross-field rules: the one place that decides whether a run config can work.

`validate` takes a composed config's values and returns every problem it finds at once, as
`ConfigError`s; `validate_container` does the same for the ConfigContainer built from them, before
training starts. Both are pure: no Megatron import (what only Megatron knows, as whether FusedAdam is
there, comes in as an argument) and nothing written. `nemo-topr train` (`check_config`, then
`nemo_topr.training.config.check_values` and `build_training_run`), `plan` and `submit`
(`check_values`) call the same `validate`, so what `plan` and `submit --dry-run` pass, `train` accepts.
Each rule stops at its first problem; the rules run apart, so a config with several problems hears
of each rule's. The keys' names, types and bounds are the schema's (`nemo_topr.training.schema`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_topr import errors
from nemo_topr.model import source as model_source
from nemo_topr.model.device import DEVICES, DeviceError, resolve_device
from nemo_topr.model.source import ModelSource
from nemo_topr.objective import ObjectiveConfig
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.run_state import START_CONFIGS_DIR, entries_of_others
from nemo_topr.training.schema import (NEEDS_A_VALUE, NO_VALIDATION, NOT_SETTINGS, check_section, check_sections,
                                       check_value)
from nemo_topr.utils.outputs import nearest_existing


def raised_by(*rules: Callable[[], object]) -> list[ConfigError]:
    """The ConfigError each rule raises, in the rules' order (a rule raises its first problem)."""
    problems = []
    for rule in rules:
        try:
            rule()
        except ConfigError as problem:
            problems.append(problem)
    return problems


def refuse(problems: list[ConfigError]) -> None:
    """Raise the problems found (`nemo_topr.errors.refuse`): the one, or all of them, each on a line of its own."""
    errors.refuse(problems, key="config.several_problems")


def validate(values: dict[str, Any]) -> list[ConfigError]:
    """Every problem of a composed config's values that its keys' relations show: keys the recipe
    sets itself (NOT_SETTINGS), our values, the model's choices Megatron would refuse, the learning
    rate's range, the weight-decay schedule, the objective. `values`' sections are mappings
    (`nemo_topr.training.schema.check_sections` refuses others first)."""
    return raised_by(lambda: check_no_recipe_keys(values), lambda: check_own_values(values),
                     lambda: _check_model_choices(values.get("model") or {}),
                     lambda: _check_lr_range(values.get("optimizer") or {}), lambda: weight_decay_schedule(values),
                     lambda: objective_from(values.get("objective") or {}))


def validate_container(container: Any, device: str, *, cuda: bool, fused_adam: bool) -> list[ConfigError]:
    """Every problem of a built ConfigContainer that the config's values alone did not show (a
    length or a layout the base model or the recipe's defaults set). `cuda`: this machine has a
    GPU; `fused_adam`: Megatron's optimizers get TE's or Apex's FusedAdam here
    (`nemo_topr.model.settings.fused_adam_available`, read only where `cuda`)."""
    model = container.model
    rules = [lambda: _check_per_token_loss(model),
             lambda: check_sequence_lengths(container.dataset.seq_length, model.seq_length),
             lambda: _check_packed_stream_pipeline(container), lambda: check_virtual_pipeline(model)]
    if device == "cpu":
        rules.append(lambda: check_cpu_precision(container))
    if device == "cpu" or cuda:  # this machine trains; a login node may not
        rules += [lambda: _check_distributed_optimizer(container, device, fused_adam),
                  lambda: check_fp8(model, device)]
    return raised_by(*rules)


def check_config(raw: DictConfig) -> tuple[dict[str, Any], ModelSource, ObjectiveConfig]:
    """The checks that need no Megatron import (a second, not the ~25 s of Bridge's): required
    keys, the sections' shape, `validate`'s rules, `base_model` (with training state to resume if
    resume_from_base), `run_dir`. Returns the resolved values, the base model and the objective.
    `build_training_run` runs it first, then `check_values` (Bridge's sections, which need
    Bridge's classes); `nemo-topr train` runs it before importing Megatron and loading the data."""
    values = OmegaConf.to_container(raw, resolve=True)
    examples = {"base_model": "base_model=/path/to/hf_llama_or_checkpoint", "run_dir": "run_dir=runs/my_run",
                "objective": "the objective section of conf/topr.yaml", "device": "device=cuda or device=cpu"}
    missing = [key for key in examples if values.get(key) in (None, "", "???")]
    if missing:
        raise ConfigError(f"config keys {missing} must be set (e.g. {'; '.join(examples[key] for key in missing)})",
                          key="config.required_unset", where=", ".join(missing))
    check_sections(values)
    refuse(validate(values))
    try:
        base_model = model_source.resolve(values["base_model"])
    except model_source.ModelSourceError as error:
        raise ConfigError(str(error), key="base_model.not_a_model", where="base_model") from None
    check_run_dir(Path(values["run_dir"]))
    if values.get("resume_from_base"):
        check_resumable(base_model)
    return values, base_model, objective_from(values.get("objective") or {})


def _check_per_token_loss(model: Any) -> None:
    if not model.calculate_per_token_loss:
        raise ConfigError("model.calculate_per_token_loss must stay true: the TOPR step returns (sum, denominator)",
                          key="model.calculate_per_token_loss.false", where="model.calculate_per_token_loss")


def check_no_recipe_keys(values: dict[str, Any]) -> None:
    """Refuse the keys of `NOT_SETTINGS`, naming what to use instead: `plan` and `submit` passed
    train.train_iters, and the job failed at its start, after the queue wait."""
    for section, keys in NOT_SETTINGS.items():
        given = values.get(section) or {}
        for key in sorted(given) if isinstance(given, dict) else ():
            if keys is None or key in keys:
                why = NO_VALIDATION if keys is None else keys[key]
                raise ConfigError(f"{section}.{key}={given[key]!r} {why}", key=f"{section}.{key}.not_a_setting",
                                  where=f"{section}.{key}")


def check_own_values(values: dict[str, Any]) -> None:
    """Our keys' values and the rules across keys, which `plan` and `submit` passed and `train`
    refused: resume_from_base, device, dataset.seq_length against model.seq_length,
    dataset.shared_prefix against dataset.packed; and NEEDS_A_VALUE, in the sections the config has."""
    for dotted in NEEDS_A_VALUE:
        section, key = dotted.split(".")
        if isinstance(values.get(section), dict) and values[section].get(key) is None:
            raise ConfigError(f"{dotted} is unset (null): a run needs a value; set {dotted}=VALUE",
                              key=f"{dotted}.unset", where=dotted)
    if not isinstance(values.get("resume_from_base", False), bool):  # "maybe" and 'false' were taken for true
        raise ConfigError(f"resume_from_base={values['resume_from_base']!r} must be true or false",
                          key="resume_from_base.not_boolean", where="resume_from_base")
    # the value only: whether this machine has CUDA is checked where the process starts
    # (`use_device` in `nemo-topr train`), so a GPU preset still builds on a login node (plan, tests)
    try:  # where set: `score-logprobs --train-config` checks a model section alone
        if "device" in values:
            resolve_device(values["device"], cuda_available=True, where="device", choices=DEVICES)
    except DeviceError as error:
        raise ConfigError(str(error), key="device.invalid", where="device") from None
    dataset, model = values.get("dataset") or {}, values.get("model") or {}
    if "seq_length" in dataset and "seq_length" in model:
        check_sequence_lengths(dataset["seq_length"], model["seq_length"])
    # ToprDatasetConfig.prepare refuses it too, after Megatron's import and the data, in a traceback
    if dataset.get("shared_prefix") is True and dataset.get("packed") is False:
        raise ConfigError("dataset.shared_prefix=true packs each row with a prompt and several of its completions; "
                          "it cannot be combined with dataset.packed=false (one sequence per row): drop one of them",
                          key="dataset.shared_prefix.unpacked", where="dataset.shared_prefix")


def check_sequence_lengths(dataset_length: int, model_length: int) -> None:
    """From the config's values (plan, submit) and again on the container, where a length the config
    leaves unset comes from the base model."""
    if dataset_length != model_length:
        raise ConfigError(f"dataset.seq_length ({dataset_length}) must equal model.seq_length ({model_length})",
                          key="dataset.seq_length.differs_from_model", where="dataset.seq_length")


def _check_model_choices(model: dict[str, Any]) -> None:
    """Megatron's TransformerConfig.__post_init__ rules a preset override can break, checked here:
    they raised on every rank after the run directory was written (`plan` passed them)."""
    if model.get("fp16") and model.get("bf16"):
        raise ConfigError("model.fp16 and model.bf16 are both true: choose one (set the other false)",
                          key="model.precision.two_chosen", where="model.fp16")
    if model.get("recompute_granularity") == "full" and model.get("recompute_method") not in ("block", "uniform"):
        raise ConfigError(f"model.recompute_granularity=full needs model.recompute_method=block or uniform (and "
                          f"model.recompute_num_layers); got recompute_method={model.get('recompute_method')!r}",
                          key="model.recompute_method.not_set_for_full", where="model.recompute_method")


def _check_lr_range(optimizer: dict[str, Any]) -> None:
    """Megatron's scheduler asserts max_lr >= min_lr when it is built, after the data is prepared
    (megatron/core/optimizer_param_scheduler.py): a traceback on every rank, after the queue."""
    lr, min_lr = optimizer.get("lr"), optimizer.get("min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and lr < min_lr:
        raise ConfigError(f"optimizer.lr={lr} is below optimizer.min_lr={min_lr}, where the schedule decays to; "
                          f"set optimizer.min_lr={lr} too for a constant rate (the presets' choice), or lower",
                          key="optimizer.lr.below_min_lr", where="optimizer.lr")


def weight_decay_schedule(values: dict[str, Any]) -> tuple[float, float]:
    """(start, end) weight decay for Megatron's parameter scheduler, which sets each parameter
    group's decay from scheduler.start_weight_decay and end_weight_decay at every step
    (megatron/core/optimizer_param_scheduler.py, get_wd) and never reads optimizer.weight_decay:
    our defaults set both to 0, so optimizer.weight_decay=0.1 trained with none. As Megatron-LM's
    arguments do, a constant style (the default) takes optimizer.weight_decay, and a linear or
    cosine one needs both ends. A rule of `validate`; `build_training_run` takes the schedule from it."""
    optimizer, scheduler = values.get("optimizer") or {}, values.get("scheduler") or {}
    weight_decay = optimizer.get("weight_decay", 0.0)
    ends = {key: scheduler.get(key) for key in ("start_weight_decay", "end_weight_decay")}
    if scheduler.get("weight_decay_incr_style", "constant") == "constant":
        if other := [f"scheduler.{key}={value}" for key, value in ends.items()
                     if value is not None and value != weight_decay]:
            raise ConfigError(f"{', '.join(other)} with scheduler.weight_decay_incr_style=constant: a constant weight "
                              f"decay is optimizer.weight_decay ({weight_decay}); set that, or "
                              "weight_decay_incr_style=linear (or cosine) for a schedule from start to end",
                              key="scheduler.weight_decay_ends.with_constant_style", where=other[0].split("=")[0])
        return weight_decay, weight_decay
    if missing := [f"scheduler.{key}" for key, value in ends.items() if value is None]:
        raise ConfigError(f"scheduler.weight_decay_incr_style={scheduler['weight_decay_incr_style']} schedules the "
                          f"weight decay from start to end: set {' and '.join(missing)}",
                          key="scheduler.weight_decay_ends.unset", where=missing[0])
    return ends["start_weight_decay"], ends["end_weight_decay"]


def objective_from(values: dict[str, Any]) -> ObjectiveConfig:
    """The run's objective; `ratio_level=token` is refused here, not at the first step: it needs
    log mu of every completion token, and records carry one sum per completion (behavior_logprob)."""
    check_section(ObjectiveConfig, values, "objective")
    try:
        objective = ObjectiveConfig(**values)
    except ValueError as error:
        raise ConfigError(f"objective: {error}", key="objective.invalid", where="objective") from None
    if objective.ratio_level == "token":
        raise ConfigError("objective.ratio_level=token needs log mu of every completion token, and records carry one "
                          "behavior_logprob per completion (its sum), so training offers sequence (the paper's "
                          "ratio) and geometric_mean; the per-token ratio is nemo_topr.objective.policy_loss's, "
                          "for callers that have per-token log mu (docs/objective.md)",
                          key="objective.ratio_level.token", where="objective.ratio_level")
    return objective


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
                          f"{model_parallel}: launch a multiple of it, or change the model-parallel sizes",
                          key="world_size.not_multiple_of_model_parallel", where="WORLD_SIZE")
    data_parallel = world_size // model_parallel
    global_batch = _count(train, "train", "global_batch_size", 8)
    micro_batch = _count(train, "train", "micro_batch_size", 1)
    step = micro_batch * data_parallel
    if global_batch % step:
        below = global_batch - global_batch % step
        near = " or ".join(str(size) for size in (below, below + step) if size >= step)
        raise ConfigError(f"train.global_batch_size={global_batch} is not a multiple of train.micro_batch_size x "
                          f"data-parallel size = {micro_batch} x {data_parallel} = {step} (data-parallel size = "
                          f"WORLD_SIZE {world_size} / TP*PP*CP {model_parallel}): use a multiple, e.g. {near}",
                          key="train.global_batch_size.not_whole_micro_batches", where="train.global_batch_size")


def _count(section: dict[str, Any], name: str, key: str, default: int) -> int:
    """A size `check_batch_division` divides by, checked as `check_values` would: it runs before
    Bridge's classes are imported, so a string there was a TypeError traceback."""
    value = section.get(key)
    if value is None:
        return default
    check_value(f"{name}.{key}", value, int)
    return value


def _check_packed_stream_pipeline(container: Any) -> None:
    """The TOPR step's micro-batch rule (`nemo_topr.training.step.single_row_micro_batches`)."""
    from nemo_topr.training.step import single_row_micro_batches

    model, train = container.model, container.train
    if train.micro_batch_size > 1 and single_row_micro_batches(model):
        raise ConfigError(f"train.micro_batch_size={train.micro_batch_size} with model.pipeline_model_parallel_size="
                          f"{model.pipeline_model_parallel_size}: the TOPR step sends each micro-batch through "
                          "Transformer Engine as one packed stream, which pipeline stages would receive in "
                          "[seq_length, micro_batch_size, hidden] order. Use train.micro_batch_size=1 (a packed "
                          "row already holds many sequences; raise train.global_batch_size for more per step)",
                          key="train.micro_batch_size.above_1_with_pipeline", where="train.micro_batch_size")


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
                          "leave it unset (null) or use 2 or more",
                          key="model.virtual_pipeline_model_parallel_size.below_2",
                          where="model.virtual_pipeline_model_parallel_size")
    if pp == 1:
        raise ConfigError(f"model.virtual_pipeline_model_parallel_size={vp} with model.pipeline_model_parallel_size=1: "
                          "virtual stages interleave pipeline stages, and Megatron refuses them without a pipeline; "
                          "set model.pipeline_model_parallel_size to 2 or more, or leave VP unset (null)",
                          key="model.virtual_pipeline_model_parallel_size.without_pipeline",
                          where="model.virtual_pipeline_model_parallel_size")


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
                          f"(docs/cpu_runtime.md); set {fix}", key="precision.not_fp32_on_cpu", where=set_lower[0])


def _check_distributed_optimizer(container: Any, device: str, fused_adam: bool) -> None:
    """Megatron's distributed optimizer on the machine that trains: it needs CUDA tensors
    (megatron/core/optimizer/distrib_optimizer.py:470-480), and to resume, TE's or Apex's FusedAdam
    (`fused_adam`): refused before the first step, not at the first requeue."""
    keys = [f"{section}.use_distributed_optimizer" for section in ("optimizer", "ddp")
            if getattr(container, section).use_distributed_optimizer]
    if not keys:
        return
    turn_off = "optimizer.use_distributed_optimizer=false ddp.use_distributed_optimizer=false"
    if device == "cpu":
        raise ConfigError(f"{keys[0]}=true with device=cpu: Megatron's distributed optimizer needs CUDA "
                          f"tensors; set {turn_off}", key="use_distributed_optimizer.on_cpu", where=keys[0])
    if not fused_adam:
        raise ConfigError(f"{' and '.join(keys)}=true on a GPU without Transformer Engine or Apex: Megatron-Core "
                          "then uses torch's Adam, whose distributed-optimizer checkpoint it cannot load (the run "
                          "could not resume: megatron/core/optimizer/distrib_optimizer.py:839). Install Transformer "
                          f"Engine (requirements-gpu.txt, or the NGC container), or set {turn_off} (Adam state then "
                          "unsharded)", key="use_distributed_optimizer.without_fused_adam", where=keys[0])


def check_fp8(model: Any, device: str, *, without_fp8: str = "drop it (model.fp8=null)") -> None:
    """FP8 runs only in Transformer Engine's layers on a GPU; Megatron's local layers (the CPU
    runtime's, and a GPU's without TE) would compute in fp32 or BF16 and ignore model.fp8.
    `without_fp8`: how the calling command goes on without FP8, on purpose."""
    if not model.fp8:
        return
    if device == "cpu":
        raise ConfigError(f"model.fp8={model.fp8} with device=cpu: FP8 runs only in Transformer Engine's layers on a "
                          f"GPU; the CPU runtime trains in fp32 and would ignore it. To train on the CPU, {without_fp8}",
                          key="model.fp8.on_cpu", where="model.fp8")
    if model.transformer_impl != "transformer_engine":
        raise ConfigError(f"model.fp8={model.fp8} with model.transformer_impl={model.transformer_impl!r}: FP8 runs only "
                          "in Transformer Engine's layers, which this run does not build (TE not installed, or "
                          f"transformer_impl=local); install Transformer Engine (requirements-gpu.txt) or {without_fp8}",
                          key="model.fp8.without_transformer_engine", where="model.fp8")


def check_run_dir(run_dir: Path) -> None:
    """run_dir is where a run writes its checkpoints, configs and ledgers: an existing model
    directory there (a Hugging Face or Megatron checkpoint given as run_dir by mistake, say for
    base_model) is refused before anything is written into it. A run directory is its own resume."""
    if run_dir.is_file():
        raise ConfigError(f"run_dir={run_dir} is a file; a run writes a directory there", key="run_dir.is_a_file",
                          where="run_dir")
    if not run_dir.is_dir():
        if not (existing := nearest_existing(run_dir.absolute())).is_dir():  # a NotADirectoryError traceback
            raise ConfigError(f"run_dir={run_dir}: {existing} is a file, so no directory can be made under it",
                              key="run_dir.under_a_file", where="run_dir")
        return
    try:
        found = model_source.resolve(run_dir)
    except model_source.ModelSourceError:  # no model: an empty directory, Slurm's logs, anything a run may share...
        if others := entries_of_others(run_dir):  # ... but not names the run writes
            raise ConfigError(f"run_dir={run_dir} holds {', '.join(others)}, which no start of nemo-topr train wrote "
                              f"there (it has no {START_CONFIGS_DIR}/start_*.yaml); the run writes these names and "
                              f"would replace them: choose a new directory, e.g. run_dir={run_dir / 'run'}",
                              key="run_dir.holds_others", where="run_dir") from None
        return
    if found.kind != "run":
        raise ConfigError(f"run_dir={run_dir} is a model, {found.describe()}; a run writes its checkpoints, configs "
                          "and logs into run_dir, so it must be a new directory or a run's (the model goes in "
                          "base_model=)", key="run_dir.is_a_model", where="run_dir")


def check_resumable(base_model: ModelSource) -> None:
    """`resume_from_base=true` needs a base with training state to resume (`check_config`)."""
    if not base_model.is_megatron or not base_model.run_config().get("checkpoint", {}).get("save_optim"):
        raise ConfigError(f"resume_from_base=true needs a checkpoint saved by training, with optimizer state; "
                          f"{base_model.describe()} has none (start from it without resume_from_base)",
                          key="resume_from_base.no_training_state", where="resume_from_base")

