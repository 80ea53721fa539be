"""`nemo-topr doctor`: on CPU every check that can run here passes (the TE-only ones are skipped
with their reason), `--device cuda` without CUDA is the project's device error, and one failing
check neither stops the others nor hides what to fix. Nothing here runs on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from nemo_topr.doctor import CheckFailed, Doctor


def _doctor(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nemo_topr.cli", "doctor", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_doctor_on_cpu_passes_and_writes_its_table(tmp_path):
    report = tmp_path / "doctor.json"
    proc = _doctor("--device", "cpu", "--json", str(report), "--work-dir", str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    table = json.loads(report.read_text())
    status = {c["name"]: c["status"] for c in table["checks"]}
    assert status == {"versions": "pass", "build": "pass", "score": "pass", "score vs cpu": "skipped",
                      "train": "pass", "resume": "pass", "train fp8": "skipped", "export": "pass",
                      "packed parity": "skipped"}
    details = {c["name"]: c["detail"] for c in table["checks"]}
    assert "Transformer Engine is not installed" in details["train fp8"] and "Transformer Engine" in details["packed parity"]
    assert "resumed from iteration 1, completed at 2" in details["resume"]
    assert table["versions"]["megatron_core"] == "0.19.2" and table["versions"]["megatron_bridge"] == "0.6.2"
    assert "nemo-topr doctor --device cpu: all passed" in proc.stdout


def test_doctor_on_cuda_without_cuda_is_the_device_error(tmp_path):
    proc = _doctor("--device", "cuda", "--work-dir", str(tmp_path / "work"), timeout=120)
    assert proc.returncode == 1
    assert "nemo-topr doctor: --device is cuda, but CUDA is not available" in proc.stderr
    assert proc.stderr.rstrip().endswith("--device cpu") and not (tmp_path / "work").exists()


def test_a_failing_check_names_its_fix_skips_its_dependants_and_the_rest_still_run(tmp_path):
    doctor = Doctor("cpu", tmp_path, timeout=5)

    def broken() -> str:
        raise CheckFailed("scores are NaN", "reinstall the driver")

    doctor.run("score", broken)
    doctor.run("train", lambda: "trained", needs=("score",))
    doctor.run("versions", lambda: "torch x")
    doctor.run("crash", lambda: 1 / 0)
    assert [(c.name, c.status) for c in doctor.checks] == [("score", "fail"), ("train", "skipped"),
                                                          ("versions", "pass"), ("crash", "fail")]
    assert doctor.checks[0].fix == "reinstall the driver" and "needs score" in doctor.checks[1].detail
    assert "ZeroDivisionError" in doctor.checks[3].detail and doctor.checks[3].fix


def test_a_check_past_its_time_limit_is_killed_and_reported(tmp_path):
    doctor = Doctor("cpu", tmp_path, timeout=60)
    doctor.run("hang", lambda: doctor.command("hang", ["data", "--help"]) and "ok")  # fast: passes
    assert doctor.checks[-1].status == "pass"
    doctor.timeout = 0.01
    doctor.run("hang", lambda: doctor.command("hang", ["data", "--help"]))
    assert doctor.checks[-1].status == "fail" and "no result within" in doctor.checks[-1].detail
