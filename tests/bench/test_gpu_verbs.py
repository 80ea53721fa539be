"""bench/gpu_verbs.py, the one-call run of the recipe's verbs on a lent GPU machine (issue 27),
dry-run here on the CPU: every check it adds to the doctor's passes, the table is written as it
goes, and `--only` without the doctor skips what needs the doctor's files. Nothing here runs on
a GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO
from tests.doctor.cpu_doctor import doctor_on_cpu


def _gpu_verbs(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(env or {**os.environ, "PYTHONPATH": str(REPO)}), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "bench.gpu_verbs", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _apart(detail: str) -> float:
    return float(re.search(r": ([0-9.e+-]+) per token apart", detail).group(1))


@pytest.mark.slow
def test_every_verb_passes_on_cpu_and_the_copies_of_the_model_score_alike(tmp_path, tmp_path_factory):
    """bench.gpu_verbs's own checks, on the session's one CPU doctor run (tests/doctor/cpu_doctor.py,
    whose table tests/doctor/test_doctor.py checks) through `--doctor-table`, in the doctor's
    environment: Transformer Engine and Apex installed, no GPU; no verb here imports either."""
    doctor = doctor_on_cpu(tmp_path_factory)
    assert doctor.proc.returncode == 0, doctor.proc.stdout[-4000:] + doctor.proc.stderr[-2000:]
    out = tmp_path / "out"
    # the default deadline (540 s) fits a lent GPU machine's call, not a loaded 2-core machine's dry run
    proc = _gpu_verbs("--device", "cpu", "--out", str(out), "--work-dir", str(doctor.work), "--doctor-table",
                      str(doctor.table), "--commit", "abc123", "--deadline", "3000", timeout=3600, env=doctor.env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    table = json.loads((out / "gpu_verbs.json").read_text())
    status = {c["name"]: c["status"] for c in table["checks"]}
    assert status == {"versions": "pass", "te attention": "skipped", "build": "pass", "score": "pass", "score vs cpu": "skipped",
                      "train": "pass", "resume": "pass", "train fp8": "skipped", "export": "pass",
                      "packed parity": "skipped", "import": "pass", "shared prefix": "pass", "score run": "pass",
                      "export scores": "pass", "eval": "pass", "bench gpu": "pass"}
    # the doctor's part is the doctor's table, not a second run of it
    assert table["checks"][:10] == json.loads(doctor.table.read_text())["checks"]
    assert (table["commit"], table["device"], table["transformer_engine"], table["passed"]) == ("abc123", "cpu",
                                                                                              True, True)
    assert table["versions"]["transformer_engine"] == "2.17.1"
    detail = {c["name"]: c["detail"] for c in table["checks"]}
    # fp32 on one CPU: the Megatron import and the HF export hold the very weights they came from
    assert _apart(detail["import"]) < 1e-6 and _apart(detail["export scores"]) < 1e-6
    assert _apart(detail["shared prefix"]) < 1e-4
    moved = float(detail["score run"].split(" per token")[0])
    assert moved > 1e-3  # two TOPR steps at lr 3e-3 moved the model that the run directory loads
    evaluation = json.loads(detail["eval"])
    assert (evaluation["num_problems"], evaluation["num_samples"], evaluation["grader_errors"]["grader_errors"]) == (4, 8, 0)
    assert detail["bench gpu"].startswith("not measured: CUDA not available")
    with tarfile.open(out / "logs.tar.gz") as logs:
        assert {"train.log", "resume.log", "import.log", "eval.log", "bench_gpu.log"} <= set(logs.getnames())
    # what a lent machine returns: at most 8 files; the bench's, without CUDA, says why it measured nothing
    assert sorted(p.name for p in out.rglob("*")) == ["gpu_bench.json", "gpu_verbs.json", "logs.tar.gz"]
    bench = json.loads((out / "gpu_bench.json").read_text())
    assert bench["bench_gpu"]["skipped"] and bench["environment"]["cuda_available"] is False


@pytest.mark.slow
def test_only_some_checks_skip_what_needs_the_doctor_and_the_table_says_so(tmp_path):
    out = tmp_path / "out"
    proc = _gpu_verbs("--device", "cpu", "--out", str(out), "--work-dir", str(tmp_path / "work"),
                      "--only", "import", "bench gpu", "--commit", "abc123", timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    table = json.loads((out / "gpu_verbs.json").read_text())
    assert [(c["name"], c["status"]) for c in table["checks"]] == [("import", "skipped"), ("bench gpu", "pass")]
    assert table["checks"][0]["detail"] == "needs score, which did not pass"
    assert table["finished"] and table["command"].endswith("--only import 'bench gpu' --commit abc123")


def test_cuda_without_cuda_is_the_device_error(tmp_path):
    proc = _gpu_verbs("--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 1 and "bench.gpu_verbs: --device is cuda, but CUDA is not available" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_bench_line_fails_on_a_failed_precision_or_topr_step_not_on_a_skipped_one(tmp_path):
    from bench.gpu_verbs import bench_gpu_summary
    from nemo_topr.doctor.runner import CheckFailed

    run = {"precision": "bf16", "topr_error": None, "topr_over_sft_time": {"median": 0.997, "iqr": [0.996, 0.998]},
           "sft_mfu": 0.246, "topr_mfu": 0.247, "max_memory_allocated_gib": 51.8, "sft_step_seconds": 1.63}
    no_te = {"fp8_current": "skipped: FP8 needs Transformer Engine, not installed"}
    assert json.loads(bench_gpu_summary({"skipped": False, "runs": [run], "errors": no_te, "fp8_minus_bf16": {}},
                                        tmp_path)) == {
        "runs": [{"precision": "bf16", "topr_over_sft_time": 0.997, "sft_mfu": 0.246, "topr_mfu": 0.247,
                  "max_memory_allocated_gib": 51.8}], "fp8_minus_bf16": {}}
    assert bench_gpu_summary({"skipped": True, "reason": "CUDA not available"}, tmp_path) == "not measured: CUDA not available"
    raised = {**run, "topr_error": "Traceback ...\nRuntimeError: Expected all tensors to be on the same device\n"}
    with pytest.raises(CheckFailed, match="^bf16: TOPR step: RuntimeError: Expected all tensors to be on the same device$"):
        bench_gpu_summary({"skipped": False, "runs": [raised], "errors": no_te}, tmp_path)
    with pytest.raises(CheckFailed, match="^fp8_delayed: torch.OutOfMemoryError: CUDA out of memory$"):
        bench_gpu_summary({"skipped": False, "runs": [run],
                           "errors": {"fp8_delayed": "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory"}},
                          tmp_path)


def test_a_doctor_table_that_cannot_stand_for_the_doctor_is_refused_before_any_check(tmp_path):
    """`--doctor-table` of another device, without the doctor's work directory, or not a doctor's
    table: refused naming the option and the file, and nothing written."""
    from bench.gpu_verbs import main

    out, work, table = tmp_path / "out", tmp_path / "work", tmp_path / "doctor.json"

    def refusal(*args: str) -> str | int:
        with pytest.raises(SystemExit) as refused:
            main(["--device", "cpu", "--out", str(out), "--commit", "x", "--work-dir", str(work),
                  "--doctor-table", str(table), *args])
        return refused.value.code

    table.write_text(json.dumps({"device": "cuda", "checks": [{"name": "versions", "status": "pass"}]}))
    work.mkdir()
    assert refusal().startswith(f"bench.gpu_verbs: --doctor-table {table} is the doctor's on cuda")
    table.write_text(json.dumps({"device": "cpu", "checks": [{"name": "versions", "status": "pass"}]}))
    work.rmdir()
    assert refusal().startswith(f"bench.gpu_verbs: --doctor-table needs the doctor's --work-dir; {work}")
    table.write_text(json.dumps({"device": "cpu"}))
    assert refusal().startswith(f"bench.gpu_verbs: --doctor-table {table}: not a `nemo-topr doctor --json` table")
    assert refusal("--only", "doctor", "import") == 2  # a usage error: the table is the doctor's part
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor.json"]
