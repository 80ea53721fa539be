"""Where a verb's starting model comes from: one key, ``base_model``, three kinds of directory.

    base_model=/models/Llama-3.1-8B-Instruct        a Hugging Face directory (converted at start)
    base_model=/ckpt/llama31_8b                     a Megatron distributed checkpoint (its latest
                                                    iteration), e.g. from `nemo-topr import`
    base_model=/ckpt/llama31_8b/iter_0000000        one iteration of such a checkpoint
    base_model=runs/round_1                         a nemo-topr run directory (its latest checkpoint)
    base_model=runs/round_1@200                     ... or one of its saved iterations

A Megatron checkpoint holds weights only; the Hugging Face config (architecture, for the
provider and for export) and the tokenizer travel beside it in ``hf_artifacts/`` (written by
`nemo-topr import` and by every `nemo-topr train` run). Every verb resolves its model here,
logs the kind, and gets a clear error, naming what was expected, for anything else: no silent
fallback. Pure file inspection (no Megatron import), so `plan` and `submit --dry-run` use it too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nemo_topr.errors import UserError
from nemo_topr.model.checkpoint_layout import (TRACKER, DamagedCheckpointError, iteration_dir_name,
                                              latest_iteration, saved_iterations)

HF_ARTIFACTS = "hf_artifacts"  # config.json, tokenizer files, generation_config.json of the model
HF_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
# Files a finished torch_dist save leaves in an iteration directory: PyTorch DCP's `.metadata`,
# Megatron-Core's `metadata.json` (dist_checkpointing/serialization.py save()), and Bridge's
# `run_config.yaml`, read on load for the saved TP/PP layout (bridge/training/checkpointing.py:2749).
ITERATION_FILES = (".metadata", "metadata.json", "run_config.yaml")
# HF config.json key -> Megatron model key (Llama family), checked before loading a checkpoint
ARCHITECTURE_KEYS = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
                     "intermediate_size": "ffn_hidden_size", "num_attention_heads": "num_attention_heads",
                     "num_key_value_heads": "num_query_groups", "vocab_size": "vocab_size"}
# ... and those of its numerics, compared too (the rope base: _megatron_view)
NUMERIC_KEYS = {"head_dim": "kv_channels", "rms_norm_eps": "layernorm_epsilon",
                "tie_word_embeddings": "share_embeddings_and_output_weights"}

# What the recipe converts to Megatron, trains and exports: the architecture its packing, parity
# and export tests run (Llama 3 and 3.1, and models fine-tuned from them, are LlamaForCausalLM).
ARCHITECTURE = "LlamaForCausalLM"

# What a missing or unknown model is told it should have been: the kinds the verb takes.
HF_KIND = "a Hugging Face model directory (config.json, *.safetensors, tokenizer.json)"
MEGATRON_KINDS = ("a Megatron distributed checkpoint (latest_checkpointed_iteration.txt and iter_*/, with "
                  "hf_artifacts/ beside them, as `nemo-topr import` writes); one iter_* directory of it; a nemo-topr "
                  "run directory (config.yaml and checkpoints/); or RUN@ITERATION")
EXPECTED = f"one of: {HF_KIND}; {MEGATRON_KINDS}"  # train, score-logprobs, plan, submit: any kind


class ModelSourceError(UserError, ValueError):
    """A starting model that is missing, of no known kind, incomplete or inconsistent."""


def _option(named: str) -> str:
    """A refusal's `where`: the key or option a model was given by (`named`: "base_model=", "--model "),
    HF_DIR for import's positional argument."""
    return named.strip().rstrip("=") or "HF_DIR"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "huggingface" | "megatron" | "run"
    path: Path  # the directory as given (resolved)
    hf_dir: Path  # config.json + tokenizer: the HF directory itself, or the checkpoint's hf_artifacts/
    checkpoint: Path | None = None  # Megatron: the iteration directory that is loaded
    iteration: int | None = None
    # how the user gave it, for messages: "base_model=" (train's key), "--model ", "--ckpt ", "" (import's HF_DIR)
    named: str = field(default="base_model=", compare=False)

    @property
    def is_megatron(self) -> bool:
        return self.checkpoint is not None

    def describe(self) -> str:
        if not self.is_megatron:
            return f"Hugging Face directory {self.path}"
        what = "nemo-topr run" if self.kind == "run" else "Megatron distributed checkpoint"
        return f"{what} {self.path}, iteration {self.iteration} ({self.checkpoint}; HF config from {self.hf_dir})"

    def at_iteration(self, iteration: int) -> ModelSource:
        """Another saved iteration of the same checkpoint (checked complete, like any source)."""
        if not self.is_megatron:
            raise ModelSourceError(f"{self.path} is a Hugging Face directory: it has no iterations",
                                   key="model.iterations.of_hugging_face", where=_option(self.named))
        return _megatron_source(self.checkpoint.parent, iteration, kind=self.kind, shown=self.path, named=self.named)

    def saved_iterations(self) -> list[int]:
        return saved_iterations(self.checkpoint.parent) if self.is_megatron else []

    def run_config(self) -> dict:
        """The iteration's run_config.yaml (Bridge's record of the config it was saved with)."""
        path = self.checkpoint / "run_config.yaml"
        try:
            read = yaml.safe_load(path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise ModelSourceError(f"{self.named}{self.path}: {path} is not readable YAML "
                                   f"({' '.join(str(error).split())})",
                                   key="model.run_config.not_yaml", where=_option(self.named)) from None
        if not isinstance(read, dict) or not isinstance(read.get("model", {}), dict):
            raise ModelSourceError(f"{self.named}{self.path}: {path} is not Bridge's run config (a mapping with a "
                                   "`model` mapping)", key="model.run_config.not_a_mapping", where=_option(self.named))
        return read


def context_length(hf_dir: str | Path) -> int | None:
    """A model's max_position_embeddings (config.json): the longest sequence it was trained at."""
    return json.loads((Path(hf_dir) / "config.json").read_text()).get("max_position_embeddings")


def context_of(path: str | Path) -> int | None:
    """`context_length` of the model at `path`, anything `base_model=` takes (a checkpoint's
    hf_artifacts/ hold its config.json); None where `path` holds no model config (a bare tokenizer)."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        try:
            directory = resolve(path, megatron=False).hf_dir
        except ModelSourceError:
            return None
    return context_length(directory)


def split_iteration(spec: str | Path) -> tuple[str, str]:
    """(the directory part, "@N" or "") of a base_model value: RUN@ITERATION reads RUN. A path
    that exists as given (a directory whose name contains "@N") is never split."""
    text = str(spec)
    match = re.fullmatch(r"(.+)(@\d+)", text)
    return (match[1], match[2]) if match and not Path(text).exists() else (text, "")


def resolve(spec: str | Path, *, named: str = "base_model=", megatron: bool = True,
            expected: str = EXPECTED) -> ModelSource:
    """Detect the kind of `spec` and check it is complete (see the module docstring). Errors name
    it as the user gave it: `named` is the option or key before the path ("--model "). With
    `megatron` (a verb that converts it to Megatron) its HF config must name ARCHITECTURE: another
    model would fail inside Bridge after the imports (GPT-2: AutoBridge's multi-line ValueError),
    or after a queue wait under `submit`, or run a path no test has run. `expected`: the kinds the
    verb takes, named when `spec` is none of them."""
    source = _resolve(spec, named, expected)
    if megatron:
        _check_supported(source)
    return source


def read_config(source: ModelSource) -> dict:
    """The source's HF config.json (a checkpoint's hf_artifacts/ hold it), checked to be a JSON object."""
    config = source.hf_dir / "config.json"
    try:
        read = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelSourceError(f"{source.named}{source.path}: {config} is not a JSON object ({error})",
                               key="model.config_json.not_json", where=_option(source.named)) from None
    if not isinstance(read, dict):
        raise ModelSourceError(f"{source.named}{source.path}: {config} is not a JSON object (a JSON "
                               f"{type(read).__name__})",
                               key="model.config_json.not_an_object", where=_option(source.named))
    return read


def _check_supported(source: ModelSource) -> None:
    config = source.hf_dir / "config.json"
    architectures = read_config(source).get("architectures") or []
    if ARCHITECTURE not in architectures:
        found = f"architecture {', '.join(architectures)}" if architectures else 'no architecture ("architectures")'
        raise ModelSourceError(f"{source.named}{source.path}: {config} names {found}; nemo-topr converts, trains and "
                               f"exports {ARCHITECTURE} models only (Llama 3 and 3.1 and their fine-tunes), the "
                               "architecture its tests run",
                               key="model.architecture.unsupported", where=_option(source.named))


def _resolve(spec: str | Path, named: str, expected: str) -> ModelSource:
    text = str(spec)
    directory, iteration = split_iteration(text)
    if iteration:
        return _run_source(Path(directory).resolve(), int(iteration[1:]), given=text, named=named)
    path = Path(text).resolve()
    if path.is_file():
        raise ModelSourceError(f"{named}{text}: a file, not a directory; give the directory that holds it "
                               f"({path.parent}?) (expected {expected})", key="model.is_a_file", where=_option(named))
    if not path.is_dir():
        raise ModelSourceError(f"{named}{text}: no such directory (expected {expected}){_hub_id_hint(text)}",
                               key="model.no_such_directory", where=_option(named))
    if (path / "context").is_dir() and (path / "weights").is_dir():
        raise ModelSourceError(_nemo2_message(path, named), key="model.nemo2_checkpoint", where=_option(named))
    if (path / "config.json").is_file() and _has_hf_weights(path):
        _check_tokenizer(path, f"{named}{path}", where=_option(named))
        return ModelSource("huggingface", path, path, named=named)
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return _run_source(path, None, given=text, named=named)
    if re.fullmatch(r"iter_\d+", path.name) and _looks_like_iteration(path):
        return _megatron_source(path.parent, int(path.name.removeprefix("iter_")), kind="megatron", shown=path,
                                named=named)
    if not (path / TRACKER).is_file() and (exports := _hf_iterations(path)):
        folder = (f"{named}{path}: a folder of Hugging Face models, one per iteration, as `nemo-topr export "
                  "--iteration/--all-iterations` writes")
        if "Hugging Face" not in expected:  # export: nothing in there to export
            raise ModelSourceError(f"{folder}, exported already; give the Megatron checkpoint they came from "
                                   f"(expected {expected})",
                                   key="model.exports_folder.nothing_to_export", where=_option(named))
        raise ModelSourceError(f"{folder}; give one of them: {exports[-1]}",
                               key="model.exports_folder", where=_option(named))
    if _looks_like_checkpoint_root(path):
        return _megatron_source(path, None, kind="megatron", shown=path, named=named)
    if (path / "config.json").is_file():
        raise ModelSourceError(f"{named}{path}: has config.json but no weights "
                               f"({' or '.join(HF_WEIGHT_PATTERNS)}); expected {expected}",
                               key="model.weights.none", where=_option(named))
    raise ModelSourceError(f"{named}{path}: not a model directory; expected {expected}",
                           key="model.unknown_kind", where=_option(named))


def _hub_id_hint(text: str) -> str:
    """For a missing owner/name path whose owner is no directory either: perhaps a hub ID."""
    if not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", text) or Path(text).parent.exists():
        return ""
    return (f". If {text} is a Hugging Face hub ID: nemo-topr reads models from disk and never downloads one; "
            f"fetch it where there is internet (`huggingface-cli download {text} --local-dir DIR`) and give DIR")


def _nemo2_message(path: Path, named: str) -> str:
    """Why a NeMo 2 checkpoint is not loaded directly, and the route that works (see docs/training.md)."""
    return (f"{named}{path}: a NeMo 2 checkpoint (context/ + weights/). Megatron-Bridge 0.6.2 has no reader "
            "for it, and weights/ lacks the run_config.yaml Bridge reads on load, so it is not loaded directly. "
            "Convert it once with NeMo 2 itself: `from nemo.collections import llm; llm.export_ckpt(path=CKPT, "
            "target='hf', output_path=HF_DIR)`, then `nemo-topr import HF_DIR OUT` and start from OUT")


def _has_hf_weights(path: Path) -> bool:
    return any(next(path.glob(pattern), None) for pattern in HF_WEIGHT_PATTERNS)


def _check_tokenizer(directory: Path, what: str, *, where: str) -> None:
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelSourceError(f"{what}: no tokenizer ({' or '.join(TOKENIZER_FILES)} in {directory}); the data is "
                               "tokenized with the model's own tokenizer, so it must be there",
                               key="model.tokenizer.missing", where=where)


def _looks_like_iteration(path: Path) -> bool:
    return any((path / name).exists() for name in (*ITERATION_FILES, "train_state.pt"))


def _hf_iterations(path: Path) -> list[Path]:
    """The iter_* subdirectories of `path` that are Hugging Face models (an export's), sorted."""
    return sorted(child for child in path.glob("iter_*") if re.fullmatch(r"iter_\d+", child.name)
                  and (child / "config.json").is_file() and _has_hf_weights(child))


def _looks_like_checkpoint_root(path: Path) -> bool:
    return (path / TRACKER).is_file() or any(
        child.is_dir() and re.fullmatch(r"iter_\d+", child.name) for child in path.glob("iter_*"))


def _run_source(run_dir: Path, iteration: int | None, *, given: str, named: str) -> ModelSource:
    if not ((run_dir / "config.yaml").is_file() and (run_dir / "checkpoints").is_dir()):
        raise ModelSourceError(f"{named}{given}: {run_dir} is not a nemo-topr run directory (config.yaml and "
                               f"checkpoints/ expected)", key="model.not_a_run_directory", where=_option(named))
    return _megatron_source(run_dir / "checkpoints", iteration, kind="run", shown=run_dir, named=named)


def _megatron_source(root: Path, iteration: int | None, *, kind: str, shown: Path, named: str) -> ModelSource:
    """A checkpoint root and an iteration in it (None: the latest), checked complete."""
    if iteration is None:
        try:
            iteration = latest_iteration(root)
        except DamagedCheckpointError as error:
            raise ModelSourceError(f"{named}{shown}: {error}",
                                   key="model.checkpoint.tracker_damaged", where=_option(named)) from None
        if iteration is None:
            raise ModelSourceError(
                f"{named}{shown}: unfinished or empty checkpoint: no {root / TRACKER} (Bridge writes it when "
                f"a save completes); saved iterations: {saved_iterations(root)}; pick one as "
                f"{'RUN@ITERATION' if kind == 'run' else 'DIR/iter_NNNNNNN'} only if you know it finished",
                                   key="model.checkpoint.no_tracker", where=_option(named))
    checkpoint = root / iteration_dir_name(iteration)
    if not checkpoint.is_dir():
        raise ModelSourceError(f"{named}{shown}: no checkpoint {checkpoint}; saved iterations: "
                               f"{saved_iterations(root)}", key="model.iteration.missing", where=_option(named))
    missing = _missing_files(checkpoint)
    if missing:
        complete = [other for other in saved_iterations(root)
                    if other != iteration and not _missing_files(root / iteration_dir_name(other))]
        others = f"complete iterations: {complete}" if complete else "no other iteration there is complete"
        if missing == ["run_config.yaml"]:  # the distributed checkpoint itself is whole
            raise ModelSourceError(
                f"{named}{shown}: {checkpoint} has no run_config.yaml: a Megatron-Bridge save killed before its last "
                "file, or a checkpoint Megatron-LM wrote (it writes none). nemo-topr reads Megatron-Bridge "
                "checkpoints (its runs, `nemo-topr import`); convert a Megatron-LM one to a Hugging Face directory "
                f"and pass that ({others})", key="model.run_config.missing", where=_option(named))
        raise ModelSourceError(f"{named}{shown}: unfinished save: {checkpoint} lacks {', '.join(missing)} "
                               f"(written when a save completes); {others}",
                               key="model.iteration.save_unfinished", where=_option(named))
    hf_dir = next((d / HF_ARTIFACTS for d in (checkpoint, root) if (d / HF_ARTIFACTS / "config.json").is_file()), None)
    if hf_dir is None:
        raise ModelSourceError(
            f"{named}{shown}: no Hugging Face config with the checkpoint ({root / HF_ARTIFACTS}/config.json "
            "expected). It holds the architecture and the tokenizer: create it with `nemo-topr import`, or copy "
            f"config.json, generation_config.json and the tokenizer files of the model it was trained from into "
            f"{root / HF_ARTIFACTS}/", key="model.hf_artifacts.missing", where=_option(named))
    _check_tokenizer(hf_dir, f"{named}{shown}", where=_option(named))
    source = ModelSource(kind, shown, hf_dir, checkpoint, iteration, named)
    check_architecture(source)
    return source


def check_intact(source: ModelSource) -> None:
    """The source's weights are whole and are the model its config describes. A Megatron source's
    files as long as its .metadata says: one cut short since the save (a full disk, an interrupted
    copy) ended scoring, export and training from it in torch's bare EOFError, after Megatron's
    start-up; a resume of the run itself says so already (checkpoints.py). A Hugging Face
    directory's safetensors against its config.json (nemo_topr/model/hf_weights.py)."""
    if not source.is_megatron:
        from nemo_topr.model.hf_weights import WeightsError, check_llama_weights

        try:
            check_llama_weights(source.path, read_config(source))
        except WeightsError as error:
            raise ModelSourceError(f"{source.named}{source.path}: {error}",
                                   key=f"model.{error.key}", where=_option(source.named)) from None
        return
    from nemo_topr.model.checkpoint_layout import truncated_files

    if short := truncated_files(source.checkpoint):
        raise ModelSourceError(f"{source.named}{source.path}: iteration {source.iteration} is damaged, cut short: "
                               f"{', '.join(short[:3])}; restore it from a copy, or choose another saved iteration "
                               f"(saved: {source.saved_iterations()})",
                               key="model.iteration.cut_short", where=_option(source.named))


def _missing_files(checkpoint: Path) -> list[str]:
    return [name for name in ITERATION_FILES if not (checkpoint / name).is_file()]


def check_architecture(source: ModelSource) -> None:
    """The checkpoint's saved model shape must be the one its HF config describes: a checkpoint of
    another model would otherwise fail deep inside the distributed load, or not at all."""
    saved = source.run_config().get("model") or {}
    mismatched = [f"{megatron_key}: checkpoint {saved[megatron_key]}, {source.hf_dir}/config.json {hf_key}={value}"
                  for hf_key, megatron_key, value in _megatron_view(read_config(source))
                  if megatron_key in saved and saved[megatron_key] != value]
    if mismatched:
        raise ModelSourceError(f"{source.named}{source.path}: architecture mismatch between {source.checkpoint} and "
                               f"its HF config: {'; '.join(mismatched)}",
                               key="model.architecture.differs_from_checkpoint", where=_option(source.named))


def _megatron_view(hf_config: dict) -> list[tuple[str, str, object]]:
    """(HF key, Megatron key, value) for what config.json says of the weights' shapes and numerics,
    under the names Bridge's Llama conversion gives them (bridge/models/conversion/model_bridge.py
    CONFIG_MAPPING; llama_bridge.py: a "llama3" rope type sets rope_scaling and its factor). A
    config.json with another rope base or norm epsilon than the checkpoint's changes every score."""
    view = [(hf_key, megatron_key, hf_config[hf_key]) for hf_key, megatron_key in ARCHITECTURE_KEYS.items()
            if hf_key in hf_config]
    view += [(hf_key, megatron_key, hf_config[hf_key]) for hf_key, megatron_key in NUMERIC_KEYS.items()
             if hf_key in hf_config]
    # transformers 5 writes rope_parameters; older files rope_theta and rope_scaling
    rope = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if isinstance(rope, dict):
        if (theta := rope.get("rope_theta", hf_config.get("rope_theta"))) is not None:
            view.append(("rope_theta", "rotary_base", theta))
        llama3 = rope.get("rope_type", rope.get("type")) == "llama3"
        view.append(("rope_type", "rope_scaling", llama3))
        if llama3:
            view.append(("rope factor", "rope_scaling_factor", rope.get("factor", 8.0)))
    return view


def require_hugging_face(spec: str | Path, *, named: str = "--model ") -> Path:
    """The HF directory of `spec` for verbs that run it with transformers / vLLM (generate, eval,
    verifier score); a Megatron checkpoint is an error naming the export that makes one."""
    source = resolve(spec, named=named, megatron=False, expected=HF_KIND)  # transformers samples any causal LM
    if source.is_megatron:
        raise ModelSourceError(f"{source.describe()}: generate, eval and verifier run the model with transformers "
                               "or vLLM, which read Hugging Face weights only; export it once with "
                               f"`nemo-topr export --ckpt {spec} --hf-out HF_DIR` (with `--device cpu` on a machine "
                               "without a GPU) and pass HF_DIR", key="model.not_hugging_face", where=_option(named))
    return source.path


def fold_alias(cfg) -> None:
    """Rename a composed config's `hf_model` (the old key, still accepted) to `base_model`, in place."""
    from omegaconf import OmegaConf

    if "hf_model" not in cfg:
        return
    alias = cfg.pop("hf_model")
    if "base_model" not in cfg or OmegaConf.is_missing(cfg, "base_model") or cfg.base_model in (None, ""):
        cfg.base_model = alias
    elif alias not in (None, "", "???") and str(cfg.base_model) != str(alias):
        raise ModelSourceError(f"base_model={cfg.base_model} and hf_model={alias} disagree; hf_model is an alias of "
                               "base_model: set one", key="base_model.alias_disagrees", where="hf_model")


def alias_override(item: str) -> str:
    """`hf_model=X` on a command line means `base_model=X`."""
    return "base_model=" + item.split("=", 1)[1] if item.startswith("hf_model=") else item


def write_hf_artifacts(source: ModelSource, checkpoint_root: Path) -> Path:
    """Copy the source's HF config, generation config and tokenizer (every file but the weights)
    to CHECKPOINT_ROOT/hf_artifacts, so that the checkpoints saved there are a complete base
    model for later runs and for export. Kept when present (a resumed run: same source)."""
    import shutil

    target = checkpoint_root / HF_ARTIFACTS
    if (target / "config.json").is_file():
        return target
    partial = target.with_name(HF_ARTIFACTS + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weights = {p for pattern in (*HF_WEIGHT_PATTERNS, "*.index.json", "*.pt") for p in source.hf_dir.glob(pattern)}
    for file in source.hf_dir.iterdir():
        if file.is_file() and file not in weights:
            shutil.copy2(file, partial / file.name)
    partial.rename(target)
    return target


def load_route(cfg: dict, *, must_exist: bool) -> tuple[ModelSource | None, str]:
    """How a composed training config gets its weights, as one line, for `nemo-topr plan` and a
    job's dry run: (the resolved source, the line). Unset, or (with must_exist=False, for a
    planner run off the cluster) not visible on this machine: (None, why). A source that is
    visible but broken raises ModelSourceError, as training would."""
    spec = cfg.get("base_model")
    if spec in (None, "", "???"):
        if must_exist:
            raise ModelSourceError("base_model is not set", key="base_model.unset", where="base_model")
        return None, "base_model not set: not checked"
    directory = Path(split_iteration(spec)[0])
    if not directory.exists() and not must_exist:
        return None, f"{spec}: not visible on this machine: not checked (the job checks it at start)"
    source = resolve(spec)
    if not source.is_megatron:
        return source, (f"{source.describe()}: converted by AutoBridge at every start and requeue, on every rank; "
                        f"convert once with `nemo-topr import {source.path} OUT` and set base_model=OUT")
    if cfg.get("resume_from_base"):
        return source, f"{source.describe()}: distributed-checkpoint load, resuming its training state"
    return source, (f"{source.describe()}: distributed-checkpoint load (reshards to this layout), weights only: "
                    "fresh optimizer, iteration 0, fresh data order")
