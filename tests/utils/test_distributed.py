"""nemo_topr/utils/distributed.py: a launcher's rendezvous that cannot work is refused at once, naming the
variable, instead of every rank retrying an unresolvable MASTER_ADDR until torch's store times out."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from tests.conftest import REPO

from nemo_topr.utils.distributed import RendezvousError, check_local_gpu, check_rendezvous

# RFC 6761: names under .invalid never resolve
UNRESOLVABLE = "node-0042.invalid"


def test_a_plain_process_needs_no_rendezvous():
    check_rendezvous({})
    check_rendezvous({"MASTER_ADDR": UNRESOLVABLE})  # not launched: the variables are not used


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost"])
def test_a_resolvable_rendezvous_passes(addr):
    check_rendezvous({"WORLD_SIZE": "2", "MASTER_ADDR": addr, "MASTER_PORT": "29500"})


@pytest.mark.parametrize(("environ", "key", "where"), [
    ({"MASTER_ADDR": UNRESOLVABLE, "MASTER_PORT": "29500"}, "MASTER_ADDR.unresolvable", "MASTER_ADDR"),
    ({"MASTER_PORT": "29500"}, "rendezvous.unset", "MASTER_ADDR"),
    ({"MASTER_ADDR": "127.0.0.1"}, "rendezvous.unset", "MASTER_PORT"),
    ({}, "rendezvous.unset", "MASTER_ADDR and MASTER_PORT"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "port"}, "MASTER_PORT.not_a_port", "MASTER_PORT"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"}, "MASTER_PORT.not_a_port", "MASTER_PORT"),
])
def test_a_rendezvous_that_cannot_work_is_named(environ, key, where):
    with pytest.raises(RendezvousError) as error:
        check_rendezvous({"WORLD_SIZE": "2", **environ})
    assert (error.value.key, error.value.where) == (key, where)


def test_a_plain_process_world_of_one_needs_no_port_chosen_ahead(tmp_path):
    """A plain `train` or `import` makes its world of one from the environment. A free port picked
    ahead would be bound by torch's store seconds later, so another process could take it first
    (EADDRINUSE). Here the port that free_port() picks is taken before the bind, as that process
    would: the world is still made, on a port the OS gives the store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        script = ("import datetime, torch.distributed as dist\n"
                  "from nemo_topr.utils import distributed\n"
                  f"distributed.free_port = lambda: {taken.getsockname()[1]}  # chosen, then taken by another\n"
                  "distributed.local_rendezvous()\n"
                  "dist.init_process_group('gloo', world_size=1, rank=0, timeout=datetime.timedelta(seconds=20))\n"
                  "dist.barrier()\n"
                  "print('world of', dist.get_world_size())\n")
        environ = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=environ, capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("world of 1")


@pytest.mark.slow
def test_train_refuses_an_unresolvable_master_addr_before_importing_megatron(tmp_path):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    tiny_hf = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer(corpus=["The answer is 7."] * 20, vocab_size=300))
    environ = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": UNRESOLVABLE,
               "MASTER_PORT": "29500"}
    data = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_topr.cli", "train", "--config-name",
                           "tiny_cpu", f"hf_model={tiny_hf}", f"run_dir={tmp_path / 'run'}",
                           f"dataset.train_path={data}"],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith("nemo-topr train: ") and UNRESOLVABLE in lines[0]  # MASTER_ADDR.unresolvable's row
    assert "| megatron" not in proc.stderr  # -X importtime lists every module imported
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_score_logprobs_leaves_no_process_group_behind_and_a_callers_own_in_place(tiny_graded, tmp_path):
    """NCCL warns at exit about a process group never destroyed: every `score-logprobs` on the
    H200 printed it (bench/results/gpu_verbs_h200_2026-11-26_0e4bf37.json, the score logs). A
    world the caller made before is the caller's: scoring in-process in a pytest worker destroyed
    the session's world, and the worker's later Megatron tests failed in Bridge's NCCL set-up."""
    model_dir, graded = tiny_graded
    data = tmp_path / "two.jsonl"
    data.write_text("".join(graded.read_text().splitlines(keepends=True)[:2]))
    script = ("import sys, torch; from nemo_topr.training import scoring; "
              "from nemo_topr.utils.distributed import initialize_model_parallel; out, args = sys.argv[1], sys.argv[2:]; "
              "scoring.main(args + ['--out', out + '/first.jsonl']); "
              "print('made and ended:', not torch.distributed.is_initialized()); "
              "initialize_model_parallel(1, 1); scoring.main(args + ['--out', out + '/second.jsonl']); "
              "print('kept:', torch.distributed.is_initialized())")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), "--model", str(model_dir), "--data", str(data),
                           "--seq-length", "512", "--device", "cpu"],
                          cwd=REPO, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "made and ended: True\n" in proc.stdout and proc.stdout.strip().endswith("kept: True")
    assert (tmp_path / "first.jsonl").read_text() == (tmp_path / "second.jsonl").read_text()
    assert len((tmp_path / "first.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(("local_rank", "visible"), [("4", None), ("1", "0")])
def test_a_rank_past_the_nodes_gpus_is_refused_naming_them(monkeypatch, local_rank, visible):
    """Eight ranks on a node of four GPUs (or one made visible): ranks 4-7 would have failed with
    CUDA's "invalid device ordinal" inside Megatron's set-up; rank 3 of them, or any plain
    process, is fine."""
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4 if visible is None else 1)
    environ = {"WORLD_SIZE": "8", "LOCAL_RANK": local_rank,
               **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
    with pytest.raises(RendezvousError) as error:
        check_local_gpu(environ)
    assert (error.value.key, error.value.where) == ("LOCAL_RANK.beyond_gpus", "LOCAL_RANK")
    check_local_gpu({**environ, "LOCAL_RANK": "3" if visible is None else "0"})
    check_local_gpu({})  # not launched


def _launched_as_rank(monkeypatch, rank: int, of: int) -> None:
    """This process's environment as a launcher's (torchrun's) rank `rank` of `of`, on one node."""
    for name, value in {"WORLD_SIZE": str(of), "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # a CPU test before may have hidden the GPUs


def test_a_rank_past_the_gpus_stops_before_its_process_group(monkeypatch):
    """What `score-logprobs` starts its world with, on CUDA (mocked: 2 GPUs)."""
    import torch

    from nemo_topr.utils.distributed import initialize_model_parallel

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail(f"set_device({device}) reached"))
    _launched_as_rank(monkeypatch, 2, of=4)
    with pytest.raises(RendezvousError) as error:
        initialize_model_parallel()
    assert error.value.key == "LOCAL_RANK.beyond_gpus"


@pytest.mark.slow
def test_train_refuses_a_rank_past_the_gpus_before_importing_megatron(demo_inputs, tmp_path, monkeypatch):
    """`nemo-topr train` on CUDA (mocked: 2 GPUs) as local rank 3 of 4: one line, before Megatron's
    imports and the run directory."""
    import torch

    from nemo_topr.training import recipe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(recipe, "use_device", lambda *args, **kwargs: pytest.fail("Megatron imported"))
    _launched_as_rank(monkeypatch, 3, of=4)
    model_dir, data = demo_inputs
    with pytest.raises(RendezvousError) as stop:
        recipe.main(["--config-name", "tiny_cpu", "device=cuda", "train.global_batch_size=8", f"hf_model={model_dir}",
                     f"run_dir={tmp_path / 'run'}", f"dataset.train_path={data}"])
    assert stop.value.key == "LOCAL_RANK.beyond_gpus"
    assert not (tmp_path / "run").exists()
