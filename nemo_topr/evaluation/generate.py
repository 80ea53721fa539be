"""`nemo-topr generate`: sample completions from a local Hugging Face checkpoint and grade them.

Prompts come from a benchmark (GSM8K train/test with the paper's 8-shot prompt, MATH-500
zero-shot; see `nemo_topr.data.prompts`) or from a JSONL file of {prompt, reference_answer,
prompt_id}. Each prompt gets N samples with the paper's sampling settings (temperature 1,
top-p 1, top-k 500, 512 new tokens), on `--device` (default cuda; `nemo_topr.model.device`): from
vLLM when it is installed and the device is cuda, from `transformers` otherwise (on cuda it
ran once, through `eval`, on an H200: bench/results/gpu_verbs_h200_2026-11-26_f0673b4_te.json;
vLLM has never run). Prompts are tokenized exactly as
training tokenizes them (`prompt_token_ids`: the chat template when the tokenizer has one).

Generation stops at EOS, and at the task's stop strings (GSM8K: "\\n\\nQuestion:", where a
few-shot model starts the next question); the completion is cut before the stop string.
Sample j of prompt i is drawn with seed `prompt_seed(seed, i)`, so a run is deterministic
and `--limit K` reproduces the first K prompts of the full run.

The output is pre-scored records (reward +1 correct, -1 wrong or invalid) whose `meta` holds
the task, the reference answer, the extracted answer and the grade (correct / wrong /
invalid), and with `--sampler-logprobs` the sampler's own log-probability of the sampled
tokens. Training's log mu comes from `nemo-topr score-logprobs`, not from the sampler (see
docs/generation_evaluation.md). Empty completions (EOS first) cannot be records and are counted, not
written. Nor are completions the grader failed on (grade "error", `nemo_topr.grading`): they
are counted, and above `--max-grader-error-rate` (default 0.01) the command fails and writes no
records.

Every sample, empty and grader-failed ones included, is written to OUT.samples as its prompt
finishes (`nemo_topr.evaluation.sample_log`): after a crash or a time limit the same command
resumes there (other sampling options are refused), and a rerun with a higher
--max-grader-error-rate reuses the samples. Progress (samples/s, ETA) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nemo_topr.data.records import write_jsonl
from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.evaluation.logged_sampling import logged_sample_and_grade
from nemo_topr.evaluation.problems import BENCHMARKS, check_prompts, prompt_problems, prompt_source
from nemo_topr.evaluation.samples import graded_records, no_record_note
from nemo_topr.evaluation.sampling_options import add_sampling_arguments, check_sampling_args
from nemo_topr.model.source import require_hugging_face
from nemo_topr.utils.arguments import Parser
from nemo_topr.utils.outputs import add_overwrite_argument, writable_records_file


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nemo-topr generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True,
                        help=f"{' | '.join(BENCHMARKS)}, or a JSONL file of {{prompt, reference_answer, prompt_id}}")
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face checkpoint directory")
    parser.add_argument("--rendered-prompts", action="store_true",
                        help="the prompt file's prompts are rendered already (chat template and BOS written out), as "
                             "a sampler read them: sampled as written; give the same option to what reads the records")
    add_sampling_arguments(parser, num_samples=16)
    parser.add_argument("--out", type=Path, required=True, help="JSONL of graded records")
    add_overwrite_argument(parser)
    return parser


@dataclass(frozen=True)
class GenerateSpec:
    """What `nemo-topr generate` will do: sample `model` on `prompts` into `out`; `options`, the command
    line as parsed, is what the prompts' reader and the sampler take (`add_sampling_arguments`)."""

    model: Path
    prompts: str
    out: Path
    overwrite: bool
    options: argparse.Namespace

    @classmethod
    def of(cls, args: argparse.Namespace) -> GenerateSpec:
        return cls(args.model, args.prompts, args.out, args.overwrite, args)


def validate(spec: GenerateSpec) -> list[UserError]:
    """Every problem of `spec` before a model or the prompts' data is read, nothing written: the
    sampling options, the model (a Hugging Face directory), the prompts (a benchmark or a prompt file,
    with the options it takes) and `out` (a .jsonl that is none of them)."""
    problems = Problems()
    with problems.check():
        check_sampling_args(spec.options)
    with problems.check():
        require_hugging_face(spec.model)
    with problems.check():
        check_prompts(spec.options)
    with problems.check():
        writable_records_file(spec.out, inputs=[] if spec.prompts in BENCHMARKS else [spec.prompts],
                              overwrite=spec.overwrite)
    return problems


def main(argv: list[str] | None = None) -> int:
    spec = GenerateSpec.of(build_parser().parse_args(argv))
    refuse(validate(spec), key="generate.several_problems")
    return run(spec)


def run(spec: GenerateSpec) -> int:
    """Sample, grade and write `spec`'s records (`validate`d); the prompts' rows are checked as they are read."""
    args = spec.options
    problems = prompt_problems(args)
    source = prompt_source(args.prompts)
    settings, graded, errors = logged_sample_and_grade(args, problems, source, args.out, "nemo-topr generate")
    records = graded_records(problems, graded)
    write_jsonl(records, args.out)
    empty = sum(not sample.completion.text for samples in graded for sample in samples)
    if note := no_record_note(problems, graded):
        print(note)
    if errors["grader_errors"]:
        print(f"grader errors: {json.dumps(errors)}")
    print(f"settings: {json.dumps(asdict(settings))}")
    if args.rendered_prompts:
        print("the records' prompts are rendered: read them with dataset.rendered_prompts=true (train) or "
              "--rendered-prompts (score-logprobs, data)")
    # last, as every verb ends: what it wrote
    print(f"wrote {len(records)} records to {args.out} ({empty} empty completions and "
          f"{errors['grader_errors']} grader errors not written)")
    return 0
