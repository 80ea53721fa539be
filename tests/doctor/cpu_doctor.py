"""`nemo-topr doctor --device cpu`, run once per test session on a node image with Transformer
Engine and Apex installed (`with_cuda_only_packages`): tests/doctor/test_doctor.py reads its table,
tests/bench/test_gpu_verbs.py runs bench.gpu_verbs's own checks on its work directory
(`--doctor-table`). tests/conftest.py's xdist_unit keeps both modules on one worker, so that
`make test` runs this doctor once. It takes minutes: every check is a verb in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, with_cuda_only_packages


def run_doctor(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(env or {**os.environ, "PYTHONPATH": str(REPO)}), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "nemo_topr.cli", "doctor", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class DoctorRun:
    proc: subprocess.CompletedProcess
    table: Path  # --json
    work: Path  # --work-dir: the model, data, runs and logs
    env: dict[str, str]  # TE and Apex installed, no GPU visible


_runs: list[DoctorRun] = []  # this process's one run


def doctor_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> DoctorRun:
    if not _runs:
        root = tmp_path_factory.mktemp("doctor_on_cpu")
        env = with_cuda_only_packages(root / "site")
        proc = run_doctor("--device", "cpu", "--json", str(root / "doctor.json"), "--work-dir", str(root / "work"),
                          env=env)
        _runs.append(DoctorRun(proc, root / "doctor.json", root / "work", env))
    return _runs[0]
