"""The `nemo-topr` verbs tests/training/test_checkpoint_route.py runs, each kind of process once:
a `nemo-topr` of its own (training), several verbs in one process (tests/workers/nemo_topr_verbs.py),
both forked with Megatron imported (tests/forked.py); a torchrun world; and the readers of what
they write."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from tests import forked
from tests.conftest import WORKERS, run_distributed


def nemo_topr(*args: str) -> subprocess.CompletedProcess:
    """`nemo-topr ARGS` in a process of its own (tests/forked.py), which must succeed."""
    proc = forked.run(["-m", "nemo_topr.cli", *map(str, args)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def step(*argv, **options: str) -> dict:
    """One step of verbs(): `nemo-topr ARGV` (options: tests/workers/nemo_topr_verbs.py)."""
    return {"argv": list(map(str, argv)), **options}


def score_step(model, data: Path, out: Path) -> dict:
    return step("score-logprobs", "--model", model, "--data", data, "--out", out, "--seq-length", "512",
                "--device", "cpu")


def verbs(work: Path, steps: dict[str, dict]) -> dict[str, dict]:
    """STEPS run one after another in one fresh process, which imports Megatron once: each one's
    returncode (or the exception it "raised"), stdout and stderr."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "steps.json").write_text(json.dumps(steps))
    proc = forked.run([str(WORKERS / "nemo_topr_verbs.py"), str(work / "steps.json"), str(work / "results.json")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((work / "results.json").read_text())


def succeeded(result: dict) -> dict:
    assert result.get("returncode") == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
    return result


def logprobs(scored: Path) -> dict[int, float]:
    return {i: json.loads(line)["behavior_logprob"] for i, line in enumerate(scored.read_text().splitlines())}


def score(model, data: Path, out: Path, *, tp: int = 1, pp: int = 1) -> dict[int, float]:
    """Scored by `tp * pp` ranks (a torchrun launch)."""
    run_distributed("nemo_topr_cli.py", tp * pp, "score-logprobs", "--model", str(model), "--data", str(data),
                    "--out", str(out), "--seq-length", "512", "--tp", str(tp), "--pp", str(pp), "--device", "cpu")
    return logprobs(out)


def safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}


def dist_checkpoint(iteration_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a torch_dist checkpoint, read with PyTorch DCP (not with the code under test)."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(iteration_dir)).read_metadata().state_dict_metadata
    tensors = {key: torch.empty(meta.size, dtype=meta.properties.dtype) for key, meta in metadata.items()
               if isinstance(meta, TensorStorageMetadata) and "/" not in key}  # "/": sharded extra/rng state
    load(tensors, storage_reader=FileSystemReader(str(iteration_dir)), no_dist=True)
    return tensors
