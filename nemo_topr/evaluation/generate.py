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
import difflib
import importlib.util
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nemo_topr.utils.arguments import Parser, non_negative, share
from nemo_topr.data.records import (
    DataError, Messages, Record, RenderedPrompt, check_messages, is_id, is_number, lone_surrogate_problem, write_jsonl,
)
from nemo_topr.data.prompts import GSM8K_SHOTS
from nemo_topr.data.schema import RejectedRow
from nemo_topr.data.sources import jsonl_rows
from nemo_topr.model.device import add_device_argument, out_of_memory, select_device
from nemo_topr.grading import (
    GRADES, MAX_GRADER_ERROR_RATE, TASKS, Grade, GradeResult, GraderErrorRateExceeded, check_grader_errors,
    graded_answer, reference_problem, reward_of,
)
from nemo_topr.utils.outputs import add_overwrite_argument, writable_records_file
from nemo_topr.utils.progress import Progress

BENCHMARKS = ("gsm8k-train", "gsm8k-test", "math500")
STOP_STRINGS = {"gsm8k": ("\n\nQuestion:",), "math": ()}
BACKENDS = ("auto", "vllm", "transformers")
VLLM_CHUNK = 256  # prompts per vLLM call (see _sample_with_vllm)
TRANSFORMERS_ON_ONE_DEVICE = ("the transformers backend runs on one device; --tensor-parallel-size needs --backend "
                              "vllm (--backend auto chooses it on cuda when vLLM is installed)")


@dataclass(frozen=True)
class Problem:
    """One prompt to sample, with what grades its completions."""

    prompt_id: str
    prompt: str | Messages
    reference_answer: str
    task: str


@dataclass(frozen=True)
class SamplingSettings:
    """The paper's defaults: temperature 1, top-p 1, top-k 500, at most 512 new tokens."""

    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 500
    max_new_tokens: int = 512
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    sampler_logprobs: bool = False
    tensor_parallel_size: int = 1  # vLLM: GPUs one model is split over (Llama 3.1 70B: 4 or 8)


@dataclass(frozen=True)
class Completion:
    """A sampled completion (cut at its stop string), with the sampler's log-prob if asked for."""

    text: str
    sampler_logprob: float | None = None


@dataclass(frozen=True)
class GradedCompletion:
    completion: Completion
    answer: str | None
    grade: Grade
    grader_error: str | None = None  # what the grader raised, for grade "error"

    @property
    def result(self) -> GradeResult:
        return GradeResult(self.answer, self.grade, self.grader_error)


# ---------------------------------------------------------------------------------------------
# Prompts


def benchmark_problems(name: str, data_dir: str | Path | None = None, shots: int = GSM8K_SHOTS) -> list[Problem]:
    """Every problem of `gsm8k-train`, `gsm8k-test` (a `shots`-shot prompt, the paper's 8 by
    default) or `math500` (zero-shot)."""
    from nemo_topr.data import prompts

    if name == "math500":
        if shots != GSM8K_SHOTS:
            raise ValueError(f"--num-shots {shots}: math500's prompt is zero-shot; the option sets GSM8K's exemplars")
        rows = prompts.load_math500(data_dir)
        return [Problem(f"math500-{i}", prompts.math500_prompt(row["question"]), row["answer"], "math")
                for i, row in enumerate(rows)]
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; expected one of {BENCHMARKS}")
    train = prompts.load_gsm8k("train", data_dir)
    exemplars = prompts.gsm8k_exemplars(train, shots)
    rows = train if name == "gsm8k-train" else prompts.load_gsm8k(name.removeprefix("gsm8k-"), data_dir)

    def exemplars_of(index: int, row: dict) -> list[dict]:  # an exemplar's own prompt takes another row
        return (prompts.gsm8k_exemplars(train, shots, leaving_out=index)
                if rows is train and any(row is exemplar for exemplar in exemplars) else exemplars)

    return [Problem(f"{name}-{i}", prompts.gsm8k_prompt(row["question"], exemplars_of(i, row)),
                    prompts.gsm8k_final_answer(row["answer"]), "gsm8k")
            for i, row in enumerate(rows)]


