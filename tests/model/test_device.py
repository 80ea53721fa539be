"""The device is an explicit choice: the decision table, clear errors when CUDA is asked for and
missing, and scoring moving its batches to the model's device.

Where CUDA must be absent, the commands run with CUDA_VISIBLE_DEVICES="" (no GPU can be seen,
on any machine): that is CUDA's own switch, not a fake. No test here runs anything on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.conftest import REPO, placeholder_hf_model
from nemo_topr.model.device import CHOICES, DEVICES, DeviceError, resolve_device


@pytest.mark.parametrize("requested, cuda_available, expected", [
    ("auto", True, "cuda"), ("auto", False, "cpu"),
    ("cpu", True, "cpu"), ("cpu", False, "cpu"),
    ("cuda", True, "cuda"),
])
def test_resolution_table(requested, cuda_available, expected):
    assert resolve_device(requested, cuda_available=cuda_available, where="--device") == expected


@pytest.mark.parametrize("where", ["--device", "device"])
def test_cuda_without_cuda_is_an_error_naming_the_option_or_key_it_came_from(where):
    with pytest.raises(DeviceError) as error:
        resolve_device("cuda", cuda_available=False, where=where)
    assert (error.value.key, error.value.where) == ("device.cuda_unavailable", where)


def test_training_configs_accept_cuda_or_cpu_only():
    assert DEVICES == ("cuda", "cpu") and set(CHOICES) == {"cuda", "cpu", "auto"}
    for bad in ("auto", "gpu", None):
        with pytest.raises(DeviceError) as error:
            resolve_device(bad, cuda_available=True, where="device", choices=DEVICES)
        assert error.value.key == "device.invalid"


def _without_cuda(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nemo_topr.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_gpu_training_config_without_cuda_fails_naming_the_key(tmp_path):
    # the 8B preset inherits nothing about devices from the machine: device: cuda
    proc = _without_cuda("train", "--config-name", "llama31_8b_bf16", f"hf_model={tmp_path}",
                         f"run_dir={tmp_path / 'run'}", f"dataset.train_path={tmp_path / 'x.jsonl'}")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nemo-topr train: device is cuda, but CUDA is not available" in proc.stderr
    assert proc.stderr.rstrip().endswith("device=cpu")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["score-logprobs", "export", "generate", "eval"])
def test_every_model_verb_defaults_to_cuda_and_fails_clearly_without_it(verb, tmp_path):
    # a model each verb takes (a sized Llama config, weights of no bytes): the device is what is wrong
    model = placeholder_hf_model(tmp_path / "hf_model", {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 2048})
    args = {"score-logprobs": ["--model", str(model), "--data", str(tmp_path / "x.jsonl"),
                               "--out", str(tmp_path / "out.jsonl")],
            "export": ["--ckpt", str(tmp_path), "--hf-out", str(tmp_path / "hf")],
            "generate": ["--model", str(model), "--prompts", "gsm8k-test", "--out", str(tmp_path / "out.jsonl")],
            "eval": ["--model", str(model), "--benchmark", "gsm8k", "--out", str(tmp_path / "r.json")]}[verb]
    proc = _without_cuda(verb, *args)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the device's problem first (its remedy ends its line); export's --ckpt, no checkpoint, follows it
    first = proc.stderr.splitlines()[0]
    assert "--device is cuda, but CUDA is not available" in first and first.rstrip().endswith("--device cpu")
    assert not (tmp_path / "out.jsonl").exists()


def test_device_cpu_hides_the_gpus_from_the_process():
    code = ("import os; from nemo_topr.model.device import select_device; "
            "print(select_device('cpu', where='--device'), repr(os.environ['CUDA_VISIBLE_DEVICES']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["cpu", "''"], proc.stderr


class _RecordDeviceMoves(TorchFunctionMode):
    """Records (tensor, device) for every Tensor.to(device, ...) call made inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[tuple[torch.Tensor, torch.device]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(target, (str, torch.device)):
                self.moves.append((args[0], torch.device(target)))
        return func(*args, **kwargs)


def test_scoring_moves_each_batch_to_the_model_device_and_scores_like_a_plain_forward(megatron_world):
    from tests.workers.topr_step_parallel import PAD_ID, SEQ_LENGTH, VOCAB, build_sequences, sequence_logprobs

    from nemo_topr.data.packing import collate_packed, collate_padded, pack_sequences
    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.training.scoring import scoring_forward_step

    torch.manual_seed(0)
    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0].eval()
    seqs = build_sequences([20, 35, 50, 12], seed=3)
    batch = collate_packed(seqs, pack_sequences(seqs, SEQ_LENGTH, PAD_ID), SEQ_LENGTH, PAD_ID)

    scores: dict[int, float] = {}
    with torch.no_grad(), _RecordDeviceMoves() as recorder:
        output, collect = scoring_forward_step(scores, model.config)(iter([batch]), model)
        collect(output)
    model_device = next(model.parameters()).device
    moved = {id(tensor) for tensor, device in recorder.moves if device == model_device}
    assert {key for key, tensor in batch.items() if id(tensor) not in moved} == set()

    # the scores themselves: the test worker's own padded forward, one sequence per row
    padded = collate_padded(seqs, range(len(seqs)), SEQ_LENGTH, PAD_ID)
    with torch.no_grad():
        expected = dict(zip(padded["sample_ids"].tolist(), sequence_logprobs(model, padded).tolist()))
    assert scores.keys() == expected.keys()
    assert all(abs(scores[k] - expected[k]) <= 1e-4 * abs(expected[k]) for k in expected)
