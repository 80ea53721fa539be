"""Generation's, evaluation's and the verifier's refusals as a table: one row per problem, its bad input → the
problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
compared here (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/evaluation/test_refusals.py``
rewrites this table's section). Every key `SOURCES` can raise has a row or a reason in `UNREACHABLE`: a new
refusal without one fails `test_the_table_covers_every_key_the_code_raises`. A row's verb is the one a user
meets it through first: the sampling options and prompts are `generate`'s (and `eval --prompts`'s), the
records, results and metrics `eval`'s, the judge prompt `verifier`'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from tests.conftest import REPO, checkout_env
from tests.refusal_table import assert_covers, assert_golden, raised, rendered

from nemo_topr.data.records import Record, RenderedPrompt, load_records
from nemo_topr.evaluation import evaluate, generate, problems, sample_log, sampling, verifier
from nemo_topr.evaluation.evaluate import (benchmark_results, build_parser, check_usage, outcomes_of_records,
                                           plotted_metrics, read_round_results)
from nemo_topr.evaluation.metrics import SampleOutcome, benchmark_metrics, pass_at_k
from nemo_topr.evaluation.problems import check_limit, jsonl_problems, load_problems
from nemo_topr.evaluation.sample_log import SampleLog
from nemo_topr.evaluation.samples import Problem
from nemo_topr.evaluation.sampling import choose_backend, new_token_budgets, prompt_ids_checked
from nemo_topr.evaluation.sampling_options import check_sampling_args
from nemo_topr.evaluation.verifier import judge_prompt

EVALUATION = REPO / "nemo_topr" / "evaluation"
SOURCES = [EVALUATION / f"{name}.py" for name in ("problems", "generate", "evaluate", "sampling_options",
                                                   "sampling", "sample_log", "logged_sampling", "verifier", "metrics")]
ERRORS = {"PromptsError", "EvalError", "UsageError", "SamplingError", "SampleLogError", "MetricsError", "DataError",
          "error", "GraderErrorRateExceeded", "OutputWriteError"}
UNREACHABLE = {
    "sampling.out_of_memory": "transformers' generate running out of memory on a model (tests/evaluation/test_generate_eval.py "
                              "test_only_a_failed_allocation_while_sampling_is_read_as_out_of_memory)",
    "--num-shots.prompt_beyond_model_context": "logged_sample_and_grade, which loads the model's tokenizer and "
                                               "fingerprints its weights before it budgets the prompts "
                                               "(tests/evaluation/test_generate_eval.py test_gsm8k_on_a_short_context_model_...)",
    "{}": "logged_sample_and_grade's re-raise of grading's grader-error-rate refusal (its key and where), met "
          "after sampling a model",
    "sample_log.write_failed": "a filesystem that refuses the sample log's line half-way (tests/evaluation/test_generate_eval.py "
                               "test_a_sample_log_the_disk_cannot_take_..., through /dev/full)",
    "eval.input_unreadable": "eval's main translating a library's OSError or ValueError met loading a model or "
                             "file (tests/evaluation/test_generate_eval.py asserts it end to end)",
}

GSM8K = Problem("q0", "What is 2 + 3?", "5", "gsm8k")


def options(*given: str) -> SimpleNamespace:
    """`generate`'s arguments as its parser reads them, with the sampling options `given`."""
    return generate.build_parser().parse_args(["--prompts", "p.jsonl", "--model", "m", "--out", "o.jsonl",
                                               "--device", "cpu", *given])


def usage(*argv: str):
    """A row's problem: `eval`'s options `argv` (and --out r.json), which `check_usage` refuses before anything
    is read."""
    out = [] if "--out" in argv else ["--out", "r.json"]
    return raised(lambda: check_usage(build_parser().parse_args([*argv, *out])))


def records(name: str) -> list[Record]:
    return load_records(name).records


def resumed(log: str) -> None:
    """`log` resumed by a command sampling GSM8K's problem q0 with options {"seed": 1}."""
    SampleLog(Path(log), {"seed": 1}, [GSM8K])


def where_vllm(installed: bool, check, *args):
    """`check(*args)` where vLLM can be imported (`installed`) or cannot."""
    def run() -> None:
        with mock.patch.object(sampling.importlib.util, "find_spec", lambda name: object() if installed else None):
            check(*args)
    return raised(run)


def benchmark_of(task: str):
    """`load_problems` where gsm8k-test's problems are one of `task`'s (no benchmark is read)."""
    return mock.patch.object(problems, "benchmark_problems", lambda *_: [Problem("gsm8k-test-0", "q", "5", task)])


def problems_of(source: str, task: str | None = None):
    def run() -> None:
        with benchmark_of("gsm8k"):
            load_problems(source, task=task)
    return raised(run)


SPECIAL_TOKENS = SimpleNamespace(added_tokens_decoder={}, all_special_tokens=["<|begin_of_text|>"])
RECORD = {"prompt": "What is 2 + 3?", "completion": "5", "reward": 1.0}
LOG_ROW = {"index": 0, "prompt_id": "q0", "samples": []}
RESULT = {"task": "gsm8k", "metrics": {"pass@1": 0.5}}


def jsonl(root: Path, name: str, *rows: object) -> None:
    (root / name).write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    identity = sample_log._identity(GSM8K)
    row = {"prompt": "What is 2 + 3?", "reference_answer": "5"}
    for name, rows in {
            "prompts.jsonl": [row],
            "duplicate_ids.jsonl": [{**row, "prompt_id": "a"}, {**row, "prompt_id": "a"}],
            "empty.jsonl": [], "list_row.jsonl": [[1]], "no_prompt.jsonl": [{"reference_answer": "5"}],
            "no_reference.jsonl": [{"prompt": "q"}], "misspelt.jsonl": [{**row, "promptid": "a"}],
            "messages.jsonl": [{**row, "prompt": [{"role": "user", "content": "q"}]}],
            "number_prompt.jsonl": [{**row, "prompt": 5}], "surrogate.jsonl": [{**row, "prompt": "q \ud800"}],
            "true_reference.jsonl": [{**row, "reference_answer": True}],
            "list_id.jsonl": [{**row, "prompt_id": [1]}], "empty_prompt.jsonl": [{**row, "prompt": ""}],
            "blank_reference.jsonl": [{**row, "reference_answer": " "}],
            "word_reference.jsonl": [{**row, "reference_answer": "five"}],
            "math_record.jsonl": [{**RECORD, "meta": {"task": "math", "reference_answer": "5"}}],
            "bare_record.jsonl": [RECORD],
            "bad_reference.jsonl": [{**RECORD, "meta": {"task": "gsm8k", "reference_answer": "five"}}],
            "two_references.jsonl": [{**RECORD, "meta": {"task": "gsm8k", "reference_answer": "5"}},
                                     {**RECORD, "meta": {"task": "gsm8k", "reference_answer": "6"}}],
            "nan_score.jsonl": [{**RECORD, "meta": {"task": "gsm8k", "reference_answer": "5", "verifier_score": "x"}}],
            "empty_ids.jsonl": [{**RECORD, "meta": {"task": "gsm8k", "reference_answer": "5",
                                                    "empty_sample_ids": "1"}}],
            "two_tasks.jsonl": [{**RECORD, "meta": {"task": "gsm8k", "reference_answer": "5"}},
                                {**RECORD, "prompt": "q2", "meta": {"task": "math", "reference_answer": "5"}}],
            "other_options.samples": [{"options": {"seed": 0}}, LOG_ROW],
            "other_prompt.samples": [{"options": {"seed": 1}}, {**LOG_ROW, "prompt_id": "q9"}],
            "no_digest.samples": [{"options": {"seed": 1}}, LOG_ROW],
            "other_text.samples": [{"options": {"seed": 1}}, {**LOG_ROW, **identity, "prompt_sha256": "0" * 64}],
            "other_reference.samples": [{"options": {"seed": 1}}, {**LOG_ROW, **identity, "reference_answer": "6"}],
            "result.json": [RESULT], "math_result.json": [{**RESULT, "task": "math"}],
            "other_metric.json": [{"task": "gsm8k", "metrics": {"maj@4": 0.5}}],
            "no_result.json": [{"metrics": {}}], "unknown_task.json": [{**RESULT, "task": "code"}],
            "null_metric.json": [{**RESULT, "metrics": {"pass@1": None}}]}.items():
        jsonl(root, name, *rows)
    (root / "not_json.json").write_text("{")
    (root / "adir").mkdir()
    (root / "small_model").mkdir()
    (root / "small_model" / "config.json").write_text(json.dumps({"max_position_embeddings": 4}))


def data(name: str, field: str, line: int = 1) -> str:
    return f"{name}:{line}: {field}"


def graded(name: str, task: str | None = None):
    return raised(lambda: outcomes_of_records(records(name), task, 1.0))


def prompt_file_row(key: str, name: str, field: str, line: int = 1, **options: bool):
    """The row of prompt file `name`'s problem with `field` on `line`, read for gsm8k with `options`."""
    return "generate", key, data(name, field, line), raised(jsonl_problems, name, "gsm8k", **options)


def records_row(key: str, name: str, field: str, line: int = 1, task: str | None = None):
    """The row of records file `name`'s problem with `field` on `line`, evaluated with `--task`."""
    return "eval", key, data(name, field, line), graded(name, task)


def judged(record: Record):
    return raised(judge_prompt, record)


PLOT = ("result.json", "other_metric.json")

# (verb, key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("generate", "--num-samples.below_1", "--num-samples", raised(check_sampling_args, options("--num-samples", "0"))),
    ("generate", "--temperature.negative_or_infinite", "--temperature",
     raised(check_sampling_args, options("--temperature", "inf"))),
    ("generate", "--temperature.below_min", "--temperature",
     raised(check_sampling_args, options("--temperature", "1e-9"))),
    ("generate", "--seed.out_of_range", "--seed", raised(check_sampling_args, options("--seed", "-1"))),
    ("generate", "--top-p.out_of_range", "--top-p", raised(check_sampling_args, options("--top-p", "0"))),
    ("generate", "--stop.empty", "--stop", raised(check_sampling_args, options("--stop", ""))),
    ("generate", "--num-samples.above_1_when_greedy", "--num-samples",
     raised(check_sampling_args, options("--temperature", "0", "--num-samples", "2"))),
    ("generate", "--tensor-parallel-size.transformers_backend", "--tensor-parallel-size",
     raised(check_sampling_args, options("--tensor-parallel-size", "2"))),
    ("generate", "--sampler-logprobs.greedy", "--sampler-logprobs",
     raised(check_sampling_args, options("--temperature", "0", "--num-samples", "1", "--sampler-logprobs"))),
    ("generate", "--backend.vllm_not_installed", "--backend", where_vllm(False, choose_backend, "vllm", "cuda")),
    ("generate", "--backend.vllm_on_cpu", "--backend", where_vllm(True, choose_backend, "vllm", "cpu")),
    ("generate", "prompts.prompt.special_token", "prompts.jsonl: prompt q0",
     raised(prompt_ids_checked, SPECIAL_TOKENS, {0: Problem("q0", "<|begin_of_text|>What?", "5", "gsm8k")},
            "prompts.jsonl")),
    ("generate", "prompts.prompt.not_rendered", "prompts.jsonl: prompt q0",
     raised(prompt_ids_checked, SPECIAL_TOKENS, {0: Problem("q0", RenderedPrompt("What?"), "5", "gsm8k")},
            "prompts.jsonl")),
    ("generate", "prompts.prompt.beyond_model_context", "prompt q0",
     raised(new_token_budgets, "small_model", {0: GSM8K}, 8, {0: [1, 2, 3]})),
    ("generate", "sample_log.options.differ", "other_options.samples:1: options",
     raised(resumed, "other_options.samples")),
    ("generate", "sample_log.prompt_id.changed", "other_prompt.samples:2: prompt_id",
     raised(resumed, "other_prompt.samples")),
    ("generate", "sample_log.prompt_sha256.missing", "no_digest.samples:2: prompt_sha256",
     raised(resumed, "no_digest.samples")),
    ("generate", "sample_log.prompt_sha256.changed", "other_text.samples:2: prompt_sha256",
     raised(resumed, "other_text.samples")),
    ("generate", "sample_log.reference_answer.changed", "other_reference.samples:2: reference_answer",
     raised(resumed, "other_reference.samples")),
    ("generate", "--num-shots.math500", "--num-shots", raised(problems.benchmark_problems, "math500", None, 3)),
    ("generate", "--prompts.unknown_benchmark", "--prompts", raised(problems.benchmark_problems, "gsm8k-dev")),
    ("generate", "--limit.below_1", "--limit", raised(check_limit, 0)),
    ("generate", "generate.several_problems", "--num-samples, --model, --prompts",
     raised(generate.main, ["--prompts", "gsm8k-tst", "--model", "m", "--out", "o.jsonl", "--num-samples", "0"])),
    ("generate", "--rendered-prompts.benchmark", "--rendered-prompts",
     raised(load_problems, "gsm8k-test", rendered_prompts=True)),
    ("generate", "--task.not_the_benchmarks", "--task", problems_of("gsm8k-test", "math")),
    ("generate", "--prompts.directory", "--prompts", raised(load_problems, "adir")),
    ("generate", "--prompts.no_such_file", "--prompts", raised(load_problems, "gsm8k-tst")),
    ("generate", "--num-shots.prompt_file", "--num-shots",
     raised(load_problems, "prompts.jsonl", task="gsm8k", shots=3)),
    ("generate", "--task.unset_for_prompt_file", "--task", raised(load_problems, "prompts.jsonl")),
    prompt_file_row("prompts.prompt_id.duplicate", "duplicate_ids.jsonl", "prompt_id", line=2),
    ("generate", "prompts.file.empty", "empty.jsonl", raised(jsonl_problems, "empty.jsonl", "gsm8k")),
    prompt_file_row("prompts.row.not_an_object", "list_row.jsonl", "row"),
    prompt_file_row("prompts.prompt.missing", "no_prompt.jsonl", "prompt"),
    prompt_file_row("prompts.reference_answer.missing", "no_reference.jsonl", "reference_answer"),
    prompt_file_row("prompts.field.unknown", "misspelt.jsonl", "promptid"),
    prompt_file_row("prompts.prompt.messages_when_rendered", "messages.jsonl", "prompt", rendered_prompts=True),
    prompt_file_row("prompts.prompt.not_text", "number_prompt.jsonl", "prompt"),
    prompt_file_row("prompts.prompt.lone_surrogate", "surrogate.jsonl", "prompt"),
    prompt_file_row("prompts.reference_answer.not_text", "true_reference.jsonl", "reference_answer"),
    prompt_file_row("prompts.prompt_id.not_an_id", "list_id.jsonl", "prompt_id"),
    prompt_file_row("prompts.prompt.empty", "empty_prompt.jsonl", "prompt"),
    prompt_file_row("prompts.reference_answer.empty", "blank_reference.jsonl", "reference_answer"),
    prompt_file_row("prompts.reference_answer.invalid", "word_reference.jsonl", "reference_answer"),
    ("eval", "--model.missing", "--prompts", usage("--prompts", "p.jsonl", "--task", "gsm8k")),
    ("eval", "--model.without_sampling", "--model", usage("--records", "r.jsonl", "--model", "m")),
    ("eval", "--samples-out.without_sampling", "--samples-out",
     usage("--records", "r.jsonl", "--samples-out", "s.jsonl")),
    ("eval", "sampling_option.without_sampling", "--temperature", usage("--plot", "a.json", "--temperature", "0.6")),
    ("eval", "--metrics.without_plot", "--metrics", usage("--records", "r.jsonl", "--metrics", "all")),
    ("eval", "eval.several_problems", "--num-samples, --model",
     raised(evaluate.main, ["--benchmark", "gsm8k", "--model", "m", "--num-samples", "0", "--out", "r.json"])),
    ("eval", "--rendered-prompts.without_prompts", "--rendered-prompts",
     usage("--benchmark", "gsm8k", "--model", "m", "--rendered-prompts")),
    ("eval", "--out.not_a_plot_format", "--out", usage("--plot", "a.json", "--out", "rounds.txt")),
    ("eval", "--k.below_1", "--k", usage("--records", "r.jsonl", "--k", "0", "2")),
    ("eval", "--k.above_num_samples", "--k",
     usage("--benchmark", "gsm8k", "--model", "m", "--num-samples", "4", "--k", "1", "8")),
    ("eval", "problems.none", "problems", raised(benchmark_results, [], "gsm8k", None)),
    ("eval", "--k.above_samples", "--k", raised(benchmark_results, [[SampleOutcome("5", True)]], "gsm8k", [2])),
    records_row("record.meta.task.not_--task", "math_record.jsonl", "meta.task", task="gsm8k"),
    records_row("record.meta.unset", "bare_record.jsonl", "meta"),
    records_row("record.meta.reference_answer.invalid", "bad_reference.jsonl", "meta.reference_answer"),
    records_row("record.meta.reference_answer.differs_within_prompt", "two_references.jsonl", "meta.reference_answer",
                line=2),
    records_row("record.meta.verifier_score.not_a_weight", "nan_score.jsonl", "meta.verifier_score"),
    records_row("record.meta.empty_sample_ids.invalid", "empty_ids.jsonl", "meta.empty_sample_ids"),
    ("eval", "records.meta.task.mixed", "two_tasks.jsonl", graded("two_tasks.jsonl")),
    ("eval", "--plot.no_headline_metric", "--plot",
     raised(plotted_metrics, [{"metrics": {"pass@4": 0.5}}], [Path("pass4.json")], None)),
    ("eval", "--metrics.not_in_result", "--metrics",
     raised(plotted_metrics, [RESULT], [Path("result.json")], ["maj@4"])),
    ("eval", "--plot.unreadable", "missing.json", raised(read_round_results, ["missing.json"])),
    ("eval", "--plot.not_json", "not_json.json", raised(read_round_results, ["not_json.json"])),
    ("eval", "--plot.not_a_result", "no_result.json", raised(read_round_results, ["no_result.json"])),
    ("eval", "--plot.task.unknown", "unknown_task.json: task", raised(read_round_results, ["unknown_task.json"])),
    ("eval", "--plot.metrics.not_a_rate", "null_metric.json: metrics.pass@1",
     raised(read_round_results, ["null_metric.json"])),
    ("eval", "--plot.tasks.mixed", "--plot", raised(read_round_results, ["result.json", "math_result.json"])),
    ("eval", "--plot.no_common_metric", "--plot", raised(read_round_results, list(PLOT))),
    ("eval", "pass@k.out_of_range", "k", raised(pass_at_k, 1, 0, 2)),
    ("eval", "problems.none_sampled", "problems", raised(benchmark_metrics, [[]], [1])),
    ("verifier", "record.prompt.no_user_message", "graded.jsonl:2: prompt",
     judged(Record([{"role": "system", "content": "Be brief."}], "5", 1.0, path="graded.jsonl", line=2))),
    ("verifier", "record.completion.special_token", "graded.jsonl:2: completion",
     judged(Record("What is 2 + 3?", "5<|eot_id|>", 1.0, path="graded.jsonl", line=2))),
    ("verifier", "verifier.several_problems", "--model, missing.jsonl: path",
     raised(verifier.main, ["score", "--model", "m", "--records", "missing.jsonl", "--out", "s.jsonl"])),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refusal_inputs")
    make_inputs(root)
    return root


@pytest.mark.parametrize("verb, key, where, problem", ROWS, ids=[row[1] for row in ROWS])
def test_each_bad_input_raises_its_problem(verb, key, where, problem, inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    before = {path: path.read_bytes() for path in inputs.rglob("*") if path.is_file()}
    assert [(error.key, error.where) for error in problem()] == [(key, where)]
    # nothing written: a refused resume keeps its log, a refused read leaves its inputs
    assert {path: path.read_bytes() for path in inputs.rglob("*") if path.is_file()} == before


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """What each row changes is its problem: the same calls on the inputs without it refuse nothing."""
    monkeypatch.chdir(inputs)
    check_sampling_args(options())
    check_usage(build_parser().parse_args(["--benchmark", "gsm8k", "--model", "m", "--num-samples", "4", "--k", "1",
                                           "4", "--out", "r.json"]))
    check_usage(build_parser().parse_args(["--plot", "a.json", "--metrics", "all", "--out", "rounds.svg"]))
    assert [problem.prompt_id for problem in jsonl_problems("prompts.jsonl", "gsm8k")] == ["1"]
    assert outcomes_of_records(records("two_references.jsonl")[:1], None, 1.0)[0] == "gsm8k"
    assert new_token_budgets("small_model", {0: GSM8K}, 8, {0: [1, 2]}) == {0: 1}
    assert read_round_results(["result.json"]) == [RESULT]
    jsonl(inputs, "resumable.samples", {"options": {"seed": 1}}, {**LOG_ROW, **sample_log._identity(GSM8K)})
    assert list(SampleLog(Path("resumable.samples"), {"seed": 1}, [GSM8K]).done) == [0]
    assert judge_prompt(Record("What is 2 + 3?", "5", 1.0)).startswith("What is 2 + 3?")


def test_the_table_covers_every_key_the_code_raises():
    rows = [(key, where, problem) for _, key, where, problem in ROWS]
    assert_covers(rows, SOURCES, ERRORS, unreachable=UNREACHABLE)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/evaluation/test_refusals.py",
                  [rendered(verb, key, where, *problem(), inputs) for verb, key, where, problem in ROWS])


MEGATRON = ("megatron", "transformer_engine")


@pytest.mark.slow
def test_the_table_imports_no_megatron(inputs, monkeypatch):
    """Each problem comes out of the pure checks: no row's check imports Megatron or Transformer Engine on the
    way to its refusal, and neither do the modules that hold the checks (imported in a fresh interpreter)."""
    monkeypatch.chdir(inputs)
    before = set(sys.modules)
    assert all(problem() for *_, problem in ROWS)
    assert sorted(name for name in set(sys.modules) - before if name.startswith(MEGATRON)) == []
    modules = ", ".join(f"nemo_topr.evaluation.{source.stem}" for source in SOURCES)
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.startswith({MEGATRON})))"
    run = subprocess.run([sys.executable, "-c", code], env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr

