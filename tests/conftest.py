"""Shared test fixtures: an in-process Megatron world of one, ranks forked as torchrun starts
them, and the environment under which a test's subprocesses import this checkout's ``nemo_topr``.

A script run by path (``python tests/workers/WORKER.py``) puts its own folder, not the working
directory, first on ``sys.path``, so without ``checkout_env()`` it imports ``nemo_topr`` from
wherever the venv's editable install points -- another checkout when the venv is shared.
(``python -m`` and ``python -c`` with ``cwd=REPO`` put REPO first themselves.)"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).parent / "workers"

# One torch thread in every test process and in what it starts (unless set already): `make test`'s
# two workers share two cores, and a second OpenMP thread per process spins while the other
# worker's processes hold the cores. A test about threads sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The modules whose tests start a real Slurm (the `slurm_cluster` or `slurm_two_nodes` fixture).
# Each cluster is one unit of work, so that a single xdist worker starts and stops it: the two
# clusters run side by side (scripts/slurm_cluster.sh: their own ports, configs and state).
REAL_SLURM_MODULES = ("tests/slurm/test_scripts.py", "tests/slurm/test_one_node.py", "tests/slurm/test_two_nodes.py",
                      "tests/slurm/test_srun.py")
TWO_NODE_MODULES = ("tests/slurm/test_two_nodes.py",)

# The modules that read one run made once per process (tests/doctor/cpu_doctor.py): one unit.
DOCTOR_MODULES = ("tests/doctor/test_doctor.py", "tests/bench/test_gpu_verbs.py")


def xdist_unit(nodeid: str) -> str:
    """The unit of work a test belongs to on `make test`'s xdist workers: its module, so that the
    module's fixtures are built once; "real_slurm_two_nodes" for TWO_NODE_MODULES, "real_slurm"
    for the other REAL_SLURM_MODULES, "doctor" for DOCTOR_MODULES."""
    module = nodeid.split("::")[0]
    if module in TWO_NODE_MODULES:
        return "real_slurm_two_nodes"
    return "real_slurm" if module in REAL_SLURM_MODULES else "doctor" if module in DOCTOR_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with xdist_unit as the scope. (xdist's ``loadgroup`` cannot group under
    pytest 9: it renames items through ``item._nodeid``, which pytest 9's ``nodeid`` ignores.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the units with the most `slow` tests first, since xdist hands units out in
    collection order (``--no-loadscope-reorder``) and a long unit started last leaves a worker idle."""
    if not hasattr(config, "workerinput"):
        return  # serial: collection order unchanged
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(xdist_unit(item.nodeid), []).append(item)
    ranked = sorted(units.values(), key=lambda unit: -sum(bool(item.get_closest_marker("slow")) for item in unit))
    items[:] = [item for unit in ranked for item in unit]


