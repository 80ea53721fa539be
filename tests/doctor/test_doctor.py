"""`nemo-topr doctor`: on CPU every check that can run here passes (the TE-only ones are skipped
with their reason), `--device cuda` without CUDA is the project's device error, and one failing
check neither stops the others nor hides what to fix. Nothing here runs on a GPU."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest

from tests.doctor.cpu_doctor import doctor_on_cpu, run_doctor
from nemo_topr.doctor.checks import CHECKS, Files, per_token_difference
from nemo_topr.doctor.command import report, write_json
from nemo_topr.doctor.runner import CheckFailed, Doctor
from nemo_topr.utils.outputs import OutputError

TE_CHECKS = ("te attention", "train fp8", "packed parity")


@pytest.mark.slow
def test_doctor_on_cpu_passes_and_writes_its_table(tmp_path_factory):
    """A node whose image has TE and Apex, run on its CPU (the H200 node's case, 2026-11-26, where
    CPU scoring failed in TE's norm): every CPU verb passes without importing either, and the TE
    checks are skipped because the device is the CPU, not because TE is absent. This is the
    session's one doctor run (tests/doctor/cpu_doctor.py); tests/bench/test_gpu_verbs.py goes on
    from its work directory."""
    doctor = doctor_on_cpu(tmp_path_factory)
    assert doctor.proc.returncode == 0, doctor.proc.stdout[-4000:] + doctor.proc.stderr[-2000:]
    table = json.loads(doctor.table.read_text())
    status = {c["name"]: c["status"] for c in table["checks"]}
    assert status == {"versions": "pass", "te attention": "skipped", "build": "pass", "score": "pass",
                      "score vs cpu": "skipped",
                      "train": "pass", "resume": "pass", "train fp8": "skipped", "export": "pass",
                      "packed parity": "skipped"}
    assert (table["device"], table["finished"], table["passed"]) == ("cpu", True, True)
    assert_te_checks_skipped(table, "Transformer Engine's kernels need CUDA")
    details = {c["name"]: c["detail"] for c in table["checks"]}
    assert "resumed from iteration 1, completed at 2" in details["resume"]
    assert table["versions"]["megatron_core"] == "0.19.2" and table["versions"]["megatron_bridge"] == "0.6.2"
    assert table["versions"]["transformer_engine"] == "2.17.1"
    assert "nemo-topr doctor --device cpu: all passed" in doctor.proc.stdout


def test_without_te_its_checks_are_skipped_naming_the_install(tmp_path):
    """This venv's own case, as on a node without TE: each TE check is skipped before it starts
    anything, saying how to install TE, and the table records no TE version."""
    from nemo_topr.model.settings import transformer_engine_available

    assert not transformer_engine_available()  # the premise: the test venv has no TE
    doctor = Doctor("cpu", tmp_path, timeout=5)
    for name, check, _ in CHECKS:
        if name in TE_CHECKS:
            doctor.run(name, functools.partial(check, doctor, Files(tmp_path)))
    table = report(doctor, finished=True)
    assert [(c["name"], c["status"]) for c in table["checks"]] == [(name, "skipped") for name in TE_CHECKS]
    assert_te_checks_skipped(table, "Transformer Engine is not installed (pip install -r requirements-gpu.txt, or "
                                    "the NGC container)")
    assert not list(tmp_path.iterdir())  # no check's log: none started a process
    assert table["versions"]["transformer_engine"] is None


def assert_te_checks_skipped(table: dict, why: str) -> None:
    """The doctor's TE-only checks skipped, saying why."""
    details = {c["name"]: c["detail"] for c in table["checks"]}
    assert details["te attention"] == f"TE's attention on packed THD: {why}"
    assert details["train fp8"] == f"FP8 training: {why}"
    assert details["packed parity"] == f"compares TE's THD attention with local layers: {why}"


def test_doctor_on_cuda_without_cuda_is_the_device_error(tmp_path):
    proc = run_doctor("--device", "cuda", "--work-dir", str(tmp_path / "work"), timeout=120)
    assert proc.returncode == 1
    assert "nemo-topr doctor: --device is cuda, but CUDA is not available" in proc.stderr
    assert proc.stderr.rstrip().endswith("--device cpu") and not (tmp_path / "work").exists()


@pytest.mark.parametrize("json_at, work_at, key", [
    ("work", "work", "--json.is_work_dir"),
    ("out", "out/work", "--json.holds_work_dir"),
    ("work/doctor.json", "work", "--json.inside_work_dir"),
])
def test_a_json_table_that_is_in_or_holds_the_work_dir_is_a_usage_error_before_any_check(
        tmp_path, capsys, monkeypatch, json_at, work_at, key):
    """`--json DIR --work-dir DIR` ran the first check, then ended in IsADirectoryError when the
    table was written over the work directory; a table inside the work directory is deleted when
    the doctor empties it on a rerun."""
    from nemo_topr.doctor import command as doctor
    monkeypatch.setattr(doctor, "diagnose", lambda *args, **kwargs: pytest.fail("a check ran"))
    json_path, work = tmp_path / json_at, tmp_path / work_at
    with pytest.raises(OutputError) as refused:
        doctor.main(["--device", "cpu", "--json", str(json_path), "--work-dir", str(work)])
    assert (refused.value.key, refused.value.where) == (key, "--json")
    assert not list(tmp_path.iterdir())


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


def test_a_check_stops_at_the_deadline_and_after_each_check_the_table_so_far_is_reported(tmp_path):
    seen = []
    doctor = Doctor("cpu", tmp_path, timeout=60, deadline=time.monotonic() + 2,
                    after_check=lambda so_far: seen.append([(c.name, c.status) for c in so_far.checks]))
    started = time.monotonic()
    doctor.run("hang", lambda: doctor.python("hang", ["-c", "import time; time.sleep(60)"]))
    assert time.monotonic() - started < 10  # the deadline's 2 s, not the check's 60
    doctor.run("late", lambda: doctor.python("late", ["-c", "pass"]))
    # cut by the deadline, not by its own limit: not reported as a hang (the GPU run's "export
    # scores" was cut this way and called a hang: bench/results/gpu_verbs_h200_2026-11-26_0e4bf37.json)
    assert [(c.status, c.detail.split(" (")[0]) for c in doctor.checks] == [
        ("fail", "cut off by the deadline after 2 s, unfinished"), ("fail", "no time left before the deadline")]
    assert doctor.checks[0].fix == doctor.checks[1].fix == "rerun this check alone with more time"
    assert seen == [[("hang", "fail")], [("hang", "fail"), ("late", "fail")]]


def test_the_json_table_passes_only_when_finished_and_is_replaced_whole(tmp_path):
    doctor = Doctor("cpu", tmp_path, timeout=5)
    doctor.run("versions", lambda: "torch x")
    path = tmp_path / "doctor.json"
    write_json(path, report(doctor, finished=False))
    assert json.loads(path.read_text())["passed"] is False  # a killed doctor has not passed
    write_json(path, report(doctor, finished=True))
    table = json.loads(path.read_text())
    assert (table["passed"], table["finished"], [c["name"] for c in table["checks"]]) == (True, True, ["versions"])
    assert [p.name for p in tmp_path.iterdir()] == ["doctor.json"]  # no partial file left behind
    doctor.run("crash", lambda: 1 / 0)
    assert report(doctor, finished=True)["passed"] is False


def test_per_token_difference_divides_by_completion_tokens_with_eos(tmp_path):
    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    files = Files(tmp_path)
    build_tiny_hf_llama(files.model_dir, build_tiny_tokenizer())
    records = [{"prompt": "Q: 1+1?", "completion": " two", "reward": 1.0, "prompt_id": "p", "sample_id": 0},
               {"prompt": "Q: 1+1?", "completion": " three, surely", "reward": -1.0, "prompt_id": "p", "sample_id": 1}]
    files.graded.write_text("".join(json.dumps(r) + "\n" for r in records))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({**r, "behavior_logprob": -1.0}) + "\n" for r in records))
    b.write_text("".join(json.dumps({**r, "behavior_logprob": v}) + "\n" for r, v in zip(records, (-1.5, -2.0))))
    tokenizer = load_tokenizer(files.model_dir)
    tokens = sum(len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) + 1 for r in records)
    assert per_token_difference(a, b, files) == pytest.approx((0.5 + 1.0) / tokens)
    b.write_text(json.dumps({**records[0], "behavior_logprob": -1.0}) + "\n")
    with pytest.raises(CheckFailed, match="score different records"):
        per_token_difference(a, b, files)


