"""`nemo-topr doctor`: check a new node (or container) end to end before a real job.

    nemo-topr doctor [--device cuda|cpu|auto] [--json PATH] [--work-dir DIR] [--timeout SECONDS]

Builds a small Llama-shaped model and a graded dataset in code, then runs the user-facing verbs
on them, each in its own process with its own time limit, and prints one pass/fail table:

    versions          torch, CUDA, cuDNN, NCCL, Transformer Engine, Apex, Megatron-Core, Bridge; fails
                      when torch loaded a cuDNN other than its own
    te attention      TE's attention forward and backward on packed THD, as the step calls it (TE only)
    score             `score-logprobs` on the device
    score vs cpu      the same scores on the CPU; per-token agreement within the precision's bound
    train             `train` through Bridge's finetune() (BF16 on cuda, fp32 on cpu), stopped after
                      iteration 1 with a checkpoint (train.exit_interval); |log rho| at step 0 (the
                      model scored its own data) and a finite loss
    resume            the same command again: resumes from the checkpoint and finishes
    train fp8         mu scored in FP8 (`--train-config`), then one FP8 iteration: a finite loss;
                      |log rho| at step 0 and FP8 - BF16 scores recorded (Transformer Engine only)
    export            `export` to Hugging Face, reloaded with transformers: same tensors, finite logits
    packed parity     Transformer Engine's THD attention against local layers on packed rows: per-token
                      cross-entropy, per-sequence log pi, TOPR gradients (TE only)

A step whose prerequisite failed is skipped, naming it; a failure names what to fix; no failure
stops the others. Exit status 0 when nothing failed. `--json` writes the same table, rewritten after
every check, so that a doctor killed from outside (a job's time limit) still leaves what it found.

On CPU it runs in the test suite, with TE absent and with it installed. On cuda it ran on one H200
without Transformer Engine (every check passed; train fp8 and packed parity skipped,
bench/results/gpu_verbs_h200_2026-11-26_0e4bf37.json) and with TE 2.17.1 (every check passed:
bench/results/gpu_verbs_h200_2026-11-26_f0673b4_te.json, before packed parity compared gradients,
which it did since with TE's unfused attention only; docs/cluster.md says what ran where).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nemo_topr import installed_version
from nemo_topr.utils.arguments import Parser, positive_seconds
from nemo_topr.model.device import DeviceError, add_device_argument, resolve_device
from nemo_topr.model.settings import CUDNN_922_ATTRIBUTE, CUDNN_922_FIX, loaded_cudnn, own_cudnn_fix
from nemo_topr.utils.outputs import OutputError, add_overwrite_argument, fresh_output_dir, writable_output_file, write_whole

TRAIN_RECORDS_PER_PROMPT = 3  # build_graded_records: a gold and two wrong completions
PROMPTS = 4  # 12 records packed into 512-token rows, global batch 4 rows: 2 iterations
STOP_AT = 1  # the first training process stops (with a checkpoint) after this iteration
# |log rho| at step 0 when the starting model scored its own data: only rounding, which grows with
# the precision's epsilon times the completion length (tens of tokens here)
LOG_RATIO_BOUND = {"fp32": 1e-3, "bf16": 0.1}
# mean |difference| per completion token between device and CPU scores
PER_TOKEN_SCORE_BOUND = {"fp32": 1e-4, "bf16": 0.05}
SCORE_SEQ_LENGTH = 512  # every scoring of the graded records, so that any two compare
# the FP8 model settings of `train fp8`: mu is scored with them (a YAML) and training uses them
FP8_MODEL = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}
RERUN_ALONE = "rerun this check alone with more time"
# The H200's failure (2026-11-26): TE's library set an attribute that cuDNN has only since 9.22
CUDNN_TOO_OLD = (f"Transformer Engine was built against a newer cuDNN than the one loaded ({CUDNN_922_ATTRIBUTE} "
                 f"exists since cuDNN 9.22): {CUDNN_922_FIX}")


@dataclass
class Check:
    name: str
    status: str = "pass"  # pass | fail | skipped
    seconds: float = 0.0
    detail: str = ""
    fix: str = ""


class CheckFailed(Exception):
    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.fix = fix


class Skipped(Exception):
    pass


@dataclass
class Doctor:
    device: str
    work: Path
    timeout: float
    deadline: float | None = None  # time.monotonic() by which every check must end (a lent machine)
    after_check: Callable[[Doctor], None] | None = None  # e.g. rewrite the JSON table
    checks: list[Check] = field(default_factory=list)
    done: set[str] = field(default_factory=set)

    @property
    def precision(self) -> str:
        return "bf16" if self.device == "cuda" else "fp32"

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, name: str, step: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        """Run one check; record pass/fail/skipped with its time and what to fix."""
        check = Check(name)
        started = time.monotonic()
        missing = [need for need in needs if need not in self.done]
        try:
            if missing:
                raise Skipped(f"needs {', '.join(missing)}, which did not pass")
            check.detail = step()
            self.done.add(name)
        except Skipped as skipped:
            check.status, check.detail = "skipped", str(skipped)
        except CheckFailed as failure:
            check.status, check.detail, check.fix = "fail", str(failure), failure.fix
        except Exception as error:  # noqa: BLE001 - a doctor reports every failure and goes on
            check.status, check.detail = "fail", f"{type(error).__name__}: {error}"
            check.fix = "an error inside the doctor itself; report it with the table"
        check.seconds = round(time.monotonic() - started, 1)
        self.checks.append(check)
        print(f"[doctor] {check.name}: {check.status} ({check.seconds} s) {check.detail}", flush=True)
        if self.after_check:
            self.after_check(self)

    def time_limit(self) -> float:
        """Seconds the next command may take: the per-check limit, cut to what the deadline leaves."""
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left < 1:
            raise CheckFailed("no time left before the deadline", RERUN_ALONE)
        return min(self.timeout, left)

    def command(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
                expect: tuple[int, ...] = (0,)) -> str:
        """Run `nemo-topr ARGS` with this check's time limit; its output goes to WORK/NAME.log."""
        return self.python(name, ["-m", "nemo_topr.cli", *args], env=env, expect=expect)

    def python(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
               expect: tuple[int, ...] = (0,)) -> str:
        """Run `python ARGS` with this check's time limit; its output goes to WORK/NAME.log."""
        log = self.work / f"{name.replace(' ', '_')}.log"
        limit = self.time_limit()
        with log.open("w") as out:
            process = subprocess.Popen([sys.executable, *args], stdout=out,
                                       stderr=subprocess.STDOUT, env=env or self.env(), start_new_session=True)
            try:
                code = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if limit < self.timeout:  # the deadline cut it short: not evidence of a hang
                    raise CheckFailed(f"cut off by the deadline after {limit:.0f} s, unfinished (log: {log})",
                                      RERUN_ALONE) from None
                raise CheckFailed(f"no result within {limit:.0f} s (log: {log})",
                                  "a hang: look at the log's last lines (NCCL, a compile, a download); "
                                  "raise --timeout on a slow node") from None
        if code not in expect:
            tail = log.read_text().strip().splitlines()[-3:]
            what = f"nemo-topr {args[2]}" if args[:2] == ["-m", "nemo_topr.cli"] else "python " + " ".join(args[:2])
            raise CheckFailed(f"`{what}` exited {code} (log: {log}): {' | '.join(tail)[-600:]}",
                              f"the log names the failing call; fix it and rerun `nemo-topr doctor --device "
                              f"{self.device}`")
        return str(log)


