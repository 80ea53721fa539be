"""`nemo-topr plan`: pre-flight check of a parallel layout and of per-GPU memory.

    nemo-topr plan llama31_70b_fp8 --nodes 4 --gpus-per-node 8 [key=value ...]
    nemo-topr plan --config my_run.yaml [key=value ...]    # as submit spells it (train: --config-name)

Composes the run config exactly as `nemo-topr train` does (conf/ + key=value overrides), checks
the layout against the rules Megatron-Core, Transformer Engine and the TOPR step enforce at
start-up (so a bad layout fails here, not after the job waited in the queue), and estimates
the memory of each GPU. Every key and value is checked as `train` checks it
(`nemo_topr.training.config.check_values`: `nemo_topr.training.schema`, against Bridge's config
classes as `nemo_topr.training.bridge_schema` keeps them, and `nemo_topr.training.validation`); the rest is
arithmetic: no model is built, no GPU is needed.

The architecture comes from the HF config of ``base_model`` (its config.json, or a Megatron
checkpoint's hf_artifacts/config.json) when that model is readable here, else from a built-in
reference (Llama 3.1 8B / 70B, chosen by ``--arch`` or by the config's name). ``model.*``
architecture keys in the config are refused where they differ from a readable base model's, as in
training, and otherwise override the reference, to plan a model not on this machine. The report also shows
how training will load ``base_model`` (converted from HF at every start, or a Megatron checkpoint
loaded directly); a checkpoint that is visible here but unfinished or inconsistent fails the plan.

Exit status: 0 when every check passes and the estimate fits; 1 otherwise; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any

from nemo_topr.errors import run_refusing
from nemo_topr.utils.arguments import Parser, UsageError, run_settings
from nemo_topr.model.architecture import (REFERENCE_ARCHITECTURES, Architecture, architecture_from_hf_config,
                                            with_model_overrides)
from nemo_topr.cluster.checks import check_layout
from nemo_topr.cluster.layout import layout_from_config
from nemo_topr.cluster.memory import estimate_memory
from nemo_topr.cluster.report import format_report
from nemo_topr.model.source import ModelSourceError, load_route
from nemo_topr.training.config_error import ConfigError


def resolve_architecture(cfg: dict[str, Any], config_name: str, arch_key: str | None) -> tuple[Architecture, str]:
    """(architecture, where it came from): base_model's HF config.json if readable, else a reference."""
    source, route = _load_route(cfg)
    config_json = source.hf_dir / "config.json" if source is not None else None
    if arch_key is None and config_json is not None:
        try:
            arch = architecture_from_hf_config(config_json, source.path.name)
        except ValueError as error:  # a config.json without a Llama's sizes: the user's to fix
            raise ConfigError(str(error), key="base_model.config_json.not_llama", where="base_model") from None
        return with_model_overrides(arch, cfg.get("model") or {}), str(config_json)
    why = "--arch" if arch_key else route
    key = arch_key or _reference_key_from_name(config_name)
    if key is None:
        raise ConfigError(f"cannot tell the architecture of {config_name!r} ({why}): set base_model to a local "
                         f"model or pass --arch {{{','.join(REFERENCE_ARCHITECTURES)}}}",
                         key="architecture.unknown", where="base_model")
    arch = REFERENCE_ARCHITECTURES[key]
    return with_model_overrides(arch, cfg.get("model") or {}), f"built-in reference {key}; {why}"


def _load_route(cfg: dict[str, Any]) -> tuple[Any, str]:
    """(base model or None, how training loads it), as `nemo_topr.model.source.load_route` says; a
    base model visible here but broken is refused as training refuses it."""
    try:
        return load_route(cfg, must_exist=False)
    except ModelSourceError as error:
        raise ConfigError(str(error), key="base_model.unusable", where="base_model") from None


def _reference_key_from_name(config_name: str) -> str | None:
    match = re.search(r"(\d+)b", config_name.lower())
    key = f"llama31_{match.group(1)}b" if match else None
    return key if key in REFERENCE_ARCHITECTURES else None


