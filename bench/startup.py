"""Section 6: time from process start to the first training step, HF start vs imported start.

The same `nemo-topr train` (tiny_cpu config, the same scored GSM8K records) starts as a fresh
process, either from a Hugging Face directory (AutoBridge converts the HF weights at start) or
from that directory's `nemo-topr import` checkpoint (the distributed checkpoint is loaded).
The two alternate (A B, B A, ...) in one bench run; each is timed from launch to Bridge's first
"iteration 1/" log line (wall clock, and the process's CPU time, which other load on shared
cores barely touches) and then stopped; the ratio imported / HF is paired within each
repetition. The one-off `nemo-topr import` is timed too.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, gsm8k_rows, summary, tiny_tokenizer, write_records

# HF LlamaConfig shapes (build_tiny_hf_llama keywords); "small" is bench/step.py's small model
MODELS = {
    "tiny": dict(num_layers=2, hidden_size=64, intermediate_size=172, num_heads=4, num_kv_heads=2),
    "small": dict(num_layers=4, hidden_size=256, intermediate_size=688, num_heads=8, num_kv_heads=4),
}
FIRST_STEP = re.compile(r"iteration\s+1/")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nemo_topr.cli", *args]


def _env(threads: int) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def seconds_to_first_step(base_model: Path, data: Path, run_dir: Path, threads: int) -> dict[str, float]:
    """Launch `nemo-topr train`; wall seconds until its first training step, and the process's
    CPU seconds up to then (plus the moment it takes to stop it: robust to other load)."""
    cpu, started = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(_command("train", "--config-name", "tiny_cpu", f"base_model={base_model}",
                                     f"run_dir={run_dir}", f"dataset.train_path={data}", "dataset.too_long=drop"),
                            cwd=REPO, env=_env(threads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    tail: list[str] = []
    wall = None
    try:
        for line in proc.stdout:
            if FIRST_STEP.search(line):
                wall = time.perf_counter() - started
                break
            tail = (tail + [line])[-30:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if wall is None:
        raise RuntimeError(f"nemo-topr train ({base_model}) ended before its first step:\n{''.join(tail)}")
    return {"wall": wall, "cpu": _children_cpu() - cpu}


def measure_model(name: str, tmp: Path, reps: int, threads: int) -> dict:
    from safetensors.torch import load_file

    from nemo_topr.model.providers import build_tiny_hf_llama

    hf = build_tiny_hf_llama(tmp / name / "hf", tiny_tokenizer(), **MODELS[name])
    started = time.perf_counter()
    subprocess.run(_command("import", str(hf), str(tmp / name / "imported")), cwd=REPO, env=_env(threads),
                   check=True, capture_output=True)
    import_seconds = time.perf_counter() - started
    rows = gsm8k_rows(64)
    data = write_records(tmp / name / "scored.jsonl", [r["question"] for r in rows], [r["answer"] for r in rows])
    starts = {"hf": hf, "imported": tmp / name / "imported"}
    seconds: dict[str, dict[str, list[float]]] = {clock: {"hf": [], "imported": []} for clock in ("wall", "cpu")}
    for rep in range(reps):
        for label in (("hf", "imported") if rep % 2 == 0 else ("imported", "hf")):
            measured = seconds_to_first_step(starts[label], data, tmp / name / f"run_{label}_{rep}", threads)
            for clock, value in measured.items():
                seconds[clock][label].append(value)
    parameters = sum(tensor.numel() for tensor in load_file(str(hf / "model.safetensors")).values())
    return {"model": name, "parameters": parameters, "import_wall_seconds": import_seconds, "raw_seconds": seconds,
            **{clock: {"hf_start_seconds": summary(t["hf"]), "imported_start_seconds": summary(t["imported"]),
                       "imported_over_hf": summary([b / a for a, b in zip(t["hf"], t["imported"], strict=True)])}
               for clock, t in seconds.items()}}


def measure(models: list[str], reps: int, threads: int = 1) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return [measure_model(name, Path(tmp), reps, threads) for name in models]