@contextlib.contextmanager
def _real_slurm(*options: str):
    """``scripts/slurm_cluster.sh [options] start``, yielding its output; stopped at the end if
    this started it. Unavailable (not root, no apt-get...): skipped with the reason, or a failure
    where NEMO_TOPR_REQUIRE_SLURM=1 (set by .ci/run, so CI cannot skip them)."""
    script = REPO / "scripts" / "slurm_cluster.sh"
    was_up = subprocess.run([script, *options, "status"], capture_output=True).returncode == 0
    started = subprocess.run([script, *options, "start"], capture_output=True, text=True)
    if started.returncode != 0:
        reason = f"real Slurm unavailable: {script} {' '.join(options)} start failed: {started.stderr.strip()[-2000:]}"
        if os.environ.get("NEMO_TOPR_REQUIRE_SLURM") == "1":
            pytest.fail(reason + " (NEMO_TOPR_REQUIRE_SLURM=1 requires these tests)")
        pytest.skip(reason)
    yield started.stdout
    if not was_up:
        subprocess.run([script, *options, "stop"], check=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm (scripts/slurm_cluster.sh), started once."""
    with _real_slurm():
        yield


@pytest.fixture(scope="session")
def slurm_two_nodes():
    """A second, separate real Slurm of two nodes, each a network namespace with its own address
    and hostname (scripts/slurm_cluster.sh --two-nodes), started once; yields the SLURM_CONF its
    clients need."""
    with _real_slurm("--two-nodes") as output:
        yield re.search(r"^export SLURM_CONF=(\S+)$", output, re.MULTILINE).group(1)


@pytest.fixture(scope="session")
def megatron_world():
    """CPU runtime on, gloo world of one, TP=PP=1, for in-process Megatron tests."""
    from nemo_topr.model import cpu_runtime
    from nemo_topr.utils.distributed import initialize_model_parallel

    cpu_runtime.enable_cpu_runtime()
    initialize_model_parallel(1, 1)
    yield


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(iteration, value) of one metric a run logged to RUN_DIR/tensorboard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def cli_verb(verb: str):
    """`nemo-topr VERB` run in this process: the verb's `main` as `cli.main` runs it, a refusal
    printed as its one line on stderr and its exit code returned."""
    from nemo_topr import cli

    return lambda argv: cli.main([verb, *argv])


def refusal(check, *args, **kwargs) -> tuple[int, str | None, str | None]:
    """(exit code, key, where) of the refusal (`UserError`) `check(*args, **kwargs)` raises: a verb's `main`,
    whose refusal `cli.main` prints and ends with that code, or a pure check. Its words are the golden file's."""
    from nemo_topr.errors import UserError

    with pytest.raises(UserError) as error:
        check(*args, **kwargs)
    return error.value.exit_code, error.value.key, error.value.where


def checkout_env(**extra: str) -> dict[str, str]:
    """``os.environ`` with this checkout first on PYTHONPATH, plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


@functools.cache
def _tiny_tokenizer_files() -> dict[str, bytes]:
    """The files of a tiny chat tokenizer (Llama 3's special tokens and template), built once."""
    import tempfile

    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    with tempfile.TemporaryDirectory() as directory:
        build_tiny_tokenizer(directory, vocab_size=300, corpus=["a small corpus: 12 + 7 = 19."])
        return {path.name: path.read_bytes() for path in Path(directory).iterdir()}


def torch_dist_save(iteration_dir: Path, size: int = 4) -> Path:
    """A real torch_dist save (torch.distributed.checkpoint, as Megatron writes one) of one tensor
    of `size` floats in `iteration_dir`: its .metadata and shard, which the verbs reading a
    checkpoint compare (`model_source.check_intact`). Bridge's other files are the caller's."""
    import torch
    from torch.distributed.checkpoint import save

    save({"weight": torch.arange(float(size))}, checkpoint_id=str(iteration_dir), no_dist=True)
    return iteration_dir


def placeholder_hf_model(directory: Path, config: dict | str | None = None, *, tokenizer: bool = True) -> Path:
    """`directory`, made shaped like a Hugging Face model as nemo_topr.model.source inspects it:
    config.json (`config`, by default a Llama's architecture; a str is written as it is, so it may
    be malformed), a weights file and, unless `tokenizer` is false, a tiny tokenizer that loads
    (`generate` and `eval` check the prompts with it before sampling). No weights load: the file
    is a safetensors header listing the tensors of a sized Llama config, each of no bytes (the
    shapes an 8B or 70B model has, without its gigabytes), and empty for any other config."""
    from nemo_topr.model.hf_weights import llama_weight_shapes

    directory.mkdir(parents=True)
    if config is None:
        config = {"architectures": ["LlamaForCausalLM"]}
    (directory / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    try:
        shapes = llama_weight_shapes(config if isinstance(config, dict) else json.loads(config))
    except (KeyError, ValueError, TypeError, AttributeError):  # not a sized Llama config
        shapes = None
    weights = b""
    if shapes:
        header = json.dumps({name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
                             for name, shape in shapes.items()}).encode()
        weights = len(header).to_bytes(8, "little") + header
    (directory / "model.safetensors").write_bytes(weights)
    if tokenizer:
        for name, content in _tiny_tokenizer_files().items():
            (directory / name).write_bytes(content)
    return directory


def with_cuda_only_packages(root: Path) -> dict[str, str]:
    """`checkout_env` in which Transformer Engine 2.17.1 and Apex are installed (in `root`) and no GPU
    is visible, as on a GPU node's CPU run. Using either raises: `transformer_engine` itself imports
    (and has its dist-info, as the doctor reads versions) but `transformer_engine.pytorch`, which
    Megatron-Core's probe imports, raises, as does `apex`. The real ones import on such a node and
    fail later, in their kernels, on CPU tensors."""
    te = root / "transformer_engine"
    (te / "pytorch").mkdir(parents=True)
    (te / "__init__.py").write_text('__version__ = "2.17.1"\n')
    (te / "pytorch" / "__init__.py").write_text("raise RuntimeError('transformer_engine.pytorch was imported')\n")
    (root / "transformer_engine-2.17.1.dist-info").mkdir()
    (root / "transformer_engine-2.17.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformer_engine\nVersion: 2.17.1\n")
    (root / "apex").mkdir()
    (root / "apex" / "__init__.py").write_text("raise RuntimeError('apex was imported')\n")
    return checkout_env(PYTHONPATH=os.pathsep.join([str(REPO), str(root)]), CUDA_VISIBLE_DEVICES="",
                        OMP_NUM_THREADS="1")


def run_distributed(worker: str, nproc: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``tests/workers/<worker>`` as NPROC ranks, as ``torchrun --standalone`` starts them on
    this host's loopback, each a fork of tests/forked.py's server (Megatron imported once): a rank's
    environment, its rendezvous store bound to a port the system picks (no port chosen ahead that
    another test's launch could take first), the others killed once one fails or at the timeout.
    Raises with the ranks' output when they fail. iterate's torchrun command and the Slurm tests
    launch real torchrun."""
    from tests import forked

    env = checkout_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    try:
        proc = forked.run_ranks([str(WORKERS / worker), *args], nproc, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{worker} x{nproc} timed out after {timeout}s:\n{expired.output[-4000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"{worker} x{nproc} exited {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc


def launched_runs(worker: str, root: Path, launches: dict[int, tuple[str, ...]]) -> Callable[[str], Path]:
    """ROOT/NAME of a run that ``tests/workers/<worker>`` makes among others: ``launches`` maps a
    world size to the runs one torchrun launch of that many ranks makes in turn (``worker ROOT
    NAME ...``), started when a test first asks for one of them. A run the launch did not finish
    (no ROOT/NAME/done) fails the test that asks for it, with the launch's output."""

    @functools.cache
    def launch(world: int) -> str:
        try:
            run_distributed(worker, world, str(root), *launches[world])
        except AssertionError as failed:
            return str(failed)
        return ""

    def run_of(name: str) -> Path:
        world = next(world for world, names in launches.items() if name in names)
        failure = launch(world)
        if not (root / name / "done").exists():
            raise AssertionError(f"{name} did not finish in {worker}'s launch of {world} ranks:\n{failure}")
        return root / name

    return run_of


def port_below_ephemeral_range() -> int:
    """A free port for ranks that must be told it ahead and bind it only after their start-up
    (the fake-srun jobs of tests/slurm/test_scripts.py, ~20-30 s later). The OS hands out ports of its
    ephemeral range (ip_local_port_range) to every bind to port 0 and outgoing connection, the
    other pytest worker's launches included, so a free port from there could be taken first
    (EADDRINUSE); below it only an explicit bind could, and the real Slurm jobs' ports
    (29500 + job id, slurm/topr_job.sh) lie above the range drawn from."""
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = range(10000, min(lowest_ephemeral, 29500))
    for port in random.sample(candidates, 50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port among 50 drawn from {candidates.start}-{candidates.stop - 1}")


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory `name`, built by `build(directory)` once per test session: on `make test`'s
    xdist workers the first to ask builds it under a lock in the session's shared temporary root
    (`getbasetemp()`'s parent there), and the others wait for it and read it. A build that failed
    leaves no directory, so the next asker tries again and fails the same way."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (directory / ".built").exists():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            (partial / ".built").touch()
            partial.rename(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_graded(tmp_path_factory):
    """A tiny HF Llama and 48 graded samples of it (the demo's first two stages), built once."""

    def build(root: Path) -> None:
        from nemo_topr.demo import build_graded_records
        from nemo_topr.model.providers import build_tiny_hf_llama
        from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

        build_tiny_hf_llama(root / "tiny", build_tiny_tokenizer())
        (root / "graded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in build_graded_records(16)))

    root = built_once(tmp_path_factory, "tiny_graded", build)
    return root / "tiny", root / "graded.jsonl"


@pytest.fixture(scope="session")
def demo_inputs(tiny_graded, tmp_path_factory):
    """`tiny_graded` scored by `score-logprobs` (the demo's first three stages); built once for the
    Slurm tests of every module."""
    model_dir, graded = tiny_graded

    def build(root: Path) -> None:
        subprocess.run([sys.executable, "-m", "nemo_topr.cli", "score-logprobs", "--model", str(model_dir),
                        "--data", str(graded), "--out", str(root / "scored.jsonl"), "--seq-length", "512",
                        "--device", "cpu"], cwd=REPO, check=True, capture_output=True)

    return model_dir, built_once(tmp_path_factory, "demo_inputs", build) / "scored.jsonl"
