"""Smoke tests of the benchmark suite (bench/, `make bench`) at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.conftest import REPO

if str(REPO) not in sys.path:  # bench/ is not an installed package; `python -m pytest` adds the cwd
    sys.path.insert(0, str(REPO))


def _check_results(out, sections):
    env = json.loads((out / "environment.json").read_text())
    for key in ("date_utc", "git_commit", "cpu_model", "cpu_count", "torch", "megatron_core", "total_seconds"):
        assert key in env, key
    headline = json.loads((out / "headline.json").read_text())["results"]
    assert headline and {row["status"] for row in headline} <= {"met", "MISSED", "info"}
    for section in sections:
        assert json.loads((out / f"{section}.json").read_text()), section
    markdown = (out / "RESULTS.md").read_text()
    assert env["date_utc"] in markdown and env["cpu_model"] in markdown
    assert "| section | figure | value | spread | target | status | notes |" in markdown
    return headline


def test_peak_rss_sees_a_torch_allocation():
    torch = pytest.importorskip("torch")
    from bench.common import PeakRss

    if not PeakRss().resettable:
        pytest.skip("/proc/self/clear_refs not writable here")
    with PeakRss() as memory:
        block = torch.ones(16 * 2**20)  # 64 MiB, touched
        del block
    # the 64 MiB block must show; what else the process touches meanwhile (allocator arenas,
    # page-table and import noise, seen up to ~8 MiB in CI) may add to it, never take from it
    assert 60 * 2**20 < memory.extra < 96 * 2**20


def test_interleaved_pairs_and_summarises():
    from bench.common import interleaved, summary

    calls = []
    result = interleaved(lambda: calls.append("a"), lambda: calls.append("b"), reps=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert result["cpu"]["ratio_b_over_a"]["n"] == 3 and result["wall"]["a"]["n"] == 3
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "q1": 1.5, "q3": 2.5, "min": 1.0, "max": 3.0, "n": 3}


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """The whole suite at tiny sizes, as `make bench` runs it (subprocesses, Megatron models): one
    run shared by the tests of its sections."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_make_bench_quick_writes_every_section(quick_bench):
    headline = _check_results(quick_bench, ("step", "logprob", "packing", "pipeline", "startup", "gpu"))
    sections = {row["section"] for row in headline}
    assert {"1 step cost", "2 log-prob path", "3 packing", "4 μ scoring", "5 data pipeline", "6 start-up",
            "GPU"} <= sections
    packing = json.loads((quick_bench / "packing.json").read_text())
    assert set(packing) == {"gsm8k_qa", "gsm8k_8shot", "math500_boxed", "math500_reasoning"}
    startup = json.loads((quick_bench / "startup.json").read_text())["results"][0]
    assert startup["model"] == "tiny" and startup["cpu"]["hf_start_seconds"]["median"] > 1  # Megatron's start alone
    logprob = json.loads((quick_bench / "logprob.json").read_text())["results"][0]
    assert logprob["relative_logprob_difference"] < 1e-5  # both paths compute the same log-probs


@pytest.mark.slow
def test_shared_prefix_section_writes_results(quick_bench):
    """Section 7 at tiny sizes (rows of 2,048 positions through a Megatron model), from the quick
    run: rows for every workload, the 8-shot ones judged against the targets."""
    headline = _check_results(quick_bench, ("shared_prefix",))
    rows = [row for row in headline if row["section"] == "7 shared prefix"]
    assert len(rows) == 5 * 3  # positions, padding, step, scoring, FlexCoreAttention step per workload
    assert {row["status"] for row in rows if "zero_shot" in row["figure"]} == {"info"}
    flex = [row for row in rows if "FlexCoreAttention" in row["figure"]]
    assert len(flex) == 3 and {row["status"] for row in flex} == {"info"}  # CPU eager: reported, not judged
    judged = [row for row in rows if "8shot" in row["figure"] and "scoring" not in row["figure"] and row not in flex]
    assert len(judged) == 2 * 3 and all(row["status"] in ("met", "MISSED") for row in judged)
    section = json.loads((quick_bench / "shared_prefix.json").read_text())
    for name in ("gsm8k_8shot", "gsm8k_8shot_completions_x2", "gsm8k_zero_shot_chat"):
        timing = section[name]["timing"]
        assert timing["scoring_max_relative_difference"] < 1e-6  # both layouts score the same
        assert timing["flex_scoring_max_relative_difference"] < 1e-6  # and so does FlexCoreAttention
        # the 8-shot prompt dominates: sharing it pays even for 2 questions x 4 samples
        assert section[name]["tokens"]["positions_ratio"] > (1.0 if "8shot" in name else 0.99)


def test_fp8_is_compared_with_bf16_step_by_step_and_says_whether_the_weights_were_the_same():
    from bench.gpu import fp8_minus_bf16

    bf16 = {"precision": "bf16", "weights_checksum": 7.0,
            "steps": [{"topr_loss": 2.0, "grad_norm": 4.0}, {"topr_loss": 2.0, "grad_norm": 4.0}]}
    delayed = {"precision": "fp8_delayed", "weights_checksum": 7.0,
               "steps": [{"topr_loss": 2.5, "grad_norm": 5.0}, {"topr_loss": 2.125, "grad_norm": 3.0}]}
    current = {"precision": "fp8_current", "weights_checksum": 7.5, "steps": bf16["steps"]}
    failed = {"precision": "fp8_current", "weights_checksum": 7.0, "topr_error": "RuntimeError"}  # no steps
    assert fp8_minus_bf16([bf16, delayed, failed]) == {"fp8_delayed": {"same_weights": True, "steps": [
        {"topr_loss": 0.5, "grad_norm_relative": 0.25}, {"topr_loss": 0.125, "grad_norm_relative": -0.25}]}}
    assert fp8_minus_bf16([bf16, current])["fp8_current"]["same_weights"] is False
    assert fp8_minus_bf16([delayed]) == {}  # no BF16 run to compare with


