"""The negative-loss console line (`nemo_topr.training.loss_line`): the average Bridge would print,
over the same iterations; checked against Bridge's own TensorBoard values in
tests/test_training_e2e.py."""

import pytest
import torch

from nemo_topr.training.loss_line import IntervalLoss


def test_a_negative_interval_average_is_printed_and_a_skipped_iteration_left_out():
    interval = IntervalLoss()
    interval.add(torch.tensor(-0.75), skipped=False)
    interval.add(torch.tensor(100.0), skipped=True)  # Bridge leaves a skipped iteration out of its average
    interval.add(torch.tensor(0.25), skipped=False)
    assert interval.negative_line(4) == ("[nemo-topr] iteration 4: topr_loss: -2.500000E-01 (below 0: not on "
                                         "Bridge's line below)")
    interval.add(torch.tensor(0.25), skipped=False)  # the next interval starts empty
    interval.add(torch.tensor(-0.25), skipped=False)
    assert interval.negative_line(6) is None  # 0.0: Bridge prints it itself (avg >= 0)
    assert interval.negative_line(8) is None  # nothing in the interval (every iteration skipped, or no loss)
    interval.add(None, skipped=False)  # a rank off the last pipeline stage has no loss
    assert interval.negative_line(10) is None


def test_the_sum_stays_on_the_device_and_in_float32():
    interval = IntervalLoss()
    interval.add(torch.tensor(-1.0, dtype=torch.bfloat16, requires_grad=True), skipped=False)
    assert interval.total.dtype == torch.float32 and not interval.total.requires_grad
    assert interval.negative_line(1).endswith("topr_loss: -1.000000E+00 (below 0: not on Bridge's line below)")


@pytest.mark.parametrize("skipped", [True, False])
def test_an_interval_of_nothing_but_skipped_iterations_prints_nothing(skipped):
    interval = IntervalLoss()
    interval.add(torch.tensor(-2.0), skipped=skipped)
    assert (interval.negative_line(2) is None) == skipped
