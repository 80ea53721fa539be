"""`nemo-topr generate` and `nemo-topr eval` end to end on CPU with a tiny random Llama."""

import json
import math
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import checkout_env, cli_verb, placeholder_hf_model, refusal

from nemo_topr.data.records import DataError, load_records
from nemo_topr import cli
from nemo_topr.evaluation import evaluate, generate
from nemo_topr.evaluation.problems import load_problems
from nemo_topr.evaluation.samples import Completion, Problem, grade_completions, graded_records, grader_error_report
from nemo_topr.evaluation.sampling import (
    SamplingSettings, iter_completions, new_token_budgets, sample_and_grade, sampling_out_of_memory, trim_at_stop,
)
from nemo_topr.grading import grade

eval_main = cli_verb("eval")
TINY_SAMPLING = ["--num-samples", "2", "--max-new-tokens", "16", "--device", "cpu"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    # The 8-shot GSM8K prompt is about 3,000 tiny-tokenizer tokens.
    out = tmp_path_factory.mktemp("tiny_llama")
    return build_tiny_hf_llama(out, build_tiny_tokenizer(), max_position_embeddings=4096)


def test_generate_writes_graded_records(model_dir, tmp_path, capsys):
    out = tmp_path / "graded.jsonl"
    args = ["--model", str(model_dir), "--prompts", "gsm8k-test", "--limit", "2", *TINY_SAMPLING,
            "--sampler-logprobs", "--out", str(out)]
    assert generate.main(args) == 0
    records = load_records(out).records  # strict validation
    # the console ends, as every verb's does, with what it wrote
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"wrote {len(records)} records to {out} (")
    assert {(r.prompt_id, r.sample_id) for r in records} <= {(f"gsm8k-test-{i}", j) for i in range(2) for j in range(2)}
    for record in records:
        meta = record.meta
        assert record.reward in (1.0, -1.0)
        assert (record.reward == 1.0) == (meta["grade"] == "correct")
        assert grade(meta["task"], record.completion, meta["reference_answer"]) == meta["grade"]
        assert "\n\nQuestion:" not in record.completion
        assert math.isfinite(meta["sampler_logprob"]) and meta["sampler_logprob"] < 0


def test_sampling_is_deterministic_and_limit_keeps_the_first_prompts(model_dir):
    problems = load_problems("math500", limit=2)
    settings = SamplingSettings(num_samples=2, max_new_tokens=8)
    both = sample_and_grade(model_dir, problems, settings, backend="transformers")
    assert sample_and_grade(model_dir, problems, settings, backend="transformers") == both
    assert sample_and_grade(model_dir, problems[:1], settings, backend="transformers") == both[:1]
    other_seed = sample_and_grade(model_dir, problems, SamplingSettings(num_samples=2, max_new_tokens=8, seed=1),
                                  backend="transformers")
    assert other_seed != both


def test_stop_strings_cut_completions(model_dir):
    problems = load_problems("math500", limit=2)
    settings = SamplingSettings(num_samples=2, max_new_tokens=16, stop_strings=("e",))
    completions = [s.completion.text for samples in sample_and_grade(model_dir, problems, settings, "transformers")
                   for s in samples]
    assert not any("e" in text for text in completions)
    assert trim_at_stop(" 12.\n\nQuestion: Tom has", ["\n\nQuestion:"]) == " 12."
    assert trim_at_stop("a STOP b END", ["END", "STOP"]) == "a "


def test_empty_completions_are_not_written():
    problem = Problem("p0", "What is 2+3?", "5", "math")
    graded = grade_completions(problem, [Completion(""), Completion("so \\boxed{5}"), Completion("so \\boxed{6}")])
    assert [g.grade for g in graded] == ["invalid", "correct", "wrong"]
    records = graded_records([problem], [graded])
    assert [(r.sample_id, r.reward) for r in records] == [(1, 1.0), (2, -1.0)]


def test_generate_reads_a_prompt_file(model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Question: What is 2+3?\nAnswer:", "reference_answer": "5", "prompt_id": "add"},
            {"prompt": "Question: What is 2*3?\nAnswer:", "reference_answer": "#### 6"}]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "graded.jsonl"
    args = ["--model", str(model_dir), "--prompts", str(prompts), *TINY_SAMPLING, "--out", str(out)]
    assert cli.main(["generate", *args]) == 1  # a prompt file needs --task
    assert generate.main([*args, "--task", "gsm8k"]) == 0
    assert {r.prompt_id for r in load_records(out).records} <= {"add", "2"}


def test_eval_writes_results_and_plots_rounds(model_dir, tmp_path):
    result, samples = tmp_path / "r1.json", tmp_path / "samples.jsonl"
    args = ["--model", str(model_dir), "--benchmark", "math500", "--limit", "3", *TINY_SAMPLING,
            "--out", str(result), "--samples-out", str(samples)]
    assert eval_main(args) == 0
    results = json.loads(result.read_text())
    assert (results["num_problems"], results["samples_per_problem"], results["ks"]) == (3, 2, [1, 2])
    assert set(results["metrics"]) == {"pass@1", "pass@2", "maj@2", "invalid_rate", "grader_error_rate"}
    assert "| pass@1 |" in result.with_suffix(".md").read_text()

    # The same samples re-graded from records, with verifier scores added to their meta.
    scored = tmp_path / "scored.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    for row in lines:
        row["meta"]["verifier_score"] = 0.5
    scored.write_text("".join(json.dumps(row) + "\n" for row in lines))
    assert eval_main(["--records", str(scored), "--k", "1", "--out", str(tmp_path / "r2.json")]) == 0
    rescored = json.loads((tmp_path / "r2.json").read_text())
    assert rescored["task"] == "math" and "weighted_maj@1" not in rescored["metrics"]
    # both samples of each problem, empty ones included (`meta.empty_sample_ids`), so k = 2 votes
    assert rescored["samples_per_problem"] == 2
    assert eval_main(["--records", str(scored), "--out", str(tmp_path / "r3.json")]) == 0
    assert "weighted_maj@2" in json.loads((tmp_path / "r3.json").read_text())["metrics"]

    plot = tmp_path / "rounds.png"
    assert eval_main(["--plot", str(result), str(tmp_path / "r2.json"), "--out", str(plot)]) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_eval_on_a_prompt_file_grades_what_generate_samples_from_it(model_dir, tmp_path):
    """A benchmark's problems in the prompt form a model was trained on (here zero-shot): `eval
    --prompts` gives the metrics that `eval --records` computes from `generate`'s records of the
    same file and options; and `--prompts gsm8k-test` is `--benchmark gsm8k`."""
    prompts = tmp_path / "zero_shot.jsonl"
    rows = [("What is 2 + 3?", "5"), ("What is 4 * 6?", "24"), ("What is 10 - 7?", "3")]
    prompts.write_text("".join(json.dumps({"prompt": f"Question: {q}\nAnswer:", "reference_answer": a,
                                           "prompt_id": f"z{i}"}) + "\n" for i, (q, a) in enumerate(rows)))
    sampling = ["--model", str(model_dir), "--num-samples", "4", "--max-new-tokens", "16", "--device", "cpu"]
    assert eval_main(["--prompts", str(prompts), "--task", "gsm8k", *sampling,
                          "--out", str(tmp_path / "prompts.json")]) == 0
    graded = tmp_path / "graded.jsonl"
    assert generate.main(["--prompts", str(prompts), "--task", "gsm8k", *sampling, "--out", str(graded)]) == 0
    assert eval_main(["--records", str(graded), "--out", str(tmp_path / "records.json")]) == 0
    sampled, regraded = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("prompts", "records"))
    assert (sampled["source"], sampled["task"], sampled["num_problems"]) == (str(prompts.resolve()), "gsm8k", 3)
    assert sampled["metrics"] == regraded["metrics"] and sampled["ks"] == [1, 2, 4]

    one = ["--limit", "1", *sampling[:4], "--max-new-tokens", "8", "--device", "cpu"]
    assert eval_main(["--prompts", "gsm8k-test", *one, "--out", str(tmp_path / "split.json")]) == 0
    assert eval_main(["--benchmark", "gsm8k", *one, "--out", str(tmp_path / "benchmark.json")]) == 0
    split, benchmark = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("split", "benchmark"))
    assert split["metrics"] == benchmark["metrics"] and split["num_samples"] == benchmark["num_samples"] == 4


@pytest.mark.parametrize("options, key, where", [
    (["--prompts", "p.jsonl", "--task", "gsm8k"], "--model.missing", "--prompts"),
    (["--records", "r.jsonl", "--model", "M"], "--model.without_sampling", "--model"),
    (["--records", "r.jsonl", "--samples-out", "s.jsonl"], "--samples-out.without_sampling", "--samples-out"),
    (["--benchmark", "gsm8k", "--model", "M", "--rendered-prompts"], "--rendered-prompts.without_prompts",
     "--rendered-prompts"),
    *[(["--records", "r.jsonl", *flags], "sampling_option.without_sampling", flags[0])
      for flags in (["--temperature", "0"], ["--num-samples", "8"], ["--seed", "1"], ["--max-new-tokens", "64"],
                    ["--no-stop"], ["--stop", "###"], ["--device", "cpu"], ["--backend", "vllm"],
                    ["--sampler-logprobs"], ["--data-dir", "d"], ["--top-p", "0.9"], ["--top-k", "5"],
                    ["--tensor-parallel-size", "2"], ["--num-shots", "0"])],
    (["--plot", "a.json", "--temperature", "0.6"], "sampling_option.without_sampling", "--temperature"),
])
def test_eval_refuses_options_its_mode_would_ignore(options, key, where, tmp_path, monkeypatch):
    """`--records` with `--model` or `--samples-out` ran and ignored them: no samples were written.
    So were the sampling options (`--records r.jsonl --num-samples 8` graded the records' own samples)."""
    monkeypatch.chdir(tmp_path)
    assert refusal(evaluate.main, [*options, "--out", "r.json"]) == (2, key, where)
    assert not list(tmp_path.iterdir())


def test_gsm8k_on_a_short_context_model_is_refused_naming_num_shots_and_runs_with_fewer(tmp_path, capsys):
    """The demo model's context (1,024) holds no 8-shot GSM8K prompt (about 3,000 tiny-tokenizer
    tokens): `eval --benchmark gsm8k` was refused with no way to evaluate it."""
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    short = build_tiny_hf_llama(tmp_path / "short", build_tiny_tokenizer(), max_position_embeddings=1024)
    sampling = ["--benchmark", "gsm8k", "--model", str(short), "--limit", "1", "--max-new-tokens", "4",
                "--device", "cpu"]
    assert refusal(evaluate.main, [*sampling, "--out", str(tmp_path / "eight.json")]) == (
        1, "--num-shots.prompt_beyond_model_context", "--num-shots")
    assert not (tmp_path / "eight.json").exists()
    assert eval_main([*sampling, "--num-shots", "0", "--out", str(tmp_path / "zero.json")]) == 0
    zero = json.loads((tmp_path / "zero.json").read_text())
    assert (zero["num_problems"], zero["num_shots"]) == (1, 0)
    # the prompt holds that many worked exemplars before its own question
    for shots in (0, 2):
        prompt = load_problems("gsm8k-test", limit=1, shots=shots)[0].prompt
        assert prompt.count("Question: ") == shots + 1 and prompt.count("The answer is ") == shots
    assert refusal(load_problems, "math500", shots=0)[1] == "--num-shots.math500"  # zero-shot already


@pytest.mark.parametrize("verb, options", [
    (generate.main, ["--prompts", "gsm8k-test", "--task", "math", "--out", "g.jsonl"]),
    (evaluate.main, ["--benchmark", "gsm8k", "--task", "math", "--out", "r.json"]),
    (evaluate.main, ["--prompts", "math500", "--task", "gsm8k", "--out", "r.json"]),
], ids=["generate", "eval-benchmark", "eval-prompts"])
def test_a_task_that_contradicts_the_benchmark_is_refused(verb, options, tmp_path, monkeypatch):
    """It was ignored: GSM8K's problems graded by GSM8K's grader under `--task math`, unsaid."""
    monkeypatch.chdir(tmp_path)
    model = placeholder_hf_model(tmp_path / "model")
    assert refusal(verb, [*options, "--model", str(model), "--limit", "1", "--device", "cpu"]) == (
        1, "--task.not_the_benchmarks", "--task")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_records_eval_grades_each_record_for_its_own_task(tmp_path, capsys):
    def record(sample_id, completion, task="gsm8k", **meta):
        return json.dumps({"prompt": "Q: 200 + 50?", "completion": completion, "reward": 1.0, "prompt_id": "p0",
                           "sample_id": sample_id, "meta": {"task": task, "reference_answer": "250", **meta}})

    graded = tmp_path / "graded.jsonl"
    graded.write_text("\n".join([record(0, " The answer is 250."), record(1, " The answer is 12.")]) + "\n")
    out = tmp_path / "r.json"
    assert eval_main(["--records", str(graded), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["pass@1"] == 0.5  # hand-graded: one of two says 250
    assert eval_main(["--records", str(graded), "--task", "gsm8k", "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    for score in (float("nan"), -0.5, "0.2", True, float("inf")):  # NaN won every vote for the first answer
        scored = tmp_path / "scored.jsonl"
        scored.write_text("\n".join([record(0, " The answer is 250.", verifier_score=0.9),
                                     record(1, " The answer is 12.", verifier_score=score)]) + "\n")
        assert refusal(evaluate.main, ["--records", str(scored), "--out", str(tmp_path / "s.json")]) == (
            1, "record.meta.verifier_score.not_a_weight", f"{scored}:2: meta.verifier_score")
    for limit in ("-1", "0"):  # `--limit -1` evaluated all but the last problem without a word
        assert refusal(evaluate.main, ["--records", str(graded), "--limit", limit, "--out",
                                       str(tmp_path / "l.json")]) == (1, "--limit.below_1", "--limit")
    assert not (tmp_path / "l.json").exists()
    # --task that contradicts a record: MATH's grader on GSM8K samples, never unsaid
    assert refusal(evaluate.main, ["--records", str(graded), "--task", "math", "--out", str(tmp_path / "m.json")]) == (
        1, "record.meta.task.not_--task", f"{graded}:1: meta.task")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([record(0, " 250"), record(1, " 250", task="math")]) + "\n")
    assert refusal(evaluate.main, ["--records", str(mixed), "--out", str(tmp_path / "x.json")]) == (
        1, "records.meta.task.mixed", str(mixed))
    bare = tmp_path / "bare.jsonl"  # no task: --task supplies it; no reference answer: named
    bare.write_text(json.dumps({"prompt": "Q", "completion": " 250", "reward": 1.0, "prompt_id": "p0", "sample_id": 0,
                                "meta": {"reference_answer": "250"}}) + "\n")
    assert refusal(evaluate.main, ["--records", str(bare), "--out", str(tmp_path / "b.json")]) == (
        1, "record.meta.unset", f"{bare}:1: meta")
    assert eval_main(["--records", str(bare), "--task", "gsm8k", "--out", str(tmp_path / "b.json")]) == 0
    # a reference GSM8K's grader cannot read: refused, not an unanswered sample counted merely invalid
    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text(json.dumps({"prompt": "Q", "completion": " I do not know.", "reward": -1.0, "prompt_id": "p0",
                                      "sample_id": 0, "meta": {"task": "gsm8k", "reference_answer": "twelve"}}) + "\n")
    assert refusal(evaluate.main, ["--records", str(unreadable), "--out", str(tmp_path / "u.json")]) == (
        1, "record.meta.reference_answer.invalid", f"{unreadable}:1: meta.reference_answer")
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "x.json").exists()
    assert not (tmp_path / "u.json").exists()


def test_records_scored_in_part_by_a_verifier_say_why_the_weighted_vote_is_left_out(tmp_path, capsys):
    rows = [{"prompt": "Q: 200 + 50?", "completion": f" The answer is {answer}.", "reward": 1.0, "prompt_id": "p0",
             "sample_id": i, "meta": {"task": "gsm8k", "reference_answer": "250",
                                      **({"verifier_score": 0.9} if i < 2 else {})}}
            for i, answer in enumerate((250, 250, 12, 12))]
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert eval_main(["--records", str(graded), "--out", str(tmp_path / "r.json")]) == 0
    assert "weighted_maj@4" not in json.loads((tmp_path / "r.json").read_text())["metrics"]
    # a verifier run that stopped half-way: the metric is left out, and now it says so
    assert ("nemo-topr eval: weighted_maj@k left out: 2 of the 4 samples with an answer have meta.verifier_score"
            in capsys.readouterr().err)
    graded.write_text("".join(json.dumps({**row, "meta": {**row["meta"], "verifier_score": 0.5}}) + "\n"
                              for row in rows))
    assert eval_main(["--records", str(graded), "--out", str(tmp_path / "r.json"), "--overwrite"]) == 0
    assert "weighted_maj@4" in json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert "left out" not in capsys.readouterr().err


def _graded_record(prompt_id, sample_id, answer, reference, **fields):
    return json.dumps({"prompt": "Q: 2 + 3?", "completion": f" The answer is {answer}.", "reward": 1.0,
                       "prompt_id": prompt_id, "sample_id": sample_id,
                       "meta": {"task": "gsm8k", "reference_answer": reference}, **fields}) + "\n"


def test_records_of_one_prompt_with_two_reference_answers_are_refused_naming_both(tmp_path):
    """Each record was graded against its own reference: prompt 'a' with references 5 and 6 and
    answers 5 and 6 scored pass@2 and maj@2 100 % as one problem, without a word."""
    conflicting = tmp_path / "conflicting.jsonl"
    conflicting.write_text(_graded_record("a", 0, 5, "5") + _graded_record("a", 1, 6, "6"))
    no_ids = tmp_path / "no_ids.jsonl"  # the prompt text groups them
    no_ids.write_text(_graded_record(None, 0, 5, "5") + _graded_record(None, 1, 6, 6))
    for records, out in ((conflicting, "c.json"), (no_ids, "n.json")):
        assert refusal(evaluate.main, ["--records", str(records), "--out", str(tmp_path / out)]) == (
            1, "record.meta.reference_answer.differs_within_prompt", f"{records}:2: meta.reference_answer")
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "n.json").exists()
    same = tmp_path / "same.jsonl"  # the number 5 and the string "5" are one reference
    same.write_text(_graded_record("a", 0, 5, "5") + _graded_record("a", 1, 6, 5))
    assert eval_main(["--records", str(same), "--out", str(tmp_path / "s.json")]) == 0


def test_the_markdown_title_of_uneven_sample_counts_says_so(tmp_path, capsys):
    """Problem 'a' with 2 samples and 'b' with 1 were titled "2 problems, 1 samples each", though
    pass@1 reads all 3 (the mean of a's 1/2 and b's 1)."""
    graded = tmp_path / "uneven.jsonl"
    graded.write_text(_graded_record("a", 0, 5, "5") + _graded_record("a", 1, 6, "5") + _graded_record("b", 0, 5, "5"))
    out = tmp_path / "r.json"
    assert eval_main(["--records", str(graded), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["pass@1"] == 0.75
    assert out.with_suffix(".md").read_text().startswith("**uneven** (gsm8k): 2 problems, 3 samples, at least 1 each\n")
    graded.write_text(_graded_record("a", 0, 5, "5") + _graded_record("b", 0, 6, "5"))
    assert eval_main(["--records", str(graded), "--out", str(out), "--overwrite"]) == 0
    assert out.with_suffix(".md").read_text().startswith("**uneven** (gsm8k): 2 problems, 1 samples each\n")


def test_the_plot_draws_the_headline_metrics_unless_told_otherwise(tmp_path):
    """16 samples give 11 metrics; a round plot of all of them was unreadable. By default it draws
    pass@1, the votes at the largest k every round has, and the invalid rate."""
    def result(name, ks, weighted=False):
        metrics = {**{f"pass@{k}": 0.1 for k in ks}, **{f"maj@{k}": 0.2 for k in ks if k > 1},
                   **({f"weighted_maj@{k}": 0.3 for k in ks if k > 1} if weighted else {}),
                   "invalid_rate": 0.05, "grader_error_rate": 0.0}
        (tmp_path / name).write_text(json.dumps({"task": "gsm8k", "label": name, "ks": ks, "metrics": metrics}))
        return tmp_path / name

    paths = [result("r0.json", [1, 2, 4, 8, 16], weighted=True), result("r1.json", [1, 2, 4, 8], weighted=True)]
    results = evaluate.read_round_results(paths)
    assert evaluate.plotted_metrics(results, paths, None) == ["pass@1", "maj@8", "weighted_maj@8", "invalid_rate"]
    assert evaluate.plotted_metrics(results, paths, ["all"]) == [
        "pass@1", "pass@2", "pass@4", "pass@8", "maj@2", "maj@4", "maj@8", "weighted_maj@2", "weighted_maj@4",
        "weighted_maj@8", "invalid_rate", "grader_error_rate"]
    assert evaluate.plotted_metrics(results, paths, ["maj@2", "pass@2"]) == ["maj@2", "pass@2"]
    one_sample = [result("r2.json", [1]), result("r3.json", [1])]
    assert evaluate.plotted_metrics(evaluate.read_round_results(one_sample), one_sample, None) == [
        "pass@1", "invalid_rate"]

    out = tmp_path / "rounds.png"
    assert refusal(evaluate.main, ["--plot", *map(str, paths), "--metrics", "maj@16", "--out", str(out)]) == (
        1, "--metrics.not_in_result", "--metrics")
    records_with_metrics = ["--records", str(paths[0]), "--metrics", "all", "--out", str(tmp_path / "r.json")]
    assert refusal(evaluate.main, records_with_metrics) == (2, "--metrics.without_plot", "--metrics")
    assert not out.exists()
    assert eval_main(["--plot", *map(str, paths), "--metrics", "all", "--out", str(out)]) == 0


def test_plot_refuses_what_it_cannot_draw_naming_the_file(tmp_path):
    def result(name, task, **metrics):
        (tmp_path / name).write_text(json.dumps({"task": task, "label": name, "metrics": metrics}))
        return str(tmp_path / name)

    gsm8k, math = result("r0.json", "gsm8k", **{"pass@1": 0.1}), result("r1.json", "math", **{"pass@1": 0.3})
    other = result("r2.json", "gsm8k", invalid_rate=0.2)
    records = tmp_path / "graded.jsonl"
    records.write_text('{"a": 1}\n{"a": 2}\n')
    (tmp_path / "doctor.json").write_text('{"passed": true}')
    plot = tmp_path / "rounds.png"
    cases = [  # before: a plot titled "gsm8k" holding MATH's rate, an empty plot, tracebacks, no file name
        ([gsm8k, math], "--plot.tasks.mixed", "--plot"),
        ([gsm8k, other], "--plot.no_common_metric", "--plot"),
        ([str(records)], "--plot.not_json", str(records)),
        ([str(tmp_path / "doctor.json")], "--plot.not_a_result", str(tmp_path / "doctor.json")),
        ([str(tmp_path / "r9.json")], "--plot.unreadable", str(tmp_path / "r9.json")),
        # a null ended in a TypeError, a string was drawn as a point, a list as task in a TypeError
        *[([result(name, "gsm8k", **{"pass@1": value})], "--plot.metrics.not_a_rate",
           f"{tmp_path / name}: metrics.pass@1")
          for name, value in (("n.json", None), ("s.json", "0.5"), ("p.json", 35.0))],
        ([result("t.json", ["gsm8k"], **{"pass@1": 0.1})], "--plot.task.unknown", f"{tmp_path / 't.json'}: task"),
    ]
    for paths, key, where in cases:
        assert refusal(evaluate.main, ["--plot", *paths, "--out", str(plot)]) == (1, key, where)
    # matplotlib saves "rounds" as rounds.png (the file said written was not there, and another
    # rounds.png was replaced without --overwrite), and fails on ".txt" after the reading
    for out in ("rounds", "rounds.txt"):
        assert refusal(evaluate.main, ["--plot", gsm8k, "--out", str(tmp_path / out)]) == (
            2, "--out.not_a_plot_format", "--out")
    assert not plot.exists() and not (tmp_path / "rounds.txt").exists()
    assert eval_main(["--plot", gsm8k, other, "--out", str(tmp_path / "rounds.svg")]) == 1  # nothing in common
    assert eval_main(["--plot", gsm8k, gsm8k, "--out", str(tmp_path / "rounds.svg")]) == 0
    assert (tmp_path / "rounds.svg").read_text().lstrip().startswith("<?xml")


# ---------------------------------------------------------------------------------------------
# Grader errors (math-verify failing): dropped and counted, never -1 rewards or wrong answers

# Per problem: correct, the answer whose grading fails, wrong, correct.
BOXED = ["so \\boxed{5}", "so \\boxed{7}", "so \\boxed{6}", "so \\boxed{5}"]


def _verify_fails_on_seven(monkeypatch):
    """math-verify raising while comparing the answer 7 (as a broken sympy would)."""
    import math_verify

    real = math_verify.verify

    def verify(gold, target, **kwargs):
        if "7" in map(str, target):
            raise RuntimeError("sympy exploded")
        return real(gold, target, **kwargs)

    monkeypatch.setattr(math_verify, "verify", verify)


def test_grader_errors_are_not_written_as_negatives(monkeypatch):
    _verify_fails_on_seven(monkeypatch)
    problem = Problem("p0", "What is 2+3?", "5", "math")
    graded = grade_completions(problem, [Completion(text) for text in BOXED])
    assert [g.grade for g in graded] == ["correct", "error", "wrong", "correct"]
    assert "RuntimeError: sympy exploded" in graded[1].grader_error
    records = graded_records([problem], [graded])
    assert [(r.sample_id, r.reward) for r in records] == [(0, 1.0), (2, -1.0), (3, 1.0)]
    assert grader_error_report([graded], max_rate=0.25)["grader_errors"] == 1


def _math_prompts(tmp_path, n: int):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"What is {i}+5-{i}?", "reference_answer": "5",
                                           "prompt_id": f"q{i}"}) + "\n" for i in range(n)))
    return prompts


class FixedSampler:
    """Stands in for `iter_completions`: BOXED for every prompt, the prompt indices it was asked
    for recorded, and a crash after `crash_after` prompts when set."""

    def __init__(self, crash_after: int | None = None):
        self.asked: list[int] = []
        self.crash_after = crash_after

    def __call__(self, model_dir, problems, settings, backend, device):
        for index in problems:
            if self.crash_after is not None and len(self.asked) == self.crash_after:
                raise KeyboardInterrupt("killed")
            self.asked.append(index)
            yield index, [Completion(f"{text} (prompt {index})") for text in BOXED]


def test_generate_fails_above_the_grader_error_rate_and_keeps_every_sample(monkeypatch, tmp_path, capsys):
    _verify_fails_on_seven(monkeypatch)
    # The sampler is replaced by fixed completions: what is tested is what happens after sampling.
    sampler = FixedSampler()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", sampler)
    out, model = tmp_path / "graded.jsonl", placeholder_hf_model(tmp_path / "model")
    args = ["--model", str(model), "--prompts", str(_math_prompts(tmp_path, 2)), "--task", "math",
            "--num-samples", "4", "--device", "cpu", "--out", str(out)]
    assert cli.main(["generate", *args]) == 1  # 2 grader errors in 8 samples = 25 % > 1 % (the default)
    assert not out.exists()
    err = capsys.readouterr().err
    assert "the grader failed on 2 of 8 answers (25.00%), above --max-grader-error-rate 0.01" in err
    assert f"Every sample is kept in {out}.samples" in err
    logged = [json.loads(line) for line in (tmp_path / "graded.jsonl.samples").read_text().splitlines()[1:]]
    assert [[s["grade"] for s in row["samples"]] for row in logged] == [["correct", "error", "wrong", "correct"]] * 2
    assert all("sympy exploded" in row["samples"][1]["grader_error"] for row in logged)
    assert generate.main([*args, "--max-grader-error-rate", "0.25"]) == 0
    assert sampler.asked == [0, 1]  # the rerun used the logged samples, it did not sample again
    records = load_records(out).records
    assert len(records) == 6 and {r.meta["grade"] for r in records} == {"correct", "wrong"}
    assert sum(r.reward == -1.0 for r in records) == 2  # the two wrong answers only


def test_generate_writes_as_it_goes_and_resumes_where_it_stopped(monkeypatch, tmp_path, capsys):
    prompts, model = _math_prompts(tmp_path, 5), placeholder_hf_model(tmp_path / "model")
    args = ["--model", str(model), "--prompts", str(prompts), "--task", "math", "--num-samples", "4",
            "--device", "cpu", "--max-grader-error-rate", "0.5"]
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", FixedSampler())
    assert generate.main([*args, "--out", str(tmp_path / "whole.jsonl")]) == 0
    assert "[nemo-topr generate] 20/20 samples (100.0%)" in capsys.readouterr().err

    out, crashing = tmp_path / "graded.jsonl", FixedSampler(crash_after=3)
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", crashing)
    with pytest.raises(KeyboardInterrupt):
        generate.main([*args, "--out", str(out)])
    log = tmp_path / "graded.jsonl.samples"
    assert [json.loads(line)["prompt_id"] for line in log.read_text().splitlines()[1:]] == ["q0", "q1", "q2"]
    with log.open("a") as cut:  # a line the crash cut short is sampled again
        cut.write('{"index": 3, "prompt_id": "q3", "sam')
    assert "samples/s, ETA" in capsys.readouterr().err  # progress while it ran

    resumed = FixedSampler()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", resumed)
    assert generate.main([*args, "--out", str(out)]) == 0
    assert resumed.asked == [3, 4]
    assert "resuming: 3 of 5 prompts already sampled" in capsys.readouterr().err
    assert out.read_text() == (tmp_path / "whole.jsonl").read_text()
    assert (log.read_text().splitlines()[1:] ==
            (tmp_path / "whole.jsonl.samples").read_text().splitlines()[1:])

    before = out.read_bytes()
    assert cli.main(["generate", *args, "--out", str(out), "--seed", "1"]) == 1
    assert capsys.readouterr().err == (f"nemo-topr generate: --out {out} exists: pass --overwrite to replace it, "
                                       "or choose another path\n")
    assert cli.main(["generate", *args, "--out", str(out), "--seed", "1", "--overwrite"]) == 1  # nor other samples' log
    err = capsys.readouterr().err
    assert f"{log} holds samples drawn with other options (settings.seed: 0 then, 1 now): rerun" in err
    assert resumed.asked == [3, 4] and out.read_bytes() == before

    (model / "model.safetensors").write_text('{"re-exported": 1}')  # other weights under the same path
    assert cli.main(["generate", *args, "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert f"{log} holds samples drawn with other options (weights: [['model.safetensors', 0, " in err
    assert resumed.asked == [3, 4] and out.read_bytes() == before


def _crashed_generate(monkeypatch, tmp_path, *, prompts: int, crash_after: int, first_options=()):
    """`generate` of `prompts` math prompts killed after `crash_after` of them: (prompt file, out,
    its sample log, the arguments to rerun it with)."""
    prompt_file, model = _math_prompts(tmp_path, prompts), placeholder_hf_model(tmp_path / "model")
    out, log = tmp_path / "graded.jsonl", tmp_path / "graded.jsonl.samples"
    args = ["--model", str(model), "--prompts", str(prompt_file), "--task", "math", "--num-samples", "4",
            "--device", "cpu", "--max-grader-error-rate", "0.5", "--out", str(out)]
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", FixedSampler(crash_after=crash_after))
    with pytest.raises(KeyboardInterrupt):
        generate.main([*args, *first_options])
    return prompt_file, out, log, args


def test_a_sample_log_of_prompts_edited_since_is_not_resumed(monkeypatch, tmp_path, capsys):
    """The log's options name the prompt file by its path; a file edited after a crash was resumed
    with the old samples and grades: a record of the new text carried a completion of the old one,
    and a completion answering 18 against a reference corrected to 18 stayed "wrong"."""
    prompts, out, log, args = _crashed_generate(monkeypatch, tmp_path, prompts=3, crash_after=2)
    capsys.readouterr()
    original = prompts.read_text()
    rows = [json.loads(line) for line in original.splitlines()]
    sampler = FixedSampler()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", sampler)
    for field, value, key in (("prompt", "What is 1+50-1?", "sample_log.prompt_sha256.changed"),
                              ("reference_answer", "50", "sample_log.reference_answer.changed")):
        edited = [dict(row, **({field: value} if row["prompt_id"] == "q1" else {})) for row in rows]
        prompts.write_text("".join(json.dumps(row) + "\n" for row in edited))
        assert refusal(generate.main, args) == (1, key, f"{log}:3: {key.split('.')[1]}")
        assert sampler.asked == [] and not out.exists()
    prompts.write_text(original)  # as logged: resumed
    assert generate.main(args) == 0 and sampler.asked == [2]


def test_a_sample_log_graded_for_another_task_is_graded_again_on_resume(monkeypatch, tmp_path, capsys):
    """--task is not a sampling option (the stop strings it implies are): a rerun with --task gsm8k
    after a crashed --task math run took the MATH grader's verdicts under the gsm8k label. The logged
    prompts are now graded again, so the result is what a fresh gsm8k run of the same samples gives."""
    # graded apart by the two graders (by hand: MATH reads \boxed only, GSM8K "The answer is" and the
    # last number, so 10/2 is 10 to it)
    monkeypatch.setattr(sys.modules[__name__], "BOXED", ["The answer is 5.", "so \\boxed{\\frac{10}{2}}"])
    _, out, log, args = _crashed_generate(monkeypatch, tmp_path, prompts=3, crash_after=2, first_options=["--no-stop"])
    as_gsm8k = [*args[:args.index("--task")], "--task", "gsm8k", *args[args.index("--task") + 2:], "--no-stop"]
    math_grades = [[s["grade"] for s in json.loads(line)["samples"]] for line in log.read_text().splitlines()[1:]]
    capsys.readouterr()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", FixedSampler())
    assert generate.main(as_gsm8k) == 0
    assert ("nemo-topr generate: 2 logged prompts graded again as gsm8k (2 graded as math); the log now holds these "
            "grades\n") in capsys.readouterr().err
    fresh = tmp_path / "fresh.jsonl"
    fresh_args = [*as_gsm8k[:as_gsm8k.index("--out")], "--out", str(fresh), *as_gsm8k[as_gsm8k.index("--out") + 2:]]
    assert generate.main(fresh_args) == 0
    assert out.read_text() == fresh.read_text()  # records: rewards and meta.grade of the gsm8k grader
    logged = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    assert [row["samples"] for row in logged] == [json.loads(line)["samples"] for line in
                                                   (tmp_path / "fresh.jsonl.samples").read_text().splitlines()[1:]]
    assert {row["task"] for row in logged} == {"gsm8k"}
    assert math_grades == [["invalid", "correct"]] * 2
    assert [[s["grade"] for s in row["samples"]] for row in logged] == [["correct", "wrong"]] * 3


def test_a_sample_log_line_without_its_task_is_graded_again(tmp_path):
    """A log written before its lines named their task: which grader graded it cannot be told."""
    from nemo_topr.evaluation.sample_log import SampleLog, _identity

    problem, log = Problem("q0", "What is 2+3?", "5", "gsm8k"), tmp_path / "graded.jsonl.samples"
    identity = {key: value for key, value in _identity(problem).items() if key != "task"}
    sample = {"text": " The answer is 5.", "sampler_logprob": None, "answer": None, "grade": "invalid",
              "grader_error": None}
    log.write_text(json.dumps({"options": {}}) + "\n" +
                   json.dumps({"index": 0, "prompt_id": "q0", **identity, "samples": [sample]}) + "\n")
    resumed = SampleLog(log, {}, [problem])
    assert resumed.regraded == {None: 1}
    assert [(s.answer, s.grade) for s in resumed.done[0]] == [("5", "correct")]  # by hand: "5" against "5"
    assert json.loads(log.read_text().splitlines()[1])["task"] == "gsm8k"
    assert SampleLog(log, {}, [problem]).regraded == {}  # rewritten: graded once


def test_a_sample_log_whose_lines_cannot_show_the_prompts_is_not_resumed(tmp_path):
    """A log written before its lines held the prompt's digest cannot prove the prompts unchanged."""
    from nemo_topr.evaluation.sample_log import SampleLog

    problem, log = Problem("q0", "What is 2+3?", "5", "math"), tmp_path / "graded.jsonl.samples"
    log.write_text('{"options": {}}\n{"index": 0, "prompt_id": "q0", "samples": []}\n')
    assert refusal(SampleLog, log, {}, [problem]) == (1, "sample_log.prompt_sha256.missing", f"{log}:2: prompt_sha256")
    log.write_text('{"options": {}}\n')
    SampleLog(log, {}, [problem]).append(0, problem, [])
    assert SampleLog(log, {}, [problem]).done == {0: []}


def test_a_sample_log_without_a_finished_prompt_starts_over_with_other_options(monkeypatch, tmp_path, capsys):
    """A run that stopped before its first prompt finished (vLLM out of memory at start-up, a kill)
    leaves a log of options alone; the rerun with other options was refused as "samples drawn with
    other options" until the log was deleted by hand, though none had been drawn."""
    _, out, log, args = _crashed_generate(monkeypatch, tmp_path, prompts=2, crash_after=0,
                                          first_options=["--max-new-tokens", "64"])
    assert len(log.read_text().splitlines()) == 1 and '"max_new_tokens": 64' in log.read_text()
    sampler = FixedSampler()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", sampler)
    assert generate.main([*args, "--max-new-tokens", "32"]) == 0
    assert sampler.asked == [0, 1] and '"max_new_tokens": 32' in log.read_text().splitlines()[0]
    assert len(out.read_text().splitlines()) == 8
    capsys.readouterr()


def test_a_sample_log_the_disk_cannot_take_ends_in_one_line_and_the_rerun_resumes(monkeypatch, tmp_path, capsys):
    """The disk fills after two prompts (the third line goes to /dev/full: the kernel's ENOSPC).
    It ended in "[Errno 28] No space left on device", naming no file (a 40 KB tmpfs, by hand)."""
    model = placeholder_hf_model(tmp_path / "model")
    args = ["--model", str(model), "--prompts", str(_math_prompts(tmp_path, 5)), "--task", "math",
            "--num-samples", "4", "--device", "cpu", "--max-grader-error-rate", "0.5", "--out",
            str(tmp_path / "graded.jsonl")]
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", FixedSampler())
    real_open, appended = Path.open, []

    def full_after_two_prompts(self, mode="r", *rest, **options):
        if self.name.endswith(".samples") and mode == "a":
            appended.append(self)
            if len(appended) > 2:
                return real_open(Path("/dev/full"), mode, *rest, **options)
        return real_open(self, mode, *rest, **options)

    monkeypatch.setattr(Path, "open", full_after_two_prompts)
    log = tmp_path / "graded.jsonl.samples"
    assert refusal(generate.main, args) == (1, "sample_log.write_failed", str(log))
    assert not (tmp_path / "graded.jsonl").exists()
    monkeypatch.setattr(Path, "open", real_open)  # room again
    resumed = FixedSampler()
    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", resumed)
    assert generate.main(args) == 0 and resumed.asked == [2, 3, 4]
    assert len(load_records(tmp_path / "graded.jsonl").records) == 20


def test_a_model_that_is_not_there_leaves_no_sample_log(tmp_path, capsys):
    """The model is checked before the log beside --out is started, so a typo leaves nothing."""
    assert cli.main(["generate", "--prompts", "gsm8k-test", "--model", str(tmp_path / "nothere"), "--limit", "1",
                          "--device", "cpu", "--out", str(tmp_path / "g.jsonl")]) == 1
    assert capsys.readouterr().err.startswith(f"nemo-topr generate: --model {tmp_path / 'nothere'}: no such "
                                              "directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_more_samples_than_memory_holds_end_in_one_line_naming_what_to_lower(model_dir, tmp_path):
    """A prompt's samples are one batch for transformers: 10^9 of them need about 1.4 TB for the
    prompt's copies alone. The allocation fails for real (the address space capped at 64 GiB, so
    that the kernel's overcommit policy cannot let it through); it ended in torch's traceback."""
    out = tmp_path / "g.jsonl"
    cap = 64 << 30
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_topr.cli", "generate", "--prompts", "math500", "--limit", "1", "--model",
         str(model_dir), "--num-samples", str(10**9), "--max-new-tokens", "16", "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, env=checkout_env(), timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("nemo-topr generate: cpu ran out of memory sampling one prompt's 1000000000 samples (up to ")
    assert "Give a lower --num-samples or --max-new-tokens (" in last and "can't allocate memory" in last
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize(("raised", "expected"), [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB"),
     (ValueError, r"^cpu ran out of memory sampling one prompt's 64 samples \(up to \d+ tokens each\): .* one batch; "
                  r"the scores of every step are kept for --sampler-logprobs, vocabulary-wide: leave it out\. Give a "
                  r"lower --num-samples or --max-new-tokens \(CUDA out of memory\. Tried to allocate 40\.00 GiB\)$")),
    # Python's own failed allocation says nothing: named by its type
    (MemoryError(), (ValueError, r"^cpu ran out of memory sampling one prompt's 64 samples .* \(MemoryError\)$")),
    # an error that is no failed allocation is the program's, raised as it is
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), (RuntimeError, "^mat1 and mat2 shapes")),
])
def test_only_a_failed_allocation_while_sampling_is_read_as_out_of_memory(model_dir, monkeypatch, raised, expected):
    from transformers import GenerationMixin

    def generate_fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(GenerationMixin, "generate", generate_fails)
    settings = SamplingSettings(num_samples=64, max_new_tokens=8, sampler_logprobs=True)
    with pytest.raises(expected[0], match=expected[1]):
        sample_and_grade(str(model_dir), load_problems("math500", limit=1), settings, device="cpu")


def test_a_gpu_out_of_memory_offers_vllm():
    settings = SamplingSettings(num_samples=512, max_new_tokens=4000)
    error = torch.OutOfMemoryError("CUDA out of memory.\nmore")
    assert sampling_out_of_memory(settings, "cuda", 4100, error) == (
        "cuda ran out of memory sampling one prompt's 512 samples (up to 4100 tokens each): the transformers backend "
        "samples a prompt's samples as one batch. Give a lower --num-samples or --max-new-tokens, or sample with "
        "--backend vllm (CUDA out of memory.)")


@pytest.mark.parametrize("flag", ["--num-samples", "--max-new-tokens"])
def test_eval_and_generate_refuse_zero_samples_or_tokens(flag, tmp_path, capsys):
    model = placeholder_hf_model(tmp_path / "model")
    assert eval_main(["--benchmark", "gsm8k", "--model", str(model), "--limit", "1", flag, "0",
                          "--device", "cpu", "--out", str(tmp_path / "r.json")]) == 1
    assert cli.main(["generate", "--prompts", "gsm8k-test", "--model", str(model), "--limit", "1", flag, "0",
                          "--device", "cpu", "--out", str(tmp_path / "g.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.count(f"{flag} must be at least 1; got 0") == 2
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob("*.samples"))


@pytest.mark.parametrize("options, key", [
    (["--temperature", "-1"], "--temperature.negative_or_infinite"),
    (["--temperature", "nan"], "--temperature.negative_or_infinite"),
    # inf sampled uniformly from the top-k and wrote `Infinity` (no JSON) in the settings line
    (["--temperature", "inf"], "--temperature.negative_or_infinite"),
    # 1e-300 is 0 in float32: the logits divided by it ended in torch's "probability tensor contains inf, nan"
    (["--temperature", "1e-300"], "--temperature.below_min"),
    # -1, a "random seed" in some tools, was one fixed seed here
    (["--seed", "-1"], "--seed.out_of_range"),
    (["--seed", str(2**63)], "--seed.out_of_range"),
    (["--top-p", "0"], "--top-p.out_of_range"),
    (["--top-p", "1.5"], "--top-p.out_of_range"),
    # an empty stop string (meant as "no stop string"?) made every sample empty, reported as such
    (["--stop", "\n\nQuestion:", "--stop", ""], "--stop.empty"),
    (["--temperature", "0", "--num-samples", "4"], "--num-samples.above_1_when_greedy"),
    (["--temperature", "0", "--sampler-logprobs"], "--sampler-logprobs.greedy"),
])
def test_sampling_options_are_checked_before_the_model_loads(options, key, tmp_path):
    """transformers refused a temperature of 0 or below only after loading the weights, and left a
    sample log behind; the placeholder weights here would fail to load, so no load happened."""
    model = placeholder_hf_model(tmp_path / "model")
    problem = (1, key, key.partition(".")[0])
    assert refusal(evaluate.main, ["--benchmark", "gsm8k", "--model", str(model), "--limit", "1", "--device", "cpu",
                                   *options, "--out", str(tmp_path / "r.json")]) == problem
    assert refusal(generate.main, ["--prompts", "gsm8k-test", "--model", str(model), "--limit", "1", "--device",
                                   "cpu", "--num-samples", "1", *options, "--out", str(tmp_path / "g.jsonl")]
                   ) == problem
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_temperature_zero_is_greedy_decoding_whatever_the_models_generation_config(model_dir, tmp_path):
    """The completion is the argmax path, computed here token by token, for any seed, although the
    model's generation_config asks for sampling (as Llama 3 Instruct's does)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import load_tokenizer, prompt_token_ids

    model = shutil.copytree(model_dir, tmp_path / "model")
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, "temperature": 0.6,
                                                              "top_p": 0.9}))
    problem = Problem("q0", "Question: What is 2+3?\nAnswer:", "5", "gsm8k")
    tokenizer = load_tokenizer(model)
    ids = prompt_token_ids(tokenizer, [problem.prompt])[0]
    network = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32).eval()
    path = []
    with torch.no_grad():
        while len(path) < 12 and (not path or path[-1] != tokenizer.eos_token_id):
            path.append(int(network(torch.tensor([ids + path])).logits[0, -1].argmax()))
    expected = tokenizer.decode(path, skip_special_tokens=True)
    assert expected.strip()  # a path of real tokens, not EOS at once
    for seed in (0, 1):
        settings = SamplingSettings(temperature=0.0, max_new_tokens=12, seed=seed)
        [(index, [completion])] = iter_completions(model, {0: problem}, settings, "transformers", "cpu")
        assert (index, completion.text) == (0, expected)


@pytest.mark.parametrize("ks, key", [(["1", "8"], "--k.above_num_samples"), (["0", "2"], "--k.below_1")])
def test_eval_refuses_a_k_it_cannot_compute_before_sampling(ks, key, tmp_path):
    """It sampled every problem first and failed only at the metrics."""
    model = placeholder_hf_model(tmp_path / "model")
    assert refusal(evaluate.main, ["--benchmark", "gsm8k", "--model", str(model), "--limit", "1", "--num-samples", "4",
                                   "--k", *ks, "--device", "cpu", "--out", str(tmp_path / "r.json")]) == (2, key, "--k")
    assert sorted(p.name for p in tmp_path.iterdir()) == [model.name]  # no sample log, no results


def test_a_misspelled_benchmark_or_a_bad_prompt_file_is_named(tmp_path, capsys):
    model, out = placeholder_hf_model(tmp_path / "model"), tmp_path / "g.jsonl"
    for prompts, key in (("gsm8k-tst", "--prompts.no_such_file"), (str(tmp_path), "--prompts.directory")):
        assert refusal(generate.main, ["--prompts", prompts, "--model", str(model), "--device", "cpu", "--out",
                                       str(out)]) == (1, key, "--prompts")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Q: 1+1?", "reference_answer": "2"}\n{"prompt": "Q: 2+2?", reference_answer: 4}\n')
    assert cli.main(["generate", "--prompts", str(prompts), "--task", "gsm8k", "--model", str(model), "--device", "cpu",
                          "--out", str(out)]) == 1
    assert capsys.readouterr().err == (f"nemo-topr generate: {prompts}:2: record: invalid JSON: Expecting property "
                                       "name enclosed in double quotes (column 23)\n")
    assert not out.exists() and not list(tmp_path.glob("*.samples"))


@pytest.mark.parametrize("row, key, field", [
    ({"question": "Q: 1+1?", "answer": "2"}, "prompts.prompt.missing", "prompt"),
    ({"prompt": "Q: 1+1?"}, "prompts.reference_answer.missing", "reference_answer"),
    ({"prompt": 7, "reference_answer": "2"}, "prompts.prompt.not_text", "prompt"),
    ({"prompt": "", "reference_answer": "2"}, "prompts.prompt.empty", "prompt"),
    ({"prompt": [], "reference_answer": "2"}, "prompts.prompt.empty", "prompt"),
    ({"prompt": "Q: 1+1?", "reference_answer": " "}, "prompts.reference_answer.empty", "reference_answer"),
    ({"prompt": "Q: 1+1?", "reference_answer": True}, "prompts.reference_answer.not_text", "reference_answer"),
    # read before sampling: the grader reads a reference only for a sample with an answer, hours later
    ({"prompt": "Q: 1+1?", "reference_answer": "two"}, "prompts.reference_answer.invalid", "reference_answer"),
    ({"prompt": "Q: 1+1?", "reference_answer": "2", "prompt_id": 1.5}, "prompts.prompt_id.not_an_id", "prompt_id"),
    (["Q: 1+1?", "2"], "prompts.row.not_an_object", "row"),
    # the id was lost to the line number, the other key to nothing, without a word
    ({"prompt": "Q: 1+1?", "reference_answer": "2", "promptid": "q17"}, "prompts.field.unknown", "promptid"),
    ({"prompt": "Q: 1+1?", "reference_answer": "2", "source": "web"}, "prompts.field.unknown", "source"),
    # an emoji cut in two: the tokenizer's TypeError traceback after the model loaded
    ({"prompt": "Q: 1+1? \ud83d", "reference_answer": "2"}, "prompts.prompt.lone_surrogate", "prompt"),
])
def test_a_prompt_files_bad_row_is_named_by_line_and_field(tmp_path, row, key, field):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Q: 2+2?", "reference_answer": "4"}) + "\n" + json.dumps(row) + "\n")
    assert refusal(load_problems, str(prompts), task="gsm8k") == (1, key, f"{prompts}:2: {field}")


# a prompt's messages are checked as a record's (nemo_topr.data.records.check_messages, its keys its table's)
@pytest.mark.parametrize("row, message", [
    ({"prompt": [{"role": "user"}], "reference_answer": "2"}, "prompt[0].content: expected a string, got null"),
    ({"prompt": [{"content": "Q: 1+1?"}], "reference_answer": "2"}, "prompt[0].role: expected a string, got null"),
    ({"prompt": ["Q: 1+1?"], "reference_answer": "2"}, "prompt[0]: expected a message object, got string"),
    ({"prompt": [{"role": "usr", "content": "Q: 1+1?"}], "reference_answer": "2"},
     "prompt[0].role: unknown role 'usr'; the chat template knows system, user, assistant, ipython, tool; did you "
     "mean 'user'?"),
])
def test_a_prompt_files_bad_messages_are_named_by_line_and_field(tmp_path, row, message):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Q: 2+2?", "reference_answer": "4"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as error:
        load_problems(str(prompts), task="gsm8k")
    assert str(error.value).startswith(f"{prompts}:2: {message}")


def test_a_prompt_files_numeric_answers_zero_included_and_its_ids_are_read_as_given(tmp_path):
    """A reference answer of 0 was refused as "missing or empty"; two prompts under one id would be
    one prompt to the records, curation and asymre's group means."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Q: 5-5?", "reference_answer": 0}, {"prompt": "Q: 1/2?", "reference_answer": 0.5},
            {"prompt": "Q: 2+2?", "reference_answer": "4", "prompt_id": "four"},
            {"prompt": "Q: 3+3?", "reference_answer": "6", "prompt_id": None}]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    problems = load_problems(str(prompts), task="gsm8k")
    assert [(p.prompt_id, p.reference_answer) for p in problems] == [
        ("1", "0"), ("2", "0.5"), ("four", "4"), ("4", "6")]
    assert grade("gsm8k", "5 - 5 = 0. The answer is 0", problems[0].reference_answer) == "correct"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in [*rows, {"prompt": "Q: 4+4?", "reference_answer": 8,
                                                                          "prompt_id": "four"}]))
    assert refusal(load_problems, str(prompts), task="gsm8k") == (1, "prompts.prompt_id.duplicate",
                                                                  f"{prompts}:5: prompt_id")


def test_eval_leaves_grader_errors_out_of_the_metrics(monkeypatch, tmp_path):
    _verify_fails_on_seven(monkeypatch)
    rows = [{"prompt": "What is 2+3?", "completion": text, "reward": 0.0, "prompt_id": "p", "sample_id": i,
             "meta": {"task": "math", "reference_answer": "5"}} for i, text in enumerate(BOXED)]
    records = tmp_path / "graded.jsonl"
    records.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = tmp_path / "r.json"
    assert eval_main(["--records", str(records), "--out", str(result)]) == 1  # 25 % > 1 %
    assert eval_main(["--records", str(records), "--k", "1", "--max-grader-error-rate", "0.25",
                          "--out", str(result)]) == 0
    results = json.loads(result.read_text())
    # 3 samples graded (2 correct, 1 wrong); the failed one is not a wrong answer: 2/3, not 2/4
    assert results["metrics"] == {"pass@1": pytest.approx(2 / 3), "invalid_rate": 0.0, "grader_error_rate": 0.25}
    assert results["grader_errors"]["grader_errors"] == 1 and results["samples_per_problem"] == 3


def test_eval_of_the_samples_records_equals_eval_of_the_samples_empty_completions_included(monkeypatch, tmp_path):
    """An empty completion (EOS first) is an invalid sample to `eval --benchmark`, but no record:
    `eval --records` of its `--samples-out` (the verifier's route to weighted votes) counted
    fewer samples, so a higher pass@k and a lower invalid rate than the model had. The records
    now name their prompt's empty samples (`meta.empty_sample_ids`) and both routes agree."""
    def sampler(model_dir, problems, settings, backend, device):
        for index, problem in problems.items():
            right, wrong = f"so \\boxed{{{problem.reference_answer}}}", "so \\boxed{-7}"
            texts = ([right, "", wrong, right], ["", right, "", "no box"], [wrong, right, "", ""])[index]
            yield index, [Completion(text) for text in texts]

    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", sampler)
    model, direct, samples = placeholder_hf_model(tmp_path / "model"), tmp_path / "direct.json", tmp_path / "s.jsonl"
    assert eval_main(["--model", str(model), "--benchmark", "math500", "--limit", "3", "--num-samples", "4",
                          "--device", "cpu", "--samples-out", str(samples), "--out", str(direct)]) == 0
    from_model = json.loads(direct.read_text())
    # by hand: 12 samples, 5 empty and 1 without a box; right answers 2, 1, 1 of 4
    assert from_model["num_samples"] == 12 and from_model["metrics"]["invalid_rate"] == pytest.approx(6 / 12)
    assert from_model["metrics"]["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 1 / 4) / 3)
    records = load_records(samples).records
    first_prompts = [r.meta.get("empty_sample_ids") for r in records if r.prompt_id == records[0].prompt_id]
    assert len(records) == 7 and first_prompts == [[1], [1], [1]]

    from_records = tmp_path / "records.json"
    assert eval_main(["--records", str(samples), "--out", str(from_records)]) == 0
    regraded = json.loads(from_records.read_text())
    assert regraded["metrics"] == from_model["metrics"] and regraded["num_samples"] == 12

    # the verifier's scores: the weighted vote is reported though the empty samples (which do not vote) have none
    scored = tmp_path / "scored.jsonl"
    scored.write_text("".join(json.dumps({**record.to_json(), "meta": {**record.meta, "verifier_score": 0.5}}) + "\n"
                              for record in records))
    assert eval_main(["--records", str(scored), "--out", str(tmp_path / "weighted.json")]) == 0
    weighted = json.loads((tmp_path / "weighted.json").read_text())["metrics"]
    assert weighted["weighted_maj@4"] == weighted["maj@4"] and weighted["invalid_rate"] == pytest.approx(6 / 12)


def test_a_prompt_left_without_records_is_named_where_the_records_are_written(monkeypatch, tmp_path, capsys):
    """A prompt whose samples are all empty has no record, so `eval --records` cannot count it:
    `generate` and `eval --samples-out` say so, with the count and the first such prompt."""
    def sampler(model_dir, problems, settings, backend, device):
        for index, problem in problems.items():
            yield index, [Completion(text) for text in (["", ""], ["", f"so \\boxed{{{problem.reference_answer}}}"],
                                                        ["", ""])[index]]

    monkeypatch.setattr("nemo_topr.evaluation.sampling.iter_completions", sampler)
    model = placeholder_hf_model(tmp_path / "model")
    note = ("2 of 3 prompts have no record, every sample empty or failed by the grader (first: {first}): "
            "`eval --records` of these records leaves them out, where `eval --benchmark` counts one of empty samples "
            "as failed")
    assert eval_main(["--model", str(model), "--benchmark", "math500", "--limit", "3", "--num-samples", "2",
                          "--device", "cpu", "--samples-out", str(tmp_path / "s.jsonl"),
                          "--out", str(tmp_path / "e.json")]) == 0
    assert f"nemo-topr eval: --samples-out: {note.format(first='math500-0')}\n" in capsys.readouterr().err
    assert [r.prompt_id for r in load_records(tmp_path / "s.jsonl").records] == ["math500-1"]
    prompts = _math_prompts(tmp_path, 3)
    assert generate.main(["--prompts", str(prompts), "--task", "math", "--model", str(model), "--device", "cpu",
                          "--num-samples", "2", "--out", str(tmp_path / "g.jsonl")]) == 0
    assert f"\n{note.format(first='q0')}\n" in capsys.readouterr().out


def test_sampling_leaves_room_in_the_models_context_and_refuses_a_full_prompt(tmp_path, capsys, monkeypatch):
    """score-logprobs and train refuse a record longer than max_position_embeddings
    (`beyond_model_context`); transformers would sample on past it. Each prompt gets at most
    context - prompt - 1 new tokens (room for the EOS training appends; the completion's text
    tokenized again may differ by a few tokens); a prompt without room for one is refused before
    anything is sampled or written."""
    from transformers import GenerationMixin

    from nemo_topr.data.tokenization import prompt_token_ids
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    prompts = _math_prompts(tmp_path, 3)
    problems = load_problems(str(prompts), task="math")
    tokenizer = build_tiny_tokenizer()
    lengths = [len(ids) for ids in prompt_token_ids(tokenizer, [p.prompt for p in problems])]
    context = max(lengths) + 6  # the longest prompt leaves 5 new tokens and the EOS
    model = build_tiny_hf_llama(tmp_path / "short", tokenizer, max_position_embeddings=context)
    budgets = new_token_budgets(model, dict(enumerate(problems)), 64)
    assert budgets == {i: context - n - 1 for i, n in enumerate(lengths)} and min(budgets.values()) == 5
    assert new_token_budgets(model, dict(enumerate(problems)), 3) == {0: 3, 1: 3, 2: 3}

    real_generate, lengths_sampled = GenerationMixin.generate, []

    def spy(self, input_ids, **options):  # the sequences transformers returns: prompt + sampled tokens
        output = real_generate(self, input_ids, **options)
        lengths_sampled.append((input_ids.shape[1], options["max_new_tokens"], output.sequences.shape[1]))
        return output

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    out = tmp_path / "graded.jsonl"
    assert generate.main(["--model", str(model), "--prompts", str(prompts), "--task", "math", "--num-samples", "2",
                          "--max-new-tokens", "64", "--device", "cpu", "--max-grader-error-rate", "1",
                          "--out", str(out)]) == 0
    assert [(prompt, budget) for prompt, budget, _ in lengths_sampled] == [(n, context - n - 1) for n in lengths]
    assert all(total <= context - 1 for _, _, total in lengths_sampled)  # room left for the EOS
    assert any(total == context - 1 for _, _, total in lengths_sampled)  # a random model ran to its budget

    tight = build_tiny_hf_llama(tmp_path / "tight", tokenizer, max_position_embeddings=max(lengths) + 1)
    refused = tmp_path / "refused.jsonl"
    longest = problems[lengths.index(max(lengths))].prompt_id
    assert refusal(generate.main, ["--model", str(tight), "--prompts", str(prompts), "--task", "math", "--device",
                                   "cpu", "--out", str(refused)]) == (
        1, "prompts.prompt.beyond_model_context", f"prompt {longest}")
    assert not refused.exists() and not Path(f"{refused}.samples").exists()


def test_rendered_prompts_are_refused_before_sampling_or_sampled_as_written_when_said(tmp_path, capsys, monkeypatch):
    """A prompt file of prompts rendered already (chat template and BOS written out, as sampling
    pipelines keep them) got the template again: sampled from a context that scoring and training
    never see, into records `train` refuses (`special_token`) after the sampling. `generate`
    refuses them before anything is sampled or written; with --rendered-prompts it samples them as
    written, from the tokens the template gives the plain text."""
    from transformers import GenerationMixin

    from nemo_topr.data.tokenization import prompt_token_ids
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_hf_llama(tmp_path / "model", tokenizer)
    plain = [f"What is {i}+5-{i}?" for i in range(2)]
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True) for text in plain]
    assert all(text.startswith("<|begin_of_text|><|start_header_id|>user") for text in rendered)
    files = {}
    for name, texts in (("rendered", rendered), ("plain", plain)):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps({"prompt": text, "reference_answer": "5", "prompt_id": f"q{i}"})
                                       + "\n" for i, text in enumerate(texts)))
    real_generate, sampled = GenerationMixin.generate, []

    def spy(self, input_ids, **options):
        sampled.append(input_ids[0].tolist())
        return real_generate(self, input_ids, **options)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    out = tmp_path / "graded.jsonl"
    args = ["--model", str(model), "--task", "math", "--num-samples", "1", "--max-new-tokens", "4", "--device", "cpu",
            "--max-grader-error-rate", "1", "--out", str(out)]

    assert refusal(generate.main, ["--prompts", str(files["rendered"]), *args]) == (
        1, "prompts.prompt.special_token", f"{files['rendered']}: prompt q0")
    assert sampled == [] and not out.exists() and not Path(f"{out}.samples").exists()

    assert generate.main(["--prompts", str(files["rendered"]), "--rendered-prompts", *args]) == 0
    assert sampled == prompt_token_ids(tokenizer, plain)  # as written: no second template, no second BOS
    assert "read them with dataset.rendered_prompts=true (train)" in capsys.readouterr().out
    assert [record.prompt for record in load_records(out, rendered_prompts=True).records] == rendered
    assert json.loads(Path(f"{out}.samples").read_text().splitlines()[0])["options"]["rendered_prompts"] is True

    # the option on plain prompts, which read as written would lose the template and BOS
    refused = tmp_path / "refused.jsonl"
    assert refusal(generate.main, ["--prompts", str(files["plain"]), "--rendered-prompts", *args[:-1], str(refused)]
                   ) == (1, "prompts.prompt.not_rendered", f"{files['plain']}: prompt q0")
    assert not refused.exists() and len(sampled) == 2
    assert refusal(load_problems, "gsm8k-test", rendered_prompts=True)[1] == "--rendered-prompts.benchmark"
