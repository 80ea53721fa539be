"""Starting from a Megatron checkpoint instead of a Hugging Face directory, end to end on CPU:
`nemo-topr import`, training / scoring / export from the import or from an earlier run,
weights-only continuation vs resume, loading at another TP/PP layout, and the errors for
checkpoints that are unfinished, carry no HF config or belong to another architecture."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_distributed, tensorboard_scalars

pytestmark = pytest.mark.slow

# Same fp32 CPU kernels either way, but two separate multi-threaded trainings are not bitwise
# reproducible: a fresh-clone `make test` saw 2.6e-6 relative at one of the three steps (other runs:
# equal within 1e-6). 1e-5 leaves room for summation order only; a wrong weight moves it far more.
LOSS_RTOL = 1e-5
LOGPROB_ATOL = 1e-4  # per-sequence sums of ~100 token log-probs (|sum| ~ 500): TP splits the reductions
LOGIT_ATOL = 1e-5


def nemo_topr(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "nemo_topr.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny HF Llama and 24 graded records (12 packed rows: 3 iterations of tiny_cpu's 4)."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_hf_llama(root / "hf", build_tiny_tokenizer())
    (root / "graded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in build_graded_records(8)))
    return root


@pytest.fixture(scope="module")
def imported(tiny) -> tuple[Path, subprocess.CompletedProcess]:
    return tiny / "imported", nemo_topr("import", tiny / "hf", tiny / "imported")


def score(model, data: Path, out: Path, *, tp: int = 1, pp: int = 1) -> dict[int, float]:
    args = ["score-logprobs", "--model", str(model), "--data", str(data), "--out", str(out), "--seq-length", "512",
            "--tp", str(tp), "--pp", str(pp), "--device", "cpu"]
    if tp * pp == 1:
        nemo_topr(*args)
    else:
        run_distributed("nemo_topr_cli.py", tp * pp, *args)
    return {i: json.loads(line)["behavior_logprob"] for i, line in enumerate(out.read_text().splitlines())}


@pytest.fixture(scope="module")
def scored(tiny) -> Path:
    """mu from the HF starting model (the data both runs train on)."""
    score(tiny / "hf", tiny / "graded.jsonl", tiny / "scored.jsonl")
    return tiny / "scored.jsonl"


@pytest.fixture(scope="module")
def scored_from_import(tiny, imported, tmp_path_factory) -> dict[int, float]:
    """The same records scored from the import at TP1 (compared with HF's scores and with TP2's)."""
    return score(imported[0], tiny / "graded.jsonl", tmp_path_factory.mktemp("tp1") / "scored.jsonl")


def train(tiny: Path, scored: Path, base_model, run_dir: Path, *overrides: str) -> Path:
    nemo_topr("train", "--config-name", "tiny_cpu", f"base_model={base_model}", f"run_dir={run_dir}",
              f"dataset.train_path={scored}", *overrides)
    return run_dir


@pytest.fixture(scope="module")
def runs(tiny, imported, scored) -> dict[str, Path]:
    """The same config started from the HF directory and from its import (a checkpoint every iteration)."""
    return {start: train(tiny, scored, model, tiny / f"run_{start}", "checkpoint.save_interval=1")
            for start, model in (("hf", tiny / "hf"), ("imported", imported[0]))}


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


# ---------------------------------------------------------------------------------------------
# import


def test_import_writes_a_complete_checkpoint_that_exports_back_to_the_same_weights(tiny, imported, tmp_path):
    from nemo_topr.model.source import resolve

    out, proc = imported
    assert [line.split("]")[1].strip()[:5] for line in proc.stderr.splitlines() if line.startswith("[nemo-topr import]")
            ] == ["[1/3", "[2/3", "[3/3"]  # progress, on stderr with Megatron's and Gloo's prints
    assert proc.stdout == f"imported {tiny / 'hf'} -> {out}\n"  # the result alone, for a script
    report = json.loads((out / "nemo_topr_import.json").read_text())
    assert report["parameters"] == sum(t.numel() for t in safetensors(tiny / "hf").values())
    assert 0.1 < report["peak_host_memory_gib"]["self"] < 8
    source = resolve(out)
    assert (source.kind, source.iteration, source.hf_dir) == ("megatron", 0, out / "hf_artifacts")
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= {p.name for p in source.hf_dir.iterdir()}
    # item 6: export straight from the import (no run) loads in transformers with the HF weights, bit for bit
    exported = nemo_topr("export", "--ckpt", out, "--hf-out", tmp_path / "back", "--device", "cpu")
    assert exported.stdout == f"exported {out / 'iter_0000000'} -> {tmp_path / 'back'}\n"  # Gloo's lines: stderr
    original, back = safetensors(tiny / "hf"), safetensors(tmp_path / "back")
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in original)
    assert (tmp_path / "back" / "tokenizer.json").read_text() == (tiny / "hf" / "tokenizer.json").read_text()
    # run again: the checkpoint, read by Megatron meanwhile, is unchanged, so its export is kept as it is
    again = nemo_topr("export", "--ckpt", out, "--hf-out", tmp_path / "back", "--device", "cpu")
    assert again.stdout == f"kept {out / 'iter_0000000'} -> {tmp_path / 'back'} (exported earlier, unchanged since)\n"
    assert safetensors(tmp_path / "back").keys() == original.keys()
    assert nemo_topr("import", tiny / "hf", out, ok=False).stderr.strip().endswith(
        "exists and is not an empty directory; import writes a new checkpoint directory")


# `nemo-topr import` in a fresh process with one thing replaced: the free space it reads, or the
# save failing as torch's writer failed on a full 300-700 KB tmpfs (by hand): a CheckpointException
# naming only a "Worker failure", after part of the checkpoint was written.
FULL_DISK = {
    "no room": "import_checkpoint.free_bytes = lambda path: 1000",
    "save fails": """
