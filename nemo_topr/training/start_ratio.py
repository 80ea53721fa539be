"""Say so when a new run's first iteration finds log mu far from the starting model's own log-probs.

When `behavior_logprob` was scored from the starting model (`nemo-topr score-logprobs`), rho =
pi/mu is 1 at the first iteration: TOPR begins as SFT on positives with every negative at weight
1, and a negative's weight falls only as training moves pi away from it. Log-probs from elsewhere
(a sampler's own, with its numerics, a temperature or top-p other than 1; another model or
tokenizer) put rho far from 1 before any update: the negatives' weights start elsewhere, another
objective than the one chosen, and nothing said so. Measured with mu scored from the
starting model: |log rho| < 1e-4 on CPU, 0 on an H200 in BF16, 2.3e-2 mean for FP8 training
against BF16 scores (docs/training.md, "mu and rho"), all far below FAR_LOG_RATIO.

Only iteration 1 of a new run is read (one host sync): later, training moves rho, and a resume
or `resume_from_base=true` starts from a trained model. Only for objectives whose weights use rho.
"""

from __future__ import annotations

import math

import torch

# a negative at log rho = -0.5 starts at weight exp(-0.5) = 0.61 instead of 1
FAR_LOG_RATIO = 0.5


def far_from_start_line(log_ratio_abs_mean: float, negative_weight_mean: float | None) -> str | None:
    """The warning for iteration 1's batch metrics (None while the mean |log rho| is within
    FAR_LOG_RATIO). `negative_weight_mean` is NaN or None for a batch without negatives."""
    if not log_ratio_abs_mean > FAR_LOG_RATIO:  # a NaN is the non-finite check's (nonfinite.py)
        return None
    negatives = ("" if negative_weight_mean is None or not math.isfinite(negative_weight_mean)
                 else f", negatives' mean weight {negative_weight_mean:.3f} (1 when mu is the starting model)")
    return (f"[nemo-topr] WARNING: iteration 1: mean |log rho| = {log_ratio_abs_mean:.3f}{negatives}: the records' "
            f"behavior_logprob is far from the starting model's own log-probs (|log rho| > {FAR_LOG_RATIO} before "
            "any update), so the weights do not start where TOPR starts. If the completions were sampled from this "
            "model, score log mu with `nemo-topr score-logprobs` (a sampler's own log-probs, a temperature or "
            "top-p other than 1, or another tokenizer move rho); if they came from another model, this is expected.")


def warn_if_far_from_start(uses_ratio: bool):  # noqa: ANN201
    """A Bridge callback printing `far_from_start_line` after a new run's first iteration, on the
    rank that prints Bridge's log line; nothing when the objective's weights do not use rho
    (`ObjectiveConfig.weights_use_ratio` is `uses_ratio`)."""
    from megatron.bridge.training.callbacks import Callback

    class WarnIfFarFromStart(Callback):
        def on_train_step_end(self, context) -> None:  # noqa: ANN001
            # the step is counted after this callback: 0 in a new run's first iteration only
            if not uses_ratio or context.state.train_state.step != 0:
                return
            if torch.distributed.get_rank() != torch.distributed.get_world_size() - 1:
                return
            metrics = context.loss_dict or {}
            if "log_ratio_abs_mean" not in metrics:  # a skipped iteration
                return
            negative = metrics.get("negative_weight_mean")
            line = far_from_start_line(float(metrics["log_ratio_abs_mean"]),
                                       None if negative is None else float(negative))
            if line:
                print(line, flush=True)

    return WarnIfFarFromStart()
