"""The run directory's own records of its starts (`nemo_topr.training.run_state`): the lock, the
resume fingerprint, the config of each start, the sample ledger after a resume."""

import json
import os
import socket
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from nemo_topr.data.packing import TokenizedSequence
from nemo_topr.data.sequence_table import SequenceTable, rows_digest
from nemo_topr.training.run_state import (
    RunLock,
    RunStateError,
    check_resume,
    data_as_recorded,
    data_fingerprint,
    first_data_fingerprint,
    resume_settings,
    save_start_config,
    truncate_ledgers,
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_training_is_refused_with_the_first_ones_host_and_pid(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "LOCK").write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid}))
        with pytest.raises(RunStateError) as refused:
            RunLock(tmp_path).acquire()
        assert refused.value.key == "run_dir.lock.held"
        assert json.loads((tmp_path / "LOCK").read_text())["pid"] == holder.pid  # the holder's lock stays
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_dead_process_is_taken_over_and_released(tmp_path):
    dead = _dead_pid()
    (tmp_path / "LOCK").write_text(json.dumps({"host": socket.gethostname(), "pid": dead}))
    lock = RunLock(tmp_path)
    assert f"process {dead}" in lock.acquire()
    assert json.loads((tmp_path / "LOCK").read_text()) == {"host": socket.gethostname(), "pid": os.getpid()}
    lock.release()
    assert not (tmp_path / "LOCK").exists()


def test_a_released_lock_removes_the_folders_it_made_while_nothing_was_written_in_them(tmp_path):
    lock = RunLock(tmp_path / "runs" / "a")
    lock.acquire()
    assert (tmp_path / "runs" / "a" / "LOCK").is_file()
    lock.release()
    assert list(tmp_path.iterdir()) == []  # the run directory and its parent, both made by acquire
    lock = RunLock(tmp_path / "runs" / "b")
    lock.acquire()
    (tmp_path / "runs" / "b" / "config.yaml").write_text("written by the run\n")
    lock.release()
    assert [p.name for p in (tmp_path / "runs" / "b").iterdir()] == ["config.yaml"]
    (tmp_path / "made_by_the_user").mkdir()
    lock = RunLock(tmp_path / "made_by_the_user")
    lock.acquire()
    lock.release()
    assert (tmp_path / "made_by_the_user").is_dir() and not any((tmp_path / "made_by_the_user").iterdir())


def _sequences(rewards, tokens=(5, 6, 7), mask=(0, 1, 1)):
    return [TokenizedSequence(input_ids=list(tokens), loss_mask=list(mask), reward=r, behavior_logprob=-2.0,
                              prompt_id=0, sample_id=i) for i, r in enumerate(rewards)]


def _fingerprint(rows, rewards, **sequence):
    return data_fingerprint(SequenceTable.from_sequences(_sequences(rewards, **sequence)).digest(), rows_digest(rows))


@pytest.mark.guards_resume
def test_fingerprint_changes_with_any_record_or_the_row_order():
    base = _fingerprint([[0], [1]], [1.0, -1.0])
    assert base == _fingerprint([[0], [1]], [1.0, -1.0])
    assert base != _fingerprint([[0], [1]], [1.0, 1.0])  # a reward
    assert base != _fingerprint([[1], [0]], [1.0, -1.0])  # the order
    assert base != _fingerprint([[0, 1]], [1.0, -1.0])  # the packing
    assert base != _fingerprint([[0], []], [1.0])  # a record fewer
    assert base != _fingerprint([[0], [1]], [1.0, -1.0], tokens=(5, 6, 8))  # a token
    assert base != _fingerprint([[0], [1]], [1.0, -1.0], mask=(0, 0, 1))  # the prompt's length


def test_a_run_recorded_with_the_first_data_hash_resumes_and_other_data_is_still_refused(tmp_path):
    sequences, rows = _sequences([1.0, -1.0]), [[0], [1]]
    first = first_data_fingerprint(sequences, rows)
    now = _fingerprint(rows, [1.0, -1.0])
    (tmp_path / "fingerprint.json").write_text(json.dumps({"data": first, "config": {}}))
    assert data_as_recorded(tmp_path, now, lambda: first_data_fingerprint(sequences, rows)) == first
    other = _sequences([1.0, 1.0])
    assert data_as_recorded(tmp_path, now, lambda: first_data_fingerprint(other, rows)) == now
    with pytest.raises(RunStateError) as refused:
        check_resume(tmp_path, resuming=True, fingerprint={"data": now, "config": {}})
    assert refused.value.key == "run_dir.data_or_settings_changed"


