"""Training's run-time refusals (after its config is valid) and the doctor's, as a table: one row per problem,
its bad input → the problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
compared here (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/training/test_refusals_run.py``
rewrites this table's section). Every key of `SOURCES` has a row but the `NEEDS_MEGATRON` ones: a new refusal
without one fails `test_the_table_covers_every_key_the_code_raises`.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from tests.conftest import REPO, checkout_env
from omegaconf import OmegaConf
from tests.refusal_table import assert_covers, assert_golden, raised, rendered

from nemo_topr.doctor import command as doctor
from nemo_topr.errors import UserError
from nemo_topr.objective import ObjectiveConfig, baseline_for_share, effective_positive_share, policy_loss
from nemo_topr.training import disk_space, recipe
from nemo_topr.training.checkpoints import ensure_latest_complete
from nemo_topr.training.nonfinite import check_finite
from nemo_topr.training.host_memory import check_cpu_attention
from nemo_topr.training.run_state import RunLock, check_queued_start, check_resume, check_resume_from_base
from nemo_topr.training.step import check_batch, thd_cu_seqlens
from nemo_topr.utils import distributed

SOURCES = [REPO / "nemo_topr" / path for path in (
    "objective.py", "training/run_state.py", "training/step.py", "training/recipe.py", "training/flex_attention.py",
    "training/host_memory.py", "training/disk_space.py", "utils/distributed.py", "doctor/command.py",
    "training/checkpoints.py", "training/nonfinite.py", "training/prepare.py")]
ERRORS = {"ObjectiveError", "BatchError", "RunStateError", "ConfigError", "NoRoomError", "FlexAttentionError",
          "RendezvousError", "OutputError", "DamagedCheckpointError", "NonFiniteTrainingError"}
# keys the table cannot reach without Megatron, and what needs it
NEEDS_MEGATRON = {
    "dataset.no_advantage": "recipe.prepare, on a TrainingRun that build_training_run makes with Bridge",
    "run_dir.no_room_after_failure": "a save that failed inside Bridge's finetune()",
    "model.position_embedding_type.not_for_shared_prefix": "step.rotary_at_position_ids reads a Megatron model",
    "batch.cu_seqlens.missing": "step.packed_seq_params imports Megatron's PackedSeqParams first",
    "model.flex_attention.unsupported_setting": "nemo_topr.training.flex_attention imports Megatron",
    "flex_attention.attention_mask.not_a_block_mask": "nemo_topr.training.flex_attention imports Megatron",
    "flex_attention.inputs.thd_or_bias": "nemo_topr.training.flex_attention imports Megatron",
    "model.attention_backend.local_under_flex": "nemo_topr.training.flex_attention imports Megatron "
                                                "(tests/data/test_shared_prefix.py reaches it)"}
# the verb a user meets a refusal through, where it is not `train`
VERBS = {"--json.is_work_dir": "doctor", "--json.holds_work_dir": "doctor", "--json.inside_work_dir": "doctor",
         "--work-dir.unusable": "doctor", "doctor.several_problems": "doctor", "run_dir.checkpoints.damaged": "submit",
         "run_dir.finished": "submit"}
BASE = SimpleNamespace(checkpoint=Path("base/checkpoints/iter_0000004"), iteration=4,
                       describe=lambda: "nemo-topr run base, iteration 4")
NO_FINGERPRINT = SimpleNamespace(checkpoint=Path("unrecorded/checkpoints/iter_0000004"), iteration=4,
                                 describe=lambda: "nemo-topr run unrecorded, iteration 4")


def make_inputs(root: Path) -> None:
    """The run directories and files the rows name, relative to `root` (the rows run there)."""
    (root / "notes.txt").write_text("not a directory\n")
    for name, holder in (("held", {"host": "node-elsewhere", "pid": 1}), ("garbled", None)):
        (root / name).mkdir()
        (root / name / "LOCK").write_text("{" if holder is None else json.dumps(holder))
    for name, config in (("base", {"optimizer.lr": 1e-4}), ("resumed", {"optimizer.lr": 1e-4}),
                         ("moved", {"base_model": "/models/a"})):
        (root / name).mkdir()
        (root / name / "fingerprint.json").write_text(json.dumps({"data": "aaa", "config": config}))
    for name, tracker in (("damaged", "release"), ("finished", "5")):
        (root / name / "checkpoints").mkdir(parents=True)
        (root / name / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(tracker)
    (root / "finished" / "COMPLETED").write_text("")
    cut_short_checkpoint(root / "cut_short" / "checkpoints", 2)


def cut_short_checkpoint(root: Path, iteration: int) -> None:
    """A torch_dist checkpoint (as Megatron writes it, with Bridge's train state and run config) at
    `iteration`, the latest, whose data file lost all but its first 100 bytes after the save."""
    from torch.distributed.checkpoint import save

    path = root / f"iter_{iteration:07d}"
    save({"weight": torch.arange(4096, dtype=torch.float32)}, checkpoint_id=str(path), no_dist=True)
    torch.save({"step": iteration}, path / "train_state.pt")
    (path / "run_config.yaml").write_text("model: {tensor_model_parallel_size: 1, pipeline_model_parallel_size: 1}\n"
                                          "checkpoint: {save_rng: true, save_optim: true, fully_parallel_save: false}\n")
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    for shard in path.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])


def patched(check: Callable[..., object], *args: object, patches: dict[tuple[object, str], object]
            ) -> Callable[[], list[UserError]]:
    """`raised(check, *args)` with each (owner, attribute) of `patches` replaced: what this host would
    otherwise put into the message (its name, its GPUs, its free space)."""
    def problem() -> list[UserError]:
        with ExitStack() as stack:
            for (owner, attribute), value in patches.items():
                stack.enter_context(mock.patch.object(owner, attribute, value))
            return raised(check, *args)()
    return problem


def losses(**changes: object) -> Callable[[], list[UserError]]:
    """`policy_loss` of two sequences of three tokens that passes, but for `changes`."""
    inputs = dict(token_logprobs=torch.full((2, 3), -1.0), loss_mask=torch.ones(2, 3),
                  behavior_logprobs=torch.tensor([-3.0, -3.0]), rewards=torch.tensor([1.0, -1.0]),
                  config=ObjectiveConfig(), baseline=None)
    return raised(lambda: policy_loss(**(inputs | changes)))


def batch(**changes: object) -> dict[str, torch.Tensor]:
    """A collated host batch of three scored records that `check_batch` passes, but for `changes`."""
    nan = torch.full((3,), math.nan, dtype=torch.float64)
    return {"rewards": torch.tensor([1.0, -1.0, 1.0]), "sample_ids": torch.tensor([0, 1, 2]),
            "behavior_logprobs": torch.full((3,), -5.0, dtype=torch.float64), "baselines": nan,
            "group_mean_rewards": nan, "seq_len": torch.tensor([4, 5, 6])} | changes


def objective(**fields: object) -> Callable[[], list[UserError]]:
    return raised(ObjectiveConfig, **fields)


GAI_ERROR = socket.gaierror(-2, "Name or service not known")
HOST = (socket, "gethostname")

# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("objective.variant.not_a_choice", "objective.variant", objective(variant="bogus")),
    ("objective.ratio_level.not_a_choice", "objective.ratio_level", objective(ratio_level="bogus")),
    ("objective.normalization.not_a_choice", "objective.normalization", objective(normalization="bogus")),
    ("objective.negative_rule.not_a_choice", "objective.negative_rule", objective(negative_rule="bogus")),
    ("objective.weight_bounds.with_ppo_clip", "objective.variant", objective(variant="ppo_clip", neg_upper=1.0)),
    ("objective.neg_bounds.out_of_order", "objective.neg_lower", objective(neg_lower=2.0)),
    ("objective.pos_bounds.out_of_order", "objective.pos_lower", objective(pos_lower=-1.0, pos_upper=1.0)),
    ("objective.baseline.not_finite", "objective.baseline", objective(baseline=math.nan)),
    ("objective.baseline.with_asymre", "objective.baseline", objective(variant="asymre", baseline=0.5)),
    ("objective.asymre_delta_v.not_finite", "objective.asymre_delta_v", objective(asymre_delta_v=math.inf)),
    ("objective.ppo_epsilon.outside_0_1", "objective.ppo_epsilon", objective(ppo_epsilon=1.5)),
    ("objective.max_log_ratio.not_positive_finite", "objective.max_log_ratio", objective(max_log_ratio=0.0)),
    ("policy_loss.loss_mask.empty_row", "loss_mask rows [1]", losses(loss_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))),
    ("policy_loss.token_logprobs.not_float_2d", "token_logprobs", losses(token_logprobs=torch.full((3,), -1.0))),
    ("policy_loss.token_logprobs.no_rows", "token_logprobs", losses(token_logprobs=torch.zeros(0, 3))),
    ("policy_loss.loss_mask.wrong_shape", "loss_mask", losses(loss_mask=torch.ones(2, 2))),
    ("policy_loss.behavior_logprobs.wrong_shape", "behavior_logprobs", losses(behavior_logprobs=torch.zeros(1))),
    ("policy_loss.behavior_logprobs.sums_at_token_level", "behavior_logprobs",
     losses(config=ObjectiveConfig(ratio_level="token"))),
    ("policy_loss.rewards.wrong_shape", "rewards", losses(rewards=torch.ones(2, 1))),
    ("policy_loss.baseline.wrong_shape", "baseline", losses(baseline=torch.zeros(3))),
    ("policy_loss.baseline.with_scalar_baseline", "objective.baseline",
     losses(config=ObjectiveConfig(baseline=0.2), baseline=torch.zeros(2))),
    ("policy_loss.baseline.missing_for_asymre", "baseline", losses(config=ObjectiveConfig(variant="asymre"))),
    ("effective_positive_share.outside_domain", "p, c", raised(effective_positive_share, 1.1, 0.0)),
    ("effective_positive_share.undefined", "p, c", raised(effective_positive_share, 0.0, -1.0)),
    ("baseline_for_share.outside_domain", "p, target", raised(baseline_for_share, 0.0, 0.5)),
    # c rounds to -1 where p is the least float and the target the largest below 1
    ("baseline_for_share.unreachable", "p, target", raised(baseline_for_share, 5e-324, 0.9999999999999999)),
    ("batch.rewards.on_device", "rewards",
     raised(check_batch, batch(rewards=torch.ones(3, device="meta")), ObjectiveConfig())),
    ("record.behavior_logprob.missing", "sample_ids [1, 2] (2 of 3): behavior_logprob",
     raised(check_batch, batch(behavior_logprobs=torch.tensor([-5.0, math.nan, math.nan])), ObjectiveConfig())),
    ("record.baseline.on_some_records", "sample_ids [1] (1 of 3): baseline",
     raised(check_batch, batch(baselines=torch.tensor([0.5, math.nan, 0.1])), ObjectiveConfig())),
    ("objective.baseline.with_record_baselines", "objective.baseline",
     raised(check_batch, batch(baselines=torch.tensor([0.5, 0.2, 0.1])), ObjectiveConfig(baseline=0.3))),
    ("record.group_mean_reward.missing_for_asymre", "sample_ids [0, 1, 2] (3 of 3): group_mean_reward",
     raised(check_batch, batch(), ObjectiveConfig(variant="asymre"))),
    ("batch.seq_start.on_device", "seq_start", raised(thd_cu_seqlens, {"seq_start": torch.zeros(1, device="meta")})),
    ("objective.baseline.equals_every_reward", "objective.baseline",
     raised(recipe.check_baseline, ObjectiveConfig(baseline=0.0), {0.0}, warn=False)),
    ("objective.baseline.flips_signs", "objective.baseline",
     raised(recipe.check_baseline, ObjectiveConfig(baseline=1.0), {-1.0, 1.0}, warn=False)),
    ("train.exit_signal.not_a_signal", "train.exit_signal",
     raised(recipe.resolve_exit_signal, SimpleNamespace(exit_signal="SIGNOPE"))),
    ("dataset.train_path.unset", "dataset.train_path", raised(recipe._records_of, OmegaConf.create({"dataset": {}}))),
    ("model.seq_length.attention_above_host_memory", "model.seq_length",
     raised(check_cpu_attention, SimpleNamespace(seq_length=4096, num_attention_heads=4, tensor_model_parallel_size=1),
            2, 2**30, 1)),
    ("run_dir.no_room_for_checkpoint", "run_dir",
     patched(disk_space.check_room, Path("run/checkpoints"), (3 * 2**20, "the size of iteration 2"),
             patches={(disk_space.shutil, "disk_usage"): lambda path: SimpleNamespace(total=0, used=0, free=2**20)})),
    ("run_dir.lock.held", "run_dir", raised(lambda: RunLock(Path("held")).acquire())),
    ("run_dir.lock.names_no_process", "run_dir", raised(lambda: RunLock(Path("garbled")).acquire())),
    ("resume_from_base.no_fingerprint", "resume_from_base",
     raised(check_resume_from_base, NO_FINGERPRINT, {"data": "aaa", "config": {}}, 10)),
    ("resume_from_base.data_or_settings_changed", "resume_from_base",
     raised(check_resume_from_base, BASE, {"data": "bbb", "config": {"optimizer.lr": 1e-4}}, 10)),
    ("resume_from_base.base_finished", "resume_from_base",
     raised(check_resume_from_base, BASE, {"data": "aaa", "config": {"optimizer.lr": 1e-4}}, 4)),
    ("run_dir.data_or_settings_changed", "run_dir",
     raised(check_resume, Path("resumed"), True, {"data": "aaa", "config": {"optimizer.lr": 2e-4}})),
    ("run_dir.base_model_changed", "base_model",
     raised(check_resume, Path("moved"), True, {"data": "aaa", "config": {"base_model": "/models/b"}})),
    ("run_dir.checkpoints.damaged", "run_dir", raised(check_queued_start, Path("damaged"), {})),
    ("run_dir.finished", "run_dir", raised(check_queued_start, Path("finished"), {})),
    ("rendezvous.unset", "MASTER_PORT",
     raised(distributed.check_rendezvous, {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})),
    ("MASTER_PORT.not_a_port", "MASTER_PORT",
     raised(distributed.check_rendezvous, {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"})),
    ("MASTER_ADDR.unresolvable", "MASTER_ADDR",
     patched(distributed.check_rendezvous, {"WORLD_SIZE": "2", "MASTER_ADDR": "node-0042", "MASTER_PORT": "29500"},
             patches={HOST: lambda: "login-1", (socket, "getaddrinfo"): mock.Mock(side_effect=GAI_ERROR)})),
    ("LOCAL_RANK.beyond_gpus", "LOCAL_RANK",
     patched(distributed.check_local_gpu, {"WORLD_SIZE": "8", "LOCAL_RANK": "4"},
             patches={HOST: lambda: "node-1", (torch.cuda, "device_count"): lambda: 4})),
    ("--json.is_work_dir", "--json", raised(doctor.json_outside_work_dir, Path("doctor"), Path("doctor"))),
    ("--json.holds_work_dir", "--json", raised(doctor.json_outside_work_dir, Path("doctor"), Path("doctor/work"))),
    ("--json.inside_work_dir", "--json",
     raised(doctor.json_outside_work_dir, Path("doctor/table.json"), Path("doctor"))),
    ("checkpoint.latest.cut_short", "cut_short/checkpoints/iter_0000002",
     raised(ensure_latest_complete, Path("cut_short/checkpoints"))),
    ("iteration.loss.not_finite", "iteration 7", raised(check_finite, 7, torch.tensor(math.nan), 1.0, [3, 14, 15])),
    ("iteration.grad_norm.not_finite", "iteration 7", raised(check_finite, 7, torch.tensor(0.5), math.inf, [3])),
    ("iteration.loss_and_grad_norm.not_finite", "iteration 1",
     raised(check_finite, 1, torch.tensor(math.inf), math.nan, list(range(70)))),
    ("--work-dir.unusable", "--work-dir", raised(doctor.main, ["--device", "cpu", "--work-dir", "notes.txt"])),
    ("doctor.several_problems", "--json, --work-dir",
     raised(doctor.main, ["--device", "cpu", "--json", "notes.txt", "--work-dir", "held"])),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refusal_inputs")
    make_inputs(root)
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(root)): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


@pytest.mark.parametrize("key, where, problem", ROWS, ids=[row[0] for row in ROWS])
def test_each_bad_input_raises_its_problem(key, where, problem, inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    before = tree(inputs)
    assert [(error.key, error.where) for error in problem()] == [(key, where)]
    assert tree(inputs) == before  # a refused start writes nothing: no lock, no fingerprint, no directory


def test_the_rows_inputs_pass_but_for_their_change():
    """What each row changes is its problem: the default objective, the loss inputs and the batch pass."""
    assert losses()() == []
    assert check_batch(batch(), ObjectiveConfig()).num_sequences == 3
    assert effective_positive_share(0.5, 0.0) == 0.5 and baseline_for_share(0.5, 0.5) == 0.0


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, ERRORS, unreachable=NEEDS_MEGATRON)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/training/test_refusals_run.py",
                  [rendered(VERBS.get(key, "train"), key, where, *problem(), inputs)
                   for key, where, problem in ROWS])


@pytest.mark.slow
def test_the_table_imports_no_megatron(tmp_path):
    """Each problem comes out of the pure checks: every row, run in a fresh interpreter, refuses without
    importing Megatron or Transformer Engine."""
    rows = "\n".join([
        "import sys; from pathlib import Path; import tests.training.test_refusals_run as table",
        "table.make_inputs(Path.cwd())",
        "assert all(problem() for _, _, problem in table.ROWS)",
        "loaded = [name for name in sys.modules if name.split('.')[0] in ('megatron', 'transformer_engine')]",
        "assert not loaded, loaded"])
    run = subprocess.run([sys.executable, "-c", rows], cwd=tmp_path, env=checkout_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
