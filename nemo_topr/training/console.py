"""What `nemo-topr train` shows on the console, and the run's full log in RUN_DIR/logs/.

Everything a training process writes to its stdout and stderr (Bridge's config dump and
per-interval lines, Megatron's prints, the `[Gloo]` lines torch's C++ writes on CPU) goes, at the
file-descriptor level, to RUN_DIR/logs/ (`log_file`): one file per start and rank (under Slurm the
job's and srun's output files then hold only the console). The console keeps:

- nemo-topr's own lines (``[nemo-topr] ...``), each wrapped to at most MAX_WIDTH characters:
  what the run trains, one line per logging interval (`nemo_topr.training.iteration_line`), the
  warnings, the end-of-run summary;
- everything on stderr (a Python warning not known to be harmless, an error);
- everything, with ``--verbose`` (NEMO_TOPR_VERBOSE=1).

Each ``[nemo-topr] WARNING:`` line is kept and repeated in the summary (`summary_lines`).
Before the log file can be opened (a new run's directory exists only once `recipe.prepare`'s
checks pass) the lines are held in memory; a start that fails before it shows them on the
console instead, so nothing is lost.
"""

from __future__ import annotations

import ctypes
import os
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from nemo_topr.model.quiet import VERBOSE_ENV

LOG_DIR = "logs"
MAX_WIDTH = 160
OURS = "[nemo-topr] "
WARNING = OURS + "WARNING: "


def log_file(run_dir: Path, rank: int, environ: Mapping[str, str] = os.environ, now: float | None = None) -> Path:
    """This start's log on launcher rank `rank`. Under Slurm, beside srun's per-rank console
    files in slurm/topr_job.sh's directory for the start (logs/job-JOB-start-RESTART/); else
    logs/train-UTCTIME-rankR.log."""
    job = environ.get("SLURM_JOB_ID")
    if job:
        return Path(run_dir) / LOG_DIR / f"job-{job}-start-{environ.get('SLURM_RESTART_COUNT', '0')}" / \
            f"train-rank{rank}.log"
    return Path(run_dir) / LOG_DIR / f"train-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-rank{rank}.log"


def shown(line: str, *, verbose: bool) -> list[str]:
    """The console lines for one line of stdout: nemo-topr's own, wrapped to MAX_WIDTH (continued
    with an indent), or every line unchanged when `verbose`; [] for the rest (the log keeps it)."""
    if verbose:
        return [line]
    if not line.startswith(OURS):
        return []
    return textwrap.wrap(line, MAX_WIDTH, subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False) or [line]


