"""The main job end to end on CPU: the demo (score mu -> TOPR on Bridge -> export -> transformers),
the HF round trip, and kill-and-resume with the data order, losses and final weights intact.

The kill-and-resume test kills at an iteration drawn from a new seed each run, printed and in
every assertion message; NEMO_TOPR_TEST_SEED=SEED replays a run."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests import forked
from tests.conftest import REPO, run_distributed, tensorboard_scalars
from nemo_topr.training.checkpoints import is_complete, iteration_dir_name, latest_iteration, saved_iterations

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """One real `make demo` run (python -m nemo_topr.demo), shared by the tests below."""
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "nemo_topr.demo", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "TOPR demo summary" in proc.stdout
    (out.parent / f"{out.name}.console").write_text(proc.stdout)  # beside the demo's own directory
    return out


def test_the_demo_ends_pointing_to_the_tour_and_its_tensorboard_logs(demo):
    """Its last lines named its outputs, and not what to do next."""
    last = (demo.parent / f"{demo.name}.console").read_text().splitlines()[-3:]
    assert any("README.md" in line and "tour" in line for line in last), last
    board = next(line for line in last if "tensorboard --logdir" in line).split("tensorboard --logdir ", 1)[1]
    assert Path(board) == demo / "run" / "tensorboard" and any(Path(board).iterdir())


def test_the_checkpoint_size_estimate_is_just_short_of_a_saved_iteration(demo):
    """`train` refuses a run directory that cannot hold one checkpoint, estimated before the
    first save: an estimate above the real size would refuse a start that could run."""
    from nemo_topr.training import disk_space

    estimate = disk_space.estimated_checkpoint_bytes(disk_space.parameter_count(demo / "tiny_llama_hf"), 4, True)
    measured, how = disk_space.checkpoint_bytes(demo / "run" / "checkpoints", estimate)
    assert how.startswith("the size of iteration") and estimate <= measured <= 1.1 * estimate, (estimate, measured)


def test_demo_moves_positives_up_and_negatives_down(demo):
    summary = json.loads((demo / "summary.json").read_text())
    positive, negative = summary["positive_logprob_per_token"], summary["negative_logprob_per_token"]
    # measured with plain transformers on the exported model vs the starting model
    assert positive["after"] > positive["before"]
    assert negative["after"] < negative["before"]
    # "before" computed another way: log mu of the scored data is the starting model's log pi
    # through Megatron (score-logprobs), summed over completion + EOS tokens
    from nemo_topr.data.records import is_positive
    from nemo_topr.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(demo / "tiny_llama_hf")
    per_token = {True: [], False: []}
    for line in (demo / "data" / "scored.jsonl").read_text().splitlines():
        record = json.loads(line)
        tokens = len(tokenizer(record["completion"], add_special_tokens=False)["input_ids"]) + 1
        per_token[is_positive(record["reward"])].append(record["behavior_logprob"] / tokens)
    assert positive["before"] == pytest.approx(sum(per_token[True]) / len(per_token[True]), rel=1e-5)
    assert negative["before"] == pytest.approx(sum(per_token[False]) / len(per_token[False]), rel=1e-5)
    report = json.loads((demo / "run" / "data_report.json").read_text())
    assert report["records_in"] == report["records_used"] == 144 and report["records_dropped"] == 0


def test_the_console_shows_every_iterations_loss_as_tensorboard_has_it(demo):
    """Bridge's own line prints a loss only when it is at least 0; the console's line per interval
    (nemo_topr.training.iteration_line) shows every one, negative or not. Each iteration
    (log_interval 1) shows exactly one value, and it is the value Bridge wrote to TensorBoard."""
    log = (demo / "train.log").read_text()
    shown = [(int(i), float(v)) for i, v in re.findall(r"\[nemo-topr\] iteration (\d+)/\d+ \| loss (\S+) \|", log)]
    board = dict(tensorboard_scalars(demo / "run", "topr_loss"))
    assert [i for i, _ in shown] == sorted(board) == list(range(1, len(board) + 1))
    assert any(value < 0 for _, value in shown) and any(value >= 0 for _, value in shown)
    for iteration, value in shown:
        assert value == pytest.approx(board[iteration], rel=1e-6, abs=1e-12), iteration


def test_rho_is_one_at_step_zero_when_mu_comes_from_the_starting_model(demo):
    # scoring (forward-only pass) and training (Bridge step) are separate code paths and
    # processes; at iteration 1 the policy is still the starting model, so log rho = 0.
    (step, first_max), *_ = tensorboard_scalars(demo / "run", "log_ratio_abs_max")
    assert step == 1 and first_max < 1e-4
    later = [value for _, value in tensorboard_scalars(demo / "run", "log_ratio_abs_max")[1:]]
    assert max(later) > 0.1  # and it moves once training does


def test_every_sample_trained_once_per_epoch(demo):
    ledger = [json.loads(line) for line in (demo / "run" / "samples_dp0.jsonl").read_text().splitlines()]
    counts = Counter(sample for entry in ledger for sample in entry["sample_ids"])
    assert set(counts) == set(range(144)) and set(counts.values()) == {3}  # 3 epochs


@pytest.mark.distributed
def test_hf_export_logits_match_the_megatron_checkpoint(demo, tmp_path):
    out = tmp_path / "roundtrip.json"
    run_distributed("hf_roundtrip.py", 1, str(demo / "run"), str(demo / "hf_export"), str(out))
    result = json.loads(out.read_text())
    assert result["max_abs_diff"] <= 1e-5, result
    exported = _safetensors(demo / "hf_export")
    original = _safetensors(demo / "tiny_llama_hf")
    assert exported.keys() == original.keys()
    assert any(not torch.equal(exported[k], original[k]) for k in exported)  # trained weights, not a copy


def _safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}


# The kill-and-resume test compares two processes bit for bit. Multi-threaded CPU kernels are not
# bitwise reproducible run to run: two resumed processes started from the same (bit-identical)
# checkpoint differed by up to 3.4e-7 three steps later in one fresh-clone `make test`. One thread
# per training process takes that out, so what is compared is the resume alone.
SINGLE_THREADED = {**os.environ, "OMP_NUM_THREADS": "1"}


def _train_command(demo: Path, run_dir: Path) -> list[str]:
    return ["-m", "nemo_topr.cli", "train", "--config-name", "tiny_cpu",
            f"hf_model={demo / 'tiny_llama_hf'}", f"dataset.train_path={demo / 'data' / 'scored.jsonl'}",
            f"run_dir={run_dir}", "dataset.epochs=1", "checkpoint.save_interval=3"]


def _train(demo: Path, run_dir: Path) -> None:
    proc = forked.run(_train_command(demo, run_dir), env=SINGLE_THREADED)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples_dp0.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference_dir(demo, tmp_path_factory) -> Path:
    """One uninterrupted epoch with checkpoints every 3 iterations."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    _train(demo, run_dir)
    return run_dir


def kill_seed() -> str:
    """NEMO_TOPR_TEST_SEED when set (a replay), else a new seed each run."""
    return os.environ.get("NEMO_TOPR_TEST_SEED") or str(time.time_ns())


def kill_iteration(seed: str) -> int:
    """An iteration after the first checkpoint (every 3 iterations), well before the end of the
    one-epoch run (18 iterations)."""
    return random.Random(seed).randint(4, 10)


def test_kill_iteration_varies_with_the_seed_and_replays_from_it():
    draws = {kill_iteration(str(seed)) for seed in range(200)}
    assert draws == set(range(4, 11))  # every allowed iteration gets drawn, not always one
    assert kill_iteration("1234") == kill_iteration("1234")  # a printed seed replays its run


def test_killed_run_resumes_with_exactly_the_remaining_samples_and_weights(demo, reference_dir, tmp_path,
                                                                           megatron_world):
    killed_dir = tmp_path / "killed"

    # SIGKILL at a random iteration after the first checkpoint (checkpoints every 3 iterations),
    # possibly in the middle of writing a later one
    seed = kill_seed()
    kill_after = kill_iteration(seed)
    replay = f"killed after iteration {kill_after} (seed {seed}; replay: NEMO_TOPR_TEST_SEED={seed})"
    print(replay)
    proc = forked.start(_train_command(demo, killed_dir), tmp_path / "killed.out", env=SINGLE_THREADED)
    ledger = killed_dir / "samples_dp0.jsonl"
    deadline = time.time() + 600
    while _last_iteration(ledger) < kill_after:
        assert proc.exitcode is None and time.time() < deadline, replay
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and the checkpoint writer it started: its session
    proc.join()
    checkpoints = killed_dir / "checkpoints"
    checkpoint_iteration = max(it for it in saved_iterations(checkpoints)  # what the resume starts from
                               if is_complete(checkpoints / iteration_dir_name(it)))
    assert checkpoint_iteration % 3 == 0 and 3 <= checkpoint_iteration <= kill_after, replay
    assert _last_iteration(ledger) >= checkpoint_iteration, replay  # the ledger holds iterations to redo
    _train(demo, killed_dir)
    # Iterations the killed run reached after its checkpoint are redone (the model state was
    # lost with them) and the ledger drops their first attempt: it equals the uninterrupted run's.
    stitched = _ledger(killed_dir)
    assert stitched == _ledger(reference_dir), replay
    trained = [sample for entry in stitched for sample in entry["sample_ids"]]
    assert sorted(trained) == list(range(144)), replay  # one epoch: every sample exactly once
    # Same per-step losses as the uninterrupted run, bit for bit (CPU, no dropout). Per step, the
    # value logged last wins: the resumed run re-logs the steps after its checkpoint, and TensorBoard
    # drops the killed run's orphaned steps only when the resumed run logs a *smaller* step than the
    # killed run's last (when the kill landed right after the killed run logged step k+1, both files
    # hold step k+1).
    reference_losses = tensorboard_scalars(reference_dir, "topr_loss")
    assert len({step for step, _ in reference_losses}) == len(reference_losses)
    assert dict(tensorboard_scalars(killed_dir, "topr_loss")) == dict(reference_losses), replay
    # And the same final model: every tensor of the last checkpoint (weights and Adam moments),
    # bit for bit.
    (resumed_iteration, resumed), (reference_iteration, reference) = map(_final_checkpoint, (killed_dir, reference_dir))
    assert resumed_iteration == reference_iteration and resumed.keys() == reference.keys(), replay
    assert {"output_layer.weight", "optimizer.state.exp_avg.output_layer.weight"} <= reference.keys()
    differing = [key for key in reference if not torch.equal(resumed[key], reference[key])]
    assert differing == [], replay


