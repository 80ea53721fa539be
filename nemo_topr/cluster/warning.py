"""Slurm's pre-emption warning (SIGUSR1, slurm/topr_job.sh) while a training rank starts.

SIGUSR1's default action terminates, and Bridge installs its handler only once training is set
up, so `nemo-topr train` holds the warning (blocks it: it stays pending) from its first line until
training starts (`release_the_warning`, from the recipe's on_train_start), when Bridge's handler
takes it and the rank saves.

The ranks reach that first line a fraction of a second apart. A warning that falls in between
kills the ranks not yet holding it, and srun's --kill-on-bad-exit then sends SIGTERM to the ones
holding it. srun exits 128 + the highest signal that killed a task: dying of that SIGTERM made it
143, a failed job, where the ranks killed by the warning alone give 138, which topr_job.sh
requeues. So a rank holding the warning answers SIGTERM by dying of the warning it holds; with no
warning pending it dies of SIGTERM, as it would without the handler.
"""

from __future__ import annotations

import os
import signal


def hold_the_warning() -> None:
    """Keep SIGUSR1 pending from now on, and have SIGTERM end this process by it if it came."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.signal(signal.SIGTERM, _die_of_the_held_warning)


def release_the_warning() -> None:
    """SIGUSR1 delivered again (to Bridge's handler, installed by now), SIGTERM's default back
    unless Bridge has put its own handler there (train.exit_signal=SIGTERM)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    if signal.getsignal(signal.SIGTERM) is _die_of_the_held_warning:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _die_of_the_held_warning(signum: int, frame) -> None:
    dying_of = signal.SIGUSR1 if signal.SIGUSR1 in signal.sigpending() else signal.SIGTERM
    signal.signal(dying_of, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {dying_of})  # a pending SIGUSR1 is delivered here
    os.kill(os.getpid(), dying_of)
