"""Process-group set-up for the tools that run a Megatron model outside Bridge's training loop
(log-prob scoring, export, tests). Bridge's ``finetune()`` does its own initialisation."""

from __future__ import annotations

import os
import socket

import torch

from nemo_topr.errors import UserError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def standalone_torchrun(nproc: int, *options: str) -> list[str]:
    """``python`` arguments that start ``nproc`` ranks on this node under torchrun ``--standalone``
    (then ``-m module`` or a script): its rendezvous store binds port 0, so no port is chosen
    ahead for another process to take before the bind (EADDRINUSE, seen once in the suite)."""
    return ["-m", "torch.distributed.run", "--standalone", *options, f"--nproc-per-node={nproc}"]


def local_rendezvous(environ=os.environ) -> None:  # noqa: B008 - the process environment by default
    """For a plain process (no launcher) whose process group Bridge makes from the environment
    (env://, which would default to port 29500): this host and port 0. In a world of one no
    other rank needs the port, so torch's store binds whichever the OS gives it: no free port
    chosen first, which another process could take before the store binds it (EADDRINUSE,
    seen once in the suite)."""
    environ.setdefault("MASTER_ADDR", "127.0.0.1")
    environ.setdefault("MASTER_PORT", "0")


class RendezvousError(UserError, RuntimeError):
    """The launcher's variables (rendezvous, local rank) cannot work; raised before any process
    group exists."""


def check_rendezvous(environ=os.environ) -> None:  # noqa: B008 - the process environment by default
    """Under a launcher (WORLD_SIZE set), MASTER_ADDR must resolve and MASTER_PORT be a port:
    otherwise torch's TCP store retries the name until its timeout, with no word of why, on every
    rank."""
    if "WORLD_SIZE" not in environ:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(name)]
    if missing:
        raise RendezvousError(f"WORLD_SIZE is set but {' and '.join(missing)} is not: the launcher (torchrun, "
                              "slurm/topr_job.sh) sets both", key="rendezvous.unset", where=" and ".join(missing))
    addr, port = environ["MASTER_ADDR"], environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousError(f"MASTER_PORT={port!r} is not a port number (1-65535)", key="MASTER_PORT.not_a_port",
                              where="MASTER_PORT")
    try:
        socket.getaddrinfo(addr, int(port), type=socket.SOCK_STREAM)
    except OSError as error:
        raise RendezvousError(f"MASTER_ADDR={addr!r} does not resolve on {socket.gethostname()} ({error}); "
                              "slurm/topr_job.sh sets it to the job's first node",
                              key="MASTER_ADDR.unresolvable", where="MASTER_ADDR") from None


def check_local_gpu(environ=os.environ) -> None:  # noqa: B008 - the process environment by default
    """Under a launcher, a CUDA rank takes GPU LOCAL_RANK (torchrun; slurm/task.sh: SLURM_LOCALID).
    More ranks on a node than GPUs torch sees would fail only on the ranks past them, with CUDA's
    "invalid device ordinal" traceback deep in Megatron's set-up, after its imports."""
    if "WORLD_SIZE" not in environ:
        return
    local_rank, gpus = int(environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local_rank >= gpus:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        seen = f"{gpus} GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
        raise RendezvousError(f"LOCAL_RANK={local_rank}, but torch sees {seen} on {socket.gethostname()}: one rank "
                              f"per GPU, so start at most {gpus} rank(s) on this node (torchrun --nproc-per-node, "
                              "launchers/local.sh -n, nemo-topr submit --gpus-per-node)",
                              key="LOCAL_RANK.beyond_gpus", where="LOCAL_RANK")


def initialize_model_parallel(tensor_parallel: int = 1, pipeline_parallel: int = 1, *, seed: int = 1234) -> None:
    """Join (or create) the default process group and Megatron's model-parallel groups.

    Under torchrun the rendezvous comes from the environment; a plain ``python`` process becomes
    a world of one with an in-memory store. The backend is NCCL with CUDA and gloo without.

    With CUDA, also seeds Megatron's CUDA RNG tracker as Bridge's training set-up does
    (bridge/training/initialize.py:875): building a model with perform_initialization=True (any
    config-only provider: a Megatron checkpoint or run as the source) forks its
    "model-parallel-rng" state, which must exist (core/tensor_parallel/random.py:316).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "WORLD_SIZE" in os.environ:  # torchrun / srun: rendezvous from the environment
            check_rendezvous()
            if torch.cuda.is_available():
                check_local_gpu()
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            torch.distributed.init_process_group(backend)
        else:  # a world of one needs no port (so parallel jobs on one machine cannot collide)
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel,
            pipeline_model_parallel_size=pipeline_parallel,
            create_gloo_process_groups=True,
        )
    if torch.cuda.is_available() and not get_cuda_rng_tracker().is_initialized():
        model_parallel_cuda_manual_seed(seed)


def destroy_model_parallel() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def launcher_world_size() -> int:
    """The processes the launcher started (torchrun, or slurm/task.sh from srun: WORLD_SIZE), 1
    for a plain process; read before torch.distributed exists, to check a layout against it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launcher_rank() -> int:
    """This process's global rank, also before torch.distributed is initialised: the process
    group's when it exists, else the launcher's (torchrun: RANK; srun: SLURM_PROCID), else 0
    (a plain single process)."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for name in ("RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0