def jsonl_problems(path: str | Path, task: str, rendered_prompts: bool = False) -> list[Problem]:
    """Problems from JSONL rows {prompt, reference_answer, prompt_id (default: the line number)};
    `rendered_prompts`: each prompt is rendered already, to be read as written (`RenderedPrompt`)."""
    problems, lines_of_ids = [], {}
    for number, row in jsonl_rows(Path(path)):
        if isinstance(row, RejectedRow):
            raise row.error
        problem = _problem_of_row(path, number, row, task, rendered_prompts)
        if problem.prompt_id in lines_of_ids:  # records, curation and group baselines tell prompts apart by it
            first = lines_of_ids[problem.prompt_id]
            raise DataError(path, number, "prompt_id", f"{problem.prompt_id!r} is also line {first}'s; each prompt "
                                                       "needs its own")
        lines_of_ids[problem.prompt_id] = number
        problems.append(problem)
    if not problems:
        raise DataError(path, 0, "file", "empty (no prompts)")
    return problems


PROMPT_FIELDS = ("prompt", "reference_answer", "prompt_id")


def _problem_of_row(path: str | Path, number: int, row: object, task: str, rendered_prompts: bool) -> Problem:
    if not isinstance(row, dict):
        raise DataError(path, number, "row", f"expected a JSON object, got {type(row).__name__}")
    prompt, answer = row.get("prompt"), row.get("reference_answer")
    prompt_id = number if row.get("prompt_id") is None else row["prompt_id"]
    for name, value in (("prompt", prompt), ("reference_answer", answer)):
        if value is None:
            raise DataError(path, number, name, f"missing; the row has {', '.join(map(repr, row)) or 'no fields'}")
    if unknown := sorted(set(row) - set(PROMPT_FIELDS)):  # a misspelt prompt_id would become the line number
        close = difflib.get_close_matches(unknown[0], PROMPT_FIELDS, n=1)
        raise DataError(path, number, unknown[0], "unknown field (a prompt file's rows hold prompt, reference_answer "
                        "and prompt_id)" + (f"; did you mean {close[0]!r}?" if close else ""))
    if isinstance(prompt, list):  # the messages a record's prompt may be, checked as records check them
        if rendered_prompts:
            raise DataError(path, number, "prompt", "a list of messages, but --rendered-prompts is set: a rendered "
                                                    "prompt is one string, as the sampler read it")
        try:
            check_messages(path, number, prompt)
        except RejectedRow as rejected:
            raise rejected.error from None
    elif not isinstance(prompt, str):
        raise DataError(path, number, "prompt", "expected a string or a list of {role, content} messages")
    elif problem := lone_surrogate_problem(prompt):  # the tokenizer's TypeError traceback otherwise
        raise DataError(path, number, "prompt", problem)
    # a number is an answer (0 among them); a boolean or an object is no answer a grader compares
    if not (isinstance(answer, str) or is_number(answer)):
        raise DataError(path, number, "reference_answer", f"expected a string or a number, got {answer!r}")
    if not is_id(prompt_id):
        raise DataError(path, number, "prompt_id", f"expected a string or an integer, got {prompt_id!r}")
    for name, empty in (("prompt", not prompt), ("reference_answer", not str(answer).strip())):
        if empty:
            raise DataError(path, number, name, "empty")
    if problem := reference_problem(task, str(answer)):
        raise DataError(path, number, "reference_answer", problem)
    return Problem(str(prompt_id), RenderedPrompt(prompt) if rendered_prompts else prompt, str(answer), task)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1; got {limit}")


