"""`nemo-topr verifier`: a generative verifier, trained with TOPR, for verifier-weighted votes.

    nemo-topr verifier build --graded graded.jsonl --out judge.jsonl
        judge data: per graded sample, a judge prompt (problem + candidate solution + "Is the
        answer correct? Answer Yes or No.") with BOTH judgments as completions, " Yes" and
        " No"; the one that matches the grade gets reward +1, the other -1
    nemo-topr verifier score --model DIR --records samples.jsonl --out scored.jsonl [--device cpu]
        P(Yes) = p(" Yes") / (p(" Yes") + p(" No")) after each sample's judge prompt, written to
        `meta.verifier_score`; `nemo-topr eval --records scored.jsonl` then adds the weighted vote

The judge data is an ordinary pre-scored dataset whose rewards are known exactly: it holds
both outputs a judge can give, so the usual recipe trains the verifier unchanged
(`score-logprobs` with the verifier's starting model for log mu, then `train`, then `export`).
`score` also reports the verifier's accuracy against the grades (Yes when P(Yes) >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nemo_topr.data.sources import open_sources
from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.utils.arguments import Parser, at_least_one, documented
from nemo_topr.data.positives import require_signed_grades
from nemo_topr.data.records import Messages, Record, is_positive, load_records, write_jsonl
from nemo_topr.model.device import add_device_argument, select_device
from nemo_topr.model.source import require_hugging_face
from nemo_topr.utils.outputs import add_overwrite_argument, writable_output_file, writable_records_file, write_whole

YES, NO = " Yes", " No"
JUDGE_QUESTION = "Is the answer correct? Answer Yes or No."
THRESHOLD = 0.5
# what 0/1 grades would do here (`require_signed_grades`): R >= 0 is correct, the paper's rule
ALL_JUDGED_CORRECT = ("the verifier reads a sample as correct when its reward is >= 0, so every sample would be "
                      "judged correct")


# ---------------------------------------------------------------------------------------------
# Judge prompts and judge data


# Llama 3's special tokens written out (the recipe trains Llama 3 only): a prompt rendered already, as a
# sampler read it, holds them; the judge needs the problem's text between them
LLAMA3_SPECIAL_TOKEN = re.compile(r"<\|(?:begin_of_text|end_of_text|start_header_id|end_header_id|eot_id|eom_id|"
                                  r"python_tag|finetune_right_pad_id|reserved_special_token_\d+)\|>")
LLAMA3_USER_TURN = re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.DOTALL)


def judged_problem(prompt: str | Messages) -> str:
    """The problem a candidate answered: a chat prompt's last user message, or the prompt text.

    A prompt rendered already by Llama 3's chat template is read as its last user turn, and one
    rendered without turns (a base model's) as its text after BOS: the same problem as the plain
    prompt. The paper's GSM8K prompt is reduced to its last question (from the last "Question: ",
    its trailing "Answer:" removed): the judge needs the problem, not the few-shot demonstrations.
    """
    if isinstance(prompt, str):
        turns = LLAMA3_USER_TURN.findall(prompt)
        text = turns[-1] if turns else prompt.removeprefix("<|begin_of_text|>")
    else:
        text = [m for m in prompt if m["role"] == "user"][-1]["content"]
    last_question = text.rfind("Question: ")
    if last_question >= 0:
        text = text[last_question:]
    return text.removesuffix("Answer:").rstrip()


def judge_prompt(record: Record) -> str:
    """What the verifier reads before answering " Yes" or " No". A special token left in the
    problem or written in the completion is refused: tokenized inside the judge's own turn, it
    would be read as the token, and `train` refuses the judge data that holds it."""
    if not isinstance(record.prompt, str) and not any(message["role"] == "user" for message in record.prompt):
        roles = [message["role"] for message in record.prompt]
        raise record.error("prompt", f"has no user message (roles {roles}), whose text the verifier's judge reads as "
                                     "the problem: give the problem as a message with role \"user\"",
                           key="record.prompt.no_user_message", where=f"{record.path}:{record.line}: prompt")
    problem = judged_problem(record.prompt)
    for field, text in (("prompt", problem), ("completion", record.completion)):
        if match := LLAMA3_SPECIAL_TOKEN.search(text):
            raise record.error(field, f"holds Llama 3's special token {match[0]!r} as text, which the verifier's "
                                      "judge prompt cannot hold: give the prompt as plain text, as messages, or "
                                      "rendered by the chat template with its user turn (read as that turn's text), "
                                      "and the completion without special tokens",
                               key=f"record.{field}.special_token", where=f"{record.path}:{record.line}: {field}")
    return f"{problem}\n\nProposed solution:\n{record.completion.strip()}\n\n{JUDGE_QUESTION}"


def judge_records(graded: Sequence[Record]) -> list[Record]:
    """Two judge records per graded sample, " Yes" and " No": reward +1 for the judgment that
    matches the grade (correct: R >= 0), -1 for the other."""
    judge = []
    for record in graded:
        prompt, correct = judge_prompt(record), is_positive(record.reward)
        meta = {"judged_prompt_id": record.prompt_key, "judged_sample_id": record.sample_id, "judged_correct": correct}
        for option, says_correct in ((YES, True), (NO, False)):
            judge.append(Record(prompt=prompt, completion=option, reward=1.0 if says_correct == correct else -1.0,
                                prompt_id=f"judge-{record.index}", sample_id=option.strip().lower(), meta=meta))
    return judge


# ---------------------------------------------------------------------------------------------
# P(Yes)


def completion_logprobs(model, pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> list[float]:
    """log p(completion | prompt), summed over the completion's tokens, for each (prompt ids,
    completion ids) pair, in one right-padded forward: under causal attention the padding after
    a sequence cannot change its logits."""
    import torch

    lengths = [len(prompt) + len(completion) for prompt, completion in pairs]
    input_ids = torch.full((len(pairs), max(lengths)), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ((prompt, completion), length) in enumerate(zip(pairs, lengths)):
        input_ids[row, :length] = torch.tensor(prompt + completion)
        attention_mask[row, :length] = 1
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
    sums = []
    for row, (prompt, completion) in enumerate(pairs):
        # logits at position t predict token t + 1: the completion's are at len(prompt) - 1 onwards
        predicting = logits[row, len(prompt) - 1 : len(prompt) + len(completion) - 1].float().log_softmax(-1)
        sums.append(predicting.gather(-1, torch.tensor(completion, device=device)[:, None]).sum().item())
    return sums


def yes_probabilities(model_dir: str | Path, records: Sequence[Record], batch_size: int = 8,
                      device: str = "cpu") -> list[float]:
    """P(Yes) = p(YES) / (p(YES) + p(NO)) after each record's judge prompt, where each option's
    probability is the product over its tokens (" Yes" may be several tokens), with the model on
    `device` ("cpu" or "cuda", resolved by `nemo_topr.model.device.select_device`; cuda has never run
    on a GPU)."""
    judge_prompts = [judge_prompt(record) for record in records]  # a refused record before anything loads
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import load_tokenizer, pad_id_of, prompt_token_ids

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype="auto").eval().to(device)
    # tokenized exactly as training tokenizes judge records: chat template, completion on its own
    prompts = prompt_token_ids(tokenizer, judge_prompts)
    options = [tokenizer(option, add_special_tokens=False)["input_ids"] for option in (YES, NO)]
    pairs = [(prompt, option) for prompt in prompts for option in options]
    logprobs: list[float] = []
    for start in range(0, len(pairs), 2 * batch_size):
        logprobs += completion_logprobs(model, pairs[start : start + 2 * batch_size], pad_id_of(tokenizer))
    yes, no = torch.tensor(logprobs[0::2], dtype=torch.float64), torch.tensor(logprobs[1::2], dtype=torch.float64)
    return torch.sigmoid(yes - no).tolist()  # exp(yes) / (exp(yes) + exp(no)), without overflow


def judge_accuracy(records: Sequence[Record], scores: Sequence[float], threshold: float = THRESHOLD) -> dict[str, Any]:
    """Agreement of the verifier's Yes (score >= threshold) with the grades, overall and per side."""

    def mean(values: list[float]) -> float | None:  # None for an empty side
        return sum(values) / len(values) if values else None

    correct = [is_positive(record.reward) for record in records]
    hits = [is_correct == (score >= threshold) for is_correct, score in zip(correct, scores)]
    return {
        "records": len(records),
        "correct_samples": sum(correct),
        "threshold": threshold,
        "accuracy": mean(hits),
        "accuracy_on_correct": mean([hit for hit, c in zip(hits, correct) if c]),
        "accuracy_on_incorrect": mean([hit for hit, c in zip(hits, correct) if not c]),
        "mean_score_correct": mean([score for score, c in zip(scores, correct) if c]),
        "mean_score_incorrect": mean([score for score, c in zip(scores, correct) if not c]),
    }


