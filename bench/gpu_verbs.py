"""The recipe's verbs on a GPU node, in one call of a lent GPU machine (issue 27; 10 minutes a
call, and /tmp goes with the machine). Without Transformer Engine this is issue 27's stage 1
(Megatron's local layers, BF16); with it, the doctor's FP8 and packed-parity checks and the bench's
FP8 run join in by themselves.

    bash .gpu/kit/install-base.sh && source .gpu/kit/env.sh && \
        python3 -m bench.gpu_verbs --out "$OUT" --commit SHA      # the GPU machine
    python -m bench.gpu_verbs --device cpu --out /tmp/gpu_verbs      # the dry run, on a CPU machine

1. `nemo-topr doctor` in this process (versions, score, score vs cpu, train through finetune()
   with NCCL and the distributed optimizer, resume, export, and with TE train fp8 and packed
   parity; docs/cluster.md), its work directory kept;
2. what the doctor does not cover, each in its own process with a time limit:
     import         `nemo-topr import` of the doctor's HF model; scoring the Megatron checkpoint
                    gives the HF directory's scores
     shared prefix  `score-logprobs --shared-prefix` gives the plain scores
     score run      `score-logprobs` from the trained run directory (it must differ from the
                    starting model's scores: the trained weights were loaded)
     export scores  the Hugging Face export scores as the run directory does
     eval           `eval --backend transformers` of the export on a few GSM8K problems
     bench gpu      `python -m bench.run --sections gpu` (8B-shaped, 16 layers; BF16, and FP8 with TE)

OUT/gpu_verbs.json (device, versions, date, commit, every check so far) and OUT/logs.tar.gz (the
checks' logs) are rewritten after every check, so that a call cut off at its limit still returns
what ran; the bench's result is OUT/gpu_bench.json. Three files: a lent machine returns at most 8
(the first GPU call copied each log on its own, and they did not come back). Every check ends by
--deadline seconds from the start. `--only` runs the named checks, e.g. `--only "bench gpu"` in a
later call; the checks that need the doctor's files are then skipped, naming what they need.
`--doctor-table` takes the doctor's part from an earlier `nemo-topr doctor --json TABLE --work-dir
DIR` on the same device instead of running it again (DIR is then --work-dir).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import shlex
import shutil
import sys
import tarfile
import time
from pathlib import Path

import torch

from bench.common import git_output
from bench.gpu import ATTENTION_BACKENDS
from nemo_topr.model.device import DeviceError, add_device_argument, resolve_device
from nemo_topr.doctor.checks import PER_TOKEN_SCORE_BOUND, Files, diagnose, per_token_difference, scores_by_record
from nemo_topr.doctor.command import report, write_json
from nemo_topr.doctor.runner import Check, CheckFailed, Doctor
from nemo_topr.utils.outputs import fresh_output_dir, write_whole

BENCH_NOTE = ("bench/gpu.py as `python -m bench.run --sections gpu`, the 'bench gpu' check of `python -m "
              "bench.gpu_verbs`: the bench's environment.json and gpu.json as they came")
EXTRA_CHECKS = ("import", "shared prefix", "score run", "export scores", "eval", "bench gpu")
EVAL_PROBLEMS = 4


def commit_of_checkout() -> str | None:
    """HEAD, with "-dirty" when the tree has changes git would commit; None without git (the GPU
    machine gets the work tree without .git: pass --commit)."""
    head = git_output("rev-parse", "HEAD")
    return head and head + ("-dirty" if git_output("status", "--porcelain", "--untracked-files=no") else "")


def bench_gpu_summary(gpu: dict, path: Path) -> str:
    """One line from bench/gpu.py's results; a failed precision or TOPR step fails the check."""
    if gpu.get("skipped"):
        return f"not measured: {gpu['reason']}"
    def last_line(error: str) -> str:  # of a traceback; the whole of it is in gpu.json
        return error.strip().splitlines()[-1]

    failed = [f"{precision}: {last_line(error)}" for precision, error in gpu["errors"].items()
              if not error.startswith("skipped")]
    failed += [f"{run['precision']}: TOPR step: {last_line(run['topr_error'])}" for run in gpu["runs"] if run["topr_error"]]
    if failed:
        raise CheckFailed("; ".join(failed)[:600], f"see {path}")
    runs = [{"precision": run["precision"], "topr_over_sft_time": run["topr_over_sft_time"]["median"],
             **{key: run[key] for key in ("sft_mfu", "topr_mfu", "max_memory_allocated_gib")}} for run in gpu["runs"]]
    return json.dumps({"runs": runs, "fp8_minus_bf16": gpu.get("fp8_minus_bf16", {})})