def load_problems(source: str, *, task: str | None = None, data_dir: str | Path | None = None,
                  limit: int | None = None, rendered_prompts: bool = False, shots: int = GSM8K_SHOTS
                  ) -> list[Problem]:
    """The first `limit` problems of a benchmark name (GSM8K's with `shots` exemplars) or of a
    JSONL file (which needs `task`)."""
    check_limit(limit)
    if source in BENCHMARKS:
        if rendered_prompts:
            raise ValueError(f"--rendered-prompts is for a prompt file of rendered prompts; {source}'s are plain text")
        problems = benchmark_problems(source, data_dir, shots)
        if task is not None and task != problems[0].task:  # was ignored: graded as the benchmark, unsaid
            raise ValueError(f"--task {task}: {source}'s problems are graded as {problems[0].task}; drop --task (a "
                             "benchmark sets its own)")
    elif Path(source).is_dir():
        raise ValueError(f"{source}: a directory; --prompts takes a JSONL file or a benchmark name "
                         f"({', '.join(BENCHMARKS)}), whose local copy (JSONL files or a save_to_disk dataset) "
                         "--data-dir names")
    elif not Path(source).is_file():
        close = difflib.get_close_matches(source, BENCHMARKS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(f"{source}: no such prompt file, and not a benchmark ({', '.join(BENCHMARKS)}){hint}")
    elif shots != GSM8K_SHOTS:
        raise ValueError(f"--num-shots {shots} sets the exemplars of GSM8K's benchmark prompts; a prompt file's "
                         "prompts are sampled as written")
    elif task in TASKS:
        problems = jsonl_problems(source, task, rendered_prompts)
    else:
        raise ValueError(f"{source}: a prompt file needs --task {'|'.join(TASKS)}")
    return problems[:limit]


# ---------------------------------------------------------------------------------------------
# Sampling


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The seed of one prompt's samples: 32 random bits drawn from (seed, prompt_index).

    32 bits because torch's CPU generator (mt19937) keeps only the low 32 bits of a seed.
    """
    return random.Random(f"{seed}:{prompt_index}").getrandbits(32)


def trim_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first occurrence of any stop string."""
    cuts = [text.find(stop) for stop in stop_strings if stop in text]
    return text[: min(cuts)] if cuts else text


def choose_backend(backend: str, device: str) -> str:
    """`auto`: vLLM when it is importable and the device is cuda, else `transformers`. `vllm`
    where vLLM is not installed, or with --device cpu, is refused (ValueError)."""
    if backend == "vllm" and not importlib.util.find_spec("vllm"):
        raise ValueError("--backend vllm: vLLM is not installed in this environment (pip install -r "
                         "requirements-vllm.txt); --backend transformers, or auto, samples without it")
    if backend == "vllm" and device == "cpu":
        raise ValueError("--backend vllm samples on GPUs: it needs --device cuda (or auto on a machine with one)")
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") and device == "cuda" else "transformers"


def _generated_lengths(new_tokens, eos_ids: set[int], pad_id: int) -> list[int]:
    """Tokens each sequence sampled: through its first EOS, or up to the padding that follows
    a stop string (or all of them at the token limit)."""
    lengths = []
    for row in new_tokens.tolist():
        length = len(row)
        for i, token in enumerate(row):
            if token in eos_ids:
                length = i + 1
                break
            if token == pad_id:
                length = i
                break
        lengths.append(length)
    return lengths


def _decoding(settings: SamplingSettings) -> dict:
    """transformers' options for `settings`: temperature 0 is greedy (as in vLLM), whatever the
    model's generation_config samples with (Llama 3 Instruct's: temperature 0.6, top-p 0.9)."""
    if settings.temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k}


def _sample_with_transformers(model_dir: Path, prompt_ids: dict[int, list[int]], budgets: dict[int, int],
                              settings: SamplingSettings, tokenizer, device: str
                              ) -> Iterator[tuple[int, list[Completion]]]:
    """One `generate` call per prompt (its N samples batched), on CPU or one GPU, yielded as it
    finishes. The sampler log-prob comes from the processed scores (after temperature and top-k/top-p)."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import pad_id_of

    if settings.tensor_parallel_size != 1:
        raise ValueError(TRANSFORMERS_ON_ONE_DEVICE)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype="auto").eval().to(device)
    eos = model.generation_config.eos_token_id
    eos_ids, pad_id = set(eos if isinstance(eos, list) else [eos]), pad_id_of(tokenizer)
    for index, ids in prompt_ids.items():
        torch.manual_seed(prompt_seed(settings.seed, index))
        input_ids = torch.tensor([ids], device=device)
        try:
            with torch.no_grad():
                output = model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), **_decoding(settings),
                    max_new_tokens=budgets[index], num_return_sequences=settings.num_samples,
                    stop_strings=list(settings.stop_strings) or None, tokenizer=tokenizer,
                    pad_token_id=pad_id, return_dict_in_generate=True,
                    output_scores=settings.sampler_logprobs,
                )
        except (RuntimeError, MemoryError) as error:
            if not out_of_memory(error):
                raise
            raise ValueError(sampling_out_of_memory(settings, device, len(ids) + budgets[index], error)) from None
        new_tokens = output.sequences[:, input_ids.shape[1]:]
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        logprobs = [None] * len(texts)
        if settings.sampler_logprobs:
            token_logprobs = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True)
            lengths = _generated_lengths(new_tokens, eos_ids, pad_id)
            logprobs = [float(row[:n].sum()) for row, n in zip(token_logprobs, lengths)]
        yield index, [Completion(trim_at_stop(t, settings.stop_strings), lp) for t, lp in zip(texts, logprobs)]


def sampling_out_of_memory(settings: SamplingSettings, device: str, tokens: int, error: BaseException) -> str:
    """What to do where transformers could not hold one prompt's samples, sampled as one batch."""
    kept = ("; the scores of every step are kept for --sampler-logprobs, vocabulary-wide: leave it out"
            if settings.sampler_logprobs else "")
    other = "" if device == "cpu" else ", or sample with --backend vllm"
    said = (str(error).splitlines() or [type(error).__name__])[0][:200]  # Python's MemoryError says nothing
    return (f"{device} ran out of memory sampling one prompt's {settings.num_samples} samples (up to {tokens} tokens "
            f"each): the transformers backend samples a prompt's samples as one batch{kept}. Give a lower "
            f"--num-samples or --max-new-tokens{other} ({said})")