# torch's refusal and TE's failure as the H200 printed them (2026-11-26, bench/README.md)
TORCH_CUDNN_REFUSAL = ("cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but found runtime "
                       "version (9, 14, 0). PyTorch already comes bundled with cuDNN.")
TE_BACKWARD_FAILURE = ("`python -m nemo_topr.doctor_attention` exited 1 (log: x): FAILED: RuntimeError: /Transformer"
                       "Engine/transformer_engine/common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu:934 in function "
                       "operator(): cuDNN Error: detail::set_attribute(reshape_operation.get_raw_desc(), "
                       "CUDNN_ATTR_OPERATION_RESHAPE_MODE, CUDNN_TYPE_RESHAPE_MODE, 1, &cudnn_reshape_mode) failed")


def test_a_foreign_cudnn_is_recorded_and_fails_the_versions_check_naming_torchs_own(monkeypatch, tmp_path):
    """On the H200, TE's import loaded the system's cuDNN 9.14 before torch's 9.19: torch then raised
    from `cudnn.version()`, which took the whole report down with it; now the table records it and
    the versions check fails with the directory to put first."""
    import torch

    from nemo_topr.doctor.versions import check_versions, versions

    def refuse():
        raise RuntimeError(TORCH_CUDNN_REFUSAL + "\nOne option ...")

    monkeypatch.setattr(torch.backends.cudnn, "version", refuse)
    found = {**versions(), "cuda": "13.0"}  # as on a CUDA build of torch, whatever this machine's is
    assert found["cudnn"] == "error: " + TORCH_CUDNN_REFUSAL
    doctor = Doctor("cpu", tmp_path, timeout=5)
    doctor.run("versions", lambda: check_versions(found, "cuda"))
    doctor.run("versions again", lambda: check_versions(found, "cpu"))
    assert [c.status for c in doctor.checks] == ["fail", "fail"]
    assert report(doctor, finished=True)["versions"]["cudnn"].startswith("error: cuDNN version incompatibility")
    fix = doctor.checks[0].fix
    assert fix.startswith("put torch's own cuDNN first: export LD_LIBRARY_PATH=") and fix.count("$LD_LIBRARY_PATH") == 1
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    assert "cudnn 91900" in check_versions(versions(), "cpu")


