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


def test_well_formed_means_a_final_answer_statement():
    assert task.is_well_formed(" 7 + 5 = 12. 12 - 3 = 9. The answer is 9.")
    assert task.is_well_formed(" The answer is -3.")
    # graded by the GSM8K grader's last-number fallback, but not in the task's format
    assert task.grade(" 7 + 5 = 12. 12 - 3 = 9.", 9)[1] == "correct"
    assert not task.is_well_formed(" 7 + 5 = 12. 12 - 3 = 9.")
    assert not task.is_well_formed(" 7 a answer 7\ufffd 9\ufffd answer 7")
    assert not task.is_well_formed(" The answer is .")


def _run(pass_at_1: float, curve_pass: list[float]) -> dict:
    return {"eval": {"pass@1": pass_at_1, "maj@4": 0.6, "invalid_rate": 0.1, "malformed_rate": 0.25,
                     "mean_chars": 40.0},
            "curve": [{"iteration": i * 5, "pass@1": v, "maj@4": 0.5, "malformed_rate": 0.0}
                      for i, v in enumerate(curve_pass)],
            "telemetry": {"positive_nll": [1.0, 0.5], "negative_nll": [1.0, 2.0],
                          "negative_weight_mean": [1.0, 0.5], "effective_positive_share": [0.4],
                          "topr_loss": [0.1, 0.0]}}


def test_report_from_results(tmp_path):
    from nemo_topr.miniature import report

    results = {"args": {"eval_samples": 4, "test_prompts": 10, "train_prompts": 8, "k": 4, "seeds": [1, 2],
                        "probe_prompts": 8, "eval_interval": 5},
               "dataset": {"records": 32, "positive_share": 0.4, "correct": 13, "wrong": 15, "invalid": 4,
                           "prompts_with_both": 5},
               "pretrain": [{"iteration": 30, "pass@1": 0.35, "maj@8": 0.5, "malformed_rate": 0.2}],
               "runs": {"mu": {"name": "mu (start)", "seed": None, "eval": _run(0.3, [])["eval"]},
                        "topr_s1": {**_run(0.5, [0.3, 0.6, 0.5]), "name": "topr", "key": "topr", "seed": 1},
                        "topr_s2": {**_run(0.7, [0.3, 0.4, 0.7]), "name": "topr", "key": "topr", "seed": 2},
                        "topr_ptilde0.1_s1": {**_run(0.5, [0.3, 0.2, 0.5]), "name": "topr p~=0.1",
                                              "key": "topr_ptilde0.1", "seed": 1}},
               "stage_seconds": {"pretrain": 100.0, "variants": 200.0}, "wall_time_s": 300.0}
    text = report.write_report(tmp_path, results, docs=tmp_path / "docs")
    # final pass@1 mean ± sd over seeds (0.5, 0.7 -> 0.600 ± 0.141); best = max over checkpoints after
    # the start (0.6 and 0.7); the start's own value (0.3) is not a checkpoint of the run
    assert "| topr | 0.600 ± 0.141 | 0.600 ± 0.000 | 0.650 ± 0.071 | 0.250 ± 0.000 | 40 |" in text
    assert "| topr p~=0.1 | 0.500 | 0.600 | 0.500 | 0.250 | 40 |" in text
    assert "| mu (start) | 0.300 | 0.600 | – |" in text
    assert "| 30 | 0.350 | 0.500 | 0.200 |" in text and "pretrain 100 s, variants 200 s" in text
    assert report._curve([results["runs"]["topr_s1"], results["runs"]["topr_s2"]], "pass@1") == (
        [0, 5, 10], [0.3, 0.5, 0.6])
    for name in report.PLOTS:
        assert (tmp_path / name).is_file() and (tmp_path / "docs" / name).is_file()
    assert "not reached" not in text
    results["pretrain_target_met"] = False
    assert "**The pretraining target was not reached**: mu is the last checkpoint (iteration 30, train pass@1 " \
        "0.350)." in report.table(results)


@pytest.mark.slow
def test_miniature_smoke(tmp_path):
    """The whole pipeline at minimal sizes: pretraining with two probed checkpoints, two variants,
    one p~ point, every checkpoint of every run evaluated. The variants save at an interval beyond
    their length, as the studies' runs do (study_run.FINAL_ONLY): only the final checkpoint, which
    training always saves."""
    from nemo_topr.miniature.pipeline import main

    out = tmp_path / "mini"
    assert main(["--out", str(out), "--docs", "", "--pretrain-problems", "64", "--train-prompts", "8",
                 "--test-prompts", "4", "--probe-prompts", "4", "--k", "2", "--eval-samples", "2",
                 "--pretrain-epochs", "2", "--pretrain-save-interval", "1", "--epochs", "1",
                 "--eval-interval", "100000", "--variants", "topr", "reinforce", "--p-tilde", "0.2",
                 "--hidden-size", "32", "--max-new-tokens", "16", "--seeds", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert {"mu", "topr_s1", "reinforce_s1"} <= set(results["runs"])
    # the p~ point runs when the sampled data has both signs, else it is skipped with a note:
    # which one is decided here from the recorded positive share
    p = results["dataset"]["positive_share"]
    if 0.0 < p < 1.0:
        assert "topr_ptilde0.2_s1" in results["runs"] and "p_tilde_skipped" not in results
    else:
        assert "topr_ptilde0.2_s1" not in results["runs"] and f"positive share p = {p}" in results["p_tilde_skipped"]
    # probing stops at the first checkpoint reaching train pass@1 0.30, else probes all (1 and 2)
    probed = [point["iteration"] for point in results["pretrain"]]
    reached = [point["pass@1"] >= 0.30 for point in results["pretrain"]]
    expected = [1, 2][:reached.index(True) + 1] if True in reached else [1, 2]
    assert probed == expected and results["pretrain_target_met"] == any(reached)
    assert results["mu"].endswith(f"iter_{probed[-1]:07d}")
    # every saved checkpoint evaluated: the start (iteration 0), then the final iteration (one
    # TensorBoard point per iteration)
    run = results["runs"]["topr_s1"]
    assert [point["iteration"] for point in run["curve"]] == [0, len(run["telemetry"]["topr_loss"])]
    assert run["curve"][-1]["pass@1"] == run["eval"]["pass@1"]
    assert (out / "results.md").is_file() and (out / "curves.png").is_file()
