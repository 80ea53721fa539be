"""The first-iteration warning of a new run whose log mu is far from the starting model
(`nemo_topr.training.start_ratio`); a real run with log mu moved by 2 nats is in
tests/training/test_e2e.py."""

import math
from types import SimpleNamespace

import pytest
import torch

from nemo_topr.training.start_ratio import FAR_LOG_RATIO, far_from_start_line, warn_if_far_from_start


def test_the_line_gives_the_mean_log_ratio_and_the_negatives_weight():
    line = far_from_start_line(2.0, math.exp(-2.0))
    assert line.startswith("[nemo-topr] WARNING: iteration 1: mean |log rho| = 2.000, negatives' mean weight "
                           "0.135 (1 when mu is the starting model): the records' behavior_logprob is far from")
    assert "`nemo-topr score-logprobs`" in line


@pytest.mark.parametrize("negative", [None, float("nan")])  # a batch without negatives reduces to 0/0
def test_a_batch_without_negatives_leaves_their_weight_out(negative):
    line = far_from_start_line(0.75, negative)
    assert line.startswith("[nemo-topr] WARNING: iteration 1: mean |log rho| = 0.750: the records'")


@pytest.mark.parametrize("mean", [0.0, 2.26e-2, FAR_LOG_RATIO, float("nan")])  # 2.26e-2: FP8 vs BF16 on an H200
def test_no_line_within_the_bound_or_for_a_non_finite_mean(mean):
    assert far_from_start_line(mean, 1.0) is None


def _context(step: int, loss_dict: dict | None):
    return SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=step)), loss_dict=loss_dict)


@pytest.fixture
def last_rank(megatron_world, monkeypatch):  # Bridge's Callback imports on the CPU runtime
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)


FAR = {"log_ratio_abs_mean": torch.tensor(2.0), "negative_weight_mean": torch.tensor(math.exp(-2.0))}


def test_the_callback_warns_after_a_new_runs_first_iteration_only(last_rank, capsys):
    callback = warn_if_far_from_start(uses_ratio=True)
    callback.on_train_step_end(_context(0, FAR))
    assert capsys.readouterr().out.startswith("[nemo-topr] WARNING: iteration 1: mean |log rho| = 2.000, ")
    callback.on_train_step_end(_context(1, FAR))  # iteration 2: training moves rho
    callback.on_train_step_end(_context(7, FAR))  # a resume's first iteration: a trained model
    callback.on_train_step_end(_context(0, {}))  # a rank off the last pipeline stage, or a skipped iteration
    callback.on_train_step_end(_context(0, None))
    assert capsys.readouterr().out == ""


def test_no_warning_where_the_weights_do_not_use_rho_or_on_another_rank(last_rank, capsys, monkeypatch):
    warn_if_far_from_start(uses_ratio=False).on_train_step_end(_context(0, FAR))  # e.g. sft_positive
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    warn_if_far_from_start(uses_ratio=True).on_train_step_end(_context(0, FAR))
    assert capsys.readouterr().out == ""
