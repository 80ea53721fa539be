"""The console's line per logging interval (`nemo_topr.training.iteration_line`): the averages
Bridge would print, over the same iterations, negative losses included; checked against Bridge's
own TensorBoard values in tests/training/test_e2e.py."""

import torch

from nemo_topr.training.iteration_line import IntervalMeans, format_line


def test_an_interval_averages_what_it_trained_and_leaves_a_skipped_iteration_out():
    interval = IntervalMeans()
    interval.add({"topr_loss": torch.tensor(-0.75), "log_ratio_abs_mean": torch.tensor(0.5),
                  "negative_truncated_share": torch.tensor(0.0)}, skipped=False)
    interval.add({"topr_loss": torch.tensor(100.0)}, skipped=True)  # Bridge leaves it out of its average
    interval.add({"topr_loss": torch.tensor(0.25), "log_ratio_abs_mean": torch.tensor(1.5),
                  "negative_truncated_share": torch.tensor(0.5)}, skipped=False)
    assert interval.means() == {"topr_loss": -0.25, "log_ratio_abs_mean": 1.0, "negative_truncated_share": 0.25}
    assert interval.means() == {}  # the next interval starts empty
    interval.add(None, skipped=False)  # a rank off the last pipeline stage has no loss
    interval.add({}, skipped=False)
    assert interval.means() == {}


def test_the_sum_stays_on_the_device_and_in_float32():
    interval = IntervalMeans()
    interval.add({"topr_loss": torch.tensor(-1.0, dtype=torch.bfloat16, requires_grad=True)}, skipped=False)
    assert interval.totals["topr_loss"].dtype == torch.float32 and not interval.totals["topr_loss"].requires_grad


def test_the_line_shows_a_negative_loss_the_rate_and_the_time_left_within_160_characters():
    line = format_line(12, 1_000_000_000, {"topr_loss": -1.2214971, "log_ratio_abs_mean": 0.01234,
                                           "negative_truncated_share": 0.04}, 123456.7, 3 * 3600 + 4 * 60 + 5.4)
    assert line == ("[nemo-topr] iteration 12/1000000000 | loss -1.221497E+00 | |log rho| 0.0123 | truncated 4.0% | "
                    "123,457 tokens/s | ETA 3:04:05")
    assert len(line) <= 160
    assert format_line(3, 6, {}, None, None) == "[nemo-topr] iteration 3/6 | skipped"