def versions() -> dict[str, str | None]:
    """Versions of what the GPU path depends on (None: not installed / not available)."""
    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    cudnn, refusal = loaded_cudnn()  # a refusal is recorded, and the versions check fails
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": f"error: {refusal}" if refusal else None if cudnn is None else str(cudnn),
            "nccl": nccl, "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "transformer_engine": installed_version("transformer_engine", "transformer-engine"),
            "apex": installed_version("apex"), "megatron_core": installed_version("megatron-core", "megatron_core"),
            "megatron_bridge": installed_version("megatron-bridge", "megatron_bridge")}


def check_versions(found: dict[str, str | None], device: str) -> str:
    """The versions check's verdict on what `versions()` found."""
    if device == "cuda" and not found["cuda"]:
        raise CheckFailed("torch has no CUDA build", "install the CUDA build of torch (requirements-gpu.txt)")
    if (found["cudnn"] or "").startswith("error:"):
        raise CheckFailed(f"cuDNN {found['cudnn']}", own_cudnn_fix())
    return ", ".join(f"{k} {v}" for k, v in found.items() if v)


def attention_fix(detail: str) -> str:
    """What to do when TE's attention fails on the node, from the failure's text."""
    if CUDNN_922_ATTRIBUTE in detail:
        return CUDNN_TOO_OLD
    return ("check the TE and cuDNN versions in the table (NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 shows TE's choice of "
            "backend); model.attention_backend=unfused avoids cuDNN attention")


