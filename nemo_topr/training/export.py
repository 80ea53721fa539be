"""`nemo-topr export`: a TOPR run's latest checkpoint -> a Hugging Face directory.

    nemo-topr export --ckpt runs/my_run --hf-out exports/my_model

Weights go through Bridge's AutoBridge (safetensors, the source model's HF config); the
tokenizer, chat template and generation config are copied from the run's starting model
(`hf_model` in RUN/config.yaml), so the result loads with `transformers` as is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nemo_topr import cpu_runtime


def latest_checkpoint(run_dir: Path) -> Path:
    checkpoints = run_dir / "checkpoints"
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        raise FileNotFoundError(f"{run_dir}: no checkpoint yet ({tracker} missing)")
    iteration = int(tracker.read_text().strip())
    return checkpoints / f"iter_{iteration:07d}"


def export_run(run_dir: str | Path, hf_out: str | Path) -> Path:
    cpu_runtime.enable_cpu_runtime()
    from megatron.bridge import AutoBridge
    from transformers import AutoTokenizer, GenerationConfig

    run_dir, hf_out = Path(run_dir), Path(hf_out)
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{run_dir}: not a nemo-topr run directory ({config_file} missing)")
    source = Path(OmegaConf.load(config_file).hf_model)
    checkpoint = latest_checkpoint(run_dir)
    bridge = AutoBridge.from_hf_pretrained(str(source), torch_dtype=torch.float32, local_files_only=True)
    bridge.export_ckpt(str(checkpoint), str(hf_out), show_progress=False)
    AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(str(hf_out))
    if (source / "generation_config.json").is_file():
        GenerationConfig.from_pretrained(str(source), local_files_only=True).save_pretrained(str(hf_out))
    (hf_out / "nemo_topr_export.json").write_text(json.dumps(
        {"run_dir": str(run_dir.resolve()), "checkpoint": str(checkpoint.resolve()), "source_model": str(source)},
        indent=2) + "\n")
    return hf_out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nemo-topr export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="run directory of `nemo-topr train`")
    parser.add_argument("--hf-out", required=True, help="output Hugging Face directory")
    args = parser.parse_args(argv)
    print(f"exported {latest_checkpoint(Path(args.ckpt))} -> {export_run(args.ckpt, args.hf_out)}")
    return 0
