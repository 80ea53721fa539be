"""Prepared data at scale: synthetic GSM8K-length records at 10 k, 100 k and 1 M (not in `make test`).

    .venv/bin/python -m bench.data_scale                       # 10 k, 100 k, 1 M; in memory at 10 k and 100 k
    .venv/bin/python -m bench.data_scale --sizes 10000 --in-memory 10000

Per size, each step in a fresh process: `nemo-topr data prepare`'s preparation (`find_or_prepare`,
a process per core given) timed, wall and CPU (its workers' included), its bytes on disk; then a
start as `nemo-topr train` makes it with the set written (`ToprDatasetConfig.prepare` and the data
part of `training.recipe.prepare`: fingerprint, p~, the freed heap given back), timed, with the
process's private memory (`RssAnon`, /proc/self/status: memory-mapped pages are shared page
cache, not counted) before the data, once it is ready and after one pass over every global batch
(also after glibc's malloc_trim once more); that pass's batches are hashed. Where asked, the same
start on the in-memory path: its time (wall and CPU), memory and batch hash (equal hashes: bitwise
the same batches). 10 M is extrapolated linearly from 100 k -> 1 M and labelled so. Writes
bench/results/data_scale.json.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, environment, write_json

SEQ_LENGTH = 2048
GLOBAL_BATCH = 32
INSTRUCTION = " Show your work step by step, then give the final answer after ####."


def rss_anon() -> int:
    """This process's private resident memory, bytes, after a garbage collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def write_synthetic(path: Path, records: int) -> None:
    """GSM8K train questions with their gold answers, cycled: 8 samples a prompt, +-1 rewards."""
    from nemo_topr.data.prompts import load_gsm8k

    rows = load_gsm8k("train")
    with path.open("w", encoding="utf-8") as out:
        for k in range(records):
            row = rows[(k // 8) % len(rows)]
            completion = row["answer"]  # with its calculator annotations: ~320 tokens with the prompt
            out.write(json.dumps({"prompt": row["question"] + INSTRUCTION, "completion": completion,
                                  "prompt_id": k // 8,
                                  "sample_id": k % 8, "reward": -1.0 if k % 3 == 0 else 1.0,
                                  "behavior_logprob": -0.5 * len(completion)}) + "\n")


# --------------------------------------------------------------------------------------------
# The steps, each run in a fresh process (`--step`)


def step_prepare(data: Path, tokenizer: Path, prepared_dir: Path) -> dict:
    from transformers import AutoTokenizer  # noqa: F401  imported before the clock, as the in-memory start has it

    from nemo_topr.data.parallel_tokenization import cores_given
    from nemo_topr.data.prepared import PrepareSpec, find_or_prepare

    started, cpu_before = time.perf_counter(), _cpu_seconds()
    prepared, written = find_or_prepare(PrepareSpec(train_path=str(data), tokenizer_dir=str(tokenizer),
                                                    seq_length=SEQ_LENGTH), prepared_dir)
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_before
    assert written
    disk = sum(entry["bytes"] for entry in prepared.manifest["files"].values())
    return {"prepare_s": seconds, "prepare_cpu_s": cpu_seconds, "processes": cores_given(),
            "sequences": prepared.manifest["sequences"], "tokens": prepared.manifest["tokens"],
            "disk_bytes": disk, "prepared_set": str(prepared.path)}


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the preparation's workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def step_start(data: Path, tokenizer: Path, prepared_dir: Path | None) -> dict:
    """A start's data, as `training.recipe.prepare` readies it, then one pass over every global batch."""
    from nemo_topr.model import cpu_runtime

    cpu_runtime.import_bridge()
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.data import ToprDatasetConfig
    from nemo_topr.training.recipe import positive_share_in_use
    from nemo_topr.utils.memory import give_back_freed_memory

    before = rss_anon()
    started, cpu_before = time.perf_counter(), _cpu_seconds()
    config = ToprDatasetConfig(train_path=str(data), tokenizer_dir=str(tokenizer), seq_length=SEQ_LENGTH,
                               prepared_dir=str(prepared_dir) if prepared_dir else None)
    prepared = config.prepare(GLOBAL_BATCH)
    fingerprint = prepared.data_fingerprint()
    positive_share_in_use(ObjectiveConfig(), prepared)
    summary = prepared.summary()
    give_back_freed_memory()  # as `training.recipe.prepare` ends
    ready_s, ready_cpu_s = time.perf_counter() - started, _cpu_seconds() - cpu_before
    ready = rss_anon()
    dataset = config.build_datasets(None)[0]
    digest = hashlib.sha256()
    started = time.perf_counter()
    for first in range(0, len(dataset), GLOBAL_BATCH):
        batch = dataset.collate_fn([dataset[k] for k in range(first, first + GLOBAL_BATCH)])
        for name in sorted(batch):
            digest.update(name.encode())
            digest.update(batch[name].numpy().tobytes())
    pass_s, after_pass = time.perf_counter() - started, rss_anon()
    give_back_freed_memory()
    return {"data_ready_s": ready_s, "data_ready_cpu_s": ready_cpu_s, "rss_anon_before": before,
            "rss_anon_ready": ready, "rss_anon_after_pass": after_pass, "rss_anon_after_pass_trimmed": rss_anon(),
            "pass_s": pass_s,
            "batches_sha256": digest.hexdigest(), "fingerprint": fingerprint, "written": prepared.written,
            "rows": summary["rows"], "sequences": summary["sequences"]}


def _run_step(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.data_scale", "--step", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"step {args[0]} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _per_token_growth(low: dict, high: dict, key: str) -> float:
    grown = lambda run: run["start"][key] - run["start"]["rss_anon_before"]  # noqa: E731
    return (grown(high) - grown(low)) / (high["prepare"]["tokens"] - low["prepare"]["tokens"])


def measure(sizes: list[int], in_memory: list[int], work: Path) -> dict:
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    measured_at = environment()  # the commit and tree measured, before anything else runs
    build_tiny_tokenizer(work / "tokenizer")
    runs = {}
    for size in sizes:
        data = work / f"records_{size}.jsonl"
        write_synthetic(data, size)
        os.sync()  # on disk, as a user's data is: the preparation's fsyncs do not write it too
        prepared_dir = work / f"prepared_{size}"
        run = {"records": size, "data_file_bytes": data.stat().st_size,
               "prepare": _run_step("prepare", str(data), str(work / "tokenizer"), str(prepared_dir))}
        run["start"] = _run_step("start", str(data), str(work / "tokenizer"), str(prepared_dir))
        assert run["start"]["written"] is False, "the cached start wrote its set"
        run["bytes_per_token_on_disk"] = run["prepare"]["disk_bytes"] / run["prepare"]["tokens"]
        run["tokens_per_record"] = run["prepare"]["tokens"] / run["prepare"]["sequences"]
        run["prepare_s_per_record"] = run["prepare"]["prepare_s"] / size
        if size in in_memory:
            memory = _run_step("start", str(data), str(work / "tokenizer"), "")
            run["in_memory"] = memory
            run["in_memory_s_per_record"] = memory["data_ready_s"] / size
            run["prepare_over_in_memory_per_record"] = run["prepare_s_per_record"] / run["in_memory_s_per_record"]
            run["prepare_cpu_over_in_memory_cpu"] = (run["prepare"]["prepare_cpu_s"]
                                                     / memory["data_ready_cpu_s"])
            run["batches_bitwise_equal"] = memory["batches_sha256"] == run["start"]["batches_sha256"]
            run["fingerprints_equal"] = memory["fingerprint"] == run["start"]["fingerprint"]
        runs[size] = run
        shutil.rmtree(prepared_dir)
        data.unlink()
    result = {"environment": measured_at, "seq_length": SEQ_LENGTH, "global_batch_size": GLOBAL_BATCH,
              "cpu_cores_given": len(os.sched_getaffinity(0)), "runs": {str(size): run for size, run in runs.items()}}
    low, high = min(sizes), max(sizes)
    if high > low:
        result["rss_anon_growth_bytes_per_token"] = {
            "range": f"{low} -> {high} records",
            "data_ready": _per_token_growth(runs[low], runs[high], "rss_anon_ready"),
            "after_one_pass": _per_token_growth(runs[low], runs[high], "rss_anon_after_pass"),
            "after_one_pass_allocator_trimmed": _per_token_growth(runs[low], runs[high], "rss_anon_after_pass_trimmed")}
    if len(sizes) >= 2:
        a, b = sorted(sizes)[-2:]
        scale = lambda key, part: runs[b][part][key] + (runs[b][part][key] - runs[a][part][key]) * (  # noqa: E731
            (10_000_000 - b) / (b - a))
        result["extrapolated_10M_not_measured"] = {
            "from": f"linear in records through {a} and {b}",
            "prepare_s": scale("prepare_s", "prepare"), "disk_bytes": scale("disk_bytes", "prepare"),
            "cached_start_data_ready_s": scale("data_ready_s", "start")}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="records per size (comma-separated)")
    parser.add_argument("--in-memory", default="10000,100000", help="sizes also started on the in-memory path")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed)")
    parser.add_argument("--out", default="data_scale", help="results name under bench/results/")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        name, *paths = args.step
        if name == "prepare":
            print(json.dumps(step_prepare(*map(Path, paths))))
        else:
            data, tokenizer, prepared_dir = paths
            print(json.dumps(step_start(Path(data), Path(tokenizer), Path(prepared_dir) if prepared_dir else None)))
        return 0
    sizes = [int(size) for size in args.sizes.split(",")]
    in_memory = [int(size) for size in args.in_memory.split(",") if size]
    work = args.work or Path(tempfile.mkdtemp(prefix="data_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = measure(sizes, in_memory, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({key: value for key, value in result.items() if key != "environment"}, indent=1))
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