# marks the line a check's own process prints as its result: other lines may follow it (torch's
# NCCL warning at exit came last in packed parity's log on the H200, and the table showed it)
RESULT_PREFIX = "doctor result: "


def report_result(line: str) -> None:
    print(RESULT_PREFIX + line, flush=True)


def result_line(log: str) -> str:
    """A check's result as its process printed it with `report_result`."""
    results = [line for line in Path(log).read_text().splitlines() if line.startswith(RESULT_PREFIX)]
    if not results:
        raise CheckFailed(f"the check's process printed no result line (log: {log})", "see the log")
    return results[-1][len(RESULT_PREFIX):]


def scores_by_record(path: Path) -> dict[tuple[str, int], float]:
    return {(r["prompt_id"], r["sample_id"]): r["behavior_logprob"]
            for r in map(json.loads, path.read_text().splitlines())}


class Files:
    """What the doctor builds and makes in its work directory (bench/gpu_verbs.py reuses them)."""

    def __init__(self, work: Path) -> None:
        self.work, self.model_dir, self.run_dir = work, work / "tiny_llama_hf", work / "run"
        self.graded, self.scored, self.hf_export = work / "graded.jsonl", work / "scored.jsonl", work / "hf_export"

    @functools.cached_property
    def completion_tokens(self) -> int:
        """Completion tokens of the graded records, EOS included (read once they are built)."""
        from nemo_topr.data.tokenization import load_tokenizer

        tokenizer = load_tokenizer(self.model_dir)
        return sum(len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) + 1
                   for r in map(json.loads, self.graded.read_text().splitlines()))

    def score_args(self, model: Path, out: Path, device: str, *options: str) -> list[str]:
        """`nemo-topr score-logprobs` of the graded records by model, written to out."""
        return ["score-logprobs", "--model", str(model), "--data", str(self.graded), "--out", str(out),
                "--seq-length", str(SCORE_SEQ_LENGTH), "--device", device, *options]


def per_token_difference(scored_a: Path, scored_b: Path, files: Files) -> float:
    """Mean |difference| per completion token (incl. EOS) between two scorings of files.graded."""
    a, b = scores_by_record(scored_a), scores_by_record(scored_b)
    if a.keys() != b.keys():
        raise CheckFailed(f"{scored_a} and {scored_b} score different records", "see the scoring logs")
    return sum(abs(a[k] - b[k]) for k in a) / files.completion_tokens


