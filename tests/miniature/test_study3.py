"""Study 3 (docs/miniature/study3_preregistration.md, issue 96): the placebo construction on
hand-built records, the bootstrap and H8's registered outcomes against hand-computed cases, the
plan against the registration, the report on synthetic results, and the driver with the pipeline
faked (`--resume`, the second-failure rule). Seconds: no Megatron start-up."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random

import pytest
from tests.conftest import REPO
from tests.miniature.fake_pipeline import fake_pipeline

from nemo_topr.errors import UserError
from nemo_topr.miniature import stats, study, study3, study3_checks, study3_placebo, study3_report
from nemo_topr.miniature.study_run import OUTCOMES, read_outcomes

# ---------------------------------------------------------------------------------------------
# The placebo: four prompts, answers 12 / 17 / 20 / 41, a positive and two negatives each

ANSWERS = {"train-2": "12", "train-7": "17", "train-10": "20", "train-31": "41"}


def row(prompt_id: str, completion: str, reward: float, sample_id: int, grade: str) -> dict:
    return {"prompt": f"Question {prompt_id}?", "completion": completion, "reward": reward, "prompt_id": prompt_id,
            "sample_id": sample_id, "behavior_logprob": -1.5,
            "meta": {"task": "gsm8k", "reference_answer": ANSWERS[prompt_id], "answer": None, "grade": grade}}


def says(n: int) -> str:
    return f"Some steps. The answer is {n}."


ROWS = [row("train-2", says(12), 1.0, 0, "correct"), row("train-2", says(5), -1.0, 1, "wrong"),
        row("train-2", "no number at all", -1.0, 2, "invalid"),
        row("train-7", says(17), 1.0, 0, "correct"), row("train-7", says(3), -1.0, 1, "wrong"),
        row("train-7", says(4), -1.0, 2, "wrong"),
        row("train-10", says(20), 1.0, 0, "correct"), row("train-10", says(2), -1.0, 1, "wrong"),
        row("train-10", says(6), -1.0, 2, "wrong"),
        row("train-31", says(41), 1.0, 0, "correct"), row("train-31", says(17), -1.0, 1, "wrong"),  # 17: train-7's answer
        row("train-31", says(8), -1.0, 2, "wrong")]


def test_placebo_by_hand():
    """Seed 8: random.Random(960008) shuffles [train-2, train-7, train-10, train-31] (numeric order) into
    [train-31, train-7, train-10, train-2]; so n0..n7 = rows 10, 11, 4, 5, 7, 8, 1, 2 and G = 2: each
    prompt's negatives rotate to the next prompt's. Row 10 ("17") would land on train-7 (answer 17):
    the repair tries rows 11 (train-7 again), 4 and 5 (would get their own train-7) and swaps with row 7
    (train-10's, assigned train-2): row 10 -> train-2, row 7 -> train-7."""
    placebo, counts = study3_placebo.placebo_rows(ROWS, seed=8, k=16)
    moved = {1: "train-31", 2: "train-31", 4: "train-10", 5: "train-10", 7: "train-7", 8: "train-2",
             10: "train-2", 11: "train-7"}
    assert {i: r["prompt_id"] for i, r in enumerate(placebo) if i in moved} == moved
    assert counts == {"records": 12, "negatives": 8, "prompts_with_negatives": 4, "G": 2, "swaps": 1, "own_prompt": 0}
    for i, (new, old) in enumerate(zip(placebo, ROWS)):
        assert (new["completion"], new["reward"], new["meta"]["grade"]) == (old["completion"], old["reward"],
                                                                             old["meta"]["grade"])
        assert "behavior_logprob" not in new  # re-scored by score-logprobs
        if old["reward"] > 0:
            assert new == {k: v for k, v in old.items() if k != "behavior_logprob"}
        else:
            assert new["prompt_id"] != old["prompt_id"] and new["prompt"] == f"Question {new['prompt_id']}?"
            assert f"is {ANSWERS[new['prompt_id']]}." not in new["completion"]  # states no new prompt's answer
            assert new["meta"]["source_prompt_id"] == old["prompt_id"]
            assert new["meta"]["reference_answer"] == ANSWERS[new["prompt_id"]]
            assert new["meta"]["placebo_grade"] == ("invalid" if i == 2 else "wrong")
    # every prompt keeps its count of negatives and of positives; sample ids 16, 17 in file order per prompt
    for prompt_id in ANSWERS:
        assert sorted(r["reward"] for r in placebo if r["prompt_id"] == prompt_id) == [-1.0, -1.0, 1.0]
    assert [(placebo[i]["prompt_id"], placebo[i]["sample_id"]) for i in (8, 10, 7, 11)] == [
        ("train-2", 16), ("train-2", 17), ("train-7", 16), ("train-7", 17)]


def test_placebo_refusals_name_the_seed_and_the_record():
    # K = 5 negatives, G = 3 on train-2: K < 2G
    few = [row("train-2", says(1), -1.0, i, "wrong") for i in range(3)] + [
        row("train-10", says(2), -1.0, i, "wrong") for i in range(2)]
    with pytest.raises(study3_placebo.PlaceboError) as refused:
        study3_placebo.placebo_rows(few, seed=4, k=16)
    assert (refused.value.seed, refused.value.record, refused.value.key) == (
        4, None, "placebo.negatives.too_few_for_rotation")
    # two prompts, each negative states the other's answer: seed 8 orders [train-10, train-2], so n0 = row 1
    # lands on train-2 and says 12; the only partner would give it back its own prompt
    crossed = [row("train-2", says(20), -1.0, 0, "wrong"), row("train-10", says(12), -1.0, 0, "wrong")]
    with pytest.raises(study3_placebo.PlaceboError) as refused:
        study3_placebo.placebo_rows(crossed, seed=8, k=16)
    assert (refused.value.seed, refused.value.record, refused.value.key) == (8, 1, "placebo.negative.no_swap_partner")


def test_percentiles_interpolate_between_order_statistics():
    values = [float(v) for v in range(101)]  # the p-th percentile of 0..100 is p
    assert study3_placebo.percentiles(values) == {"p5": 5.0, "p25": 25.0, "p50": 50.0, "p75": 75.0, "p95": 95.0}


# ---------------------------------------------------------------------------------------------
# Statistics: problem-level differences, the bootstrap, H8


def test_problem_differences_by_hand():
    # seed 1: A solves problem 0 fully, B nothing; seed 2: A 4/8 on both, B 4/8 and 8/8
    d = stats.problem_differences([[8, 0], [4, 4]], [[0, 0], [4, 8]], samples=8)
    assert d == [0.5, -0.25]  # ((8 - 0) + 0) / 16, (0 + (4 - 8)) / 16; mean 0.125 = mean of the seeds' Δ (0.5, -0.25)
    with pytest.raises(ValueError, match="same seeds and problems"):
        stats.problem_differences([[1, 2]], [[1, 2, 3]], samples=8)


def test_bootstrap_hand_cases():
    constant = stats.bootstrap([0.125] * 7)
    assert constant == stats.ProblemLevel(0.125, (0.125, 0.125), (0.125, 0.125))
    # two problems D = (0, 1): a resample's mean is 0, 1/2 or 1 with probability 1/4, 1/2, 1/4, so of
    # 10,000 sorted means the 251st and 501st are 0 and the 9,500th and 9,750th are 1
    two = stats.bootstrap([0.0, 1.0])
    assert (two.mean, two.ci95, two.ci90) == (0.5, (0.0, 1.0), (0.0, 1.0))
    assert stats.bootstrap([0.0, 0.25, 1.0]) == stats.bootstrap([0.0, 0.25, 1.0])  # the same index sets each time


def test_bootstrap_positions_against_a_second_implementation():
    d, resamples = [0.0, 0.25, 0.5, 1.0, -0.5], 40
    rng = random.Random(96)
    means = sorted(sum(d[j] for j in rng.choices(range(5), k=5)) / 5 for _ in range(resamples))
    # 95 %: the (0.025 x 40 + 1) = 2nd to the 39th value; 90 %: the 3rd to the 38th
    assert stats.bootstrap(d, resamples=resamples) == stats.ProblemLevel(0.25, (means[1], means[38]), (means[2], means[37]))


NINE = [0.5] * 9
PASS = stats.Check(True, 0.05, 9, 9)


def h8(deltas, ci95, ci90, check=PASS) -> stats.Decision:
    a = [b + d for b, d in zip(NINE, deltas)]
    return stats.decide_h8(check, stats.classify(a, NINE, margin=0.01),
                           stats.ProblemLevel(sum(deltas) / 9, ci95, ci90))


@pytest.mark.parametrize(("positive", "negative", "p"), [(9, 0, 2 / 512), (8, 1, 20 / 512), (7, 2, 92 / 512)])
def test_sign_test_with_nine_seeds(positive, negative, p):
    assert stats.sign_test_p(positive, negative) == p


def test_h8_registered_outcomes():
    big, small = 1 / 32, 1 / 256  # 0.03125 and 0.0039 (exact)
    assert h8([big] * 9, (0.02, 0.04), (0.022, 0.038)) == stats.Decision(stats.SUPPORTED, stats.INFORMATIVE)
    # 8 of 9 (p = 0.039) is enough; the TOST at m passes (sd 0 inside ±m) and the 90 % interval is inside ±m
    assert h8([small] * 8 + [0.0], (0.001, 0.007), (0.002, 0.006)) == stats.Decision(stats.SUPPORTED,
                                                                                     stats.INFORMATIVE_WITHIN)
    # every seed better but the 95 % interval reaches 0: not informative; the TOST at m fails: inconclusive
    assert h8([big] * 9, (-0.001, 0.06), (0.002, 0.05)) == stats.Decision(stats.INCONCLUSIVE, stats.UNDECIDED)
    assert h8([-big] * 9, (-0.04, -0.02), (-0.038, -0.022)) == stats.Decision(stats.REFUTED, stats.PLACEBO_BETTER)
    # no direction over seeds (4 + / 4 − / 1 tie), equivalent within m at both levels: mechanical
    mixed = [small, -small] * 4 + [0.0]
    assert h8(mixed, (-0.005, 0.005), (-0.004, 0.004)) == stats.Decision(stats.REFUTED, stats.MECHANICAL)
    # the same with a 90 % interval reaching m: inconclusive
    assert h8(mixed, (-0.012, 0.005), (-0.0101, 0.004)).reason == stats.UNDECIDED
    assert h8([big] * 9, (0.02, 0.04), (0.022, 0.038), stats.Check(False, 0.0, 3, 9)) == stats.Decision(
        stats.INCONCLUSIVE, "manipulation check failed")


def test_interval_agreement_with_study2_outcomes():
    level = lambda low95, high95, low90, high90: stats.ProblemLevel(0.0, (low95, high95), (low90, high90))  # noqa: E731
    assert stats.intervals_agree(stats.BETTER, level(0.001, 0.05, 0.002, 0.04))
    assert not stats.intervals_agree(stats.WORSE, level(-0.05, 0.001, -0.04, -0.002))
    assert stats.intervals_agree(stats.EQUIVALENT, level(-0.03, 0.03, -0.019, 0.019))
    assert not stats.intervals_agree(stats.WORSE_WITHIN, level(-0.015, 0.001, -0.012, -0.001))  # 95 % reaches 0
    assert stats.intervals_agree(stats.NOT_WORSE, level(-0.03, 0.05, -0.019, 0.04))
    assert stats.intervals_agree(stats.UNDECIDED, level(-1, 1, -1, 1)) is None


# ---------------------------------------------------------------------------------------------
# The design: plan, lr selection, estimate


def test_plan_is_the_registered_design():
    design = study3.Study3Design()
    assert study.deviations(design) == {}
    runs = study3.plan(design)
    arms = ["sft_positive", "sft_positive_token_sum", "topr", "topr_ptilde0.8", "placebo_ptilde0.8"]
    assert len(runs) == 135 and len(set(runs)) == 135
    assert set(runs) == {(s, lr, a) for s in range(1, 10) for lr in (5e-5, 1e-4, 2e-4) for a in arms}
    # seed by seed, lr by lr, arms in the table's order
    assert runs[:6] == [(1, 5e-5, a) for a in arms] + [(1, 1e-4, "sft_positive")]
    assert runs[15] == (2, 5e-5, "sft_positive")
    # the registration's budget table: 197 + 9 x 42.8 + 9 x 42.8 + 135 x 32.4 + 60 = 5,401.4 s
    assert sum(study3.estimate(design).values()) == pytest.approx(5401.4)


def test_dry_run_prints_the_registered_plan(tmp_path, capsys):
    out = tmp_path / "s3"
    assert study.main(["--design", "study3", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Pre-registered design of study 3") and "5 arms x 3 lrs x 9 seeds = 135" in text
    assert "total: 5,401 s" in text and not out.exists()
    assert study.main(["--design", "study3", "--dry-run", "--seeds", "1", "2"]) == 0
    assert capsys.readouterr().out.startswith("NOT the pre-registered design of study 3; differs in: seeds")


def test_lr_selection_exact_ties_go_to_the_smaller_lr():
    assert stats.select_lr({5e-5: [0.25, 0.5], 1e-4: [0.375, 0.375], 2e-4: [0.125, 0.625]}) == 5e-5
    assert stats.select_lr({5e-5: [0.25, 0.5], 1e-4: [0.375, 0.5], 2e-4: [0.125, 0.625]}) == 1e-4


def test_values_at_fractions_of_a_run():
    series = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]  # 9 iterations: indices 0, 2, 4, 6, 8
    assert [study3_checks.at_fraction(series, f) for f in study3_checks.FRACTIONS] == [0.0, 0.2, 0.4, 0.6, 0.8]


# ---------------------------------------------------------------------------------------------
# The report on synthetic results whose outcomes follow by hand

LRS = [5e-5, 1e-4, 2e-4]
SEEDS = list(range(1, 10))
# per-problem correct of 8 on 4 test problems at each arm's best lr (1e-4; topr: 2e-4); 0 elsewhere
BEST = {"sft_positive": (1e-4, 4), "sft_positive_token_sum": (1e-4, 4), "topr": (2e-4, 4),
        "topr_ptilde0.8": (1e-4, 5), "placebo_ptilde0.8": (1e-4, 4)}


def synthetic() -> tuple[dict, dict]:
    runs, outcomes = {}, {"mu": {"test": {"correct": [2] * 4, "malformed": [0] * 4}}}
    for arm, (best, correct) in BEST.items():
        for lr in LRS:
            for seed in SEEDS:
                c = correct if lr == best else 0
                name = study3.run_name(arm, lr, seed)
                metrics = {"pass@1": c / 8, "maj@8": c / 8, "malformed_rate": 0.0}
                runs[name] = {"stage": "study", "key": arm, "seed": seed, "lr": lr, "iterations": 5,
                              "test": metrics, "validation": {**metrics, "pass@1": 0.5 if lr == best else 0.25},
                              "telemetry": {"log_ratio_abs_mean": [1e-7, 0.1], "log_ratio_abs_max": [3e-6, 0.5],
                                            "negative_truncated_share": [0.0, 0.25, 0.5, 0.75, 1.0]}}
                outcomes[name] = {"test": {"correct": [c] * 4, "malformed": [0] * 4}}
    mu = {"pass@1": 0.25, "maj@8": 0.25, "malformed_rate": 0.0}
    results = {"design": {**json.loads(json.dumps(study3.Study3Design().__dict__)), "test_prompts": 4},
               "deviations": {"test_prompts": {}}, "mu_target_met": True,
               "mu": {"iteration": 90, "probe_pass@1": 0.25, "test": mu, "validation": mu},
               "pretrain": [{"iteration": 90, "pass@1": 0.25}],
               "datasets": {str(s): {"records": 16, "positive_share": 0.25, "correct": 4, "wrong": 10, "invalid": 2,
                                     "prompts_with_both": 1} for s in SEEDS},
               "placebos": {str(s): {"records": 16, "negatives": 12, "G": 3, "completions_unchanged": True,
                                     "own_prompt": 0, "swaps": 1, "positive_log_mu_max_change": 0.0} for s in SEEDS},
               "runs": runs, "stage_seconds": {"runs": 1.0}, "estimate_s": {"runs": 2.0}, "wall_time_s": 3.0}
    return results, outcomes


def test_report_decides_by_the_registered_rules(tmp_path):
    """Real 5/8 against placebo 4/8 on every problem of every seed: Δ = 0.125 on 9 of 9 seeds (p =
    2/512), D constant (both intervals at 0.125): negatives informative. TOPR (its lr 2e-4, an end of
    the grid) equals positives-only on every seed: equivalent (TOST with sd 0), supported; p~ = 0.8
    beats token_sum positives-only by 0.125 on 9/9: better, supported."""
    results, outcomes = synthetic()
    text = study3_report.table(results, outcomes)
    assert "| H8 (real negatives > placebo) | **supported** | negatives informative |" in text
    assert "| H9 (TOPR c = 0 >= positives-only) | **supported** | equivalent |" in text
    assert "| H10 (TOPR p~=0.8 >= positives-only token_sum) | **supported** | better |" in text
    assert "mean gain +0.250, above mu on 9/9 seeds: **passed**" in text
    assert "| topr | 0.2500 | 0.2500 | 0.5000 | 0.0002 (an end of the grid) |" in text
    assert ("| topr p~=0.8 | placebo p~=0.8 | 0.0001 / 0.0001 | " + ", ".join(["+0.1250"] * 9) + " | +0.1250 ± 0.0000 "
            "| 9 / 0 / 0 | 0.003906 | 0 | 1 | better | +0.1250 | [+0.1250, +0.1250] | [+0.1250, +0.1250] | – |") in text
    assert "| topr | sft_positive | 0.0002 / 0.0001 |" in text and "| equivalent | +0.0000 | [+0.0000, +0.0000]" in text
    assert "| 1 | 16 | 12 | 3 | True | 0 | 1 | 0.00e+00 |" in text       # placebo integrity of seed 1
    assert "| placebo p~=0.8 | truncated share | 0.000 | 0.250 | 0.500 | 0.750 | 1.000 |" in text
    assert "| topr p~=0.8 | 5e-05 | " + " | ".join(["1.0e-07 / 3.0e-06"] * 9) + " |" in text
    data = study3_report.figure_data(study3_report.analyse(results, outcomes))
    assert data["right"] == ((0.125,) * 9, 0.125, (0.125, 0.125), (0.125, 0.125))
    assert data["left"]["topr p~=0.8"] == ((0.125,) * 9, 0.125, (0.125, 0.125))
    assert list(data["left"]) == ["sft_positive token_sum", "topr", "topr p~=0.8", "placebo p~=0.8"]
    # the report with the figure and the outcomes copied to docs
    (tmp_path / OUTCOMES).write_bytes(gzip.compress(json.dumps(outcomes).encode()))
    study3_report.write_report(tmp_path, results, tmp_path / "docs")
    assert {p.name for p in (tmp_path / "docs").iterdir()} == {"results.md", "results.json", study3_report.PLOT, OUTCOMES}
    assert read_outcomes(tmp_path / "docs") == outcomes


def test_report_without_mu():
    results, outcomes = synthetic()
    results.update(mu_target_met=False, runs={})
    del results["mu"]
    text = study3_report.table(results, {})
    assert "**No pretraining checkpoint reached train pass@1 0.2**" in text and "| H8" not in text


# ---------------------------------------------------------------------------------------------
# The driver, pipeline faked: the plan it trains, the placebo data, --resume, the second failure


def fake_study3(monkeypatch, calls, kill_at=None, fail=None):
    from nemo_topr.miniature import pipeline

    calls["data"] = fake_pipeline(monkeypatch, calls, kill_at, fail=fail)

    def pretrain_mus(out, splits, model, *, targets, **kwargs):
        calls["pretrain"] = calls.get("pretrain", 0) + 1
        (out / "iter_60").mkdir()
        probes = [{"iteration": i, "pass@1": p, "per_problem": {"correct": [i], "malformed": [0]}}
                  for i, p in ((30, 0.1), (60, 0.25))]
        return {targets[0]: out / "iter_60"}, probes, out / "iter_60"

    def placebo_dataset(real, mu, seed, k, directory):
        calls["placebo"] = calls.get("placebo", 0) + 1
        directory.mkdir(parents=True)
        (directory / "scored.jsonl").write_text("{}\n")
        return directory / "scored.jsonl", {"records": 1, "negatives": 1, "G": 1, "completions_unchanged": True,
                                            "own_prompt": 0, "swaps": seed, "positive_log_mu_max_change": 0.0}

    monkeypatch.setattr(pipeline, "pretrain_mus", pretrain_mus)
    monkeypatch.setattr(study3_placebo, "placebo_dataset", placebo_dataset)
    monkeypatch.setattr(study3_placebo, "dataset_checks", lambda pairs, tokenizer: {"seeds": sorted(pairs)})


def test_driver_trains_the_plan_and_resumes(tmp_path, monkeypatch):
    """Two seeds, tiny splits, one training at a time. Killed in its 8th training, the study resumes
    with mu, 2 datasets, 2 placebos and 7 runs kept; a run that then fails stops it (recorded once);
    resumed again, its second failure is scored as degenerated and the other 30 runs finish."""
    out = tmp_path / "s3"
    options = ["--design", "study3", "--out", str(out), "--docs", "", "--jobs", "1", "--seeds", "1", "2",
               "--test-prompts", "4", "--validation-prompts", "3"]
    calls: dict = {}
    fake_study3(monkeypatch, calls, kill_at=8)
    with pytest.raises(Exception, match="topr_lr0.0001_s1"):
        study.main(options)
    kept = json.loads((out / "results.json").read_text())
    assert (calls["build"], calls["pretrain"], calls["dataset"], calls["placebo"], calls["train"]) == (1, 1, 2, 2, 7)
    assert list(kept["runs"]) == [study3.run_name(a, lr, 1) for s, lr, a in study3.plan(study3.Study3Design())[:7]]
    assert kept["mu"]["iteration"] == 60 and kept["dataset_checks"] == {"seeds": [1, 2]}
    # the placebo arm trains on the placebo, the others on the real data; both p~ arms at the same c
    data = {name: (path.parent.name, overrides) for name, (path, overrides) in calls["data"].items()}
    assert data["placebo_ptilde0.8_lr5e-05_s1"][0] == "seed1_placebo" and data["topr_lr5e-05_s1"][0] == "seed1"
    assert data["topr_ptilde0.8_lr5e-05_s1"] == ("seed1", data["placebo_ptilde0.8_lr5e-05_s1"][1])
    assert "objective.normalization=token_sum" in data["sft_positive_token_sum_lr5e-05_s1"][1]
    with pytest.raises(UserError) as other:
        study.main([*options, "--seeds", "1", "--resume"])
    assert other.value.key == "--resume.other_options"

    calls.clear()
    fake_study3(monkeypatch, calls, fail="topr_lr0.0002_s2")
    with pytest.raises(SystemExit, match="topr_lr0.0002_s2 failed"):
        study.main([*options, "--resume"])
    assert "pretrain" not in calls and "placebo" not in calls and "dataset" not in calls
    assert list(json.loads((out / "results.json").read_text())["failed_once"]) == ["topr_lr0.0002_s2"]
    calls.clear()
    fake_study3(monkeypatch, calls, fail="topr_lr0.0002_s2")
    assert study.main([*options, "--resume"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 30 and len(results["resumed"]) == 2
    assert {k: results["runs"][k] for k in kept["runs"]} == kept["runs"]
    outcomes = read_outcomes(out)
    assert set(outcomes) == {"mu", "probe_iter30", "probe_iter60", *results["runs"]}
    assert outcomes["topr_lr0.0002_s2"]["test"] == {"correct": [0] * 4, "malformed": [8] * 4}  # failed twice
    assert outcomes["topr_lr5e-05_s1"]["validation"] == {"correct": [4] * 3, "malformed": [0] * 3}
    text = (out / "results.md").read_text()
    assert "Failed twice and scored as degenerated (pass@1 0, malformed 1): topr_lr0.0002_s2." in text
    assert "| H8 (real negatives > placebo) | **inconclusive** | manipulation check failed |" in text
    assert "Resumed (`--resume`)" in text


def test_setup_check_against_study2s_committed_runs():
    """With study 2's mu 0.2 (iteration 210 and its test pass@1), the lr 1e-4 runs on seeds 1-6 are set
    beside study 2's committed values; another mu is said to be another."""
    results, outcomes = synthetic()
    committed = json.loads(study3_checks.STUDY2_RESULTS.read_text())
    mu2 = committed["mus"]["0.2"]
    results["mu"].update(iteration=mu2["iteration"], test={**results["mu"]["test"], "pass@1": mu2["test"]["pass@1"]})
    lines = study3_checks.setup_lines(study3_report.Study(results, outcomes), results)
    old = committed["runs"]["sft_positive_mu0.2_s1"]["test"]["pass@1"]
    assert f"- sft_positive: seed 1 0.5000 / {old:.4f}; seed 2 0.5000" in "\n".join(lines)
    assert "seed 7" not in "\n".join(lines)  # study 2 ran seeds 1-6
    results["mu"]["iteration"] = 240
    assert "is not study 2's mu 0.2 (iteration 210" in study3_checks.setup_lines(
        study3_report.Study(results, outcomes), results)[1]


# ---------------------------------------------------------------------------------------------
# The committed study 3: its report, README's claim lines and the docs' table, from its results
# ---------------------------------------------------------------------------------------------

STUDY3_DOCS = REPO / "docs" / "miniature" / "study3"


@pytest.fixture(scope="module")
def committed_study3():
    results = json.loads((STUDY3_DOCS / "results.json").read_text())
    outcomes = json.loads(gzip.decompress((STUDY3_DOCS / "outcomes.json.gz").read_bytes()))
    return results, outcomes, study3_report.analyse(results, outcomes)


@pytest.mark.slow  # ten bootstraps of 10,000 resamples over the committed outcomes
def test_committed_study3_ran_the_registered_design_and_its_report_is_their_rendering(committed_study3):
    results, outcomes, analysis = committed_study3
    registered = json.loads(json.dumps(dataclasses.asdict(study3.Study3Design())))
    assert results["design"] == registered and not results["deviations"]
    assert len(results["runs"]) == 5 * 3 * 9 and results["mu_target_met"]
    assert (STUDY3_DOCS / "results.md").read_text() == study3_report.table(results, outcomes, analysis)
    assert (STUDY3_DOCS / "study3.png").is_file()


@pytest.mark.slow
def test_readme_and_docs_state_each_study3_claim_as_the_rules_decided(committed_study3):
    """README's H8-H10 lines carry the decided status, and docs/miniature.md's table the outcome,
    the mean over seeds and the 95 % problem-level interval of each."""
    _, _, analysis = committed_study3
    readme = (REPO / "README.md").read_text().splitlines()
    docs = (REPO / "docs" / "miniature.md").read_text()
    statuses = {stats.SUPPORTED, stats.REFUTED, stats.INCONCLUSIVE}
    rows = {row[:2]: row for row in analysis["comparisons"] if "/" in row[2]}
    for h, pair in (("H8", ("topr p~=0.8", "placebo p~=0.8")), ("H9", ("topr", "sft_positive")),
                    ("H10", ("topr p~=0.8", "sft_positive token_sum"))):
        [line] = [line for line in readme if f"**{h}**" in line]
        part = line[line.index(f"**{h}**"):].split(". **H")[0]
        status = analysis[h].status
        assert f"**{status}**" in part and not any(f"**{s}**" in part for s in statuses - {status}), (h, part)
        _, _, _, outcome, problems, _ = rows[pair]
        [doc_row] = [r for r in docs.splitlines() if r.startswith(f"| **{h}**")]
        assert f"**{status}**" in doc_row, doc_row
        assert f"{outcome.paired.mean:+.4f}".replace("-", "−") in doc_row, doc_row
        low, high = (f"{v:+.4f}".replace("-", "−") for v in problems.ci95)
        assert f"[{low}, {high}]" in doc_row, doc_row