def _sample_with_vllm(model_dir: Path, prompt_ids: dict[int, list[int]], budgets: dict[int, int],
                      settings: SamplingSettings) -> Iterator[tuple[int, list[Completion]]]:
    """VLLM_CHUNK prompts per vLLM call (large batches keep the GPU busy; a chunk at a time is
    what a crash can lose); vLLM cuts the stop strings itself. Never run on GPU in CI.

    vLLM V1 returns raw log-probs (the model's, before temperature and top-k/top-p) unless
    `logprobs_mode` says otherwise; "processed_logprobs" makes it record what the transformers
    backend records: the log-prob under the distribution actually sampled from."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), seed=settings.seed, tensor_parallel_size=settings.tensor_parallel_size,
              logprobs_mode="processed_logprobs")
    indices = list(prompt_ids)
    for start in range(0, len(indices), VLLM_CHUNK):
        chunk = indices[start:start + VLLM_CHUNK]
        params = [
            SamplingParams(n=settings.num_samples, temperature=settings.temperature, top_p=settings.top_p,
                           top_k=settings.top_k, max_tokens=budgets[index], stop=list(settings.stop_strings),
                           seed=prompt_seed(settings.seed, index), logprobs=0 if settings.sampler_logprobs else None)
            for index in chunk
        ]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids[index]) for index in chunk], params,
                               use_tqdm=False)
        for index, output in zip(chunk, outputs):
            yield index, [Completion(trim_at_stop(sample.text, settings.stop_strings),
                                     sample.cumulative_logprob if settings.sampler_logprobs else None)
                          for sample in output.outputs]


def iter_completions(model_dir: str | Path, problems: dict[int, Problem], settings: SamplingSettings,
                     backend: str = "auto", device: str = "cpu") -> Iterator[tuple[int, list[Completion]]]:
    """(index, its `settings.num_samples` completions) for each of {index: problem} as each
    finishes, on `device` ("cpu" or "cuda", resolved by the caller:
    `nemo_topr.model.device.select_device`). The index seeds the prompt's samples (`prompt_seed`)."""
    from nemo_topr.data.tokenization import load_tokenizer

    if not problems:
        return
    tokenizer = load_tokenizer(model_dir)
    prompt_ids = prompt_ids_checked(tokenizer, problems)
    budgets = new_token_budgets(model_dir, problems, settings.max_new_tokens, prompt_ids)
    if choose_backend(backend, device) == "vllm":
        yield from _sample_with_vllm(Path(model_dir), prompt_ids, budgets, settings)
    else:
        yield from _sample_with_transformers(Path(model_dir), prompt_ids, budgets, settings, tokenizer, device)


def prompt_ids_checked(tokenizer, problems: dict[int, Problem], source: str = "prompts") -> dict[int, list[int]]:
    """{index: the prompt's tokens}, as training tokenizes it (`prompt_token_ids`), once the prompts'
    text passed training's check (`prompt_text_problem`): a prompt rendered already, templated
    again, would be sampled from a context the records' scoring and training never see."""
    from nemo_topr.data.tokenization import prompt_text_problem, prompt_token_ids, special_token_text

    if pattern := special_token_text(tokenizer):
        wrong = [(problem, found) for problem in problems.values()
                 if (found := prompt_text_problem(problem.prompt, pattern))]
        if wrong:
            (first, (_, why)), count = wrong[0], len(wrong)
            raise ValueError(f"{source}: prompt {first.prompt_id}: {why} ({count} of {len(problems)} prompts)")
    return dict(zip(problems, prompt_token_ids(tokenizer, [problem.prompt for problem in problems.values()])))


def new_token_budgets(model_dir: str | Path, problems: dict[int, Problem], max_new_tokens: int,
                      prompt_ids: dict[int, list[int]] | None = None) -> dict[int, int]:
    """{index: new tokens to sample at most}: `max_new_tokens`, less where prompt + completion + the
    EOS training appends would pass the model's context (max_position_embeddings), which
    `score-logprobs` and `train` refuse (`beyond_model_context`); transformers would sample on past
    it. A prompt that leaves no room at all is refused. `prompt_ids`: the prompts' tokens, when
    the caller has them (else they are tokenized here)."""
    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.model.source import context_length

    context = context_length(model_dir)
    if context is None:
        return {index: max_new_tokens for index in problems}
    if prompt_ids is None:
        prompt_ids = prompt_ids_checked(load_tokenizer(model_dir), problems)
    full = [index for index, ids in prompt_ids.items() if len(ids) + 2 > context]
    if full:
        first = full[0]
        raise ValueError(f"prompt {problems[first].prompt_id}: {len(prompt_ids[first])} tokens leave no room for a "
                         f"completion token and EOS in the model's context of {context} (max_position_embeddings in "
                         f"{Path(model_dir) / 'config.json'}); {len(full)} of {len(prompt_ids)} prompts are that long")
    return {index: min(max_new_tokens, context - len(ids) - 1) for index, ids in prompt_ids.items()}


# ---------------------------------------------------------------------------------------------
# Grading and records


def grade_completions(problem: Problem, completions: Sequence[Completion]) -> list[GradedCompletion]:
    graded = []
    for completion in completions:
        result = graded_answer(problem.task, completion.text, problem.reference_answer)
        graded.append(GradedCompletion(completion, result.answer, result.grade, result.error))
    return graded


def graded_records(problems: Sequence[Problem], graded: Sequence[Sequence[GradedCompletion]]) -> list[Record]:
    """Pre-scored records, sample_id = the sample's index for its prompt; empty completions and
    grader errors (no verdict, so no reward) are not records. An empty completion is still an
    invalid sample: its id is in `meta.empty_sample_ids` of its prompt's records, so that `eval
    --records` counts it as `eval --benchmark` does."""
    records = []
    for problem, samples in zip(problems, graded):
        empty = [sample_id for sample_id, sample in enumerate(samples) if not sample.completion.text]
        for sample_id, sample in enumerate(samples):
            if not _makes_a_record(sample):
                continue
            meta = {"task": problem.task, "reference_answer": problem.reference_answer,
                    "answer": sample.answer, "grade": sample.grade, **({"empty_sample_ids": empty} if empty else {})}
            if sample.completion.sampler_logprob is not None:
                meta["sampler_logprob"] = sample.completion.sampler_logprob
            records.append(Record(prompt=problem.prompt, completion=sample.completion.text,
                                  reward=reward_of(sample.grade), prompt_id=problem.prompt_id,
                                  sample_id=sample_id, meta=meta))
    return records


def _makes_a_record(sample: GradedCompletion) -> bool:
    return bool(sample.completion.text) and sample.grade != "error"


def no_record_note(problems: Sequence[Problem], graded: Sequence[Sequence[GradedCompletion]]) -> str | None:
    """What `graded_records` leaves out whole: prompts whose samples are all empty or failed by the
    grader have no record, so `eval --records` of the records cannot count them. None if none."""
    missing = [problem.prompt_id for problem, samples in zip(problems, graded)
               if not any(_makes_a_record(sample) for sample in samples)]
    if not missing:
        return None
    return (f"{len(missing)} of {len(problems)} prompts have no record, every sample empty or failed by the grader "
            f"(first: {missing[0]}): `eval --records` of these records leaves them out, where `eval --benchmark` "
            "counts one of empty samples as failed")


def sample_and_grade(model_dir: str | Path, problems: Sequence[Problem], settings: SamplingSettings,
                     backend: str = "auto", device: str = "cpu", log=None, what: str = "nemo-topr generate"
                     ) -> list[list[GradedCompletion]]:
    """Each problem's graded samples, in problem order. With `log` (a `sample_log.SampleLog`) the
    problems it holds are taken from it and each new one is appended as it finishes. Progress
    (samples/s, ETA) goes to stderr."""
    from nemo_topr.model.source import require_hugging_face

    graded = dict(log.done) if log is not None else {}
    todo = {index: problem for index, problem in enumerate(problems) if index not in graded}
    progress = Progress(what, len(problems) * settings.num_samples, "samples",
                        done=(len(problems) - len(todo)) * settings.num_samples)
    for index, completions in iter_completions(require_hugging_face(model_dir), todo, settings, backend, device):
        graded[index] = grade_completions(problems[index], completions)
        if log is not None:
            log.append(index, problems[index], graded[index])
        progress.advance(len(completions))
    return [graded[index] for index in range(len(problems))]


def grader_error_report(graded: Sequence[Sequence[GradedCompletion]], max_rate: float) -> dict:
    """`check_grader_errors` over every graded sample (raises above `max_rate`)."""
    return check_grader_errors([sample.result for samples in graded for sample in samples], max_rate)


# ---------------------------------------------------------------------------------------------
# Command line (the sampling options are shared with `nemo-topr eval`)


MIN_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it, it decodes greedily


def add_sampling_arguments(parser: argparse.ArgumentParser, *, num_samples: int) -> None:
    defaults = SamplingSettings()
    parser.add_argument("--task", choices=TASKS, help="grader for a prompt file (benchmarks set it)")
    parser.add_argument("--data-dir", type=Path, help="benchmark JSONL files or a save_to_disk dataset "
                        "(default: $NEMO_TOPR_DATA_DIR, else the repository's data/benchmarks)")
    parser.add_argument("--limit", type=int, help="only the first K problems")
    parser.add_argument("--num-shots", type=non_negative, default=GSM8K_SHOTS,
                        help="worked GSM8K train problems before each GSM8K question (default: %(default)s, the "
                             "paper's; fewer, or 0 for zero-shot, where a model's context does not hold them)")
    parser.add_argument("--num-samples", type=int, default=num_samples, help="samples per prompt (default: "
                        "%(default)s)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="0: greedy decoding (default: %(default)s)")
    for flag, kind, value in (("--top-p", float, defaults.top_p), ("--top-k", int, defaults.top_k),
                              ("--max-new-tokens", int, defaults.max_new_tokens), ("--seed", int, defaults.seed)):
        parser.add_argument(flag, type=kind, default=value, help="(default: %(default)s)")
    stops = parser.add_mutually_exclusive_group()
    stops.add_argument("--stop", action="append",
                       help="stop string, repeatable (default: the task's, GSM8K: '\\n\\nQuestion:')")
    # `--stop ''` ended every completion at once: this is how to ask for none
    stops.add_argument("--no-stop", dest="stop", action="store_const", const=[],
                       help="no stop string: sample to EOS or --max-new-tokens (a chat model on GSM8K)")
    parser.add_argument("--sampler-logprobs", action="store_true",
                        help="record the sampler's log-prob of each completion in meta.sampler_logprob")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="auto: vLLM when installed and the device is cuda, else transformers")
    add_device_argument(parser)
    parser.add_argument("--max-grader-error-rate", type=share, default=MAX_GRADER_ERROR_RATE,
                        help="fail when the grader itself fails (math-verify raised or timed out) on more than this "
                             "share of the samples (default: %(default)s); failed samples are dropped and counted, "
                             "never graded wrong")
    parser.add_argument("--tensor-parallel-size", type=int, default=defaults.tensor_parallel_size,
                        help="vLLM backend: GPUs to split the model over (70B in bf16 needs >= 2 x 80 GB)")