def compose_config(config: str, overrides: list[str], config_path: str | None) -> tuple[dict[str, Any], str]:
    """Compose like `nemo-topr train` and run its checks (`check_values`: the schema and training's
    validation): CONFIG is a name in the config dir or a path to a YAML file."""
    from omegaconf import OmegaConf

    from nemo_topr.training.config import check_values, compose, config_location

    raw = compose(config, overrides, config_path)
    values = OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
    check_values(values)
    return values, config_location(config, config_path)[1]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="nemo-topr plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    settings=run_settings)
    parser.add_argument("config", help="run config: a name in the config dir (e.g. llama31_8b_bf16) or a YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for `nemo-topr train`")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default: %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: %(default)s)")
    parser.add_argument("--gpu-memory-gb", type=float, default=80,
                        help="memory of one GPU in GiB (default: %(default)s, H100 80GB)")
    parser.add_argument("--reserve-gb", type=float, default=4,
                        help="GiB set aside for CUDA context, NCCL buffers, workspaces and allocator "
                             "fragmentation (default: %(default)s)")
    parser.add_argument("--arch", choices=sorted(REFERENCE_ARCHITECTURES),
                        help="use a built-in architecture instead of base_model's config.json")
    parser.add_argument("--config-path", default=None, help="config directory (default: the repository's conf/)")
    return parser.parse_intermixed_args(_config_first(argv))


def _config_first(argv: list[str]) -> list[str]:
    """`--config NAME` (as `submit` spells it) or `--config-name NAME` (as `train` does) made the
    first word: argparse read `--config` as an abbreviation of --config-path, and then asked for
    a config. A second one is refused: argparse took it as --config-path, and the first config
    was looked for in a directory named after the second."""
    for index, word in enumerate(argv):
        option, equals, value = word.partition("=")
        if option not in ("--config", "--config-name"):
            continue
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if not value or value.startswith("-") or ("=" in value and not equals):
            raise UsageError(f"{option} needs a config: a name in the config dir or a YAML path",
                             key="--config.value.missing", where=option)
        rest = [*argv[:index], *argv[index + (1 if equals else 2):]]
        if again := [word for word in rest if word.partition("=")[0] in ("--config", "--config-name")]:
            raise UsageError(f"{again[0]} after {option} {value}: plan one config at a time", key="--config.twice",
                             where=again[0].partition("=")[0])
        return [value, *rest]
    return argv


def check_machine(args: argparse.Namespace) -> None:
    """Refuse a machine the options describe that cannot be planned for: a usage error, not a
    layout that does not fit."""
    if args.nodes < 1 or args.gpus_per_node < 1:
        option = "--nodes" if args.nodes < 1 else "--gpus-per-node"
        raise UsageError("--nodes and --gpus-per-node must be >= 1", key=f"{option}.below_1", where=option)
    if not (math.isfinite(args.gpu_memory_gb) and args.gpu_memory_gb > 0):
        raise UsageError(f"--gpu-memory-gb {args.gpu_memory_gb:g}: must be a GPU's memory in GiB, above 0 (H100: 80)",
                         key="--gpu-memory-gb.not_positive", where="--gpu-memory-gb")
    if not (math.isfinite(args.reserve_gb) and 0 <= args.reserve_gb < args.gpu_memory_gb):
        raise UsageError(f"--reserve-gb {args.reserve_gb:g}: must be at least 0 and below --gpu-memory-gb "
                         f"{args.gpu_memory_gb:g}", key="--reserve-gb.out_of_range", where="--reserve-gb")


def plan(cfg: dict[str, Any], title: str, args: argparse.Namespace) -> tuple[int, str]:
    """(exit status, report) for a composed config."""
    arch, source = resolve_architecture(cfg, title, args.arch)
    lay = layout_from_config(cfg, args.nodes, args.gpus_per_node)
    findings = check_layout(arch, lay)
    estimate = estimate_memory(arch, lay, args.gpu_memory_gb, args.reserve_gb)
    status = 0 if estimate.fits and not any(f.blocking for f in findings) else 1
    report = format_report(title, arch, source, lay, findings, estimate).split("\n")
    report.insert(1, f"load       {_load_route(cfg)[1]}")
    return status, "\n".join(report)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    check_machine(args)
    # composing with Hydra takes seconds (and Bridge's import, where it is not the pinned one):
    # say what is under way first
    print(f"nemo-topr plan: checking {args.config} as train would", file=sys.stderr, flush=True)
    cfg, title = compose_config(args.config, args.overrides, args.config_path)
    status, report = plan(cfg, title, args)
    print(report)
    return status


if __name__ == "__main__":
    sys.exit(run_refusing("nemo-topr plan", main, sys.argv[1:]))
