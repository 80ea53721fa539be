"""The harness tests this checkout: pytest, run_distributed's workers and scripts started with
checkout_env() import ``nemo_topr`` from REPO, even when PYTHONPATH names another checkout; and
tests/forked.py's runs and ranks behave as a fresh `python` and torchrun's ranks do."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nemo_topr
from nemo_topr.utils import distributed
from tests.conftest import REPO, WORKERS, checkout_env, port_below_ephemeral_range, run_distributed


def _imported_from(output: str) -> Path:
    found = re.findall(r"nemo_topr imported from (\S+)", output)
    assert found, output[-3000:]
    return Path(found[-1]).resolve()


@pytest.fixture
def other_checkout(tmp_path, monkeypatch) -> Path:
    """A decoy ``nemo_topr`` on PYTHONPATH: a subprocess that does not put REPO first imports it."""
    decoy = tmp_path / "other_checkout" / "nemo_topr"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(decoy.parent))
    return decoy.parent


def test_pytest_imports_this_checkout():
    assert Path(nemo_topr.__file__).resolve().is_relative_to(REPO)


def test_scripts_run_with_checkout_env_import_this_checkout(other_checkout):
    proc = subprocess.run([sys.executable, str(WORKERS / "which_checkout.py")], env=checkout_env(),
                          capture_output=True, text=True, timeout=120, check=True)
    assert _imported_from(proc.stdout).is_relative_to(REPO)
    # the decoy is real: without checkout_env() the same script imports it
    plain = subprocess.run([sys.executable, str(WORKERS / "which_checkout.py")],
                           capture_output=True, text=True, timeout=120, check=True)
    assert _imported_from(plain.stdout).is_relative_to(other_checkout)


@pytest.mark.slow
def test_distributed_workers_import_this_checkout_and_need_no_port_chosen_ahead(other_checkout, monkeypatch):
    """Both from one launch. The ranks import this checkout with the decoy on PYTHONPATH. A free
    port picked ahead for torchrun, bound later, could be taken first by another pytest worker's
    launch (EADDRINUSE). Here the port free_port() would give is taken before the launch, as that
    launch would: two ranks still meet."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(distributed, "free_port", lambda: taken.getsockname()[1])
        out = run_distributed("which_checkout.py", 2, timeout=300).stdout
    imported = re.findall(r"nemo_topr imported from (\S+)", out)
    assert len(imported) == 2, out[-3000:]
    assert all(Path(path).resolve().is_relative_to(REPO) for path in imported), out[-3000:]


def test_a_port_told_ahead_is_one_the_os_never_hands_out():
    """The fake-srun jobs' ranks are told their port and bind it ~20-30 s later. A free port of
    the ephemeral range (what distributed.free_port() gives) can be handed meanwhile to another
    process's bind to port 0; one below the range cannot, and stays clear of 29500 + job id."""
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {port_below_ephemeral_range() for _ in range(20)}
    assert all(1024 <= port < min(lowest_ephemeral, 29500) for port in ports), (ports, lowest_ephemeral)
    assert len(ports) > 1, ports  # drawn, not one fixed port that two runs on a host would share
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", ports.pop()))  # free when given
    assert distributed.free_port() >= lowest_ephemeral  # the contrast: the old choice lies in the range


PROBE = """
import atexit, os, sys, time, torch
if sys.argv[1] == "sleep":
    time.sleep(600)
print(sys.argv[1:], os.getcwd(), os.environ.get("PROBE"), "megatron.bridge" in sys.modules, torch.get_num_threads(),
      os.getsid(0) == os.getpid())
print("on stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
if sys.argv[1] == "raise":
    raise ValueError("raised")
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.slow  # the fork server imports Megatron once per pytest worker
def test_a_forked_run_is_a_process_of_its_own_with_megatron_imported(tmp_path):
    """tests/forked.py: the script's arguments, working directory, environment, exit code, streams
    and atexit, as a fresh `python SCRIPT ARGS` has them; Megatron-Bridge imported before it
    started; the thread count from OMP_NUM_THREADS; a session of its own, killed at the timeout."""
    from tests import forked

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "PROBE": "p", "OMP_NUM_THREADS": "1"}
    proc = forked.run([str(script), "3", "x"], cwd=tmp_path, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        3, f"['3', 'x'] {tmp_path} p True 1 True\natexit ran\n", "on stderr\n")
    raised = forked.run([str(script), "raise"], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "2"})
    assert raised.returncode == 1 and raised.stdout.startswith(f"['raise'] {tmp_path} p True 2 True\n")
    assert raised.stderr.startswith("on stderr\nTraceback") and raised.stderr.endswith("ValueError: raised\n")
    version = forked.run(["-m", "nemo_topr.cli", "--version"])
    assert version.returncode == 0 and version.stdout.startswith(f"nemo-topr {nemo_topr.__version__} (")
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([str(script), "sleep"], cwd=tmp_path, timeout=5)


RANK_PROBE = """
import os, sys, time
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
if os.environ["RANK"] == "1":
    sys.exit(3)
time.sleep(600)
"""


@pytest.mark.slow  # the fork server imports Megatron once per pytest worker
def test_forked_ranks_end_together_when_one_fails(tmp_path):
    """tests/forked.py's run_ranks, as torchrun: once rank 1 fails, rank 0 is killed (it would wait
    for ever in a collective), and the launch's exit code is rank 1's, not the killed rank's."""
    from tests import forked

    script = tmp_path / "ranks.py"
    script.write_text(RANK_PROBE)
    started = time.monotonic()
    proc = forked.run_ranks([str(script)], 2, timeout=300)
    assert time.monotonic() - started < 60
    assert (proc.returncode, proc.stdout) == (3, "rank 0 of 2\nrank 1 of 2\n")