def test_a_finished_run_run_again_trains_nothing_and_leaves_its_files_as_they_were(demo, reference_dir, tmp_path):
    """The command again after the run finished: it stopped every rank with Bridge's "no samples
    left to consume" traceback (bridge/data/samplers.py), after loading the model. Here with
    checkpoint.save_interval=4 (a resume may change it), so that a start that got past the sampler
    would also meet Bridge's final save (bridge/training/train.py), which writes a last iteration
    that is no multiple of the interval, 18, again: the files must stay as they were, the configs of
    the starts that trained included (it wrote configs/start_002.yaml and replaced config.yaml)."""
    run_dir = shutil.copytree(reference_dir, tmp_path / "run")  # copy2 keeps the modification times
    last = latest_iteration(run_dir / "checkpoints")
    assert last % 4 != 0

    def files() -> dict[str, tuple[int, bytes]]:
        # config.yaml and configs/ describe the starts that trained (docs/training.md)
        kept = [*(run_dir / "checkpoints").rglob("*"), *run_dir.glob("samples_dp*.jsonl"), run_dir / "config.yaml",
                *(run_dir / "configs").rglob("*")]
        return {str(path): (path.stat().st_mtime_ns, path.read_bytes()) for path in kept if path.is_file()}

    before, losses = files(), tensorboard_scalars(run_dir, "topr_loss")
    proc = forked.run([*_train_command(demo, run_dir), "checkpoint.save_interval=4"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"[nemo-topr] {run_dir} is finished (iteration {last} of {last}): nothing to train" in proc.stdout
    assert files() == before and tensorboard_scalars(run_dir, "topr_loss") == losses
    assert (run_dir / "COMPLETED").read_text() == f"{last}\n"


def _final_checkpoint(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """(iteration, every tensor) of a run's latest checkpoint, read by Megatron's own loader."""
    from megatron.core import dist_checkpointing

    from nemo_topr.model.source import resolve

    state = dist_checkpointing.load_plain_tensors(str(resolve(run_dir).checkpoint))
    return state["iteration"], {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}


def _last_iteration(ledger: Path) -> int:
    """Last iteration in a ledger being written (-1 if none yet, or if its last line is partial)."""
    try:
        return json.loads(ledger.read_text().splitlines()[-1])["iteration"]
    except (FileNotFoundError, IndexError, json.JSONDecodeError):
        return -1


def _ids_by_iteration(ledger: list[dict]) -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {}
    for entry in ledger:
        ids.setdefault(entry["iteration"], []).extend(entry["sample_ids"])
    return ids


def test_export_of_several_iterations_in_one_process(reference_dir, tmp_path):
    from nemo_topr.training.checkpoints import saved_iterations

    iterations = saved_iterations(reference_dir / "checkpoints")
    last = int((reference_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert iterations[:2] == [3, 6] and iterations[-1] == last
    every, latest = tmp_path / "every", tmp_path / "latest"
    cli = ["-m", "nemo_topr.cli", "export", "--ckpt", str(reference_dir), "--device", "cpu"]
    for extra, exported in ((["--hf-out", str(every), "--all-iterations"], len(iterations)),
                            (["--hf-out", str(latest)], 1)):
        proc = forked.run(cli + extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # export's own progress lines alone: none of torch's and Megatron's notes on reading a
        # checkpoint in one process (nemo_topr/model/quiet.py)
        assert all(line.startswith("[export] ") for line in proc.stderr.splitlines()), proc.stderr
        assert proc.stderr.splitlines()[-1].startswith(f"[export] {exported}/{exported} checkpoints (100.0%)")
    assert sorted(p.name for p in every.iterdir()) == [f"iter_{i:07d}" for i in iterations]
    weights = {i: _safetensors(every / f"iter_{i:07d}") for i in iterations}
    # the last iteration exported among many = the single export of the latest checkpoint (another
    # process, another code path through the CLI), bit for bit; earlier iterations differ from it
    reference = _safetensors(latest)
    assert weights[last].keys() == reference.keys()
    assert all(torch.equal(weights[last][k], reference[k]) for k in reference)
    assert all(any(not torch.equal(weights[i][k], reference[k]) for k in reference) for i in iterations[:-1])
    assert (every / f"iter_{last:07d}" / "tokenizer.json").is_file()

    proc = forked.run(cli + ["--hf-out", str(tmp_path / "x"), "--iteration", "4"])
    assert proc.returncode != 0 and "iter_0000004" in proc.stderr and f"saved iterations: {iterations}" in proc.stderr


def test_a_run_whose_loss_turns_non_finite_stops_naming_the_iteration_and_its_samples(demo, tmp_path):
    """Issue 29: a NaN loss trained to COMPLETED. lr=1e30 makes Adam's first update (about lr per
    weight) overflow float32, so a later iteration's loss or gradient norm is NaN or infinite."""
    run_dir = tmp_path / "run"
    proc = forked.run([*_train_command(demo, run_dir), "optimizer.lr=1e30", "optimizer.min_lr=1e30",
                       "checkpoint.save_interval=1"], env=SINGLE_THREADED)
    last = proc.stderr.strip().splitlines()[-1]
    stopped = re.match(r"nemo-topr train: iteration (\d+): (loss|gradient norm) \S+ .*is not finite.*\[([\d, ]+)\]",
                       last)
    assert proc.returncode == 1 and stopped, proc.stdout[-2000:] + proc.stderr[-3000:]
    iteration = int(stopped[1])
    named = [int(sample) for sample in stopped[3].split(", ")]
    ledger = _ledger(run_dir)
    assert named == [s for entry in ledger if entry["iteration"] == iteration - 1 for s in entry["sample_ids"]]
    saved = saved_iterations(run_dir / "checkpoints")
    assert saved == list(range(1, iteration)) and not (run_dir / "COMPLETED").exists()


def test_a_run_with_warnings_shows_them_again_at_its_end_on_a_short_console(demo, tmp_path):
    """behavior_logprob raised by 2 nats on every record, as a sampler's own log-probs at another
    temperature move it: at iteration 1 log rho = -2 for every sequence (|log rho| < 1e-4
    unmoved), so the mean |log rho| is 2 and each negative starts at weight exp(-2) = 0.135, not
    1. The run warns once and trains on; the demo's run, whose mu was scored from its starting
    model, does not warn. One record too long for seq_length 512 is dropped (dataset.too_long=drop)
    and warned of. Issue 95: ~300 lines came before the first iteration (Bridge's config dump,
    Gloo's lines), warnings among them; the console now holds at most 25 lines before it, none over
    160 characters, repeats both warnings at its end, and RUN_DIR/logs/ keeps what Bridge printed."""
    scored = (demo / "data" / "scored.jsonl").read_text().splitlines()
    moved = tmp_path / "moved.jsonl"
    rows = [{**row, "behavior_logprob": row["behavior_logprob"] + 2.0} for row in map(json.loads, scored)]
    rows.append({**rows[0], "completion": rows[0]["completion"] * 60, "sample_id": 10_000})  # > 512 tokens
    moved.write_text("".join(json.dumps(row) + "\n" for row in rows))
    command = [arg if not arg.startswith("dataset.train_path=") else f"dataset.train_path={moved}"
               for arg in _train_command(demo, tmp_path / "run")]
    # a fresh interpreter: the console from its first line, start-up included
    proc = subprocess.run([sys.executable, *command, "dataset.too_long=drop"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    console = proc.stdout.splitlines()
    first_iteration = next(n for n, line in enumerate(console) if line.startswith("[nemo-topr] iteration 1/"))
    assert first_iteration <= 25 and max(map(len, console)) <= 160, proc.stdout
    assert sum(line.startswith("[nemo-topr] iteration ") for line in console) == 18  # one epoch of the demo's data
    warnings = [line for line in console if "WARNING: " in line]
    assert warnings[0].startswith(f"[nemo-topr] WARNING: dropped 1 of {len(rows)} records (too_long: 1)"), warnings
    assert warnings[1].startswith(
        "[nemo-topr] WARNING: iteration 1: mean |log rho| = 2.000, negatives' mean weight 0.135 "), warnings
    summary = console[next(n for n, line in enumerate(console) if line.startswith("[nemo-topr] summary: "))]
    end = console[console.index(summary):]
    assert summary == "[nemo-topr] summary: trained iterations 1-18 of 18 (the run is complete)", end
    assert f"[nemo-topr]   checkpoint: {tmp_path / 'run' / 'checkpoints' / 'iter_0000018'}" in end
    assert [line for line in end if "WARNING: " in line] == [line.replace("] WARNING", "]   WARNING", 1)
                                                              for line in warnings[:2]], end
    assert "mean |log rho|" not in (demo / "train.log").read_text()
    (log,) = (tmp_path / "run" / "logs").iterdir()
    assert f"[nemo-topr]   full log: {log}" in end
    kept = log.read_text()
    assert "[model] Non-default values (vs Mcore TransformerConfig):" in kept  # Bridge's config dump
    assert "[Gloo] Rank 0 is connected to" in kept and "iteration       18/      18 |" in kept
    assert "[Gloo]" not in proc.stdout and "Non-default values" not in proc.stdout
    # a plain process (no launcher) on CPU: none of Megatron's rank fallbacks, Bridge's notes on
    # finetune() and its tokenizer call, or torch's pin_memory note (nemo_topr/model/quiet.py)
    assert proc.stderr == "", proc.stderr


@pytest.mark.slow
def test_ctrl_c_and_the_exit_signal_stop_at_a_checkpoint_without_a_traceback(demo, tmp_path):
    """Issue 29: Ctrl-C printed a KeyboardInterrupt traceback and saved nothing; a clean stop by
    the exit signal printed Bridge's "Pretrain failed ... SystemExit: 0" with a traceback. Both now
    save at the next iteration boundary, exit 75 and print no traceback; the second start resumes
    from the first one's checkpoint. The signals go to the whole process group, as a terminal's
    Ctrl-C or Slurm's signal to a step do: the second start has saved before (iteration 3), so
    Megatron's checkpoint-writer process exists and must survive the signal."""
    run_dir = tmp_path / "run"
    ledger = run_dir / "samples_dp0.jsonl"
    stopped_at = 0
    for stop_signal in (signal.SIGINT, signal.SIGTERM):  # a terminal's Ctrl-C, then the default exit signal
        console = tmp_path / f"{stop_signal.name}.out"
        proc = forked.start(_train_command(demo, run_dir), console, env=SINGLE_THREADED)
        try:
            deadline = time.time() + 600
            while _last_iteration(ledger) <= stopped_at:  # this start is training
                assert proc.exitcode is None and time.time() < deadline, console.read_text()[-3000:]
                time.sleep(0.02)
            os.killpg(proc.pid, stop_signal)
            proc.join(300)
        finally:
            if proc.exitcode is None:
                os.killpg(proc.pid, signal.SIGKILL)
        output = console.read_text()
        assert proc.exitcode == 75, output[-3000:]
        for noise in ("Traceback", "Pretrain failed", "KeyboardInterrupt", "SystemExit"):
            assert noise not in output, output[-3000:]
        assert ("Ctrl-C: saving a checkpoint" in output) == (stop_signal == signal.SIGINT)
        # what stopped it, in the summary (Bridge's "Received signal 15 ... after receiving SIGTERM" is in the log)
        said = "Ctrl-C" if stop_signal == signal.SIGINT else "SIGTERM"
        assert f"; stopped by {said} with a checkpoint saved: rerun the same command" in output, output[-3000:]
        saved = int((run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
        assert saved > stopped_at and f"stopped at iteration {saved} of" in (run_dir / "STOPPED").read_text()
        stopped_at = saved