from nemo_topr.model import cpu_runtime
cpu_runtime.enable_cpu_runtime()  # as the import does first: Bridge imported without it looks for TE
from megatron.bridge import AutoBridge
from torch.distributed.checkpoint.api import CheckpointException

def save_until_the_disk_is_full(self, model, path, **kwargs):
    (Path(path) / "iter_0000000").mkdir()
    (Path(path) / "iter_0000000" / "__0_0.distcp").write_bytes(b"half a checkpoint")
    raise CheckpointException("write", {0: RuntimeError("Worker failure: An error is caught while starting worker 0")})

AutoBridge.save_megatron_model = save_until_the_disk_is_full
""",
}
FULL_DISK["save fails for space"] = FULL_DISK["save fails"] + """
answers = iter([2**40, 4096])  # room before the save, none after it
import_checkpoint.free_bytes = lambda path: next(answers)
"""


@pytest.mark.parametrize("case, message", [
    ("no room", r"0\.0 MiB free, and the checkpoint takes 0\.6 MiB \(156,480 parameters in fp32\): free space there, "
                r"or choose another OUT"),
    ("save fails", r"the checkpoint could not be written \(CheckpointException\), and what was written is removed"),
    ("save fails for space", r"the checkpoint could not be written \(CheckpointException\), and what was written is "
                             r"removed; 0\.0 MiB free for 0\.6 MiB of weights plus the tokenizer and metadata: free "
                             r"space there, or choose another OUT"),
])
def test_an_import_the_disk_cannot_hold_ends_in_one_line_and_leaves_no_checkpoint(tiny, tmp_path, case, message):
    out = tmp_path / "ckpt"
    script = "\n".join(["import sys", "from pathlib import Path", "from nemo_topr import cli",
                        "from nemo_topr.training import import_checkpoint", FULL_DISK[case],
                        f"sys.exit(cli.main(['import', {str(tiny / 'hf')!r}, {str(out)!r}]))"])
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last_line = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"nemo-topr import: {out}: {message}", last_line), proc.stderr[-2000:]
    assert not out.exists()  # made by the import: removed, so that the next one is not refused as non-empty


# `nemo-topr import` in a fresh process, stopped while it loads the HF weights
LOADING_STOPS = """
from nemo_topr.model import cpu_runtime
cpu_runtime.enable_cpu_runtime()
from megatron.bridge import AutoBridge