def _tensorboard(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [e.value for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def diagnose(device: str, work: Path, timeout: float, *, deadline: float | None = None,
             after_check: Callable[[Doctor], None] | None = None) -> Doctor:
    """Every check, in order; returns the doctor with its table."""
    from nemo_topr.model.settings import transformer_engine_available
    from nemo_topr.training.recipe import EXIT_REQUEUE

    doctor = Doctor(device, work, timeout, deadline, after_check)
    work.mkdir(parents=True, exist_ok=True)
    files = Files(work)
    model_dir, graded, scored, run_dir = files.model_dir, files.graded, files.scored, files.run_dir
    te = transformer_engine_available()
    no_te = "Transformer Engine is not installed (pip install -r requirements-gpu.txt, or the NGC container)"

    def needs_te_on_cuda(what: str) -> None:
        if not te:
            raise Skipped(f"{what}: {no_te}")
        if device != "cuda":
            raise Skipped(f"{what}: Transformer Engine's kernels need CUDA")

    def te_attention() -> str:
        needs_te_on_cuda("TE's attention on packed THD")
        try:
            log = doctor.python("te attention", ["-m", "nemo_topr.doctor_attention"])
        except CheckFailed as failure:
            raise CheckFailed(str(failure), attention_fix(str(failure))) from None
        return result_line(log)

    def build() -> str:
        from nemo_topr.demo import build_graded_records
        from nemo_topr.model.providers import build_tiny_hf_llama
        from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

        # FP8 GEMMs need every dimension a multiple of 16 (the demo's 172-wide MLP is not); eval's
        # 8-shot GSM8K prompt is ~3,000 tiny-tokenizer tokens, which `generate` keeps within the context
        build_tiny_hf_llama(model_dir, build_tiny_tokenizer(), intermediate_size=176, max_position_embeddings=4096)
        records = build_graded_records(PROMPTS)
        graded.write_text("".join(json.dumps(r) + "\n" for r in records))
        return f"2-layer Llama ({model_dir}), {len(records)} graded records"

    def score() -> str:
        doctor.command("score", files.score_args(model_dir, scored, device))
        values = list(scores_by_record(scored).values())
        if len(values) != PROMPTS * TRAIN_RECORDS_PER_PROMPT or not all(math.isfinite(v) for v in values):
            raise CheckFailed(f"{len(values)} scores, finite: {all(map(math.isfinite, values))}",
                              "scores must be finite for every record: check the model build in the log")
        return f"{len(values)} records, mean log mu {sum(values) / len(values):.3f}"

    def score_vs_cpu() -> str:
        if device == "cpu":
            raise Skipped("the device is the CPU: nothing to compare")
        on_cpu = work / "scored_cpu.jsonl"
        doctor.command("score_cpu", files.score_args(model_dir, on_cpu, "cpu"),
                       env={**doctor.env(), "CUDA_VISIBLE_DEVICES": ""})
        per_token = per_token_difference(scored, on_cpu, files)
        bound = PER_TOKEN_SCORE_BOUND[doctor.precision]
        if per_token > bound:
            raise CheckFailed(f"device and CPU scores differ by {per_token:.2e} per token (bound {bound})",
                              "wrong numerics on the device: check the TE/cuDNN versions in the table")
        return f"{per_token:.2e} per token (bound {bound} for {doctor.precision})"

    def train_args(data: Path) -> list[str]:
        return ["train", "--config-name", "tiny_cpu", f"device={device}", f"base_model={model_dir}",
                f"dataset.train_path={data}", "checkpoint.save_interval=1"]

    def train() -> str:
        doctor.command("train", [*train_args(scored), f"run_dir={run_dir}", f"train.exit_interval={STOP_AT}"],
                       expect=(EXIT_REQUEUE,))
        log_ratio, losses = _tensorboard(run_dir, "log_ratio_abs_mean"), _tensorboard(run_dir, "topr_loss")
        if len(losses) != STOP_AT or not all(map(math.isfinite, losses)):
            raise CheckFailed(f"losses {losses} (expected {STOP_AT} finite)", "a non-finite loss: see the log")
        bound = LOG_RATIO_BOUND[doctor.precision]
        if not log_ratio or log_ratio[0] > bound:
            raise CheckFailed(f"|log rho| at step 0 is {log_ratio[:1]} (bound {bound}): training and scoring "
                              "disagree about the starting model", "score with the precision you train with "
                              "(score-logprobs --precision / --train-config)")
        return f"stopped at iteration {STOP_AT} with a checkpoint; |log rho| at step 0 {log_ratio[0]:.2e}"

    def resume() -> str:
        doctor.command("resume", [*train_args(scored), f"run_dir={run_dir}"])
        losses = _tensorboard(run_dir, "topr_loss")
        marker = run_dir / "COMPLETED"
        completed = int(marker.read_text()) if marker.is_file() else 0
        if completed <= STOP_AT or len(losses) != completed or not all(map(math.isfinite, losses)):
            raise CheckFailed(f"completed at iteration {completed}, losses {losses}", "see the resume log")
        return f"resumed from iteration {STOP_AT}, completed at {completed}"

    def train_fp8() -> str:
        needs_te_on_cuda("FP8 training")
        # mu scored with the FP8 numerics training uses (docs/training.md, "mu and rho")
        fp8_config, scored_fp8, run_fp8 = work / "fp8.yaml", work / "scored_fp8.jsonl", work / "run_fp8"
        fp8_config.write_text("model:\n" + "".join(f"  {key}: {value}\n" for key, value in FP8_MODEL.items()))
        doctor.command("score_fp8", files.score_args(model_dir, scored_fp8, device, "--train-config", str(fp8_config)))
        doctor.command("train_fp8", [*train_args(scored_fp8), f"run_dir={run_fp8}",
                                     *(f"model.{key}={value}" for key, value in FP8_MODEL.items()),
                                     f"train.exit_interval={STOP_AT}"], expect=(EXIT_REQUEUE,))
        losses, log_ratio = _tensorboard(run_fp8, "topr_loss"), _tensorboard(run_fp8, "log_ratio_abs_mean")
        if not losses or not all(map(math.isfinite, losses)) or not log_ratio:
            raise CheckFailed(f"FP8 losses {losses}, |log rho| {log_ratio}", "see the FP8 log")
        # recorded, not bounded: no FP8 run has measured it yet (issue 27)
        return (f"{len(losses)} FP8 iteration(s), loss {losses[-1]:.4f}; |log rho| at step 0 {log_ratio[0]:.2e} "
                f"(mu scored in FP8); FP8 vs BF16 scores {per_token_difference(scored_fp8, scored, files):.2e} "
                "per token")

    def export() -> str:
        from transformers import AutoModelForCausalLM

        hf_out = files.hf_export
        doctor.command("export", ["export", "--ckpt", str(run_dir), "--hf-out", str(hf_out), "--device", device])
        exported = AutoModelForCausalLM.from_pretrained(str(hf_out), dtype=torch.float32)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        shapes = {k: tuple(v.shape) for k, v in exported.state_dict().items()}
        if shapes != {k: tuple(v.shape) for k, v in base.state_dict().items()}:
            raise CheckFailed("the export's tensors differ from the base model's in names or shapes",
                              "the HF mapping of Bridge does not match this model")
        logits = exported(torch.arange(1, 9)[None]).logits
        if not torch.isfinite(logits).all():
            raise CheckFailed("the exported model gives non-finite logits", "see the export log")
        return f"{len(shapes)} tensors reloaded with transformers, finite logits"

    def parity() -> str:
        needs_te_on_cuda("compares TE's THD attention with local layers")
        try:
            log = doctor.python("packed parity", ["-m", "nemo_topr.doctor_parity"])
        except CheckFailed as failure:
            raise CheckFailed(str(failure), "TE and local layers disagree on packed rows (attention across "
                                            "sequences, or its gradients): check the TE version in the table; "
                                            "`python -m nemo_topr.doctor_parity --attention-backend unfused` "
                                            "tells TE's cuDNN attention apart") from None
        return result_line(log)

    doctor.run("versions", lambda: check_versions(versions(), device))
    doctor.run("te attention", te_attention, needs=("versions",))
    doctor.run("build", build)
    doctor.run("score", score, needs=("build",))
    doctor.run("score vs cpu", score_vs_cpu, needs=("score",))
    doctor.run("train", train, needs=("score",))
    doctor.run("resume", resume, needs=("train",))
    doctor.run("train fp8", train_fp8, needs=("score",))
    doctor.run("export", export, needs=("train",))
    doctor.run("packed parity", parity, needs=("versions",))
    return doctor


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  status   seconds  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<7}  {c.seconds:>7}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<{width}}  {'':<7}  {'':>7}  fix: {c.fix}")
    return "\n".join(lines)


