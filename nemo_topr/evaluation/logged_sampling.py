"""Sampling into the sample log (`nemo_topr.evaluation.sample_log`) for `generate` and `eval
--benchmark`: the options that decide the samples (the model's weights among them), the prompts
checked before the log is written, a resumed log's samples taken as they are, the grader-error
rate checked last."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from nemo_topr.data.records import RenderedPrompt
from nemo_topr.evaluation.samples import GradedCompletion, Problem, grader_error_report
from nemo_topr.evaluation.sampling import (
    SamplingError, SamplingSettings, choose_backend, new_token_budgets, prompt_ids_checked, sample_and_grade,
)
from nemo_topr.evaluation.sampling_options import settings_from_args
from nemo_topr.grading import GRADES, GraderErrorRateExceeded
from nemo_topr.model.device import select_device


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weights_fingerprint(model: str | Path) -> list[list]:
    """Name, size and modification time of each weights file of the Hugging Face model `model`
    (checked first: not a model, or a Megatron checkpoint, is the model-source error): the same
    path holding other weights (`export --overwrite` of a later checkpoint) is another model,
    whose samples must not be resumed from the log. Hashing would cost minutes for a 70B model."""
    from nemo_topr.model.source import require_hugging_face

    directory = require_hugging_face(model)
    files = (path for path in sorted(directory.iterdir()) if path.suffix in WEIGHT_SUFFIXES and path.is_file())
    return [[path.name, path.stat().st_size, path.stat().st_mtime_ns] for path in files]


def sampling_options(args: argparse.Namespace, source: str, settings: SamplingSettings, device: str) -> dict:
    """What decides the samples, as logged by `sample_log.SampleLog` (JSON-normalised)."""
    return json.loads(json.dumps({
        "model": str(Path(args.model).resolve()), "weights": weights_fingerprint(args.model), "prompts": source,
        "backend": choose_backend(args.backend, device), "device": device, "settings": asdict(settings)}))


def logged_sample_and_grade(args: argparse.Namespace, problems: list[Problem], source: str, out: Path, what: str
                            ) -> tuple[SamplingSettings, list[list[GradedCompletion]], dict]:
    """(settings, graded samples, grader-error report) of `generate` and `eval --benchmark`:
    sampled into the log beside `out` (resumed from it), the grader-error rate checked last."""
    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.evaluation.sample_log import SampleLog, log_path

    device = select_device(args.device, where="--device")
    settings = settings_from_args(args, problems[0].task)
    options = sampling_options(args, source, settings, device)
    if isinstance(problems[0].prompt, RenderedPrompt):  # logged only then: earlier logs resume as they were
        options["rendered_prompts"] = True
    # refused before the log is written (a refused command leaves nothing): prompts read other than
    # as written, or too long for the model's context. Sampling tokenizes them once more: seconds.
    indexed = dict(enumerate(problems))
    prompt_ids = prompt_ids_checked(load_tokenizer(args.model), indexed, source)
    try:
        new_token_budgets(args.model, indexed, settings.max_new_tokens, prompt_ids)
    except ValueError as error:
        if not (source.startswith("gsm8k") and args.num_shots):
            raise
        raise SamplingError(f"{error}; fewer exemplars shorten GSM8K's prompt: --num-shots N (now {args.num_shots}; "
                         "0: zero-shot)", key="--num-shots.prompt_beyond_model_context", where="--num-shots") from None
    log = SampleLog(log_path(out), options, problems)
    if log.done:
        print(f"{what}: resuming: {len(log.done)} of {len(problems)} prompts already sampled in {log.path}",
              file=sys.stderr)
    if log.regraded:
        graded_for = ", ".join(f"{lines} graded as {task}" if task else f"{lines} logged without their task"
                               for task, lines in log.regraded.items())
        print(f"{what}: {sum(log.regraded.values())} logged prompts graded again as {problems[0].task} "
              f"({graded_for}); the log now holds these grades", file=sys.stderr)
    graded = sample_and_grade(args.model, problems, settings, args.backend, device, log=log, what=what)
    grades = Counter(sample.grade for samples in graded for sample in samples)
    print(f"{len(problems)} prompts x {settings.num_samples} samples: " + ", ".join(f"{grades[g]} {g}" for g in GRADES))
    try:
        return settings, graded, grader_error_report(graded, args.max_grader_error_rate)
    except GraderErrorRateExceeded as error:
        raise GraderErrorRateExceeded(f"{error}. Every sample is kept in {log.path} (the failed ones with grade "
                                      "\"error\" and what the grader raised); rerun with a higher "
                                      "--max-grader-error-rate to use them without sampling again",
                                      key=error.key, where=error.where) from None
