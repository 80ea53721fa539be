"""Training config's refusals as a table: one row per problem, its bad input → the problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
read as a whole and compared here (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest
tests/training/test_refusals.py`` rewrites this table's section), so rewording a message changes that file and no test. Every key `nemo_topr.training.validation` and
`nemo_topr.training.schema` and `nemo_topr.training.config` can raise has a row: a new refusal without one fails
`test_the_table_covers_every_key_the_code_raises`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from tests.conftest import REPO, checkout_env, placeholder_hf_model
from omegaconf import OmegaConf
from tests.refusal_table import assert_covers, assert_golden, raised, rendered, row_tests

from nemo_topr.model import source as model_source
from nemo_topr.training import schema
from nemo_topr.training.config import check_overrides, choose_pipeline_p2p, compose, config_location
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.validation import (check_batch_division, check_config, check_resumable, check_run_dir,
                                           refuse, validate, validate_container)

SOURCES = [REPO / "nemo_topr" / "training" / name for name in ("validation.py", "schema.py", "config.py")]
# keys the table cannot reach without Megatron, and what needs it
NEEDS_MEGATRON = {
    "{}.unknown_name": "Bridge's dtype and activation tables (tests/training/test_config.py test_bad_keys_are_clear_errors)",
    "model.architecture.differs_from_base": "Bridge's provider of the base model's config.json",
    "model.attention_backend.cudnn_backward": "Transformer Engine's cuDNN attention",
    "dataset.shared_prefix.attention": "Megatron's layer specs (nemo_topr.training.flex_attention)",
    "base_model.damaged": "build_training_run, which imports Megatron before it"}


def values(config: dict) -> Callable[[], list[ConfigError]]:
    return lambda: validate(config)


def container(device: str = "cuda", *, fused_adam: bool = True, **changes: object) -> Callable[[], list[ConfigError]]:
    """`validate_container` of a stub container that passes, but for `changes` (``model__fp8="hybrid"``)."""
    def problem() -> list[ConfigError]:
        return validate_container(stub_container(**changes), device, cuda=device == "cuda", fused_adam=fused_adam)
    return problem


def stub_container(**changes: object) -> SimpleNamespace:
    sections = {
        "model": dict(calculate_per_token_loss=True, seq_length=8, pipeline_model_parallel_size=1,
                      virtual_pipeline_model_parallel_size=None, fp8=None, transformer_impl="transformer_engine",
                      bf16=False, fp16=False, params_dtype=torch.float32, pipeline_dtype=None),
        "dataset": dict(seq_length=8), "train": dict(micro_batch_size=1),
        "optimizer": dict(use_distributed_optimizer=False, bf16=False, fp16=False, params_dtype=torch.float32),
        "ddp": dict(use_distributed_optimizer=False)}
    for change, value in changes.items():
        section, key = change.split("__")
        sections[section][key] = value
    return SimpleNamespace(**{name: SimpleNamespace(**fields) for name, fields in sections.items()})


@dataclasses.dataclass
class TrainStub:
    global_batch_size: int = 8
    micro_batch_size: int = 1


@dataclasses.dataclass
class OptimizerStub:
    lr: float = 1e-5
    min_lr: float = 1e-5


STUB_SECTIONS = {"train": TrainStub, "optimizer": OptimizerStub}


def with_stub_sections(check: Callable[[dict], None], config: dict) -> Callable[[], list[ConfigError]]:
    """`check(config)` with Bridge's section classes stood in for (`schema.section_classes` imports Bridge)."""
    def run() -> None:
        with mock.patch.object(schema, "section_classes", lambda: STUB_SECTIONS):
            check(config)
    return raised(run)


def make_inputs(root: Path) -> None:
    """The files the run_dir and base_model rows name, relative to `root` (the rows run there)."""
    (root / "notes.txt").write_text("not a run\n")
    (root / "shared").mkdir()
    (root / "shared" / "config.yaml").write_text("{}\n")
    (root / "typo.yaml").write_text("defaults:\n  - tiny_cpux\n")
    (root / "bad.yaml").write_text("a: [1,\n")
    (root / "bare.yaml").write_text("x: 1\n")
    (root / "both.yaml").write_text("defaults:\n  - tiny_cpu\n  - _self_\nbase_model: /a\nhf_model: /b\n")
    placeholder_hf_model(root / "hf_model")


