"""The doctor's checks, in the order they run: each builds on what the checks it needs made in the
work directory (`Files`) and runs the user-facing verbs in processes of their own (`Doctor`).
The module docstring of `nemo_topr.doctor.command` lists what each check proves."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable

import torch

from nemo_topr.doctor.runner import CheckFailed, Doctor, Skipped, result_line
from nemo_topr.doctor.versions import attention_fix, check_versions, versions

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

NO_TE = "Transformer Engine is not installed (pip install -r requirements-gpu.txt, or the NGC container)"


def needs_te_on_cuda(doctor: Doctor, what: str) -> None:
    from nemo_topr.model.settings import transformer_engine_available

    if not transformer_engine_available():
        raise Skipped(f"{what}: {NO_TE}")
    if doctor.device != "cuda":
        raise Skipped(f"{what}: Transformer Engine's kernels need CUDA")


def versions_check(doctor: Doctor, files: Files) -> str:
    return check_versions(versions(), doctor.device)


def te_attention(doctor: Doctor, files: Files) -> str:
    needs_te_on_cuda(doctor, "TE's attention on packed THD")
    try:
        log = doctor.python("te attention", ["-m", "nemo_topr.doctor.te_attention"])
    except CheckFailed as failure:
        raise CheckFailed(str(failure), attention_fix(str(failure))) from None
    return result_line(log)


def build(doctor: Doctor, files: Files) -> str:
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.demo import build_graded_records
    from nemo_topr.model.providers import build_tiny_hf_llama

    # FP8 GEMMs need every dimension a multiple of 16 (the demo's 172-wide MLP is not); eval's
    # 8-shot GSM8K prompt is ~3,000 tiny-tokenizer tokens, which `generate` keeps within the context
    build_tiny_hf_llama(files.model_dir, build_tiny_tokenizer(), intermediate_size=176, max_position_embeddings=4096)
    records = build_graded_records(PROMPTS)
    files.graded.write_text("".join(json.dumps(r) + "\n" for r in records))
    return f"2-layer Llama ({files.model_dir}), {len(records)} graded records"


def score(doctor: Doctor, files: Files) -> str:
    doctor.command("score", files.score_args(files.model_dir, files.scored, doctor.device))
    values = list(scores_by_record(files.scored).values())
    if len(values) != PROMPTS * TRAIN_RECORDS_PER_PROMPT or not all(math.isfinite(v) for v in values):
        raise CheckFailed(f"{len(values)} scores, finite: {all(map(math.isfinite, values))}",
                          "scores must be finite for every record: check the model build in the log")
    return f"{len(values)} records, mean log mu {sum(values) / len(values):.3f}"


def score_vs_cpu(doctor: Doctor, files: Files) -> str:
    if doctor.device == "cpu":
        raise Skipped("the device is the CPU: nothing to compare")
    on_cpu = files.work / "scored_cpu.jsonl"
    doctor.command("score_cpu", files.score_args(files.model_dir, on_cpu, "cpu"),
                   env={**doctor.env(), "CUDA_VISIBLE_DEVICES": ""})
    per_token = per_token_difference(files.scored, on_cpu, files)
    bound = PER_TOKEN_SCORE_BOUND[doctor.precision]
    if per_token > bound:
        raise CheckFailed(f"device and CPU scores differ by {per_token:.2e} per token (bound {bound})",
                          "wrong numerics on the device: check the TE/cuDNN versions in the table")
    return f"{per_token:.2e} per token (bound {bound} for {doctor.precision})"


def train_args(doctor: Doctor, files: Files, data: Path) -> list[str]:
    return ["train", "--config-name", "tiny_cpu", f"device={doctor.device}", f"base_model={files.model_dir}",
            f"dataset.train_path={data}", "checkpoint.save_interval=1"]


def train(doctor: Doctor, files: Files) -> str:
    from nemo_topr.training.recipe import EXIT_REQUEUE

    run_dir = files.run_dir
    doctor.command("train", [*train_args(doctor, files, files.scored), f"run_dir={run_dir}",
                             f"train.exit_interval={STOP_AT}"], expect=(EXIT_REQUEUE,))
    log_ratio, losses = _tensorboard(run_dir, "log_ratio_abs_mean"), _tensorboard(run_dir, "topr_loss")
    if len(losses) != STOP_AT or not all(map(math.isfinite, losses)):
        raise CheckFailed(f"losses {losses} (expected {STOP_AT} finite)", "a non-finite loss: see the log")
    bound = LOG_RATIO_BOUND[doctor.precision]
    if not log_ratio or log_ratio[0] > bound:
        raise CheckFailed(f"|log rho| at step 0 is {log_ratio[:1]} (bound {bound}): training and scoring "
                          "disagree about the starting model", "score with the precision you train with "
                          "(score-logprobs --precision / --train-config)")
    return f"stopped at iteration {STOP_AT} with a checkpoint; |log rho| at step 0 {log_ratio[0]:.2e}"


def resume(doctor: Doctor, files: Files) -> str:
    run_dir = files.run_dir
    doctor.command("resume", [*train_args(doctor, files, files.scored), f"run_dir={run_dir}"])
    losses = _tensorboard(run_dir, "topr_loss")
    marker = run_dir / "COMPLETED"
    completed = int(marker.read_text()) if marker.is_file() else 0
    if completed <= STOP_AT or len(losses) != completed or not all(map(math.isfinite, losses)):
        raise CheckFailed(f"completed at iteration {completed}, losses {losses}", "see the resume log")
    return f"resumed from iteration {STOP_AT}, completed at {completed}"


def train_fp8(doctor: Doctor, files: Files) -> str:
    from nemo_topr.training.recipe import EXIT_REQUEUE

    needs_te_on_cuda(doctor, "FP8 training")
    # mu scored with the FP8 numerics training uses (docs/training.md, "mu and rho")
    work = files.work
    fp8_config, scored_fp8, run_fp8 = work / "fp8.yaml", work / "scored_fp8.jsonl", work / "run_fp8"
    fp8_config.write_text("model:\n" + "".join(f"  {key}: {value}\n" for key, value in FP8_MODEL.items()))
    doctor.command("score_fp8", files.score_args(files.model_dir, scored_fp8, doctor.device, "--train-config",
                                                 str(fp8_config)))
    doctor.command("train_fp8", [*train_args(doctor, files, scored_fp8), f"run_dir={run_fp8}",
                                 *(f"model.{key}={value}" for key, value in FP8_MODEL.items()),
                                 f"train.exit_interval={STOP_AT}"], expect=(EXIT_REQUEUE,))
    losses, log_ratio = _tensorboard(run_fp8, "topr_loss"), _tensorboard(run_fp8, "log_ratio_abs_mean")
    if not losses or not all(map(math.isfinite, losses)) or not log_ratio:
        raise CheckFailed(f"FP8 losses {losses}, |log rho| {log_ratio}", "see the FP8 log")
    # recorded, not bounded: no FP8 run has measured it yet (issue 27)
    return (f"{len(losses)} FP8 iteration(s), loss {losses[-1]:.4f}; |log rho| at step 0 {log_ratio[0]:.2e} "
            f"(mu scored in FP8); FP8 vs BF16 scores {per_token_difference(scored_fp8, files.scored, files):.2e} "
            "per token")


def export(doctor: Doctor, files: Files) -> str:
    from transformers import AutoModelForCausalLM

    hf_out = files.hf_export
    doctor.command("export", ["export", "--ckpt", str(files.run_dir), "--hf-out", str(hf_out), "--device",
                              doctor.device])
    exported = AutoModelForCausalLM.from_pretrained(str(hf_out), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(files.model_dir), dtype=torch.float32)
    shapes = {k: tuple(v.shape) for k, v in exported.state_dict().items()}
    if shapes != {k: tuple(v.shape) for k, v in base.state_dict().items()}:
        raise CheckFailed("the export's tensors differ from the base model's in names or shapes",
                          "the HF mapping of Bridge does not match this model")
    logits = exported(torch.arange(1, 9)[None]).logits
    if not torch.isfinite(logits).all():
        raise CheckFailed("the exported model gives non-finite logits", "see the export log")
    return f"{len(shapes)} tensors reloaded with transformers, finite logits"


def packed_parity(doctor: Doctor, files: Files) -> str:
    needs_te_on_cuda(doctor, "compares TE's THD attention with local layers")
    try:
        log = doctor.python("packed parity", ["-m", "nemo_topr.doctor.packed_parity"])
    except CheckFailed as failure:
        raise CheckFailed(str(failure), "TE and local layers disagree on packed rows (attention across "
                                        "sequences, or its gradients): check the TE version in the table; "
                                        "`python -m nemo_topr.doctor.packed_parity --attention-backend unfused` "
                                        "tells TE's cuDNN attention apart") from None
    return result_line(log)


# (name, check, the checks it needs), in the order they run
CHECKS: tuple[tuple[str, Callable[[Doctor, Files], str], tuple[str, ...]], ...] = (
    ("versions", versions_check, ()),
    ("te attention", te_attention, ("versions",)),
    ("build", build, ()),
    ("score", score, ("build",)),
    ("score vs cpu", score_vs_cpu, ("score",)),
    ("train", train, ("score",)),
    ("resume", resume, ("train",)),
    ("train fp8", train_fp8, ("score",)),
    ("export", export, ("train",)),
    ("packed parity", packed_parity, ("versions",)),
)


def diagnose(device: str, work: Path, timeout: float, *, deadline: float | None = None,
             after_check: Callable[[Doctor], None] | None = None) -> Doctor:
    """Every check, in order; returns the doctor with its table."""
    doctor = Doctor(device, work, timeout, deadline, after_check)
    work.mkdir(parents=True, exist_ok=True)
    files = Files(work)
    for name, check, needs in CHECKS:
        doctor.run(name, functools.partial(check, doctor, files), needs=needs)
    return doctor
