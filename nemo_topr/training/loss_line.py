"""Show a negative loss on the console, which Bridge's log line leaves out.

Bridge prints each loss averaged over the `logger.log_interval` iterations only when it is at
least 0 (bridge/training/utils/train_utils.py, `training_log`: `if avg >= 0.0`). TOPR's loss is
negative whenever the negatives' term outweighs the positives', so on about half of a run's lines
`topr_loss` was simply missing. This callback keeps the same average (the iterations not skipped
since the last line) and, where it is negative, prints it on the rank that prints Bridge's line,
the one just before Bridge's. TensorBoard gets every value from Bridge itself.
"""

from __future__ import annotations

import torch

LOSS_KEY = "topr_loss"


class IntervalLoss:
    """The running sum of the loss over one log interval, summed on the device: one host sync per
    printed line, not per iteration."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.iterations = 0

    def add(self, loss: torch.Tensor | None, skipped: bool) -> None:
        if loss is None or skipped:  # as Bridge: a skipped iteration adds nothing to the average
            return
        loss = loss.detach().float()
        self.total = loss if self.total is None else self.total + loss
        self.iterations += 1

    def negative_line(self, iteration: int) -> str | None:
        """The line for a negative average over the interval (None otherwise); starts the next interval."""
        total, iterations = self.total, self.iterations
        self.total, self.iterations = None, 0
        if total is None:
            return None
        average = float(total) / iterations
        if average >= 0.0:
            return None
        return f"[nemo-topr] iteration {iteration}: {LOSS_KEY}: {average:.6E} (below 0: not on Bridge's line below)"


def print_negative_loss():  # noqa: ANN201
    """A Bridge callback printing the negative `topr_loss` averages Bridge's console line omits."""
    from megatron.bridge.training.callbacks import Callback

    class PrintNegativeLoss(Callback):
        def __init__(self) -> None:
            self.interval = IntervalLoss()

        def on_train_step_end(self, context) -> None:  # noqa: ANN001
            self.interval.add((context.loss_dict or {}).get(LOSS_KEY), context.skipped_iter)
            iteration = context.state.train_state.step + 1  # Bridge counts the step after this callback
            if iteration % context.state.cfg.logger.log_interval:
                return
            line = self.interval.negative_line(iteration)
            if line and torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
                print(line, flush=True)

    return PrintNegativeLoss()
