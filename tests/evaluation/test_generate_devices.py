"""Where `nemo-topr generate` runs: --device for the transformers backend (its refusal without
CUDA: tests/model/test_device.py), --tensor-parallel-size for vLLM. This machine has no GPU: the GPU
paths are checked for their refusals, and the vLLM call (tensor_parallel_size, logprobs_mode)
has never run on a GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
from tests.conftest import refusal

from nemo_topr.evaluation import generate
from nemo_topr.evaluation.sampling_options import settings_from_args


@pytest.fixture(scope="module")
def prompt_run(tmp_path_factory):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("generate_devices")
    model = build_tiny_hf_llama(root / "tiny", build_tiny_tokenizer())
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+3?", "reference_answer": "5", "prompt_id": "p0"}) + "\n")
    return ["--model", str(model), "--prompts", str(prompts), "--task", "math", "--num-samples", "2",
            "--max-new-tokens", "4"]


@pytest.mark.parametrize("backend", ["transformers", "auto"])
def test_tensor_parallel_needs_vllm(prompt_run, tmp_path, backend):
    """Refused before anything is read or logged: had the sample log recorded the size, the
    corrected rerun would be refused as one "with other options"."""
    out = tmp_path / "o.jsonl"
    args = [*prompt_run, "--backend", backend, "--tensor-parallel-size", "4", "--device", "cpu", "--out", str(out)]
    assert refusal(generate.main, args) == (
        1, "--tensor-parallel-size.transformers_backend", "--tensor-parallel-size")
    assert list(tmp_path.iterdir()) == []


def test_cpu_device_samples_what_auto_samples_here(prompt_run, tmp_path):
    """Without a GPU, auto means the CPU: the same seeded samples either way."""
    outputs = {}
    for device in ("auto", "cpu"):
        out = tmp_path / f"{device}.jsonl"
        assert generate.main([*prompt_run, "--device", device, "--out", str(out)]) == 0
        outputs[device] = out.read_text()
    assert outputs["auto"] == outputs["cpu"]


@pytest.fixture
def vllm_importable(monkeypatch):
    """vLLM importable, as on a GPU machine with requirements-vllm.txt (this environment has none)."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: object() if name == "vllm" else real_find_spec(name, *rest))


def test_the_vllm_backend_is_refused_where_it_cannot_sample(prompt_run, tmp_path, request):
    """Before anything is read or logged: without vLLM the import failed in a traceback once the
    sample log was written; on the CPU, with vLLM installed, it would not sample at all."""
    out = tmp_path / "o.jsonl"
    args = [*prompt_run, "--backend", "vllm", "--device", "cpu", "--out", str(out)]
    assert refusal(generate.main, args) == (1, "--backend.vllm_not_installed", "--backend")
    request.getfixturevalue("vllm_importable")
    assert refusal(generate.main, args) == (1, "--backend.vllm_on_cpu", "--backend")
    assert list(tmp_path.iterdir()) == []


def test_flags_reach_the_sampling_settings(prompt_run, vllm_importable):
    args = generate.build_parser().parse_args([*prompt_run, "--tensor-parallel-size", "8", "--backend", "vllm",
                                               "--device", "cuda", "--out", "x.jsonl"])
    settings = settings_from_args(args, "math")
    assert settings.tensor_parallel_size == 8


def test_stop_strings_are_the_tasks_the_given_ones_or_none(prompt_run):
    """GSM8K's default stops at the next few-shot question; `--no-stop` asks for none (`--stop ''`
    is refused: it ended every completion before its first token)."""
    def stops(*options: str) -> tuple[str, ...]:
        args = generate.build_parser().parse_args([*prompt_run, *options, "--out", "x.jsonl"])
        return settings_from_args(args, "gsm8k").stop_strings

    assert stops() == ("\n\nQuestion:",)
    assert stops("--stop", "END", "--stop", "###") == ("END", "###")
    assert stops("--no-stop") == ()
    with pytest.raises(SystemExit):
        stops("--no-stop", "--stop", "END")