def stopped(*args, **kwargs):
    raise {error}

AutoBridge.from_hf_pretrained = stopped
"""


@pytest.mark.parametrize("error, users", [("KeyboardInterrupt", False), ("RuntimeError('unreadable shard')", True)],
                         ids=["ctrl-c", "failure-in-an-empty-out-of-the-users"])
def test_an_import_stopped_while_loading_leaves_no_directory_it_made(tiny, tmp_path, error, users):
    """OUT (and its missing parents) was made before the weights loaded, and removed only when the
    save failed: Ctrl-C or a failure while loading left an empty OUT behind. An empty OUT the user
    made stays."""
    out = tmp_path / "new" / "ckpt"
    if users:
        out.mkdir(parents=True)
    script = "\n".join(["import sys", "from nemo_topr.training import import_checkpoint",
                        LOADING_STOPS.format(error=error),
                        f"sys.exit(import_checkpoint.main([{str(tiny / 'hf')!r}, {str(out)!r}]))"])
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and error.split("(")[0] in proc.stderr.splitlines()[-1], proc.stderr[-3000:]
    assert sorted(tmp_path.rglob("*")) == ([tmp_path / "new", out] if users else [])


# `nemo-topr import` whose save, once written, waits to be signalled; its children are listed first
SAVED_THEN_WAITS = """
import os, sys, time
from pathlib import Path
from nemo_topr.model import cpu_runtime
cpu_runtime.enable_cpu_runtime()
from megatron.bridge import AutoBridge
from nemo_topr.training import import_checkpoint

real_save = AutoBridge.save_megatron_model

def save_then_wait(self, model, path, **kwargs):
    real_save(self, model, path, **kwargs)
    children = [pid for task in os.listdir("/proc/self/task")
                for pid in open(f"/proc/self/task/{task}/children").read().split()]
    Path(sys.argv[2] + ".children").write_text(" ".join(children))
    time.sleep(600)

