"""Stop a run at the first iteration whose loss or gradient norm is not finite.

The TOPR step does not use Bridge's per-micro-batch NaN/Inf check on the loss (two host syncs per
micro-batch, `bench/syncs.py`), and `ddp.check_for_nan_in_grad` is off: without this check a run
with one overflowing reward trains to "COMPLETED" with non-finite weights. The check runs once per
iteration, in Bridge's ``on_train_step_end`` (bridge/training/train.py: after the optimizer step,
before that iteration's checkpoint is saved, so no checkpoint holds it), on the loss already
reduced over micro-batches and data-parallel ranks, so every rank of the last pipeline stage sees
the same value: one host sync per iteration. The gradient norm is a float Megatron already read
back for clipping, the same on every rank.
"""

from __future__ import annotations

import math

import torch

from nemo_topr.errors import UserError


class NonFiniteTrainingError(UserError, RuntimeError):
    """The loss or gradient norm of an iteration is NaN or infinite."""


def check_finite(iteration: int, loss: torch.Tensor | None, grad_norm: float | None,
                 sample_ids: list[int]) -> None:
    """Raise `NonFiniteTrainingError` naming the 1-based `iteration` and the samples this rank
    trained on in it when `loss` (a device scalar; one host sync) or `grad_norm` is not finite."""
    bad, names = [], []
    if loss is not None and not bool(torch.isfinite(loss)):
        bad.append(f"loss {float(loss)}")
        names.append("loss")
    if grad_norm is not None and not math.isfinite(grad_norm):
        bad.append(f"gradient norm {grad_norm}")
        names.append("grad_norm")
    if bad:
        shown = ", ".join(map(str, sample_ids[:64])) + (f", ... ({len(sample_ids)} in all)" if len(sample_ids) > 64
                                                        else "")
        raise NonFiniteTrainingError(
            f"iteration {iteration}: {' and '.join(bad)} is not finite; stopped before saving it (the last "
            f"checkpoint is earlier). Samples of this iteration on this rank (sample_id = record index in the "
            f"data; the ledger's \"iteration\": {iteration - 1}): [{shown}]. Check their rewards and behavior_logprob (`nemo-topr data stats`), "
            f"or lower optimizer.lr",
            key=f"iteration.{'_and_'.join(names)}.not_finite", where=f"iteration {iteration}")


def stop_on_non_finite(forward_step):  # noqa: ANN001
    """A Bridge callback that runs `check_finite` after every training step, with the sample ids
    `forward_step` (a `ToprForwardStep`) saw in it."""
    from megatron.bridge.training.callbacks import Callback

    class StopOnNonFinite(Callback):
        def on_train_step_end(self, context) -> None:  # noqa: ANN001
            check_finite(context.state.train_state.step + 1, (context.loss_dict or {}).get("topr_loss"),
                         context.grad_norm, forward_step.iteration_sample_ids)

    return StopOnNonFinite()