THREE_PROBLEMS = {"optimizer": {"lr": 1e-7, "min_lr": 5e-7}, "model": {"fp16": True, "bf16": True},
                  "resume_from_base": "maybe"}
BATCH = {"global_batch_size": 8, "micro_batch_size": 1}  # a train section needs them (NEEDS_A_VALUE)
OUR_VALUES = {"base_model": "hf_model", "run_dir": "run", "objective": {"variant": "topr"}, "device": "cpu"}

# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("train.train_iters.not_a_setting", "train.train_iters", values({"train": {"train_iters": 10, **BATCH}})),
    ("validation.eval_iters.not_a_setting", "validation.eval_iters", values({"validation": {"eval_iters": 1}})),
    ("optimizer.lr.unset", "optimizer.lr", values({"optimizer": {"lr": None, "min_lr": 0.0}})),
    ("resume_from_base.not_boolean", "resume_from_base", values({"resume_from_base": "maybe"})),
    ("device.invalid", "device", values({"device": "tpu"})),
    ("dataset.seq_length.differs_from_model", "dataset.seq_length",
     values({"dataset": {"seq_length": 8}, "model": {"seq_length": 16}})),
    ("dataset.shared_prefix.unpacked", "dataset.shared_prefix",
     values({"dataset": {"shared_prefix": True, "packed": False}})),
    ("model.precision.two_chosen", "model.fp16", values({"model": {"fp16": True, "bf16": True}})),
    ("model.recompute_method.not_set_for_full", "model.recompute_method",
     values({"model": {"recompute_granularity": "full"}})),
    ("optimizer.lr.below_min_lr", "optimizer.lr", values({"optimizer": {"lr": 1e-7, "min_lr": 5e-7}})),
    ("scheduler.weight_decay_ends.with_constant_style", "scheduler.start_weight_decay",
     values({"scheduler": {"start_weight_decay": 0.1}})),
    ("scheduler.weight_decay_ends.unset", "scheduler.end_weight_decay",
     values({"scheduler": {"weight_decay_incr_style": "linear", "start_weight_decay": 0.1}})),
    ("objective.invalid", "objective", values({"objective": {"variant": "nope"}})),
    ("objective.ratio_level.token", "objective.ratio_level", values({"objective": {"ratio_level": "token"}})),
    ("objective.clipp.unknown", "objective.clipp", values({"objective": {"clipp": 1}})),
    ("objective.baseline.wrong_type", "objective.baseline", values({"objective": {"baseline": "high"}})),
    ("objective.baseline.not_finite", "objective.baseline", values({"objective": {"baseline": math.nan}})),
    ("world_size.not_multiple_of_model_parallel", "WORLD_SIZE",
     raised(check_batch_division, {"model": {"tensor_model_parallel_size": 2}}, 3)),
    ("train.global_batch_size.not_whole_micro_batches", "train.global_batch_size",
     raised(check_batch_division, {"train": {"global_batch_size": 6, "micro_batch_size": 4}}, 1)),
    ("train.global_batch_size.below_bound", "train.global_batch_size",
     raised(check_batch_division, {"train": {"global_batch_size": 0}}, 1)),
    ("train.micro_batch_size.wrong_type", "train.micro_batch_size",
     raised(check_batch_division, {"train": {"micro_batch_size": "2"}}, 1)),
    ("optimizer.adam_beta2.above_bound", "optimizer.adam_beta2",
     raised(schema.check_value, "optimizer.adam_beta2", 1.0, float)),
    ("lr.unknown", "lr", with_stub_sections(schema.check_sections, {"lr": 0.1})),
    ("train.not_a_section_value", "train", with_stub_sections(schema.check_sections, {"train": 5})),
    ("optimiser.unknown", "optimiser", with_stub_sections(schema.check_schema, {"optimiser": {"lr": 0.1}})),
    ("model.calculate_per_token_loss.false", "model.calculate_per_token_loss",
     container(model__calculate_per_token_loss=False)),
    ("train.micro_batch_size.above_1_with_pipeline", "train.micro_batch_size",
     container(train__micro_batch_size=2, model__pipeline_model_parallel_size=2)),
    ("model.virtual_pipeline_model_parallel_size.below_2", "model.virtual_pipeline_model_parallel_size",
     container(model__virtual_pipeline_model_parallel_size=1, model__pipeline_model_parallel_size=2)),
    ("model.virtual_pipeline_model_parallel_size.without_pipeline", "model.virtual_pipeline_model_parallel_size",
     container(model__virtual_pipeline_model_parallel_size=2)),
    ("precision.not_fp32_on_cpu", "model.bf16", container("cpu", model__bf16=True)),
    ("use_distributed_optimizer.on_cpu", "optimizer.use_distributed_optimizer",
     container("cpu", optimizer__use_distributed_optimizer=True)),
    ("use_distributed_optimizer.without_fused_adam", "ddp.use_distributed_optimizer",
     container(fused_adam=False, ddp__use_distributed_optimizer=True)),
    ("model.fp8.on_cpu", "model.fp8", container("cpu", model__fp8="hybrid")),
    ("model.fp8.without_transformer_engine", "model.fp8",
     container(model__fp8="e4m3", model__transformer_impl="local")),
    ("config.required_unset", "base_model, run_dir",
     raised(check_config, OmegaConf.create({"objective": {"variant": "topr"}, "device": "cpu"}))),
    ("base_model.not_a_model", "base_model",
     raised(check_config, OmegaConf.create({**OUR_VALUES, "base_model": "no_such_model"}))),
    ("run_dir.is_a_file", "run_dir", raised(check_run_dir, Path("notes.txt"))),
    ("run_dir.under_a_file", "run_dir", raised(check_run_dir, Path("notes.txt/run"))),
    ("run_dir.holds_others", "run_dir", raised(check_run_dir, Path("shared"))),
    ("run_dir.is_a_model", "run_dir", raised(check_run_dir, Path("hf_model"))),
    ("resume_from_base.no_training_state", "resume_from_base",
     raised(lambda: check_resumable(model_source.resolve(Path("hf_model"))))),
    ("config.defaults_name_missing", "defaults", raised(compose, "typo.yaml")),
    ("config.not_found", "config", raised(compose, "nope")),
    ("config.not_yaml", "config", raised(compose, "bad.yaml")),
    ("config.without_recipe", "defaults", raised(compose, "bare.yaml")),
    ("overrides.not_key_value", "optimizer.lr", raised(compose, "tiny_cpu", ["optimizer.lr"])),
    ("base_model.alias_disagrees", "hf_model", raised(compose, "both.yaml")),
    ("config.unresolvable", "run_dir", raised(compose, "tiny_cpu", ["run_dir=${nope}"])),
    ("overrides.hydra_prefix", "optimizer.lr", raised(check_overrides, ["+optimizer.lr=1"])),
    ("overrides.empty_value", "optimizer.lr", raised(check_overrides, ["optimizer.lr="])),
    ("config.yml_suffix", "config", raised(config_location, "exp.yml")),
    ("config.no_such_file", "config", raised(config_location, "my_runs/exp.yaml")),
    ("config.not_here_nor_in_conf", "config", raised(config_location, "exp3.yaml")),
    ("model.batch_p2p_comm.crossed_at_pp2", "model.batch_p2p_comm",
     raised(choose_pipeline_p2p, SimpleNamespace(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                                 batch_p2p_comm=True, overlap_p2p_comm=False), {"batch_p2p_comm"})),
    ("config.several_problems", "resume_from_base, model.fp16, optimizer.lr",
     raised(lambda: refuse(validate(THREE_PROBLEMS)))),
]


inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)


def test_the_rows_inputs_pass_but_for_their_change():
    """What each row changes is its problem: the empty values and the stub container pass every rule."""
    assert validate({}) == []
    for device in ("cpu", "cuda"):
        assert container(device)() == []
    assert check_batch_division({}, 1) is None


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, {"ConfigError"}, unreachable=NEEDS_MEGATRON)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/training/test_refusals.py",
                  [rendered("train", key, where, *problem(), inputs) for key, where, problem in ROWS])


@pytest.mark.slow
def test_the_table_imports_no_megatron(tmp_path):
    """Each problem comes out of the pure checks: the whole table, run in a fresh interpreter, imports
    neither Megatron nor Transformer Engine."""
    code = ("import json, sys; from pathlib import Path; import tests.training.test_refusals as table; "
            "table.make_inputs(Path.cwd()); keys = [row[2]()[0].key for row in table.ROWS]; "
            "print(json.dumps([len(keys), sorted(m for m in sys.modules "
            "if m.startswith(('megatron', 'transformer_engine')))]))")
    env = checkout_env()
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [len(ROWS), []]