def test_te_attention_failing_for_an_old_cudnn_names_the_version_and_the_way_round():
    from nemo_topr.doctor.versions import CUDNN_TOO_OLD, attention_fix

    assert attention_fix(TE_BACKWARD_FAILURE) == CUDNN_TOO_OLD
    assert ">= 9.22" in CUDNN_TOO_OLD and "LD_LIBRARY_PATH" in CUDNN_TOO_OLD
    assert "model.attention_backend=unfused" in CUDNN_TOO_OLD
    other = attention_fix("FAILED: RuntimeError: no dot product attention backend is available")
    assert other != CUDNN_TOO_OLD and "NVTE_DEBUG=1" in other


# `validate(DoctorSpec)`: every problem of a command line before a check runs, nothing written; run in a
# folder holding a file (taken.json) and a directory of someone else's (full)
SPEC_ROWS = [
    ({}, []),
    ({"json": "table.json", "work_dir": "work"}, []),
    ({"json": "taken.json"}, [("output.exists", "--json")]),
    ({"json": "taken.json", "overwrite": True}, []),
    ({"work_dir": "taken.json"}, [("--work-dir.unusable", "--work-dir")]),
    ({"work_dir": "full"}, [("--work-dir.unusable", "--work-dir")]),
    ({"json": "work", "work_dir": "work"}, [("--json.is_work_dir", "--json")]),
    ({"json": "taken.json", "work_dir": "full"}, [("output.exists", "--json"), ("--work-dir.unusable", "--work-dir")]),
]


@pytest.mark.parametrize("given, problems", SPEC_ROWS, ids=[str(given) for given, _ in SPEC_ROWS])
def test_validate_names_every_problem_before_a_check_and_writes_nothing(tmp_path, monkeypatch, given, problems):
    import sys

    from nemo_topr.doctor import command as doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.json").write_text("{}\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("mine\n")
    before = sorted(tmp_path.rglob("*"))
    megatron = {name for name in sys.modules if name.startswith("megatron")}
    paths = {name: Path(given[name]) if name in given else None for name in ("json", "work_dir")}
    spec = doctor.DoctorSpec("cpu", overwrite=given.get("overwrite", False), timeout=1.0, **paths)
    assert [(problem.key, problem.where) for problem in doctor.validate(spec)] == problems
    assert sorted(tmp_path.rglob("*")) == before
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron
