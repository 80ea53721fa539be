"""The miniature's task generator and grader (exact, hand-written examples), its report, and a
`slow` smoke run of the whole miniature pipeline at minimal sizes. The full 20-minute miniature
(`make miniature`) is not run by the test suite."""

from __future__ import annotations

import json
import random

import pytest

from nemo_topr.miniature import task


def test_hand_examples_grade_exactly():
    assert task.grade(" 7 + 5 = 12. 12 - 3 = 9. The answer is 9.", 9) == ("9", "correct")
    assert task.grade(" 7 + 5 = 12. 12 - 3 = 8. The answer is 8.", 9) == ("8", "wrong")
    # the project's GSM8K rules: without a marker the last number counts; no number is invalid
    assert task.grade(" 7 + 5 = 12. 12 - 3 = 9.", 9) == ("9", "correct")
    assert task.grade(" Ann has apples.", 9) == (None, "invalid")
    # two markers on one line: the first marker's match runs to the end of the line, so its first
    # number counts (documented in docs/miniature.md); on separate lines the last marker wins
    assert task.grade(" The answer is 10. The answer is 9.", 9) == ("10", "wrong")
    assert task.grade(" The answer is 10.\nThe answer is 9.", 9) == ("9", "correct")
    assert task.grade(" The answer is 90.", 9)[1] == "wrong"
    assert task.grade("", 0) == (None, "invalid")


def test_problem_text_and_solution_are_consistent():
    problem = task.make_problem(random.Random(3))
    assert problem.prompt.startswith("Question: ") and problem.prompt.endswith("\nAnswer:")
    assert problem.solution.endswith(f" The answer is {problem.answer}.")
    assert task.grade(problem.solution, problem.answer) == (str(problem.answer), "correct")


@pytest.mark.parametrize("seed", range(5))
def test_chain_of_thought_computes_the_answer(seed):
    """Replay each equation: every step starts from the previous result, every value is >= 0,
    and the last result is the answer; the question states the start and every operand."""
    for problem in task.make_splits({"x": 50}, seed=seed)["x"]:
        steps = problem.solution.strip().split(". ")[:-1]
        assert 2 <= len(steps) <= 3
        value = int(steps[0].split()[0])
        assert f"has {value} " in problem.question
        for step in steps:
            a, op, b, _, result = step.rstrip(".").split()
            assert int(a) == value and op in "+-" and f" {b}" in problem.question
            value = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert int(result) == value >= 0
        assert value == problem.answer


def test_splits_are_disjoint_deterministic_and_sized():
    splits = task.make_splits({"pretrain": 300, "train": 50, "test": 40}, seed=0)
    assert [len(s) for s in splits.values()] == [300, 50, 40]
    questions = [p.question for s in splits.values() for p in s]
    assert len(set(questions)) == len(questions)
    assert task.make_splits({"pretrain": 300, "train": 50, "test": 40}, seed=0) == splits
    assert task.make_splits({"pretrain": 300}, seed=1)["pretrain"] != splits["pretrain"]


def test_report_from_results(tmp_path):
    from nemo_topr.miniature import report

    run = {"eval": {"pass@1": 0.5, "maj@4": 0.6, "invalid_rate": 0.1, "mean_chars": 40.0},
           "telemetry": {"positive_nll": [1.0, 0.5], "negative_nll": [1.0, 2.0],
                         "negative_weight_mean": [1.0, 0.5], "effective_positive_share": [0.4],
                         "topr_loss": [0.1, 0.0]}}
    results = {"args": {"eval_samples": 4, "test_prompts": 10, "train_prompts": 8, "k": 4, "seeds": [1, 2],
                        "probe_prompts": 8},
               "dataset": {"records": 32, "positive_share": 0.4, "correct": 13, "wrong": 15, "invalid": 4},
               "pretrain": [{"round": 1, "iterations": 10, "pass@1": 0.35, "invalid_rate": 0.2}],
               "runs": {"topr_s1": {**run, "name": "topr", "key": "topr", "seed": 1},
                        "topr_s2": {**run, "name": "topr", "key": "topr", "seed": 2},
                        "topr_ptilde0.1_s1": {**run, "name": "topr p~=0.1", "key": "topr_ptilde0.1", "seed": 1}},
               "wall_time_s": 12.0}
    (tmp_path / "results.json").write_text(json.dumps(results))
    text = report.write_report(tmp_path, results, docs=tmp_path / "docs")
    assert "| topr | 0.500 ± 0.000 | 0.600 ± 0.000 |" in text
    assert "| topr p~=0.1 | 0.500 | 0.600 |" in text
    for name in report.PLOTS:
        assert (tmp_path / name).is_file() and (tmp_path / "docs" / name).is_file()


@pytest.mark.slow
def test_miniature_smoke(tmp_path):
    """The whole pipeline at minimal sizes: one pretrain round, two variants, one p~ point."""
    from nemo_topr.miniature.pipeline import main

    out = tmp_path / "mini"
    assert main(["--out", str(out), "--docs", "", "--pretrain-problems", "64", "--train-prompts", "8",
                 "--test-prompts", "4", "--probe-prompts", "4", "--k", "2", "--eval-samples", "2",
                 "--max-pretrain-rounds", "1", "--epochs", "1", "--variants", "topr", "reinforce",
                 "--p-tilde", "0.2", "--hidden-size", "32", "--max-new-tokens", "16"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert {"mu", "topr_s1234", "reinforce_s1234"} <= set(results["runs"])
    # the p~ point runs when the sampled data has both signs, else it is skipped with a note
    assert ("topr_ptilde0.2_s1234" in results["runs"]) != ("p_tilde_skipped" in results)
    assert (out / "results.md").is_file() and (out / "variants.png").is_file()
