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
checked against the dataclass it lands on (`nemo_topr.training.schema`), and the rules across keys
are `nemo_topr.training.validation`'s; `check_values` runs both, for `train`, `plan` and `submit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_topr.model import source as model_source
from nemo_topr.model.settings import (CUDNN_922_FIX, device_model_settings, fused_adam_available,
                                      te_attention_cudnn_problem)
from nemo_topr.model.source import ModelSource
from nemo_topr.objective import ObjectiveConfig
from nemo_topr.training.checkpoints import latest_iteration
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.host_memory import available_bytes, check_cpu_attention
from nemo_topr.training.schema import OUR_KEYS, check_schema, check_sections, takes_null
from nemo_topr.training.validation import (check_config, objective_from, refuse, validate, validate_container,
                                           weight_decay_schedule)
from nemo_topr.utils.arguments import CONF_DIR



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
                              f"{sorted(p.stem for p in CONF_DIR.glob('*.yaml'))}", key="config.defaults_name_missing",
                              where="defaults") from None
        raise ConfigError(f"no config {config_name!r} in {config_dir}; available: {available}", key="config.not_found",
                          where="config") from None
    except yaml.YAMLError as error:  # the mark names the file (the user's, or one its defaults name) and line
        raise ConfigError(unparsed_yaml(f"config {config_dir / config_name}.yaml", error), key="config.not_yaml",
                          where="config") from None
    if whole_run and "resume_from_base" not in cfg:  # conf/topr.yaml's key alone: the first missing one was named
        raise ConfigError(f"config {config_dir / config_name}.yaml composes nothing from conf/topr.yaml, the "
                          "recipe's settings (device, objective, run_dir, ...): begin it with a defaults list naming "
                          "topr or a preset, as `defaults: [topr, _self_]` or `defaults: [llama31_8b_bf16, _self_]`",
                          key="config.without_recipe", where="defaults")
    malformed = [item for item in overrides if "=" not in item]
    if malformed:
        raise ConfigError(f"overrides must be key=value; got {malformed}", key="overrides.not_key_value",
                          where=malformed[0])
    check_overrides(overrides)
    OmegaConf.set_struct(cfg, False)
    try:
        model_source.fold_alias(cfg)
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([model_source.alias_override(o) for o in overrides]))
        OmegaConf.to_container(cfg, resolve=True)  # a failing interpolation named by its key, as resolve() does not
        OmegaConf.resolve(cfg)
    except model_source.ModelSourceError as error:
        raise ConfigError(str(error), key="base_model.alias_disagrees", where="hf_model") from None
    except OmegaConfBaseException as error:  # an override that does not parse, an interpolation that fails
        raise ConfigError(f"config {config_dir / config_name}.yaml{' with overrides' if overrides else ''}: "
                          f"{omegaconf_problem(error)}", key="config.unresolvable",
                          where=getattr(error, "full_key", None) or "config") from None
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
                              f"({key.lstrip('+~')}=null)", key="overrides.hydra_prefix", where=key.lstrip("+~"))
        if value == "":
            none = f", or {key}=null for none" if takes_null(key) else ""
            raise ConfigError(f"{item}: an empty value (an unset shell variable?); give one{none}",
                              key="overrides.empty_value", where=key)
        if key in ("base_model", "hf_model"):
            models[key] = value
    if len(models) == 2 and models["base_model"] != models["hf_model"]:
        raise ConfigError(f"base_model={models['base_model']} and hf_model={models['hf_model']} disagree; hf_model "
                          "is an alias of base_model: set one", key="base_model.alias_disagrees", where="hf_model")


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
                          f"{path.with_suffix('.yaml')}", key="config.yml_suffix", where="config")
    directory = Path(config_dir or CONF_DIR).resolve()
    if path.suffix == ".yaml" and (path.is_file() or len(path.parts) > 1):
        if not path.is_file():
            raise ConfigError(f"config {config}: no such file", key="config.no_such_file", where="config")
        return path.resolve().parent, path.stem
    if path.suffix == ".yaml" and not (directory / path.name).is_file():  # a file meant here, not a preset
        raise ConfigError(f"config {config}: no such file, here ({Path.cwd()}) or among the configs in {directory}",
                          key="config.not_here_nor_in_conf", where="config")
    return directory, path.name.removesuffix(".yaml")


def check_values(values: dict[str, Any], base_model: ModelSource | None = None) -> ObjectiveConfig:
    """Every key and value of a composed config, as `nemo-topr train` applies them: the sections'
    shape, training's cross-field rules (`nemo_topr.training.validation.validate`), each section
    against the Bridge dataclass it lands on (`nemo_topr.training.schema.check_schema`), the
    architecture keys against `base_model` (`check_architecture_overrides`). `plan` and `submit`
    call this too, so what they pass `train` accepts. Builds no model."""
    check_sections(values)
    refuse(validate(values))
    check_schema(values)
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
    from nemo_topr.model import cpu_runtime
    from nemo_topr.model.providers import hf_llama_provider

    cpu_runtime.import_bridge()  # Bridge's AutoBridge reads the config.json
    _, provider = hf_llama_provider(base_model.hf_dir, load_weights=False)  # config.json only
    if changed := shape_changes(model, provider, "the base model"):
        raise ConfigError(f"{changed} ({base_model.describe()}): a run trains "
                          "the base model's weights, whose shapes these keys set, so it would drop or misshape some "
                          "of them; drop the override (the architecture comes from base_model)",
                          key="model.architecture.differs_from_base", where=changed.split("=")[0])