class RunConsole:
    """Captures file descriptors 1 and 2 while open; the log file is named by `open_log`."""

    def __init__(self, *, verbose: bool | None = None, environ: Mapping[str, str] = os.environ) -> None:
        self.verbose = environ.get(VERBOSE_ENV) == "1" if verbose is None else verbose
        self.warnings: list[str] = []
        self.log_path: Path | None = None
        self._log = None
        self._held: list[bytes] = []  # for the log, until it is opened
        self._unshown: list[bytes] = []  # of those, what the console did not show
        self._lock = threading.Lock()
        self._kept: dict[int, int] = {}
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RunConsole:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            self._kept[fd] = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._forward, args=(read_end, fd), name=f"console-fd{fd}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def open_log(self, run_dir: Path, rank: int) -> Path:
        """Start writing this start's log (`log_file`), with what was held until now."""
        path = log_file(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._log = path.open("ab")
            self._log.writelines(self._held)
            self._log.flush()
            self._held, self._unshown = [], []
            self.log_path = path
        return path

    def _forward(self, read_end: int, fd: int) -> None:
        with os.fdopen(read_end, "rb") as lines:
            for raw in lines:
                text = raw.decode("utf-8", "replace").rstrip("\n")
                out = [text] if fd == 2 else shown(text, verbose=self.verbose)
                with self._lock:
                    if self._log is None:
                        self._held.append(raw)
                        if not out:
                            self._unshown.append(raw)
                    else:
                        self._log.write(raw)
                        self._log.flush()
                    if text.startswith(WARNING):
                        self.warnings.append(text[len(OURS):])
                if out:
                    os.write(self._kept[fd], ("\n".join(out) + "\n").encode())

    def __exit__(self, kind, error, trace) -> None:  # noqa: ANN001
        sys.stdout.flush()
        sys.stderr.flush()
        ctypes.CDLL(None).fflush(None)  # C stdio's buffers, into the pipes
        for fd, kept in self._kept.items():
            os.dup2(kept, fd)  # the pipe's last write end closes: the forwarder reads to its end
        for thread in self._threads:
            thread.join(timeout=10)  # a child process still holding a pipe keeps it open
        for kept in self._kept.values():
            os.close(kept)
        with self._lock:
            if self._log is not None:
                self._log.close()
            elif self._unshown:  # ended before the log existed (a refused start): show what it held
                os.write(1, b"".join(self._unshown))


def summary_lines(*, trained: str, metrics: str | None, checkpoint: str | None, log_path: Path | None,
                  warnings: list[str]) -> list[str]:
    """The end of a run on the console: what was trained, the last interval's metrics, the
    checkpoint, the full log, and every warning of the run again (one line each, as first printed)."""
    lines = [f"{OURS}summary: {trained}"]
    if metrics:
        lines.append(f"{OURS}  final: {metrics}")
    if checkpoint:
        lines.append(f"{OURS}  checkpoint: {checkpoint}")
    if log_path:
        lines.append(f"{OURS}  full log: {log_path}")
    unique = list(dict.fromkeys(warnings))
    lines.append(f"{OURS}  warnings: {len(unique)}" + (" (repeated from above)" if unique else ""))
    lines += [f"{OURS}  {warning}" for warning in unique]
    return lines


def data_lines(summary: dict, seq_length: int) -> list[str]:
    """What the run trains on, from `recipe.prepare`'s data report: counts, packing, drops (a warning)."""
    lines = [f"{OURS}data: {summary['records_in']} records in, {summary['records_used']} used, "
             f"{summary['records_dropped']} dropped; {summary['sequences']} sequences "
             f"({summary['positives']} with reward >= 0) of {summary['prompts']} prompts in {summary['rows']} rows of "
             f"{seq_length} tokens ({summary['padding_share']:.1%} padding); p~ {summary['p_tilde']}"]
    if summary["records_dropped"]:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in summary["dropped"].items())
        first = "; ".join(f"first {reason}: {error}" for reason, error in summary["first_error"].items())
        lines.append(f"{WARNING}dropped {summary['records_dropped']} of {summary['records_in']} records ({reasons}); "
                     f"{first}")
    if "prepared_set" in summary:  # a requeued start finds the set its first start wrote
        lines.append(f"{OURS}prepared data: wrote {summary['prepared_set']} (this start tokenized and packed the "
                     "records)" if summary["prepared_set_written"] else
                     f"{OURS}prepared data: found {summary['prepared_set']} (this start wrote nothing)")
    return lines


def layout_lines(container, world_size: int, resume_iteration: int | None) -> list[str]:  # noqa: ANN001
    """The parallel layout, precision and where training starts, from Bridge's config container."""
    model, train = container.model, container.train
    sizes = {name: getattr(model, f"{key}_parallel_size", 1) or 1
             for name, key in (("TP", "tensor_model"), ("PP", "pipeline_model"), ("CP", "context"))}
    data_parallel = world_size // max(1, sizes["TP"] * sizes["PP"] * sizes["CP"])
    precision = (f"fp8 ({model.fp8})" if getattr(model, "fp8", None) else "bf16" if model.bf16
                 else "fp16" if model.fp16 else "fp32")
    split = " x ".join(f"{name} {size}" for name, size in sizes.items())
    start = (f"resuming from iteration {resume_iteration}" if resume_iteration else "a new run, from iteration 0")
    return [f"{OURS}layout: {world_size} rank(s) = {split} x DP {data_parallel}; precision {precision}; global batch "
            f"{train.global_batch_size} rows, micro batch {train.micro_batch_size}",
            f"{OURS}training: {train.train_iters} iterations, {start}; checkpoints every "
            f"{container.checkpoint.save_interval} in {container.checkpoint.save}"]
