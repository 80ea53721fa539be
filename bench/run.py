"""``make bench`` / ``python -m bench.run``: every section, then bench/results/*.json and RESULTS.md.

Sections that build Megatron models or measure peak memory run in fresh subprocesses (TP=2 under
``torch.distributed.run`` with two gloo processes); the data sections run in this process.
``--quick`` shrinks every size (the smoke test); ``--sections`` picks a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, RESULTS, environment, write_json

SECTIONS = ("step", "logprob", "packing", "pipeline", "syncs", "shared_prefix", "startup", "gpu")

# Full and quick sizes. Full: about 7 minutes on 2 shared cores.
FULL = {
    "step": [{"tp": 1, "models": "tiny,small", "reps": 8}, {"tp": 2, "models": "tiny", "reps": 6}],
    "logprob": [{"tp": 1, "tokens": 2048, "dtype": "float32", "reps": 3},
                {"tp": 1, "tokens": 2048, "dtype": "bfloat16", "reps": 3},
                {"tp": 2, "tokens": 2048, "dtype": "float32", "reps": 3}],
    "packing_limit": None, "pipeline_limit": None, "pipeline_reps": 3,
    "syncs": [{"seq_length": 512, "rows": 2, "microbatches": 4}],
    "startup": {"models": ["tiny", "small"], "reps": 3},
    "shared_prefix": [{"questions": 64, "samples": 16, "time_questions": 1, "reps": 3}],
}
QUICK_MODEL = {"shape": {"num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 2,
                         "num_query_groups": 1, "vocab_size": 512}, "seq_length": 256, "rows": 1, "microbatches": 2}
QUICK = {
    "step": [{"tp": 1, "models": "tiny", "reps": 2, "model_spec": QUICK_MODEL}],
    "logprob": [{"tp": 1, "tokens": 128, "dtype": "float32", "reps": 1}],
    "packing_limit": 120, "pipeline_limit": 200, "pipeline_reps": 1,
    "syncs": [{"seq_length": 256, "rows": 1, "microbatches": 2}],
    "startup": {"models": ["tiny"], "reps": 1},
    # a smoke test, whose figures nobody reads: no untimed warm-up, half of the costliest section
    "shared_prefix": [{"questions": 2, "samples": 4, "time_questions": 1, "reps": 1, "warmup": 0}],
}


def _python_module(module: str, args: list[str], nproc: int, threads: int) -> None:
    """Run ``python -m module args`` (under torch.distributed.run when nproc > 1), fail loudly."""
    from nemo_topr.utils.distributed import standalone_torchrun

    torchrun = standalone_torchrun(nproc, "--local-addr=127.0.0.1") if nproc > 1 else []
    cmd = [sys.executable, *torchrun, "-m", module, *args, "--threads", str(threads)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def run_workers(module: str, configs: list[dict], tmp: Path, threads: int) -> list[dict]:
    """Run `module` once per config (its keys become --options; "tp" also sets the process
    count) and collect what each run wrote (a result or a list of them)."""
    results = []
    for k, config in enumerate(configs):
        out = tmp / f"{module}_{k}.json"
        args = [item for key, value in config.items() for item in
                (f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value))]
        _python_module(module, [*args, "--out", str(out)], config.get("tp", 1), threads)
        written = json.loads(out.read_text())
        results += written if isinstance(written, list) else [written]
    return results


def main(argv: list[str] | None = None) -> int:
    from bench.gpu import ATTENTION_BACKENDS

    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (1: ratios robust to other load on the cores)")
    parser.add_argument("--llama3-tokenizer", default=os.environ.get("NEMO_TOPR_LLAMA3_TOKENIZER"),
                        help="a Llama 3 tokenizer.json: packing also with real Llama 3 token counts")
    parser.add_argument("--gpu-layers", type=int, default=16, help="gpu section: the 8B-shaped model's depth")
    parser.add_argument("--gpu-attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                        help="gpu section: Megatron's attention backend (model.attention_backend)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    out = Path(args.out)
    started = time.perf_counter()
    results: dict = {"environment": environment()}
    results["environment"].update(quick=args.quick, threads_per_process=args.threads)
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for section in sections:
            print(f"[bench] {section} ...", flush=True)
            begin = time.perf_counter()
            if section == "step":
                results["step"] = run_workers("bench.step", sizes["step"], Path(tmp), args.threads)
            elif section == "logprob":
                results["logprob"] = run_workers("bench.logprob", sizes["logprob"], Path(tmp), args.threads)
            elif section == "packing":
                from bench import packing

                results["packing"] = packing.measure(sizes["packing_limit"], args.llama3_tokenizer)
            elif section == "pipeline":
                from bench import pipeline

                results["pipeline"] = pipeline.measure(sizes["pipeline_limit"], sizes["pipeline_reps"])
            elif section == "syncs":  # a fresh process: it imports Bridge for the SFT loss
                results["syncs"] = run_workers("bench.syncs", sizes["syncs"], Path(tmp), args.threads)[0]
            elif section == "startup":
                from bench import startup

                results["startup"] = startup.measure(**sizes["startup"], threads=args.threads)
            elif section == "shared_prefix":  # a fresh process: it builds Megatron models
                results["shared_prefix"] = run_workers("bench.shared_prefix", sizes["shared_prefix"], Path(tmp),
                                                       args.threads)[0]
            elif section == "gpu":
                from bench import gpu

                results["gpu"] = (gpu.measure(layers=args.gpu_layers, attention_backend=args.gpu_attention_backend)
                                  if not args.quick else {"skipped": True, "reason": "--quick"})
            seconds[section] = time.perf_counter() - begin
            print(f"[bench] {section} done in {seconds[section]:.0f} s", flush=True)
    results["environment"].update(section_seconds=seconds, total_seconds=time.perf_counter() - started,
                                  load_average_end=list(os.getloadavg()))
    from bench.report import headline, write_markdown

    results["headline"] = headline(results)
    for name, payload in results.items():
        write_json(name, payload if isinstance(payload, dict) else {"results": payload}, out)
    markdown = write_markdown(results, out / "RESULTS.md")
    print(markdown)
    if out.resolve() == RESULTS.resolve():  # the committed results: docs/performance.md quotes them
        from bench import docs_figures

        docs_figures.main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
