"""`nemo-topr import HF_DIR OUT`: convert a Hugging Face Llama once to a Megatron distributed checkpoint.

    nemo-topr import /models/Llama-3.1-70B-Instruct /ckpt/llama31_70b     # then base_model=/ckpt/llama31_70b

Bridge's own import path (AutoBridge.import_ckpt, bridge/models/conversion/auto_bridge.py:1345-1409:
HF weights -> Megatron model -> ``save_megatron_model(low_memory_save=True)``), with the CPU
runtime's layer spec where there is no GPU, the weights kept in the HF model's dtype, and
the HF config, generation config and tokenizer copied to OUT/hf_artifacts/ so that training,
scoring and export need nothing else. The result is a TP1/PP1 torch_dist checkpoint at
iteration 0 (OUT/iter_0000000, OUT/latest_checkpointed_iteration.txt); any later TP/PP layout
loads it (the distributed checkpoint reshards on load). Runs in one process, on CPU if need be.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.model import cpu_runtime
from nemo_topr.utils.arguments import Parser
from nemo_topr.utils.distributed import local_rendezvous
from nemo_topr.model.settings import device_model_settings
from nemo_topr.model.source import (HF_ARTIFACTS, HF_KIND, ModelSource, ModelSourceError, check_intact, resolve,
                                    write_hf_artifacts)
from nemo_topr.model.quiet import stdout_to_stderr
from nemo_topr.training.checkpoints import TRACKER
from nemo_topr.training.disk_space import estimated_checkpoint_bytes, free_bytes, size_text
from nemo_topr.utils.outputs import folders_to_make, nearest_existing


class Terminated(BaseException):
    """SIGTERM (`kill`, Slurm's cancel, `docker stop`): the import stops as at Ctrl-C, removing
    what it wrote, where the signal's default action left OUT half written."""


def _terminated(signum, frame) -> None:  # noqa: ANN001 - a signal handler
    raise Terminated


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# beside the weights: hf_artifacts/ (Llama 3's tokenizer.json is 9 MB), Bridge's tokenizer copy, metadata
TOKENIZER_AND_METADATA_BYTES = 32 * 2**20


def peak_host_memory_gib() -> dict[str, float]:
    """Peak resident memory (ru_maxrss, KiB on Linux) of this process and of its finished children
    (the checkpoint writer may run in a child process)."""
    return {who: round(resource.getrusage(scope).ru_maxrss / 2**20, 3)
            for who, scope in (("self", resource.RUSAGE_SELF), ("children", resource.RUSAGE_CHILDREN))}


def hf_dtype(hf_dir: Path) -> str:
    """The dtype the HF weights are stored in (config.json's torch_dtype / dtype), as a DTYPES key."""
    config = json.loads((hf_dir / "config.json").read_text())
    stored = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(stored, "fp32")


@dataclass(frozen=True)
class ImportSpec:
    """What `nemo-topr import` will do: convert `hf_dir` (as given) into `out` (resolved), its weights
    stored in `dtype` (a DTYPES key; None: the HF config's)."""

    hf_dir: str
    out: Path
    dtype: str | None = None

    @classmethod
    def of(cls, hf_dir: str | Path, out: str | Path, dtype: str | None = None) -> ImportSpec:
        return cls(str(hf_dir), Path(out).resolve(), dtype)

    def source(self) -> ModelSource:
        return resolve(self.hf_dir, named="", expected=HF_KIND)


def validate(spec: ImportSpec) -> list[UserError]:
    """Every problem of `spec` before Megatron's import, nothing written: the Hugging Face model (whole,
    an architecture nemo_topr converts) and OUT (a new or empty directory that can be made)."""
    problems = Problems()
    with problems.check():
        source = spec.source()
        if source.is_megatron:
            raise ModelSourceError(f"{spec.hf_dir}: already a Megatron checkpoint ({source.describe()}); nothing to "
                                   "import", key="import.hf_dir.megatron", where="HF_DIR")
        check_intact(source)  # weights config.json does not describe were imported as they were, exit 0
    with problems.check():
        out = spec.out
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            cut_short = (out / HF_ARTIFACTS).is_dir() and not (out / TRACKER).exists()
            hint = (f"; it holds an import cut short ({HF_ARTIFACTS}/ without {TRACKER}, which the save writes "
                    "last): remove it and import again") if cut_short else ""
            raise ModelSourceError(f"{out}: exists and is not an empty directory; import writes a new checkpoint "
                                   f"directory{hint}", key="import.out.not_empty", where="OUT")
        if unmakeable := why_unmakeable(out):
            raise ModelSourceError(f"{out}: cannot be made ({unmakeable})", key="import.out.unmakeable", where="OUT")
    return problems


def why_unmakeable(directory: Path) -> str | None:
    """Why making `directory` (and its parents) would fail, as mkdir says it (``STRERROR: FILENAME``);
    None where it can be made: its nearest existing ancestor is a directory this process may write in."""
    existing = nearest_existing(directory)
    if not existing.is_dir():
        return f"Not a directory: {directory}"
    if directory != existing and not os.access(existing, os.W_OK | os.X_OK):
        return f"Permission denied: {folders_to_make(directory)[-1]}"
    return None


def import_hf(hf_dir: str | Path, out: str | Path, *, dtype: str | None = None) -> dict:
    """Convert `hf_dir` into the Megatron checkpoint `out` (`run` of an `ImportSpec` that `validate`
    finds nothing wrong with); returns what was done and measured."""
    spec = ImportSpec.of(hf_dir, out, dtype)
    refuse(validate(spec), key="import.several_problems")
    return run(spec)


def run(spec: ImportSpec) -> dict:
    """Convert `spec`'s model, `validate`d; returns what was done and measured."""
    started = time.monotonic()
    source, out, dtype = spec.source(), spec.out, spec.dtype
    # the highest directory the import makes (OUT, or a parent of it), None for an empty OUT of the user's
    made = next((path for path in reversed((out, *out.parents)) if not path.exists()), None)
    try:  # now, not after minutes of loading: a path that cannot be made stops the import here
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ModelSourceError(f"{out}: cannot be made ({error.strerror}: {error.filename})",
                               key="import.out.unmakeable", where="OUT") from None
    needed = None  # the checkpoint's size, once the weights are loaded and it is being written
    try:
        dtype = dtype or hf_dtype(source.hf_dir)
        cpu_runtime.enable_cpu_runtime()
        from megatron.bridge import AutoBridge
        from megatron.bridge.training.model_load_save import temporary_distributed_context

        local_rendezvous()
        _progress(f"[1/3] {source.describe()}: {dtype} weights -> Megatron (TP1, PP1)")
        with temporary_distributed_context(backend="nccl" if torch.cuda.is_available() else "gloo"):
            bridge = AutoBridge.from_hf_pretrained(str(source.hf_dir), torch_dtype=DTYPES[dtype],
                                                   local_files_only=True)
            provider = device_model_settings(bridge.to_megatron_provider(load_weights=True), wrapped_in_ddp=False)
            provider.params_dtype = DTYPES[dtype]  # the CPU runtime computes in fp32; store what HF stores
            provider.finalize()
            model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
            parameters = sum(p.numel() for chunk in model for p in chunk.parameters())
            loaded = time.monotonic()
            _progress(f"[2/3] {parameters:,} parameters loaded in {loaded - started:.1f} s; writing {out}")
            # A save that does not fit fails in torch's writer with no word of space
            # (nemo_topr/training/disk_space.py); the weights alone are written, in `dtype`.
            needed = estimated_checkpoint_bytes(parameters, DTYPES[dtype].itemsize, optimizer_state=False)
            if (free := free_bytes(out)) < needed:
                raise ModelSourceError(f"{out}: {size_text(free)} free, and the checkpoint takes "
                                       f"{size_text(needed)} ({parameters:,} parameters in {dtype}): free space "
                                       "there, or choose another OUT", key="import.out.no_space", where="OUT")
            # the HF files first: the tracker Bridge writes last then marks the whole import complete
            write_hf_artifacts(source, out)
            # Megatron's own writer-queue process outlived a killed import, holding its stdout and stderr
            from nemo_topr.training.writer_queue import start_checkpoint_writer_queue

            start_checkpoint_writer_queue()
            bridge.save_megatron_model(model, str(out), hf_tokenizer_path=str(source.hf_dir), low_memory_save=True)
    except BaseException as error:  # Ctrl-C too, while loading: leave no OUT it made, no half-written checkpoint
        _remove_written(out, made)
        # torch's CheckpointException (a BaseException) names only a "Worker failure" on a full disk
        if needed is not None and isinstance(error, (OSError, CheckpointException)):
            why = error.strerror if isinstance(error, OSError) else type(error).__name__
            problem = f"{out}: the checkpoint could not be written ({why}), and what was written is removed"
            if (free := free_bytes(out)) < needed + TOKENIZER_AND_METADATA_BYTES:
                problem += (f"; {size_text(free)} free for {size_text(needed)} of weights plus the tokenizer "
                            "and metadata: free space there, or choose another OUT")
            raise ModelSourceError(problem, key="import.out.write_failed", where="OUT") from error
        raise
    summary = {"hf_dir": str(source.hf_dir), "out": str(out), "dtype": dtype, "parameters": parameters,
               "seconds": round(time.monotonic() - started, 1), "peak_host_memory_gib": peak_host_memory_gib()}
    _progress(f"[3/3] done in {summary['seconds']} s; peak host memory {summary['peak_host_memory_gib']} GiB; "
              f"start from it with base_model={out}")
    (out / "nemo_topr_import.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _remove_written(out: Path, made: Path | None) -> None:
    """Remove what the import wrote: OUT and the parents of it up to `made` that it made too, or, in
    an OUT that it found empty (made None), what it wrote there."""
    if made is not None:
        shutil.rmtree(out, ignore_errors=True)
        for parent in out.parents[:len(out.parents) - len(made.parents)]:
            with contextlib.suppress(OSError):  # kept if anything else was put there meanwhile
                parent.rmdir()
        return
    for child in out.iterdir():
        shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)


def _progress(message: str) -> None:
    print(f"[nemo-topr import] {message}", flush=True)


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr import", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hf_dir", help="local Hugging Face model directory (config, safetensors, tokenizer)")
    parser.add_argument("out", help="new directory for the Megatron distributed checkpoint")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weights dtype (default: the HF config's torch_dtype)")
    args = parser.parse_args(argv)
    spec = ImportSpec.of(args.hf_dir, args.out, args.dtype)
    refuse(validate(spec), key="import.several_problems")
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        with stdout_to_stderr():  # progress and Megatron's and Gloo's prints; stdout: the result line alone
            summary = run(spec)
    except Terminated:
        print(f"nemo-topr import: terminated (SIGTERM); what it wrote in {args.out} is removed", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"imported {summary['hf_dir']} -> {summary['out']}")
    return 0
