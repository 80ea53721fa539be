"""The process behind Megatron's checkpoint-writer results queue, started by `nemo-topr train` and `import`.

Stdlib imports only at module level: the spawned process imports this module to run its
initializer, and would otherwise load torch and Megatron for nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def start_checkpoint_writer_queue(exit_signal: signal.Signals | None = None) -> None:
    """Start Megatron's checkpoint-writer results queue in a process that ignores the exit signal
    (training's; `import` has none) and ends with the process that saves.

    A torch_dist save sends its write results through a multiprocessing Manager process that
    Megatron spawns at the first save and keeps in a module global (megatron/core/
    dist_checkpointing/strategies/filesystem_async.py, get_write_results_queue). It sits in the
    job's process group, so a signal sent to the group (a terminal, `kill -TERM -PGID`, Slurm
    signalling every process of a step) killed it: started at the first save, after the signal is
    unblocked, it runs without our Python handler (a spawned child does not inherit one), and the
    very save the signal asked for failed with BrokenPipeError. So the manager is started here, as
    Megatron would (spawn), with the exit signal ignored in it (SIGINT it ignores itself)."""
    import multiprocessing
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:  # what get_write_results_queue() would start
        manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
        manager.start(_writer_queue_process, (exit_signal, os.getpid()))
        filesystem_async._results_queue = manager.Queue()  # the proxy keeps the manager alive


def _writer_queue_process(exit_signal: int | None, parent: int) -> None:
    """In the manager process: ignore the exit signal, and die with the process that saves. A
    training (or import) killed by SIGKILL or a signal's default action left it, and the resource
    tracker it keeps open, running for good, ignoring SIGTERM, and holding the job's stdout and
    stderr open, so a caller reading them (a pipe, `subprocess.run`) waited for EOF until its timeout."""
    if exit_signal is not None:
        signal.signal(exit_signal, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the training ended before prctl: nothing would send the signal
        os._exit(0)
