"""The console's line per logging interval: loss, |log rho|, truncated share, tokens/s and ETA.

Bridge's own line (bridge/training/utils/train_utils.py, `training_log`) is ~700 characters and
goes to the run's log (`nemo_topr.training.console`); it also prints a loss only when it is at
least 0, while TOPR's loss is negative whenever the negatives' term outweighs the positives'.
This callback averages the same values over the same iterations as Bridge (the iterations not
skipped since the last line, `logger.log_interval`) and prints them on the rank that prints
Bridge's line. TensorBoard gets every value from Bridge itself.
"""

from __future__ import annotations

import time

import torch

# loss_dict key -> the name on the console
SHOWN = {"topr_loss": "loss", "log_ratio_abs_mean": "|log rho|", "negative_truncated_share": "truncated"}


class IntervalMeans:
    """Running sums of SHOWN's values over one log interval, summed on the device: one host sync
    per printed line, not per iteration."""

    def __init__(self) -> None:
        self.totals: dict[str, torch.Tensor] = {}
        self.iterations = 0

    def add(self, values: dict | None, skipped: bool) -> None:
        if not values or skipped or "topr_loss" not in values:  # as Bridge: a skipped iteration adds nothing
            return
        for key in SHOWN:
            if key in values:
                value = torch.as_tensor(values[key]).detach().float()
                self.totals[key] = value if key not in self.totals else self.totals[key] + value
        self.iterations += 1

    def means(self) -> dict[str, float]:
        """The interval's averages (empty when it trained nothing); starts the next interval."""
        totals, iterations = self.totals, self.iterations
        self.totals, self.iterations = {}, 0
        return {key: float(total) / iterations for key, total in totals.items()}


def format_metrics(means: dict[str, float]) -> str:
    """`loss -2.500000E-01 | |log rho| 0.0123 | truncated 4.0%` (what the interval has)."""
    parts = []
    if "topr_loss" in means:
        parts.append(f"loss {means['topr_loss']:.6E}")
    if "log_ratio_abs_mean" in means:
        parts.append(f"|log rho| {means['log_ratio_abs_mean']:.4f}")
    if "negative_truncated_share" in means:
        parts.append(f"truncated {100 * means['negative_truncated_share']:.1f}%")
    return " | ".join(parts)


def format_line(iteration: int, total: int, means: dict[str, float], tokens_per_second: float | None,
                seconds_left: float | None) -> str:
    """One interval's console line (under 160 characters for any run of fewer than 10^9 iterations)."""
    parts = [f"[nemo-topr] iteration {iteration}/{total}", format_metrics(means) or "skipped"]
    if tokens_per_second is not None:
        parts.append(f"{tokens_per_second:,.0f} tokens/s")
    if seconds_left is not None:
        parts.append(f"ETA {_clock(seconds_left)}")
    return " | ".join(parts)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def print_iteration_lines():  # noqa: ANN201
    """A Bridge callback printing `format_line` every `logger.log_interval` iterations; tokens/s
    counts the global batch's rows times their length (packed rows, padding included), read from
    the run's config when training starts. `last_metrics` holds the last line's metrics and `started_at` the iteration
    the start resumed from (for the run's summary)."""
    from megatron.bridge.training.callbacks import Callback

    class PrintIterationLines(Callback):
        def __init__(self) -> None:
            self.interval = IntervalMeans()
            self.last_metrics: str | None = None
            self.started_at: int | None = None  # the iteration this start began at (None: it trained none)
            self.since: tuple[float, int] | None = None  # (time, iteration) of the last line
            self.start: tuple[float, int] | None = None  # (time, iteration) at the start of training
            self.tokens_per_iteration = 0  # set when training starts

        def on_train_start(self, context) -> None:  # noqa: ANN001
            self.started_at = context.state.train_state.step
            config = context.state.cfg
            self.tokens_per_iteration = config.train.global_batch_size * config.dataset.seq_length
            self.since = self.start = (time.monotonic(), self.started_at)

        def on_train_step_end(self, context) -> None:  # noqa: ANN001
            self.interval.add(context.loss_dict, context.skipped_iter)
            iteration = context.state.train_state.step + 1  # Bridge counts the step after this callback
            if iteration % context.state.cfg.logger.log_interval:
                return
            means = self.interval.means()
            if torch.distributed.get_rank() != torch.distributed.get_world_size() - 1:
                return
            now, total = time.monotonic(), context.state.cfg.train.train_iters
            rate = seconds_left = None
            if self.since and iteration > self.since[1]:  # tokens/s over the interval
                per_iteration = (now - self.since[0]) / (iteration - self.since[1])
                rate = self.tokens_per_iteration / per_iteration if per_iteration > 0 else None
            if self.start and iteration > self.start[1]:  # the ETA at the pace since this start began
                seconds_left = (now - self.start[0]) / (iteration - self.start[1]) * (total - iteration)
            self.since = (now, iteration)
            if means:
                self.last_metrics = f"iteration {iteration}: {format_metrics(means)}"
            print(format_line(iteration, total, means, rate, seconds_left), flush=True)

    return PrintIterationLines()