@pytest.mark.guards_resume
def test_a_resume_onto_other_data_or_schedule_is_refused_naming_what_changed(tmp_path):
    recorded = {"data": "aaa", "config": {"optimizer.lr": 1e-4, "dataset.epochs": 1}}
    check_resume(tmp_path, resuming=False, fingerprint=recorded)
    check_resume(tmp_path, resuming=True, fingerprint=recorded)  # the same run resumes
    changed = {"data": "bbb", "config": {"optimizer.lr": 2e-4, "dataset.epochs": 1}}
    with pytest.raises(RunStateError) as refused:
        check_resume(tmp_path, resuming=True, fingerprint=changed)
    message = str(refused.value)
    assert "the training data" in message and "optimizer.lr: 0.0001 -> 0.0002" in message
    assert "dataset.epochs" not in message and "resume_from_base=true" in message and "run_dir" in message
    # a fresh start (no checkpoint) of the run directory records the new fingerprint
    check_resume(tmp_path, resuming=False, fingerprint=changed)
    check_resume(tmp_path, resuming=True, fingerprint=changed)


@pytest.mark.parametrize("override, change", [
    ("optimizer.adam_beta2=0.5", "optimizer.adam_beta2: None -> 0.5"),
    ("optimizer.adam_eps=1e-5", "optimizer.adam_eps: None -> 1e-05"),
    ("optimizer.weight_decay=0.1", "optimizer.weight_decay: 0.0 -> 0.1"),
])
def test_a_resume_with_other_optimizer_settings_is_refused_since_the_saved_state_keeps_its_own(
        tmp_path, override, change):
    """torch restores Adam's betas and eps with the optimizer state: a resume with
    optimizer.adam_beta2=0.5 would train bit for bit as before, while config.yaml said 0.5. Megatron's
    scheduler checks the weight decay against the checkpoint's (a traceback after the queue)."""
    import types

    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.config import compose

    base_model = types.SimpleNamespace(checkpoint=None, path="/models/a")

    def fingerprint(*overrides):
        return {"data": "aaa", "config": resume_settings(compose("tiny_cpu", list(overrides)), ObjectiveConfig(),
                                                         base_model)}

    check_resume(tmp_path, resuming=False, fingerprint=fingerprint())
    check_resume(tmp_path, resuming=True, fingerprint=fingerprint())
    with pytest.raises(RunStateError) as refused:
        check_resume(tmp_path, resuming=True, fingerprint=fingerprint(override))
    assert f"Changed: {change}. Either restore them" in str(refused.value)
    # what an unset key means, written out on a resume (or dropped from one), is no change: it was
    # refused as "optimizer.adam_beta2: None -> 0.999"
    check_resume(tmp_path, resuming=True, fingerprint=fingerprint("optimizer.adam_beta2=0.999",
                                                                  "optimizer.adam_eps=1e-8"))
    check_resume(tmp_path, resuming=False, fingerprint=fingerprint("optimizer.adam_beta1=0.9"))
    check_resume(tmp_path, resuming=True, fingerprint=fingerprint())


def test_a_setting_the_record_lacks_is_not_compared(tmp_path):
    """A run directory recorded before a key was: its resume is not refused for that key."""
    check_resume(tmp_path, resuming=False, fingerprint={"data": "aaa", "config": {"optimizer.lr": 1e-4}})
    check_resume(tmp_path, resuming=True,
                 fingerprint={"data": "aaa", "config": {"optimizer.lr": 1e-4, "objective.baseline": 0.5}})


def test_each_accepted_start_keeps_its_config(tmp_path):
    save_start_config(tmp_path, OmegaConf.create({"optimizer": {"lr": 1}}))
    save_start_config(tmp_path, OmegaConf.create({"optimizer": {"lr": 2}}))
    assert [OmegaConf.load(p).optimizer.lr for p in sorted((tmp_path / "configs").iterdir())] == [1, 2]
    assert OmegaConf.load(tmp_path / "config.yaml").optimizer.lr == 2


@pytest.mark.guards_sample_ledger
def test_ledger_keeps_only_the_iterations_before_the_checkpoint(tmp_path):
    lines = [json.dumps({"iteration": it, "sample_ids": [it]}) + "\n" for it in (0, 0, 1, 2, 3, 3, 4)]
    (tmp_path / "samples_dp0.jsonl").write_text("".join(lines) + '{"iteration": 5, "sam')  # killed mid-line
    (tmp_path / "samples_dp1.jsonl").write_text("".join(lines))
    assert truncate_ledgers(tmp_path, 3) == 4 + 3
    assert (tmp_path / "samples_dp0.jsonl").read_text() == "".join(lines[:4])
    assert (tmp_path / "samples_dp1.jsonl").read_text() == "".join(lines[:4])
    assert truncate_ledgers(tmp_path, 0) == 8 and (tmp_path / "samples_dp0.jsonl").read_text() == ""
