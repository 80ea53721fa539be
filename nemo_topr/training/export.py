"""`nemo-topr export`: a TOPR run's checkpoints -> Hugging Face directories.

    nemo-topr export --ckpt runs/my_run --hf-out exports/my_model                 # latest checkpoint
    nemo-topr export --ckpt runs/my_run --hf-out exports/my_run --iteration 100 200
    nemo-topr export --ckpt runs/my_run --hf-out exports/my_run --all-iterations  # every saved one
    nemo-topr export --ckpt runs/tiny_cpu --hf-out exports/tiny --device cpu      # on a machine without CUDA

Weights go through Bridge's AutoBridge (safetensors, the source model's HF config); the
tokenizer, chat template and generation config are copied from the run's starting model
(`hf_model` in RUN/config.yaml), so the result loads with `transformers` as is. With several
iterations each goes to HF_OUT/iter_NNNNNNN; one process exports them all, so the ~10 s of
Megatron start-up is paid once (each further checkpoint of a small model takes well under 1 s).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nemo_topr.device import DeviceError, add_device_argument, use_device
from nemo_topr.training.checkpoints import TRACKER, iteration_dir_name, latest_iteration, saved_iterations


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / iteration_dir_name(iteration)


def latest_checkpoint(run_dir: Path) -> Path:
    iteration = latest_iteration(run_dir / "checkpoints")
    if iteration is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint yet ({run_dir / 'checkpoints' / TRACKER} missing)")
    return checkpoint_dir(run_dir, iteration)


def export_run(run_dir: str | Path, hf_out: str | Path, iterations: list[int] | None = None,
               device: str = "cuda") -> dict[Path, Path]:
    """Export the latest checkpoint to HF_OUT (iterations None), or each given iteration to
    HF_OUT/iter_NNNNNNN, on `device` (`nemo_topr.device`). Returns {checkpoint directory: HF directory}."""
    run_dir, hf_out = Path(run_dir), Path(hf_out)
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{run_dir}: not a nemo-topr run directory ({config_file} missing)")
    targets: dict[Path, Path] = (
        {latest_checkpoint(run_dir): hf_out} if iterations is None
        else {checkpoint_dir(run_dir, i): hf_out / iteration_dir_name(i) for i in iterations})
    missing = [str(checkpoint) for checkpoint in targets if not checkpoint.is_dir()]
    if missing:
        raise FileNotFoundError(f"{run_dir}: no such checkpoint(s): {', '.join(missing)}; saved iterations: "
                                f"{saved_iterations(run_dir / 'checkpoints')}")

    use_device(device, where="--device")
    from megatron.bridge import AutoBridge
    from transformers import AutoTokenizer, GenerationConfig

    source = Path(OmegaConf.load(config_file).hf_model)
    bridge = AutoBridge.from_hf_pretrained(str(source), torch_dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    generation = (GenerationConfig.from_pretrained(str(source), local_files_only=True)
                  if (source / "generation_config.json").is_file() else None)
    for checkpoint, out in targets.items():
        bridge.export_ckpt(str(checkpoint), str(out), show_progress=False)
        tokenizer.save_pretrained(str(out))
        if generation is not None:
            generation.save_pretrained(str(out))
        (out / "nemo_topr_export.json").write_text(json.dumps(
            {"run_dir": str(run_dir.resolve()), "checkpoint": str(checkpoint.resolve()), "source_model": str(source)},
            indent=2) + "\n")
    return targets


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nemo-topr export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="run directory of `nemo-topr train`")
    parser.add_argument("--hf-out", required=True, help="output Hugging Face directory (a parent directory "
                        "with --iteration / --all-iterations)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--iteration", type=int, nargs="+", help="export these saved iterations")
    which.add_argument("--all-iterations", action="store_true", help="export every saved iteration")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    run_dir = Path(args.ckpt)
    iterations = saved_iterations(run_dir / "checkpoints") if args.all_iterations else args.iteration
    if iterations == []:
        raise SystemExit(f"nemo-topr export: {run_dir}: no saved checkpoints under {run_dir / 'checkpoints'}")
    try:
        exported = export_run(run_dir, args.hf_out, iterations, args.device)
    except (FileNotFoundError, DeviceError) as error:
        raise SystemExit(f"nemo-topr export: {error}") from None
    for checkpoint, out in exported.items():
        print(f"exported {checkpoint} -> {out}")
    return 0
