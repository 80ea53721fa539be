"""Shared pieces of the benchmark: environment record, interleaved A/B timing, statistics,
peak-memory probes, the GSM8K records/tokenizer every section starts from."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


# --------------------------------------------------------------------------------------------
# Statistics and timing
# --------------------------------------------------------------------------------------------

def summary(values: list[float]) -> dict:
    """Median and spread of repeated measurements (quartiles by linear interpolation)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3,
            "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


def interleaved(a: Callable[[], object], b: Callable[[], object], reps: int, warmup: int = 1) -> dict:
    """Time `a` and `b` alternately (A B, B A, A B, ...) and pair each repetition.

    Two clocks: CPU time of this process (`time.process_time`; with one torch thread it is
    barely touched by other processes sharing the cores) and wall time. Returns each side's
    per-repetition seconds and the paired ratios b/a on both clocks, so load that hits one
    repetition hits both of its sides about equally.
    """
    for _ in range(warmup):
        a()
        b()
    seconds = {"cpu": {"a": [], "b": []}, "wall": {"a": [], "b": []}}
    for rep in range(reps):
        for label, side in ((("a", a), ("b", b)) if rep % 2 == 0 else (("b", b), ("a", a))):
            wall, cpu = time.perf_counter(), time.process_time()
            side()
            seconds["cpu"][label].append(time.process_time() - cpu)
            seconds["wall"][label].append(time.perf_counter() - wall)
    result = {}
    for clock, sides in seconds.items():
        ratios = [tb / ta for ta, tb in zip(sides["a"], sides["b"], strict=True)]
        result[clock] = {"ratio_b_over_a": summary(ratios), "a": summary(sides["a"]), "b": summary(sides["b"]),
                         "b_minus_a": summary([tb - ta for ta, tb in zip(sides["a"], sides["b"], strict=True)])}
    return result


# --------------------------------------------------------------------------------------------
# Peak memory on CPU
# --------------------------------------------------------------------------------------------

class PeakRss:
    """Peak resident set size of this process over a block, from the kernel's high-water mark.

    Linux keeps VmHWM (= getrusage's ru_maxrss) per process; writing "5" to
    /proc/self/clear_refs resets it to the current RSS (Linux >= 4.0). So
    ``extra = VmHWM after the block - VmRSS at its start`` is the block's extra peak, whatever
    allocator torch uses (tracemalloc does not see torch's allocations). Large tensors are
    mmap'ed by glibc and unmapped on free, so RSS follows tensor lifetimes closely.
    """

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.resettable = True
        except OSError:
            self.resettable = False

    @staticmethod
    def _status_kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"{field} not in /proc/self/status")

    def __enter__(self) -> "PeakRss":
        if self.resettable:
            Path("/proc/self/clear_refs").write_text("5")
        self.start = self._status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        self.peak = self._status_kib("VmHWM") * 1024
        self.extra = self.peak - self.start


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_output(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment() -> dict:
    """What the numbers depend on: machine, load, library versions, date, commit."""
    import torch

    from nemo_topr import installed_version

    dirty = git_output("status", "--porcelain", "--untracked-files=no")
    mem_total = None
    try:
        mem_total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_output("rev-parse", "HEAD"),
        "git_dirty_tracked_files": bool(dirty) if dirty is not None else None,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": mem_total,
        "load_average": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "transformers": installed_version("transformers"),
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_json(name: str, payload: dict, out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# Data every section starts from
# --------------------------------------------------------------------------------------------

def tiny_tokenizer():
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


def gsm8k_rows(limit: int | None = None) -> list[dict]:
    from nemo_topr.data.prompts import load_gsm8k

    rows = load_gsm8k("train")
    return rows if limit is None else rows[:limit]


def write_records(path: Path, prompts: list[str], completions: list[str], *, scored: bool = True) -> Path:
    """A records JSONL: rewards +1/-1 (every third is a negative), log mu when `scored`."""
    with path.open("w", encoding="utf-8") as out:
        for k, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            record = {"prompt": prompt, "completion": completion, "reward": -1.0 if k % 3 == 0 else 1.0,
                      "prompt_id": k, "sample_id": 0}
            if scored:  # about a random 512-token model's log-prob per token, +-1 per sequence
                record["behavior_logprob"] = -6.2 * (1 + len(completion) // 3) + (1.0 if k % 2 else -1.0)
            out.write(json.dumps(record) + "\n")
    return path


def gsm8k_sequences(tokenizer, tmp: Path, *, limit: int | None, max_seq_length: int):
    """GSM8K train question -> gold completion, through the project's validation and
    tokenization; sequences longer than `max_seq_length` are dropped (counted)."""
    from nemo_topr.data.prompts import gsm8k_gold_completion
    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import tokenize_records

    rows = gsm8k_rows(limit)
    path = write_records(tmp / "gsm8k.jsonl", [r["question"] for r in rows],
                         [gsm8k_gold_completion(r["answer"]) for r in rows])
    return tokenize_records(load_records(path), tokenizer, max_seq_length=max_seq_length, strict=False)
