"""launchers/local.sh: torchrun with one rank per GPU, given a Slurm job's rank environment on
GPUs. Run with a stand-in Python that says how many GPUs torch sees and prints what torchrun
would be started with (the real one would need the GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.conftest import REPO

from nemo_topr.cluster.environment import training_environment

LAUNCHER = REPO / "launchers" / "local.sh"
# `python -c CODE` runs CODE with a torch that sees STAND_IN_GPUS GPUs; `python -m
# torch.distributed.run ...` prints its arguments and environment as JSON
STAND_IN = f"""#!{sys.executable}
import json, os, sys, types
if sys.argv[1] == "-c":
    gpus = int(os.environ["STAND_IN_GPUS"])
    sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: gpus,
                                                                            is_available=lambda: gpus > 0))
    exec(sys.argv[2])
else:
    print(json.dumps({{"argv": sys.argv[1:], "environ": dict(os.environ), "cwd": os.getcwd()}}))
"""


def _run(tmp_path, gpus: int, *args: str, **environ: str) -> subprocess.CompletedProcess:
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    kept = {name: value for name, value in os.environ.items() if name not in training_environment()}
    return subprocess.run(["bash", str(LAUNCHER), *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**kept, "NEMO_TOPR_PYTHON": str(python), "STAND_IN_GPUS": str(gpus), **environ})


def _launch(tmp_path, gpus: int, *args: str, **environ: str) -> dict:
    proc = _run(tmp_path, gpus, *args, **environ)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_on_gpus_the_ranks_get_a_slurm_jobs_environment_one_per_gpu(tmp_path):
    started = _launch(tmp_path, 8, "llama31_8b_bf16", "dataset.train_path=scored.jsonl",
                      NCCL_DEBUG="INFO")
    assert started["argv"] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8", "-m",
                               "nemo_topr.cli", "train", "--config-name", "llama31_8b_bf16",
                               "dataset.train_path=scored.jsonl"]
    # the caller's directory: relative paths are the caller's, as for `nemo-topr train` (it was the
    # checkout's: base_model=tiny_llama_hf beside the caller was "no such directory", run_dir=relrun
    # was made in the checkout)
    assert started["cwd"] == str(tmp_path)
    given = {name: started["environ"].get(name) for name in training_environment()}
    # slurm/environment.sh's values (read independently of the launcher), but what was set already
    assert given == {**training_environment(), "NCCL_DEBUG": "INFO"}
    assert given["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and given["OMP_NUM_THREADS"] == "8"


@pytest.mark.parametrize(("gpus", "args", "ranks"), [(0, ("tiny_cpu",), 1), (0, ("-n", "2", "tiny_cpu"), 2),
                                                     (8, ("-n", "2", "llama31_8b_bf16"), 2)])
def test_ranks_default_to_the_gpus_or_one_and_cpu_ranks_keep_their_environment(tmp_path, gpus, args, ranks):
    """On the CPU the GPU ranks' environment stays out: OMP_NUM_THREADS=8 per rank would
    oversubscribe a small machine's cores (torchrun sets 1 for several ranks)."""
    started = _launch(tmp_path, gpus, *args)
    assert f"--nproc-per-node={ranks}" in started["argv"]
    given = {name for name in training_environment() if name in started["environ"]}
    assert given == (set(training_environment()) if gpus else set())


@pytest.mark.parametrize("ranks", ["0", "-1", "abc", "2.5"])
def test_a_rank_count_below_one_or_not_a_number_is_a_usage_error(tmp_path, ranks):
    """torchrun met each with a traceback (`assert self.local_world_size > 0`, `Unsupported
    nproc_per_node value: abc`); nothing is started now."""
    proc = _run(tmp_path, 0, "-n", ranks, "tiny_cpu")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"launchers/local.sh: -n takes a number of ranks, 1 or more; got '{ranks}'\n"