def with_scores(records: Sequence[Record], scores: Sequence[float]) -> list[Record]:
    return [replace(record, meta={**(record.meta or {}), "verifier_score": score})
            for record, score in zip(records, scores)]


# ---------------------------------------------------------------------------------------------
# Command line


@dataclass(frozen=True)
class BuildSpec:
    """What `verifier build` will do: judge data from the graded `records` into `out`."""

    records: tuple[str, ...]
    out: Path
    overwrite: bool

    @classmethod
    def of(cls, args: argparse.Namespace) -> BuildSpec:
        return cls(tuple(args.graded), args.out, args.overwrite)


@dataclass(frozen=True)
class ScoreSpec:
    """What `verifier score` will do: P(Yes) of the verifier `model` for each of `records`, into `out` and
    its report, `batch_size` samples a forward on `device`."""

    model: Path
    records: tuple[str, ...]
    out: Path
    overwrite: bool
    batch_size: int
    device: str

    @classmethod
    def of(cls, args: argparse.Namespace) -> ScoreSpec:
        return cls(args.model, tuple(args.records), args.out, args.overwrite, args.batch_size, args.device)

    @property
    def report(self) -> Path:
        return self.out.with_suffix(".report.json")


def validate(spec: BuildSpec | ScoreSpec) -> list[UserError]:
    """Every problem of `spec` before a record or the model is read, nothing written: `score`'s model (a
    Hugging Face directory), the records' files, and the outputs (none of them an input, each writable).
    The records' rows are checked as they are read, then `score`'s device, where the model goes."""
    problems, inputs = Problems(), []
    if isinstance(spec, ScoreSpec):
        with problems.check():
            require_hugging_face(spec.model)  # first: a typo is named as --model, not as a tokenizer row
    with problems.check():
        inputs = [source.name for source in open_sources(spec.records)[0]]
    with problems.check():
        writable_records_file(spec.out, inputs=inputs, overwrite=spec.overwrite)
        if isinstance(spec, ScoreSpec):
            writable_output_file(spec.report, "--out's report", inputs=inputs, overwrite=spec.overwrite)
    return problems