def extras(doctor: Doctor, out: Path, wanted: set[str], bench_args: tuple[str, ...] = ()) -> None:
    """The checks that `nemo-topr doctor` does not make, on the doctor's files."""
    files, device = Files(doctor.work), doctor.device
    bound = PER_TOKEN_SCORE_BOUND[doctor.precision]

    def scored_by(name: str) -> Path:
        return doctor.work / f"scored_{name.replace(' ', '_')}.jsonl"

    def score(name: str, model: Path, *options: str) -> Path:
        scored = scored_by(name)
        doctor.command(name, files.score_args(model, scored, device, *options))
        values = list(scores_by_record(scored).values())
        if not values or not all(map(math.isfinite, values)):
            raise CheckFailed(f"scores of {model}: {len(values)}, not all finite", "see the scoring log")
        return scored

    def agree(scored: Path, reference: Path, what: str) -> str:
        per_token = per_token_difference(scored, reference, files)
        if per_token > bound:
            raise CheckFailed(f"{what}: {per_token:.2e} per token apart (bound {bound})", "see the scoring logs")
        return f"{what}: {per_token:.2e} per token apart (bound {bound} for {doctor.precision})"

    def import_checkpoint() -> str:
        megatron = doctor.work / "imported"
        shutil.rmtree(megatron, ignore_errors=True)
        doctor.command("import", ["import", str(files.model_dir), str(megatron)])
        return agree(score("score imported", megatron), files.scored, "Megatron checkpoint vs HF directory")

    def shared_prefix() -> str:
        return agree(score("score shared prefix", files.model_dir, "--shared-prefix"), files.scored,
                     "--shared-prefix vs plain")

    def score_run() -> str:
        moved = per_token_difference(score("score run", files.run_dir), files.scored, files)
        if moved == 0:
            raise CheckFailed("the run directory scores exactly as the starting model: its trained weights were "
                              "not loaded", "see the score run log: which checkpoint did it load?")
        return f"{moved:.2e} per token from the starting model's scores (the trained weights)"

    def export_scores() -> str:
        return agree(score("score export", files.hf_export), scored_by("score run"),
                     "Hugging Face export vs run directory")

    def evaluate() -> str:
        result = doctor.work / "eval.json"
        doctor.command("eval", ["eval", "--benchmark", "gsm8k", "--model", str(files.hf_export), "--backend",
                                "transformers", "--device", device, "--limit", str(EVAL_PROBLEMS),
                                "--num-samples", "2", "--max-new-tokens", "48", "--seed", "0", "--out", str(result)])
        found = json.loads(result.read_text())
        return json.dumps({key: found[key] for key in ("num_problems", "num_samples", "metrics", "grader_errors")})

    def bench_gpu() -> str:
        results = doctor.work / "bench"
        doctor.python("bench gpu", ["-m", "bench.run", "--sections", "gpu", "--out", str(results), *bench_args])
        gpu = json.loads((results / "gpu.json").read_text())
        write_json(out / "gpu_bench.json", {"note": BENCH_NOTE, "environment": json.loads(
            (results / "environment.json").read_text()), "bench_gpu": gpu})
        return bench_gpu_summary(gpu, out / "gpu_bench.json")

    for name, check, needs in (("import", import_checkpoint, ("score",)), ("shared prefix", shared_prefix, ("score",)),
                               ("score run", score_run, ("resume",)),
                               ("export scores", export_scores, ("export", "score run")),
                               ("eval", evaluate, ("export",)), ("bench gpu", bench_gpu, ())):
        if name in wanted:
            doctor.run(name, check, needs=needs)