def report(doctor: Doctor, finished: bool) -> dict:
    """The table as JSON; `passed` only once every check has run and none failed."""
    failed = any(c.status == "fail" for c in doctor.checks)
    return {"device": doctor.device, "finished": finished, "passed": finished and not failed,
            "versions": versions(), "checks": [asdict(c) for c in doctor.checks]}


def write_json(path: Path, content: dict) -> None:
    """Replace path atomically: a reader (or a kill) never sees half a table."""
    write_whole(path, (json.dumps(content, indent=2) + "\n").encode())


def json_outside_work_dir(json_path: Path, work_dir: Path) -> None:
    """Refuse a --json that is --work-dir, holds it or lies in it: the doctor makes that directory
    (the table's write then fails after the first check), fills it with its own files and folders
    and empties it when rerun (the table would be deleted)."""
    table, work = json_path.resolve(), work_dir.resolve()
    if table == work:
        raise OutputError(f"--json {json_path} is --work-dir, a directory the doctor makes; give another file")
    if work.is_relative_to(table):
        raise OutputError(f"--json {json_path} holds --work-dir {work_dir}, a directory the doctor makes; "
                          "give another file")
    if table.is_relative_to(work):
        raise OutputError(f"--json {json_path} is inside --work-dir {work_dir}, which the doctor fills with its own "
                          "files and empties when rerun; give a file outside it")


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr doctor", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_argument(parser)
    parser.add_argument("--json", type=Path, help="also write the table (and versions) as JSON here")
    add_overwrite_argument(parser)
    parser.add_argument("--work-dir", type=Path, help="keep the model, data, runs and logs here: a new or empty "
                        "directory, or an earlier doctor's, emptied first (default: a temporary directory, removed "
                        "when every check passed)")
    parser.add_argument("--timeout", type=positive_seconds, default=600,
                        help="seconds per check (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device, cuda_available=torch.cuda.is_available(), where="--device")
    except DeviceError as error:
        raise SystemExit(f"nemo-topr doctor: {error}") from None
    try:
        if args.json and args.work_dir:
            json_outside_work_dir(args.json, args.work_dir)
        if args.json:
            writable_output_file(args.json, "--json", overwrite=args.overwrite)
    except OutputError as error:
        raise SystemExit(f"nemo-topr doctor: {error}") from None
    try:  # a rerun in the same --work-dir starts from nothing, as the first run did
        work = fresh_output_dir(args.work_dir, "nemo-topr doctor") if args.work_dir else \
            Path(tempfile.mkdtemp(prefix="nemo-topr-doctor-"))
    except OutputError as error:
        raise SystemExit(f"nemo-topr doctor: --work-dir {error}") from None
    progress = (lambda so_far: write_json(args.json, report(so_far, False))) if args.json else None
    doctor = diagnose(device, work.resolve(), args.timeout, after_check=progress)
    failed = [c.name for c in doctor.checks if c.status == "fail"]
    print(f"\nnemo-topr doctor --device {device}: {'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
    print(table(doctor.checks))
    if args.json:
        write_json(args.json, report(doctor, True))
    if args.work_dir is None and not failed:
        shutil.rmtree(work, ignore_errors=True)
    elif failed:
        print(f"logs: {work}")
    return 1 if failed else 0