def run_build(spec: BuildSpec) -> int:
    loaded = load_records(list(spec.records))
    require_signed_grades(loaded, ALL_JUDGED_CORRECT)
    graded = loaded.records
    judge = judge_records(graded)
    write_jsonl(judge, spec.out)
    correct = sum(is_positive(record.reward) for record in graded)
    print(f"{len(graded)} graded samples ({correct} correct) -> {len(judge)} judge records in {spec.out}")
    return 0


def run_score(spec: ScoreSpec) -> int:
    loaded = load_records(list(spec.records))
    require_signed_grades(loaded, ALL_JUDGED_CORRECT)
    records = loaded.records
    model = require_hugging_face(spec.model)
    scores = yes_probabilities(model, records, spec.batch_size, select_device(spec.device, where="--device"))
    write_jsonl(with_scores(records, scores), spec.out)
    report = {"model": str(model), **judge_accuracy(records, scores)}
    if replaced := sum("verifier_score" in (record.meta or {}) for record in records):
        report["replaced_verifier_scores"] = replaced  # an earlier verifier's, kept only in the input
    write_whole(spec.report, json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"wrote {spec.out} and {spec.report}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nemo-topr verifier", **documented(__doc__))
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="judge data (Yes/No completions, +-1 rewards) from graded samples")
    build.add_argument("--graded", nargs="+", required=True, help="graded records (files, directories, globs)")
    build.add_argument("--out", type=Path, required=True, help="judge records (JSONL)")
    add_overwrite_argument(build)
    build.set_defaults(spec=BuildSpec.of, run=run_build)
    score = verbs.add_parser("score", help="P(Yes) of each graded sample into meta.verifier_score")
    score.add_argument("--model", type=Path, required=True, help="verifier: local Hugging Face directory")
    score.add_argument("--records", nargs="+", required=True, help="graded records (files, directories, globs)")
    score.add_argument("--out", type=Path, required=True, help="the records with meta.verifier_score (JSONL); "
                       "the accuracy report goes next to it (.report.json)")
    add_overwrite_argument(score)
    score.add_argument("--batch-size", type=at_least_one, default=8, help="samples per forward pass")
    add_device_argument(score)
    score.set_defaults(spec=ScoreSpec.of, run=run_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = args.spec(args)
    refuse(validate(spec), key="verifier.several_problems")
    return args.run(spec)