@pytest.mark.slow
def test_a_first_step_reports_the_reduced_loss_and_the_gradient_it_leaves(megatron_world):
    import functools

    import torch

    from bench.step import MODELS, build_model, first_step_numbers, packed_microbatches, run_step
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.step import ToprForwardStep

    tiny = MODELS["tiny"]
    chunks = build_model(tiny["shape"], tiny["seq_length"])
    batches = packed_microbatches(tiny["seq_length"], tiny["rows"], tiny["microbatches"])
    step = functools.partial(ToprForwardStep(ObjectiveConfig()), None)
    first = first_step_numbers(chunks, step, batches)
    assert first == first_step_numbers(chunks, step, batches)  # gradients are reset, not accumulated
    # the same step by hand: each micro-batch's reported pair, and every parameter's gradient
    pairs = [out["topr_loss"] for out in run_step(chunks, step, batches)]
    assert first["topr_loss"] == pytest.approx(float(sum(p[0] for p in pairs) / sum(p[1] for p in pairs)), rel=1e-6)
    grads = torch.cat([p.grad.flatten() for p in chunks[0].parameters()])
    assert first["grad_norm"] == pytest.approx(float(grads.norm()), rel=1e-5) and first["grad_norm"] > 0


def test_the_report_states_fp8_against_bf16(tmp_path):
    from bench.report import write_markdown

    development = json.loads((REPO / "bench/results/gpu_h100_development.json").read_text())
    gpu = {**development["reduction_pairs_on_device_4_layers"], "fp8_minus_bf16": {
        "fp8_delayed": {"same_weights": True, "steps": [{"topr_loss": 0.5, "grad_norm_relative": 0.25},
                                                        {"topr_loss": 0.125, "grad_norm_relative": -0.25}]},
        "fp8_current": {"same_weights": False, "steps": [{"topr_loss": 0.0, "grad_norm_relative": 0.0}]}}}
    environment = {"date_utc": "2026-11-25", "cpu_model": "x", "cpu_count": 16, "memory_total_bytes": 2**37,
                   "git_commit": "abc", "git_dirty_tracked_files": False, "torch": "2.11.0", "megatron_core": "0.19.2",
                   "megatron_bridge": "0.6.2", "python": "3.12", "threads_per_process": 1, "load_average": [0.0],
                   "load_average_end": [0.0], "total_seconds": 1.0, "quick": False}
    text = write_markdown({"environment": environment, "gpu": gpu, "headline": []}, tmp_path / "RESULTS.md")
    assert ("fp8_delayed − bf16, same weights, same batches, steps 1 and 2: TOPR loss +0.5000, +0.1250; "
            "gradient norm +25.00 %, -25.00 %") in text
    assert "fp8_current − bf16, DIFFERENT weights (not comparable)" in text


def test_the_gpu_sections_depth_and_attention_backend_reach_the_bench_and_its_table(tmp_path, monkeypatch):
    """`bench.run --gpu-layers/--gpu-attention-backend` (what `bench.gpu_verbs --bench-*` forwards):
    the H200's TE run of 2026-11-26 needed unfused attention at one layer (bench/README.md)."""
    from bench import gpu, run
    from bench.report import _gpu_rows

    called = {}
    monkeypatch.setattr(gpu, "measure", lambda **kwargs: called.update(kwargs) or {"skipped": True, "reason": "x"})
    assert run.main(["--sections", "gpu", "--out", str(tmp_path), "--gpu-layers", "2",
                     "--gpu-attention-backend", "unfused"]) == 0
    assert called == {"layers": 2, "attention_backend": "unfused"}
    with pytest.raises(SystemExit):
        run.main(["--sections", "gpu", "--out", str(tmp_path), "--gpu-attention-backend", "cudnn"])
    monkeypatch.undo()
    with pytest.raises(ValueError, match="attention backend 'cudnn'"):
        gpu.measure(attention_backend="cudnn")  # refused before it looks for CUDA
    run_row = {"precision": "bf16", "layers": 1, "attention_backend": "unfused", "rows": 1, "seq_length": 4096,
               "microbatches": 4, "sft_tokens_per_s": 22716.7, "sft_mfu": 0.1026, "transformer_engine": True,
               "topr_error": None, "topr_over_sft_time": {"median": 0.9966, "q1": 0.9929, "q3": 0.9975, "n": 5},
               "topr_tokens_per_s": 22870.1, "topr_mfu": 0.1033}
    assert _gpu_rows({"runs": [run_row]})[0]["figure"] == (
        "TOPR / SFT step time, bf16, 1-layer 8B-shaped, unfused attention, 1×4096 × 4 mb")
    del run_row["attention_backend"]  # the runs committed before the option: the backend TE chose
    assert _gpu_rows({"runs": [run_row]})[0]["figure"] == "TOPR / SFT step time, bf16, 1-layer 8B-shaped, 1×4096 × 4 mb"