def doctor_checks(path: Path, device: str, work: Path) -> list[Check]:
    """The checks of an earlier `nemo-topr doctor --json PATH --work-dir WORK` on this device."""
    try:
        table = json.loads(path.read_text())
        found_device, checks = table["device"], [Check(**check) for check in table["checks"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"bench.gpu_verbs: --doctor-table {path}: not a `nemo-topr doctor --json` table "
                         f"({type(error).__name__}: {error})") from None
    if found_device != device:
        raise SystemExit(f"bench.gpu_verbs: --doctor-table {path} is the doctor's on {found_device}, not on "
                         f"--device {device}")
    if not work.is_dir():
        raise SystemExit(f"bench.gpu_verbs: --doctor-table needs the doctor's --work-dir; {work} is not a directory")
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_verbs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(parser)
    parser.add_argument("--out", type=Path, required=True, help="results: gpu_verbs.json, logs.tar.gz, gpu_bench.json")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/nemo_topr_gpu_verbs"),
                        help="the doctor's model, data, runs (default: %(default)s; kept)")
    parser.add_argument("--deadline", type=float, default=540, help="seconds by which every check ends")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per check at most")
    parser.add_argument("--only", nargs="+", choices=("doctor", *EXTRA_CHECKS), help="run only these")
    parser.add_argument("--doctor-table", type=Path, help="the doctor's part from this `nemo-topr doctor --json` "
                        "table on the same device, run with --work-dir as its work directory: not run again")
    parser.add_argument("--commit", default=commit_of_checkout(), help="the project's commit (default: git's)")
    parser.add_argument("--bench-layers", type=int, default=16, help="bench gpu: the 8B-shaped model's depth")
    parser.add_argument("--bench-attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                        help="bench gpu: Megatron's attention backend (unfused: round a cuDNN that TE's fused "
                             "backward refuses, bench/README.md)")
    args = parser.parse_args(argv)
    if args.doctor_table and args.only and "doctor" in args.only:
        parser.error("--only doctor with --doctor-table: the table is the doctor's part")
    try:
        device = resolve_device(args.device, cuda_available=torch.cuda.is_available(), where="--device")
    except DeviceError as error:
        raise SystemExit(f"bench.gpu_verbs: {error}") from None
    earlier = doctor_checks(args.doctor_table, device, args.work_dir) if args.doctor_table else None
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    from nemo_topr.model.settings import transformer_engine_available

    header = {"commit": args.commit, "date_utc": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "transformer_engine": transformer_engine_available(), "python": sys.version.split()[0],
        "command": "python -m bench.gpu_verbs " + shlex.join(argv if argv is not None else sys.argv[1:])}

    def save(doctor: Doctor, finished: bool = False) -> None:
        write_json(args.out / "gpu_verbs.json", {**header, **report(doctor, finished),
                                                  "wall_s": round(time.monotonic() - started, 1)})
        logs = io.BytesIO()
        with tarfile.open(fileobj=logs, mode="w:gz") as tar:
            for log in sorted(doctor.work.glob("*.log")):
                tar.add(log, arcname=log.name)
        write_whole(args.out / "logs.tar.gz", logs.getvalue())

    deadline = started + args.deadline
    wanted = set(args.only or ("doctor", *EXTRA_CHECKS))
    if earlier is not None:  # what passed there counts as done here
        doctor = Doctor(device, args.work_dir.resolve(), args.timeout, deadline, save, checks=earlier,
                        done={check.name for check in earlier if check.status == "pass"})
        save(doctor)
    elif "doctor" in wanted:
        work = fresh_output_dir(args.work_dir, "nemo-topr doctor")  # a mistyped --work-dir is refused
        doctor = diagnose(device, work, args.timeout, deadline=deadline, after_check=save)
    else:  # the checks that need the doctor's files are skipped, naming what they need
        args.work_dir.mkdir(parents=True, exist_ok=True)
        doctor = Doctor(device, args.work_dir.resolve(), args.timeout, deadline, save)
    extras(doctor, args.out, wanted, ("--gpu-layers", str(args.bench_layers),
                                      "--gpu-attention-backend", args.bench_attention_backend))
    save(doctor, finished=True)
    failed = [c.name for c in doctor.checks if c.status == "fail"]
    print(f"\nbench.gpu_verbs on {device}: {'FAILED: ' + ', '.join(failed) if failed else 'all passed'} "
          f"({time.monotonic() - started:.0f} s); {args.out / 'gpu_verbs.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