def check_sampling_args(args: argparse.Namespace) -> None:
    """The sampling options' values (ValueError), before anything is loaded; `iterate` checks its
    generate and eval stages' options with it at its start."""
    check_limit(args.limit)
    for flag in ("num_samples", "max_new_tokens", "top_k", "tensor_parallel_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1; got {getattr(args, flag)}")
    # checked before the model loads (transformers refused a temperature of 0 only after loading it)
    if not 0 <= args.temperature < math.inf:  # inf: uniform over top-k, and `Infinity` in the settings' JSON
        raise ValueError(f"--temperature must be at least 0 (0: greedy decoding) and finite; got {args.temperature}")
    if 0 < args.temperature < MIN_TEMPERATURE:  # 1e-300 is 0 in float32: logits / 0 ended in torch's NaN traceback
        raise ValueError(f"--temperature {args.temperature}: below {MIN_TEMPERATURE} sampling is greedy decoding in "
                         "effect (vLLM switches to it) and overflows the logits; give 0 for greedy decoding")
    if not 0 <= args.seed < 2**63:  # torch's generators take 64 bits; -1 would be a fixed seed, not "random"
        raise ValueError(f"--seed must be in [0, 2^63): the same seed draws the same samples; got {args.seed}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1]; got {args.top_p}")
    if args.stop and "" in args.stop:  # the sampler matches it before the first token
        raise ValueError("--stop '': an empty stop string ends every completion before its first token (all "
                         "samples empty); give non-empty stop strings, or --no-stop for none")
    if args.temperature == 0 and args.num_samples != 1:
        raise ValueError(f"--temperature 0 is greedy decoding, one completion per prompt: --num-samples 1 "
                         f"(got {args.num_samples})")
    backend = choose_backend(args.backend, args.device)  # vLLM missing or on the CPU: refused before anything loads
    if args.tensor_parallel_size != 1 and backend == "transformers":
        raise ValueError(TRANSFORMERS_ON_ONE_DEVICE)  # before the sample log records a size no sampling used
    if args.temperature == 0 and args.sampler_logprobs:
        raise ValueError("--sampler-logprobs with --temperature 0: greedy decoding samples from no distribution "
                         "(its log-prob is 0); score the completions with `nemo-topr score-logprobs`")


def settings_from_args(args: argparse.Namespace, task: str) -> SamplingSettings:
    check_sampling_args(args)
    stops = STOP_STRINGS[task] if args.stop is None else args.stop
    return SamplingSettings(num_samples=args.num_samples, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            stop_strings=tuple(stops), sampler_logprobs=args.sampler_logprobs,
                            tensor_parallel_size=args.tensor_parallel_size)


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
        raise ValueError(f"{error}; fewer exemplars shorten GSM8K's prompt: --num-shots N (now {args.num_shots}; "
                         "0: zero-shot)") from None
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
                                      "--max-grader-error-rate to use them without sampling again") from None


def prompt_problems(args: argparse.Namespace) -> list[Problem]:
    """The problems of a command's `--prompts`, read with its --task, --data-dir, --limit and
    --rendered-prompts (generate, eval --prompts, and iterate's check of both)."""
    return load_problems(args.prompts, task=args.task, data_dir=args.data_dir, limit=args.limit,
                         rendered_prompts=args.rendered_prompts, shots=args.num_shots)


def prompt_source(prompts: str) -> str:
    """`--prompts` as the sample log and the results name it: a benchmark, or a file's absolute path."""
    return prompts if prompts in BENCHMARKS else str(Path(prompts).resolve())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        problems = prompt_problems(args)
        source = prompt_source(args.prompts)
        writable_records_file(args.out, inputs=[] if args.prompts in BENCHMARKS else [args.prompts],
                             overwrite=args.overwrite)
        settings, graded, errors = logged_sample_and_grade(args, problems, source, args.out, "nemo-topr generate")
    except (OSError, ValueError) as error:  # DataError, DeviceError and GraderErrorRateExceeded are ValueErrors
        print(f"nemo-topr generate: {error}", file=sys.stderr)
        return 1
    records = graded_records(problems, graded)
    write_jsonl(records, args.out)
    empty = sum(not sample.completion.text for samples in graded for sample in samples)
    print(f"wrote {len(records)} records to {args.out} ({empty} empty completions and "
          f"{errors['grader_errors']} grader errors not written)")
    if note := no_record_note(problems, graded):
        print(note)
    if errors["grader_errors"]:
        print(f"grader errors: {json.dumps(errors)}")
    print(f"settings: {json.dumps(asdict(settings))}")
    if args.rendered_prompts:
        print("the records' prompts are rendered: read them with dataset.rendered_prompts=true (train) or "
              "--rendered-prompts (score-logprobs, data)")
    return 0