AutoBridge.save_megatron_model = save_then_wait
sys.exit(import_checkpoint.main([sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_import_leaves_no_process_and_says_what_it_left(tiny, tmp_path, stop):
    """Killed while it saved, the import left Megatron's writer-queue process and multiprocessing's
    resource tracker running for good, holding its stdout and stderr: a caller reading them (a pipe,
    `subprocess.run`) waited until its timeout. SIGTERM also left OUT half written, as SIGKILL must."""
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", SAVED_THEN_WAITS, str(tiny / "hf"), str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = tmp_path / "ckpt.children"
    try:
        deadline = time.monotonic() + 300
        while not children.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        time.sleep(0.2)  # the list written whole
        assert len(children.read_text().split()) == 2  # the writer queue's manager and the resource tracker
        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=60)  # EOF: nothing holds the pipes
    finally:
        for pid in map(int, children.read_text().split() if children.exists() else []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
    if stop == signal.SIGTERM:
        assert (proc.returncode, stderr.splitlines()[-1]) == (
            143, f"nemo-topr import: terminated (SIGTERM); what it wrote in {out} is removed"), stderr[-3000:]
        assert not out.exists()
    else:
        assert proc.returncode == -9
        (out / "latest_checkpointed_iteration.txt").unlink()  # as a kill before the save's end leaves it
        rerun = nemo_topr("import", tiny / "hf", out, ok=False)
        assert rerun.stderr.strip().splitlines()[-1] == (
            f"nemo-topr import: {out}: exists and is not an empty directory; import writes a new checkpoint directory; "
            "it holds an import cut short (hf_artifacts/ without latest_checkpointed_iteration.txt, which the save "
            "writes last): remove it and import again")


def test_a_bf16_import_stores_bf16_and_loads_into_the_fp32_cpu_runtime(tiny, scored, tmp_path):
    """Llama 3.1's config says bfloat16, so that is the default import dtype: half the bytes."""
    from torch.distributed.checkpoint import FileSystemReader

    nemo_topr("import", tiny / "hf", tmp_path / "bf16", "--dtype", "bf16")
    metadata = FileSystemReader(str(tmp_path / "bf16" / "iter_0000000")).read_metadata().state_dict_metadata
    assert all(metadata[key].properties.dtype == torch.bfloat16 for key in
               ("embedding.word_embeddings.weight", "decoder.layers.self_attention.linear_qkv.weight",
                "decoder.layers.mlp.linear_fc1.weight", "output_layer.weight"))
    from_bf16 = score(tmp_path / "bf16", tiny / "graded.jsonl", tmp_path / "s.jsonl")
    fp32 = {i: json.loads(line)["behavior_logprob"] for i, line in enumerate(scored.read_text().splitlines())}
    # bf16-rounded weights (8 mantissa bits) move each ~-550 sum a little, never by much
    assert from_bf16 != fp32 and from_bf16 == pytest.approx(fp32, rel=1e-3)


# ---------------------------------------------------------------------------------------------
# HF start == imported start


def test_scoring_from_the_import_equals_scoring_from_hf(scored, scored_from_import):
    from_hf = {i: json.loads(line)["behavior_logprob"] for i, line in enumerate(scored.read_text().splitlines())}
    assert scored_from_import == pytest.approx(from_hf, abs=LOGPROB_ATOL)


def test_imported_start_trains_and_exports_like_the_hf_start(runs, tiny, tmp_path):
    losses = {start: tensorboard_scalars(run, "topr_loss") for start, run in runs.items()}
    assert [step for step, _ in losses["hf"]] == [1, 2, 3]
    assert [step for step, _ in losses["imported"]] == [1, 2, 3]
    for (_, hf_loss), (_, imported_loss) in zip(losses["hf"], losses["imported"]):
        assert imported_loss == pytest.approx(hf_loss, rel=LOSS_RTOL)
    assert len({loss for _, loss in losses["hf"]}) == 3  # it trained: the loss moves

    exports = {start: tmp_path / start for start in runs}
    for start, run in runs.items():
        nemo_topr("export", "--ckpt", run, "--hf-out", exports[start], "--device", "cpu")
    from transformers import AutoModelForCausalLM

    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = {start: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(tokens).logits
                  for start, path in {**exports, "base": tiny / "hf"}.items()}
    assert (logits["imported"] - logits["hf"]).abs().max() <= LOGIT_ATOL
    assert (logits["hf"] - logits["base"]).abs().max() > 100 * LOGIT_ATOL  # trained weights, not a copy


# ---------------------------------------------------------------------------------------------
# round 2 from round 1


def test_round_2_starts_from_round_1_weights_with_a_fresh_optimizer_and_count(runs, tiny, scored):
    round_1 = runs["hf"]
    # lr 0: the one step of round 2 leaves the weights where they started; 12 rows = 1 step
    round_2 = train(tiny, scored, round_1, tiny / "round_2", "optimizer.lr=0.0", "optimizer.min_lr=0.0",
                    "train.global_batch_size=12")
    final_1 = dist_checkpoint(round_1 / "checkpoints" / "iter_0000003")
    after_2 = dist_checkpoint(round_2 / "checkpoints" / "iter_0000001")
    weights = [k for k in final_1 if not k.startswith("optimizer.")]
    assert len(weights) == 9 and all(torch.equal(after_2[k], final_1[k]) for k in weights)
    # Adam after its first step: m = (1-b1) g, v = (1-b2) g^2, so m^2/v = (1-b1)^2/(1-b2) = 10
    # exactly for every element; a carried-over optimizer (round 1's moments) breaks it.
    def moment_ratio(state):
        ratios = [state[k][state[k.replace("exp_avg.", "exp_avg_sq.")] > 0] ** 2
                  / state[k.replace("exp_avg.", "exp_avg_sq.")][state[k.replace("exp_avg.", "exp_avg_sq.")] > 0]
                  for k in state if k.startswith("optimizer.state.exp_avg.")]
        return torch.cat(ratios)

    assert torch.allclose(moment_ratio(after_2), torch.tensor(10.0), rtol=1e-4)
    assert not torch.allclose(moment_ratio(final_1), torch.tensor(10.0), rtol=1e-2)  # round 1 had 3 steps
    train_state = torch.load(round_2 / "checkpoints" / "iter_0000001" / "train_state.pt", weights_only=False)
    assert (int(train_state["step"]), int(train_state["consumed_train_samples"])) == (1, 12)
    ledger = [json.loads(line) for line in (round_2 / "samples_dp0.jsonl").read_text().splitlines()]
    assert {entry["iteration"] for entry in ledger} == {0}  # the step count before the step: 3 if carried over


def test_resume_from_base_continues_the_earlier_run_exactly(runs, tiny, scored):
    round_1 = runs["hf"]
    resumed = train(tiny, scored, f"{round_1}@1", tiny / "resumed", "resume_from_base=true")
    # the run resumed from round 1's iteration 1 (optimizer, data position): iterations 2 and 3
    # are round 1's own, loss for loss
    assert tensorboard_scalars(resumed, "topr_loss") == tensorboard_scalars(round_1, "topr_loss")[1:]
    # a base without training state is refused by the config check: tests/model/test_source.py


# ---------------------------------------------------------------------------------------------
# another layout on load


@pytest.mark.distributed
def test_a_tp1_checkpoint_loads_at_tp2(tiny, imported, scored_from_import, tmp_path):
    tp1 = scored_from_import
    tp2 = score(imported[0], tiny / "graded.jsonl", tmp_path / "tp2.jsonl", tp=2)
    assert len(tp1) == 24 and tp2 == pytest.approx(tp1, abs=LOGPROB_ATOL)


@pytest.mark.distributed
def test_a_pp2_checkpoint_loads_at_tp1(tiny, imported, scored, tmp_path):
    run = tmp_path / "pp2"
    run_distributed("nemo_topr_cli.py", 2, "train", "--config-name", "tiny_cpu", f"base_model={imported[0]}",
                    f"run_dir={run}", f"dataset.train_path={scored}", "model.pipeline_model_parallel_size=2",
                    "model.pipeline_dtype=fp32")
    assert "pipeline_model_parallel_size: 2" in (run / "checkpoints" / "iter_0000003" / "run_config.yaml").read_text()
    at_pp2 = score(run, tiny / "graded.jsonl", tmp_path / "pp2.jsonl", pp=2)
    at_tp1 = score(run, tiny / "graded.jsonl", tmp_path / "tp1.jsonl")
    assert len(at_tp1) == 24 and at_tp1 == pytest.approx(at_pp2, abs=LOGPROB_ATOL)
    base = {i: json.loads(line)["behavior_logprob"] for i, line in enumerate(scored.read_text().splitlines())}
    assert max(abs(at_tp1[i] - base[i]) for i in base) > 1.0  # the trained weights were loaded, not the base


# ---------------------------------------------------------------------------------------------
# bad Megatron inputs


def _broken_copy(imported: Path, tmp_path: Path, breaks) -> Path:
    copy = Path(shutil.copytree(imported, tmp_path / "copy"))
    breaks(copy)
    return copy


def _edit_config(path: Path, **changes) -> None:
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("breaks, message", [
    (lambda c: (c / "latest_checkpointed_iteration.txt").unlink(),
     r"unfinished or empty checkpoint: no .*latest_checkpointed_iteration.txt.*saved iterations: \[0\]"),
    (lambda c: (c / "iter_0000000" / "metadata.json").unlink(), r"unfinished save: .*iter_0000000 lacks metadata.json"),
    (lambda c: (c / "iter_0000000" / ".metadata").unlink(), r"unfinished save: .*iter_0000000 lacks \.metadata"),
    (lambda c: shutil.rmtree(c / "hf_artifacts"), r"no Hugging Face config with the checkpoint .*hf_artifacts/config.json"),
    (lambda c: (c / "hf_artifacts" / "tokenizer.json").unlink(), r"no tokenizer \(tokenizer.json or tokenizer.model"),
    (lambda c: _edit_config(c / "hf_artifacts" / "config.json", num_hidden_layers=3, intermediate_size=256),
     r"architecture mismatch .*num_layers: checkpoint 2, .*num_hidden_layers=3; ffn_hidden_size: checkpoint 172"),
    # int()'s ValueError traceback in export, score-logprobs and train
    (lambda c: (c / "latest_checkpointed_iteration.txt").write_text(""),
     r"latest_checkpointed_iteration.txt names no iteration \(''\), .*saved iterations: \[0\]: write the one"),
    (lambda c: (c / "latest_checkpointed_iteration.txt").write_text("release"),
     r"latest_checkpointed_iteration.txt names no iteration \('release'\)"),
], ids=["no_tracker", "no_metadata_json", "no_dcp_metadata", "no_hf_artifacts", "no_tokenizer", "other_architecture",
        "empty_tracker", "release_tracker"])
def test_a_broken_megatron_checkpoint_is_a_clear_error(imported, tmp_path, breaks, message):
    from nemo_topr.model.source import ModelSourceError, resolve

    copy = _broken_copy(imported[0], tmp_path, breaks)
    with pytest.raises(ModelSourceError, match=message):
        resolve(copy)


def test_a_missing_iteration_and_a_bad_base_model_fail_the_verbs(runs, imported, tmp_path, tiny):
    from nemo_topr.model.source import ModelSourceError, resolve

    with pytest.raises(ModelSourceError, match=r"no checkpoint .*iter_0000007; saved iterations: \[1, 2, 3\]"):
        resolve(f"{runs['hf']}@7")
    mismatched = _broken_copy(imported[0], tmp_path, lambda c: _edit_config(c / "hf_artifacts" / "config.json",
                                                                            hidden_size=128))
    proc = nemo_topr("train", "--config-name", "tiny_cpu", f"base_model={mismatched}", f"run_dir={tmp_path / 'r'}",
                     f"dataset.train_path={tiny / 'graded.jsonl'}", ok=False)
    assert proc.returncode != 0 and "architecture mismatch" in proc.stderr and "hidden_size: checkpoint 64" in proc.stderr
    proc = nemo_topr("export", "--ckpt", tiny / "hf", "--hf-out", tmp_path / "e", "--device", "cpu", ok=False)
    assert "already a Hugging Face directory; export reads Megatron checkpoints" in proc.stderr
    proc = nemo_topr("eval", "--model", imported[0], "--benchmark", "gsm8k", "--limit", "1", "--out", tmp_path / "r.json",
                     "--device", "cpu", ok=False)  # sampling is transformers / vLLM: HF weights only
    assert proc.returncode != 0 and f"export it once with `nemo-topr export --ckpt {imported[0]}" in proc.stderr


# ---------------------------------------------------------------------------------------------
# cluster pre-flight


def test_plan_shows_the_load_route_and_rejects_an_unfinished_checkpoint(imported, tiny, tmp_path, capsys):
    from nemo_topr.cli import main as cli_main
    from nemo_topr.model.source import ModelSourceError, load_route

    def main(argv):  # `nemo-topr plan ARGV`: nemo_topr.cli renders its refusals
        return cli_main(["plan", *argv])

    main(["llama31_8b_bf16", f"base_model={imported[0]}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"load       Megatron distributed checkpoint {imported[0]}, iteration 0")
    assert "weights only: fresh optimizer, iteration 0" in lines[1]
    assert lines[2].startswith(f"model      imported ({imported[0]}/hf_artifacts/config.json)")  # its own shape
    main(["llama31_8b_bf16", f"base_model={tiny / 'hf'}"])
    assert f"converted by AutoBridge at every start and requeue, on every rank; convert once with `nemo-topr " \
           f"import {tiny / 'hf'} OUT`" in capsys.readouterr().out
    unfinished = _broken_copy(imported[0], tmp_path, lambda c: (c / "latest_checkpointed_iteration.txt").unlink())
    assert main(["llama31_8b_bf16", f"base_model={unfinished}"]) == 1
    assert "unfinished or empty checkpoint" in capsys.readouterr().err
    # off the cluster the planner cannot see the checkpoint; a job's dry run must
    assert load_route({"base_model": str(tmp_path / "elsewhere")}, must_exist=False)[0] is None
    with pytest.raises(ModelSourceError, match="no such directory"):
        load_route({"base_model": str(tmp_path / "elsewhere")}, must_exist=True)
