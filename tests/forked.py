"""`python -m MODULE ARGS` or `python SCRIPT ARGS` in a process forked from one that has already
imported Megatron-Bridge, for the tests whose subject is what a verb does, not how it starts.

Importing Megatron-Bridge costs ~8 CPU-seconds a process; a verb on CPU pays it first
(``cpu_runtime.import_bridge``, through ``use_device``). Here one fork server per pytest worker
pays it once (multiprocessing's "forkserver", preloading tests/forked_preload.py) and each run is
a fresh fork of it: its own pid, session, working directory, environment, file descriptors 1
and 2, exit code or signal, and ``atexit`` at its end, as a fresh interpreter has. What differs
from one: the modules are imported before the run (the patches of ``enable_cpu_runtime`` are
not: the verb applies them itself) and torch's thread count is set from OMP_NUM_THREADS after
the fork. Tests of start-up itself (quiet output, import order, a hidden package, a GPU image,
signals during the import) start a fresh interpreter instead.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRELOAD = "tests.forked_preload"


def _child(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """A fork of the server: become `python ARGS` in CWD with ENV, writing to OUT and ERR."""
    os.setsid()  # killed whole on a timeout, with any process it starts
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        if fd == 2 and err == out:  # 2>&1
            os.dup2(1, 2)
            continue
        opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    if args[0] == "-m":  # the working directory first on sys.path, as `python -m` puts it
        sys.argv, sys.path[0] = [args[1], *args[2:]], cwd
    else:  # the script's folder first
        sys.argv, sys.path[0] = list(args), str(Path(cwd, args[0]).resolve().parent)
    code: object = 0
    try:
        if args[0] == "-m":
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exited:
        code = exited.code
    except BaseException:  # noqa: BLE001 - as the interpreter ends: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined] - the interpreter's exit: threads, then atexit
    atexit._run_exitfuncs()
    sys.stdout.flush(), sys.stderr.flush()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


@contextlib.contextmanager
def _checkout_first_on_pythonpath():
    """The fork server is a fresh `python -c`, which imports the preload through PYTHONPATH."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved]))
    try:
        yield
    finally:
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)


_context: list[multiprocessing.context.ForkServerContext] = []


def _server() -> multiprocessing.context.ForkServerContext:
    if not _context:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([PRELOAD])
        with _checkout_first_on_pythonpath():
            from multiprocessing import forkserver

            forkserver.ensure_running()
        _context.append(context)
    return _context[0]


def start(args: list[str], output: Path, *, cwd: Path | str = REPO, env: dict[str, str] | None = None,
          errors: Path | None = None) -> multiprocessing.Process:
    """``python ARGS`` started as a fork of the server, writing stdout to OUTPUT and stderr to
    ERRORS (or to OUTPUT too); the Process gives its pid (its session's too), exitcode and join()."""
    errors = errors or output
    output.touch(), errors.touch()
    process = _server().Process(target=_child, args=(list(map(str, args)), str(cwd),
                                                     dict(os.environ if env is None else env), str(output),
                                                     str(errors)))
    process.start()
    return process


def _wait(processes: list[multiprocessing.Process], timeout: float) -> bool:
    """Wait for every process; once one fails, or at the timeout, kill the others (as torchrun
    does). False when the timeout came first."""
    deadline = time.monotonic() + timeout
    while any(p.exitcode is None for p in processes):
        failed = any(p.exitcode not in (None, 0) for p in processes)
        if failed or time.monotonic() > deadline:
            for process in processes:
                if process.exitcode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                process.join()
            return failed
        multiprocessing.connection.wait([p.sentinel for p in processes if p.exitcode is None], 0.5)
    return True


def run(args: list[str], *, cwd: Path | str = REPO, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """What ``subprocess.run([sys.executable, *ARGS], cwd=CWD, env=ENV, capture_output=True,
    text=True, timeout=TIMEOUT)`` returns, run as a fork of the server."""
    with tempfile.TemporaryDirectory(prefix="forked_") as captured:
        out, err = Path(captured, "stdout"), Path(captured, "stderr")
        process = start(args, out, cwd=cwd, env=env, errors=err)
        finished = _wait([process], timeout)
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    if not finished:
        raise subprocess.TimeoutExpired([sys.executable, *args], timeout, stdout, stderr)
    return subprocess.CompletedProcess([sys.executable, *args], process.exitcode, stdout, stderr)


def run_ranks(args: list[str], nproc: int, *, cwd: Path | str = REPO, env: dict[str, str] | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node NPROC ARGS`` on this host, its ranks forks of the
    server: the environment torchrun gives a rank, and its rendezvous store, which this process
    holds as torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE: every rank a client of it),
    bound to a port the system picks. Returns each rank's stdout and stderr, rank after rank, as
    stdout, and the exit code of a rank that failed (rather than of one killed after it), or 0."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False)
    env = dict(os.environ if env is None else env)
    world = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
             "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
             "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
             "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "forked",
             "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}  # torchrun's default
    with tempfile.TemporaryDirectory(prefix="forked_ranks_") as captured:
        ranks = [start(args, Path(captured, f"{rank}.out"), cwd=cwd, errors=Path(captured, f"{rank}.err"),
                       env={**env, **world, "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)})
                 for rank in range(nproc)]
        finished = _wait(ranks, timeout)
        output = "".join(Path(captured, f"{rank}.{stream}").read_text(errors="replace")
                         for rank in range(nproc) for stream in ("out", "err"))
    del store  # held until every rank has ended
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *args]
    if not finished:
        raise subprocess.TimeoutExpired(command, timeout, output)
    failures = [rank.exitcode for rank in ranks if rank.exitcode != 0]
    code = next((c for c in failures if c != -signal.SIGKILL), failures[0] if failures else 0)  # not one killed here
    return subprocess.CompletedProcess(command, code, output, None)