def shape_changes(model: dict[str, Any], provider, whose: str) -> str | None:
    """"model.KEY=V differs from WHOSE's KEY=W" for the SHAPE_KEYS values of a model section other
    than those of `provider` (built from the weights' own config), or None."""
    changed = {key: model[key] for key in SHAPE_KEYS if key in model and model[key] != getattr(provider, key)}
    if not changed:
        return None
    ours = ", ".join(f"model.{key}={value}" for key, value in changed.items())
    theirs = ", ".join(f"{key}={getattr(provider, key)}" for key in changed)
    return f"{ours} {'differs' if len(changed) == 1 else 'differ'} from {whose}'s {theirs}"


def apply_section(target: Any, values: dict[str, Any]) -> None:
    """Apply a section checked by `check_values` onto a Bridge config dataclass (Bridge's own
    setter handles dtype strings and activation-function names)."""
    from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

    apply_overrides(target, values, {})


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


def choose_pipeline_p2p(model: Any, set_by_config: set[str]) -> None:
    """The interleaved schedule's point-to-point mode (PP > 1 with virtual pipeline stages).

    Megatron's batched p2p (`batch_p2p_comm`, its config default) posts a stage's send to the
    previous and to the next stage in one batch. At PP = 2 both are the same rank, whose receives
    take them crossed: activations as gradients and back, of equal shapes, without an error
    (NVIDIA/Megatron-LM#750, #1450). A PP=2 x VP=2 step so gave other losses than
    one rank's (tests/training/test_step.py). Megatron-LM's default for interleaving, and Bridge's
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
                          "silently wrong; leave model.batch_p2p_comm unset (the recipe uses overlapped p2p)",
                          key="model.batch_p2p_comm.crossed_at_pp2", where="model.batch_p2p_comm")


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
        raise ConfigError(f"{problem}. To train with it: {CUDNN_922_FIX}", key="model.attention_backend.cudnn_backward",
                          where="model.attention_backend")


def _check_shared_prefix(container: Any) -> None:
    """Shared-prefix rows need an attention that honours their blocks: the local spec's, or
    FlexCoreAttention swapped into any other spec (nemo_topr/training/flex_attention.py)."""
    from nemo_topr.training.flex_attention import prepare_shared_prefix_attention

    if container.dataset.shared_prefix:
        try:
            prepare_shared_prefix_attention(container.model)
        except ValueError as error:
            raise ConfigError(f"dataset.shared_prefix=true: {error}", key="dataset.shared_prefix.attention",
                              where="dataset.shared_prefix") from None


@dataclass
class TrainingRun:
    """Everything `nemo-topr train` needs, resolved."""

    container: Any  # megatron.bridge.training.config.ConfigContainer
    objective: ObjectiveConfig
    run_dir: Path
    base_model: ModelSource
    raw: DictConfig  # the composed YAML, saved into run_dir


def build_training_run(raw: DictConfig) -> TrainingRun:
    """Map a composed config onto Bridge's ConfigContainer (model from `base_model`)."""
    from nemo_topr.data.prepare_verb import default_prepared_dir
    from nemo_topr.model.providers import source_provider
    from nemo_topr.training.data import ToprDatasetConfig

    values, base_model, objective = check_config(raw)
    check_values(values, base_model)
    if latest_iteration(Path(values["run_dir"]) / "checkpoints") is None:  # the base is loaded, not a resume
        try:
            model_source.check_intact(base_model)  # reads its .metadata with torch: here, not in check_config
        except model_source.ModelSourceError as error:
            raise ConfigError(str(error), key="base_model.damaged", where="base_model") from None
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
    cuda = torch.cuda.is_available()
    if cuda:  # after the YAML: the layer spec follows model.transformer_impl
        device_model_settings(container.model)
    refuse(validate_container(container, values["device"], cuda=cuda, fused_adam=cuda and fused_adam_available()))
    choose_pipeline_p2p(container.model, set(values.get("model") or {}))
    _check_shared_prefix(container)
    if values["device"] == "cpu":
        check_cpu_attention(container.model, container.train.micro_batch_size, available_bytes())
    if cuda:
        _check_te_attention_cudnn(container)
    return TrainingRun(container, objective, run_dir, base_model, raw)


def resume_from(checkpoint: Any, base_model: ModelSource) -> None:
    """`resume_from_base=true` (checked by `check_resumable`): until this run saves its own
    checkpoint, load the base run's full training state (optimizer, scheduler, iteration, consumed
    samples) as a resume would."""
    if latest_iteration(Path(checkpoint.save)) is None:
        checkpoint.load = str(base_model.checkpoint)
