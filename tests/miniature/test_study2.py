"""Study 2 (docs/miniature/study2_preregistration.md, issue 32): the Student t CDF and the TOST against
hand-worked values and scipy, the eight registered outcomes and the H4-H7 readings, the strength
rule, the plan against the pre-registration's budget table, the report and figure data from
synthetic results, and the driver on the fake pipeline (fake_pipeline.py): --resume with the
second-failure rule and a smoke run at tiny sizes."""

from __future__ import annotations

import json
import math

import pytest
from tests.conftest import REPO
from tests.miniature.fake_pipeline import KilledRun, fake_pipeline, trained_objective
from tests.miniature.test_study import FIGURE, figures_not_in_report

from nemo_topr.errors import UserError
from nemo_topr.miniature import stats, study, study2, study2_report

BASE = [0.5] * 6


def shifted(deltas):
    """B + deltas with B = 0.5 and dyadic deltas, so that A - B is exact in floating point."""
    return [b + d for b, d in zip(BASE, deltas)]


# ---------------------------------------------------------------------------------------------
# t distribution and TOST


@pytest.mark.parametrize("t", [-30.0, -2.5, -1.0, 0.0, 0.5, 3.0, 12.0])
def test_t_cdf_closed_forms_for_one_and_two_degrees_of_freedom(t):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-15)  # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-15)


def test_t_cdf_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in range(1, 16):
        for t in (-9.0, -2.015, -0.3, 0.0, 0.7, 2.571, 40.0):
            assert stats.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-12), (t, df)
    # textbook critical values: t_{0.95, 5} = 2.015, t_{0.975, 5} = 2.571
    assert stats.t_cdf(2.015048, 5) == pytest.approx(0.95, abs=1e-6)
    assert stats.t_cdf(2.570582, 5) == pytest.approx(0.975, abs=1e-6)
    with pytest.raises(ValueError, match="positive integer"):
        stats.t_cdf(1.0, 0)


def test_tost_hand_worked_example():
    # deltas 0, +0.01, -0.01: mean 0, sd 0.01, se 0.01 / sqrt(3); t = 0.02 / se = 2 sqrt(3) on 2 df;
    # F(t) = 1/2 + t / (2 sqrt(2 + t^2)) = 1/2 + sqrt(3/14), so each one-sided p = 1/2 - sqrt(3/14) = 0.0371
    result = stats.tost([0.0, 0.01, -0.01], 0.02)
    expected = 0.5 - math.sqrt(3 / 14)
    assert result.p_low == pytest.approx(expected, rel=1e-12) and result.p_high == pytest.approx(expected, rel=1e-12)
    assert result.p == pytest.approx(0.03709, abs=1e-5)
    # shifted by +0.01: t_low = 0.03 / se = 3 sqrt(3), t_high = -0.01 / se = -sqrt(3)
    shifted_result = stats.tost([0.01, 0.02, 0.0], 0.02)
    assert shifted_result.p_low == pytest.approx(0.5 - 3 * math.sqrt(3) / (2 * math.sqrt(29)), rel=1e-9)
    assert shifted_result.p_high == pytest.approx(0.5 - math.sqrt(3) / (2 * math.sqrt(5)), rel=1e-9)  # 0.1127


def test_tost_matches_scipy_one_sided_t_tests():
    scipy_stats = pytest.importorskip("scipy.stats")
    for deltas in ([-0.009, -0.0004, -0.017, -0.004, -0.006, -0.007], [0.03, -0.01, 0.02, 0.0, 0.05, -0.02],
                   [0.1, 0.12, 0.09, 0.11, 0.1, 0.13]):
        result = stats.tost(deltas, 0.02)
        assert result.p_low == pytest.approx(scipy_stats.ttest_1samp(deltas, -0.02, alternative="greater").pvalue,
                                             rel=1e-9)
        assert result.p_high == pytest.approx(scipy_stats.ttest_1samp(deltas, 0.02, alternative="less").pvalue,
                                              rel=1e-9)


def test_tost_degenerate_inputs():
    assert stats.tost([0.0078125] * 6, 0.02) == stats.Tost(0.0, 0.0)   # sd 0 inside the bounds
    assert stats.tost([0.03125] * 6, 0.02) == stats.Tost(0.0, 1.0)     # sd 0 above +delta
    assert stats.tost([-0.03125] * 6, 0.02) == stats.Tost(1.0, 0.0)
    assert stats.tost([0.0], 0.02) == stats.Tost(1.0, 1.0)             # one difference shows nothing


# ---------------------------------------------------------------------------------------------
# The eight outcomes and the readings

SMALL_NEGATIVE = [-1 / 128, -1 / 256, -3 / 256, -1 / 128, -1 / 256, -3 / 256]   # mean -0.0078, all below 0
MIXED_SMALL = [1 / 128, -1 / 128, 1 / 256, -1 / 256, 0.0, 1 / 256]               # 3 up, 2 down, 1 tie
WIDE_POSITIVE = [0.0625, -0.015625, 0.03125, 0.0, 0.046875, -0.0078125]           # mean +0.0195, sd 0.032
SPREAD = [0.25, -0.25, 0.125, -0.125, 0.0625, -0.0625]


@pytest.mark.parametrize(("deltas", "outcome"), [
    ([0.125] * 6, stats.BETTER),
    ([-0.125] * 6, stats.WORSE),
    (SMALL_NEGATIVE, stats.WORSE_WITHIN),
    ([-d for d in SMALL_NEGATIVE], stats.BETTER_WITHIN),
    (MIXED_SMALL, stats.EQUIVALENT),
    (WIDE_POSITIVE, stats.NOT_WORSE),
    ([-d for d in WIDE_POSITIVE], stats.NOT_BETTER),
    (SPREAD, stats.UNDECIDED),
    ([0.015625] * 6, stats.BETTER_WITHIN),   # unanimous, below delta, sd 0: inside the bounds
    # 5 of 6 (sign p = 0.22: not "better"), but mean +0.198 with sd 0.128: the t test shows mean > -delta
    ([0.25] * 5 + [-0.0625], stats.NOT_WORSE),
])
def test_classify_the_registered_outcomes(deltas, outcome):
    assert stats.classify(shifted(deltas), BASE).outcome == outcome


def test_classify_wide_positive_is_non_inferior_but_not_equivalent():
    # in units of 1/256: deltas 16, -4, 8, 0, 12, -2 -> mean 5/256; deviations 11, -9, 3, -5, 7, -7 (x 1/256)
    # -> sum of squares 334 / 256^2, sd = sqrt(334 / 5) / 256, se = sd / sqrt(6);
    # t_low = (5/256 + 0.02) / se = 3.033 (p 0.0145), t_high = (5/256 - 0.02) / se = -0.036 (p 0.486)
    se = math.sqrt(334 / 5) / 256 / math.sqrt(6)
    result = stats.classify(shifted(WIDE_POSITIVE), BASE)
    assert result.tost.p_low == pytest.approx(1 - stats.t_cdf((5 / 256 + 0.02) / se, 5), rel=1e-12)
    assert result.tost.p_high == pytest.approx(stats.t_cdf((5 / 256 - 0.02) / se, 5), rel=1e-12)
    assert (5 / 256 + 0.02) / se == pytest.approx(3.033, abs=1e-3)
    assert result.tost.p_low < 0.05 < result.tost.p_high and result.outcome == stats.NOT_WORSE


def test_study_1_topr_result_reads_worse_by_less_than_delta():
    """The pre-registration says study 1's TOPR vs positives-only (−0.007 ± 0.006, 6 of 6 below)
    would have been outcome 3; checked on study 1's committed per-seed values."""
    results = json.loads((REPO / "docs" / "miniature" / "study" / "results.json").read_text())
    per_seed = {key: [results["runs"][f"{key}_s{s}"]["test"]["pass@1"] for s in range(1, 7)]
                for key in ("topr", "sft_positive")}
    outcome = stats.classify(per_seed["topr"], per_seed["sft_positive"])
    assert outcome.outcome == stats.WORSE_WITHIN and outcome.paired.p == 0.03125


PASS = stats.Check(True, 0.05, 6, 6)
FAIL = stats.Check(False, 0.0, 3, 6)


def outcome_of(deltas):
    return stats.classify(shifted(deltas), BASE)


def test_h5_h6_reading():
    read = stats.decide_at_least_as_good
    assert read(PASS, outcome_of([0.125] * 6)) == stats.Decision(stats.SUPPORTED, stats.BETTER)
    assert read(PASS, outcome_of(MIXED_SMALL)).status == stats.SUPPORTED
    assert read(PASS, outcome_of(WIDE_POSITIVE)).status == stats.SUPPORTED
    assert read(PASS, outcome_of([-0.125] * 6)) == stats.Decision(stats.REFUTED, stats.WORSE)
    assert read(PASS, outcome_of(SMALL_NEGATIVE)) == stats.Decision(
        stats.REFUTED, "worse by less than δ: refuted within δ")
    assert read(PASS, outcome_of(SPREAD)).status == stats.INCONCLUSIVE
    assert read(PASS, outcome_of([-d for d in WIDE_POSITIVE])).status == stats.INCONCLUSIVE
    assert read(FAIL, outcome_of([0.125] * 6)) == stats.Decision(stats.INCONCLUSIVE, "manipulation check failed")


def test_h4_and_h7_readings():
    trend = stats.decide_strength_trend
    assert trend(outcome_of([0.125] * 6)) == stats.Decision(stats.SUPPORTED, "better: the gap grows as mu weakens")
    assert trend(outcome_of([-0.125] * 6)).reason == "worse: the gap shrinks as mu weakens"
    assert trend(outcome_of(MIXED_SMALL)) == stats.Decision(stats.REFUTED, "equivalent: no change within δ")
    assert trend(outcome_of(SMALL_NEGATIVE)).reason == "worse by less than δ: no change within δ"
    assert trend(outcome_of(SPREAD)).status == stats.INCONCLUSIVE
    assert trend(None).status == stats.INCONCLUSIVE
    norm = stats.decide_normalisation
    assert norm(PASS, outcome_of(MIXED_SMALL)).status == stats.SUPPORTED
    assert norm(PASS, outcome_of([0.125] * 6)) == stats.Decision(stats.REFUTED, "better: token_sum favours TOPR")
    assert norm(PASS, outcome_of([-0.125] * 6)).reason == "worse: token_sum disfavours TOPR"
    assert norm(PASS, outcome_of(WIDE_POSITIVE)).status == stats.INCONCLUSIVE
    assert norm(FAIL, outcome_of(MIXED_SMALL)).status == stats.INCONCLUSIVE


# ---------------------------------------------------------------------------------------------
# Design, plan and budget


def test_strength_rule_drops_unreached_and_duplicate_targets(tmp_path):
    a, b = tmp_path / "iter_0000210", tmp_path / "iter_0000300"
    assert study2.choose_strengths((0.2, 0.4, 0.6), {0.2: a, 0.4: b, 0.6: tmp_path / "iter_0000390"}) == (
        [0.2, 0.4, 0.6], {})
    kept, dropped = study2.choose_strengths((0.2, 0.4, 0.6), {0.2: a, 0.4: b, 0.6: b})
    assert kept == [0.2, 0.4] and dropped == {"0.6": "its checkpoint (iter_0000300) is a lower target's mu"}
    assert study2.choose_strengths((0.2, 0.4, 0.6), {0.2: a})[1] == {"0.4": "no checkpoint reached it",
                                                                      "0.6": "no checkpoint reached it"}


def test_plan_matches_the_preregistration_budget():
    design = study2.Study2Design()
    assert study.deviations(design) == {}
    assert len(study2.configurations(design)) == 6
    # docs/miniature/study2_preregistration.md's table: 220 + 20 + 18 x 47.8 + 108 x 39.6 = 5,380 s
    seconds = study2.estimate(design)
    assert seconds == pytest.approx({"pretraining": 220.2, "mu evaluations": 20.0, "datasets": 18 * 47.75,
                                     "study runs": 108 * 2853.5 / 72})
    assert sum(seconds.values()) == pytest.approx(5380, abs=5) and sum(seconds.values()) * study2.MARGIN < 2 * 3600


def test_dry_run_of_study2_prints_the_plan_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "study2"
    assert study.main(["--design", "study2", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Pre-registered design of study 2") and "runs in all: 108" in text
    assert "total: 5,380 s = 1.49 h; budget (x 1.3): 6,994 s = 1.94 h" in text and not out.exists()
    assert study.main(["--design", "study2", "--dry-run", "--seeds", "1", "--lr", "3e-4"]) == 0
    assert capsys.readouterr().out.startswith("NOT the pre-registered design of study 2; differs in: seeds, lr")
    with pytest.raises(UserError) as unknown:
        study.main(["--design", "study2", "--dry-run", "--token-sum-variants", "grpo"])
    assert unknown.value.key == "--variants.unknown"


# ---------------------------------------------------------------------------------------------
# The report from synthetic results

CONFIGS = ("sft_positive", "topr", "topr_ptilde0.1", "topr_ptilde0.8", "sft_positive_token_sum", "topr_token_sum")


def synthetic_results() -> dict:
    """Two strengths, six seeds, exact per-seed values. Weak (0.2, mu 0.25): positives-only 0.5,
    TOPR 0.625 (+0.125 on every seed), p~=0.1 0.5625 (validation 0.5), p~=0.8 0.5 (validation 0.625,
    so p~* = 0.8), token_sum positives-only 0.5, TOPR 0.625 + MIXED_SMALL. Strong (0.6, mu 0.5):
    positives-only 0.75, TOPR 0.75 + SMALL_NEGATIVE, p~ points 0.75, token_sum like sequence_mean."""
    values = {"0.2": {"sft_positive": [0.5] * 6, "topr": [0.625] * 6, "topr_ptilde0.1": [0.5625] * 6,
                      "topr_ptilde0.8": [0.5] * 6, "sft_positive_token_sum": [0.5] * 6,
                      "topr_token_sum": [0.625 + d for d in MIXED_SMALL]},
              "0.6": {"sft_positive": [0.75] * 6, "topr": [0.75 + d for d in SMALL_NEGATIVE],
                      "topr_ptilde0.1": [0.75] * 6, "topr_ptilde0.8": [0.75] * 6,
                      "sft_positive_token_sum": [0.75] * 6, "topr_token_sum": [0.75 + d for d in SMALL_NEGATIVE]}}
    validation = {("0.2", "topr_ptilde0.1"): 0.5, ("0.2", "topr_ptilde0.8"): 0.625}
    runs = {}
    for strength, configs in values.items():
        for key, per_seed in configs.items():
            for seed, v in zip(range(1, 7), per_seed):
                runs[f"{key}_mu{strength}_s{seed}"] = {
                    "stage": "study", "key": key, "strength": strength, "seed": seed, "lr": 1e-4, "warmup": 0,
                    "test": {"pass@1": v, "maj@8": v, "malformed_rate": 0.0},
                    "validation": {"pass@1": validation.get((strength, key), v), "maj@8": v, "malformed_rate": 0.0}}
    mu = lambda v, it: {"path": "/nowhere", "iteration": it, "probe_pass@1": v, "target": v,  # noqa: E731
                        "test": {"pass@1": v, "maj@8": v, "malformed_rate": 0.0},
                        "validation": {"pass@1": v, "maj@8": v, "malformed_rate": 0.0}}
    datasets = {f"{strength}/{seed}": {"records": 16, "positive_share": share + seed / 1024, "correct": 8,
                                       "wrong": 8, "invalid": 0, "prompts_with_both": 4}
                for strength, share in (("0.2", 0.25), ("0.6", 0.625)) for seed in range(1, 7)}
    return {"design": {**json.loads(json.dumps(study2.Study2Design().__dict__))},
            "deviations": {}, "mus": {"0.2": mu(0.25, 210), "0.6": mu(0.5, 390)}, "dropped": {"0.4": "no checkpoint reached it"},
            "pretrain": [{"iteration": 210, "pass@1": 0.25}, {"iteration": 390, "pass@1": 0.625}],
            "datasets": datasets, "runs": runs, "stage_seconds": {"study": 10.0}, "estimate_s": {"study runs": 20.0},
            "wall_time_s": 12.0}


def test_report_applies_the_registered_rules(tmp_path):
    results = synthetic_results()
    analysis = study2_report.analyse(results)
    assert analysis["checks"]["0.2"].passed and analysis["checks"]["0.6"].passed  # +0.25 over mu on every seed
    assert analysis["p*"] == {"0.2": 0.8, "0.6": 0.1}   # weak: validation 0.625 > 0.5; strong: tie -> 0.1
    assert analysis["H5"]["0.2"] == stats.Decision(stats.SUPPORTED, stats.BETTER)
    assert analysis["H5"]["0.6"] == stats.Decision(stats.REFUTED, "worse by less than δ: refuted within δ")
    # H6 at 0.2: p~ = 0.8 ties positives-only exactly (sd 0, mean 0): equivalent
    assert analysis["H6"]["0.2"] == stats.Decision(stats.SUPPORTED, stats.EQUIVALENT)
    # H4: gap at 0.2 = +0.125, at 0.6 = SMALL_NEGATIVE: weak - strong = 0.125 - SMALL_NEGATIVE >= delta everywhere
    assert analysis["H4"] == stats.Decision(stats.SUPPORTED, "better: the gap grows as mu weakens")
    # H7 at 0.2: token_sum gap MIXED_SMALL + 0.125 vs 0.125: equivalent; at 0.6 identical gaps: sd 0, mean 0
    assert analysis["H7"]["0.2"].status == stats.SUPPORTED and analysis["H7"]["0.6"].status == stats.SUPPORTED
    text = study2_report.write_report(tmp_path, results, docs=tmp_path / "docs")
    assert "**Deviation**: strength 0.4 dropped: no checkpoint reached it." in text
    assert "| H4 (gap grows as mu weakens) | all | **supported** | better: the gap grows as mu weakens |" in text
    assert "| H6 (TOPR p~* >= positives-only) | 0.2 (p~* = 0.8) | **supported** | equivalent |" in text
    assert "| 0.2 | topr | sft_positive | +0.125, +0.125, +0.125, +0.125, +0.125, +0.125 | +0.125 ± 0.000 " \
           "| 6 / 0 / 0 | 0.03125 | 0 | 1 | better |" in text
    assert "| 0.2 | 210 | 0.250 | 0.250 | 0.250 |" in text
    # reported, never decisive: each p~ against topr; the trend with p~* (0.8 at 0.2, 0.1 at 0.6) in place of topr
    assert "| 0.2 | topr p~=0.8 (p~*) | topr | " + ", ".join(["-0.125"] * 6) in text
    assert "| 0.6 | topr p~=0.1 (p~*) | sft_positive | " in text and "| 0.6 | topr p~=0.8 | topr | " in text
    assert ("| 0.2 vs 0.6 | topr p~* gap at 0.2 | at 0.6 | " + ", ".join(["+0.000"] * 6) + " | +0.000 ± 0.000 "
            "| 0 / 0 / 6 | 1 | 0 | 0 | equivalent |") in text
    assert "| topr token_sum | 0.633 | 0.617 | 0.629 | 0.621 | 0.625 | 0.629 |" in text
    assert (tmp_path / "docs" / study2_report.PLOT).is_file() and (tmp_path / "docs" / "results.md").read_text() == text
    # the manipulation check fails at 0.6 if positives-only does not beat mu there: H4 has one strength left
    for seed in range(1, 7):
        results["runs"][f"sft_positive_mu0.6_s{seed}"]["test"]["pass@1"] = 0.5
    failed = study2_report.analyse(results)
    assert not failed["checks"]["0.6"].passed
    assert failed["H5"]["0.6"] == stats.Decision(stats.INCONCLUSIVE, "manipulation check failed")
    assert failed["H4"].reason == "fewer than two strengths passed the manipulation check"


def test_figure_points_are_per_seed_differences_against_the_dataset_share():
    points, means = study2_report.figure_points(synthetic_results(), "topr", "sft_positive")
    assert points[:6] == [(0.25 + s / 1024, 0.125) for s in range(1, 7)]
    assert [(x, y) for x, y in points[6:]] == [(0.625 + s / 1024, d) for s, d in zip(range(1, 7), SMALL_NEGATIVE)]
    assert means[0] == pytest.approx((0.25 + 3.5 / 1024, 0.125))
    assert means[1] == pytest.approx((0.625 + 3.5 / 1024, sum(SMALL_NEGATIVE) / 6))


# ---------------------------------------------------------------------------------------------
# The driver with the pipeline faked: resume and the second-failure rule


def fake_mus(monkeypatch, calls):
    from nemo_topr.miniature import pipeline

    def pretrain_mus(out, splits, model, *, targets, **kwargs):
        calls["pretrain"] = calls.get("pretrain", 0) + 1
        mus = {}
        for target, iteration in zip(sorted(targets), (210, 300)):  # the highest target is not reached
            (out / f"iter_{iteration}").mkdir()
            mus[target] = out / f"iter_{iteration}"
        return mus, [{"iteration": 210, "pass@1": 0.25}, {"iteration": 300, "pass@1": 0.45}], out / "iter_300"

    monkeypatch.setattr(pipeline, "pretrain_mus", pretrain_mus)


def test_resume_and_a_run_that_fails_twice(tmp_path, monkeypatch):
    """Killed in its 10th training, the study resumes with the mus, 12 datasets and 9 runs kept; a
    run that then fails is recorded on its first failure and stops the study; resumed again, its
    second failure is scored as degenerated and the study finishes (2 strengths x 6 seeds x 6 runs)."""
    options = ["--design", "study2", "--out", str(tmp_path / "s2"), "--docs", "", "--jobs", "1"]
    calls: dict[str, int] = {}
    fake_pipeline(monkeypatch, calls, kill_at=10)
    fake_mus(monkeypatch, calls)
    with pytest.raises(KilledRun):
        study.main(options)
    kept = json.loads((tmp_path / "s2" / "results.json").read_text())
    assert kept["dropped"] == {"0.6": "no checkpoint reached it"} and list(kept["mus"]) == ["0.2", "0.4"]
    assert calls == {"build": 1, "pretrain": 1, "dataset": 12, "train": 9} and len(kept["runs"]) == 9
    assert list(kept["runs"])[:7] == [f"{key}_mu0.2_s1" for key in CONFIGS] + ["sft_positive_mu0.4_s1"]

    calls.clear()
    fake_pipeline(monkeypatch, calls, fail="topr_token_sum_mu0.4_s2")
    fake_mus(monkeypatch, calls)
    with pytest.raises(SystemExit, match="topr_token_sum_mu0.4_s2 failed"):
        study.main([*options, "--resume"])
    once = json.loads((tmp_path / "s2" / "results.json").read_text())
    assert list(once["failed_once"]) == ["topr_token_sum_mu0.4_s2"] and "topr_token_sum_mu0.4_s2" not in once["runs"]
    # recorded in order up to the failure: seed 1's 12 runs, then seed 2's up to its 12th (the failing one);
    # the fake trains instantly, so the pool may have trained later runs too: unrecorded, they run again
    assert len(once["runs"]) == 23 and calls["train"] >= 23 - 9
    assert study.main([*options, "--resume"]) == 0
    results = json.loads((tmp_path / "s2" / "results.json").read_text())
    assert len(results["runs"]) == 2 * 6 * 6 and "pretrain" not in calls
    failed = results["runs"]["topr_token_sum_mu0.4_s2"]
    assert failed["test"] == {"pass@1": 0.0, "maj@8": 0.0, "malformed_rate": 1.0} and "failed" in failed
    assert len(results["resumed"]) == 2
    text = (tmp_path / "s2" / "results.md").read_text()
    assert "Failed twice and scored as degenerated (pass@1 0, malformed 1): topr_token_sum_mu0.4_s2." in text
    assert "topr token_sum 1/6" in text   # counted as degenerated at strength 0.4


def test_study2_smoke(tmp_path, monkeypatch):
    """The driver on the fake pipeline at tiny sizes: pretraining probed against two targets (0 is met
    at the first checkpoint, 2 never: dropped), a dataset per seed, the runs (positives-only, TOPR at
    one p~ where the seed's data have both signs (101), skipped with the reason where they have one
    (102), TOPR under token_sum), each trained with its objective, the report and the figure."""
    out = tmp_path / "study2"
    calls: dict[str, int] = {}
    trained = fake_pipeline(monkeypatch, calls, positive_share={102: 0.0})
    assert study.main(["--design", "study2", "--out", str(out), "--docs", str(tmp_path / "docs"),
                       "--pretrain-problems", "64", "--train-prompts", "8", "--validation-prompts", "4",
                       "--test-prompts", "4", "--probe-prompts", "4", "--k", "2", "--eval-samples", "2",
                       "--pretrain-epochs", "1", "--pretrain-save-interval", "1", "--mu-targets", "0", "2",
                       "--seeds", "101", "102", "--variants", "sft_positive", "--p-tilde", "0.5",
                       "--token-sum-variants", "topr", "--hidden-size", "32", "--max-new-tokens", "16"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["mus"]) == ["0"] and results["dropped"] == {"2": "no checkpoint reached it"}
    assert [p["iteration"] for p in results["pretrain"]] == [1, 2]   # probed on, looking for 2
    assert results["mus"]["0"]["iteration"] == 1 and set(results["datasets"]) == {"0/101", "0/102"}
    runs = results["runs"]
    assert list(runs) == ["sft_positive_mu0_s101", "topr_ptilde0.5_mu0_s101", "topr_token_sum_mu0_s101",
                          "sft_positive_mu0_s102", "topr_token_sum_mu0_s102"]
    assert results["skipped"] == ["topr_ptilde0.5 at strength 0 on seed 102: positive share p = 0.0"]
    assert calls == {"build": 1, "pretrain": 1, "dataset": 2, "train": 5}
    for run in runs.values():
        assert {"test", "validation"} <= set(run) and (run["lr"], run["warmup"]) == (1e-4, 0)
    # each run trains with its variant and normalisation (the objective its overrides give the preset)
    for name, objective in (("sft_positive_mu0_s101", ("sft_positive", "sequence_mean", 0.0)),
                            ("topr_token_sum_mu0_s102", ("topr", "token_sum", 0.0)),
                            ("topr_ptilde0.5_mu0_s101", ("topr", "sequence_mean", 0.0))):  # p~ = p: c = 0
        config = trained_objective(trained[name][1])
        assert (config.variant, config.normalization, config.baseline) == objective, name
    text = (out / "results.md").read_text()
    assert text.startswith("**Not the pre-registered design**") and "| H4 (gap grows as mu weakens) |" in text
    assert "| 0 | 1 |" in text and "**Deviation**: strength 2 dropped: no checkpoint reached it." in text
    assert (tmp_path / "docs" / study2_report.PLOT).is_file() and (tmp_path / "docs" / "results.md").read_text() == text


# ---------------------------------------------------------------------------------------------
# The committed study 2: its design as registered, its report, the README's claim lines, the docs' figures

STUDY2_DOCS = REPO / "docs" / "miniature" / "study2"


def committed_study2() -> dict:
    return json.loads((STUDY2_DOCS / "results.json").read_text())


def test_committed_study2_ran_the_preregistered_design():
    results = committed_study2()
    design = results["design"]
    assert results["deviations"] == {} and design["seeds"] == [1, 2, 3, 4, 5, 6] and design["k"] == 16
    assert design["mu_targets"] == [0.2, 0.4, 0.6] and design["p_tilde"] == [0.1, 0.8]
    # each kept strength's mu is the first probed checkpoint at or above its target (the registered rule)
    probes = results["pretrain"]
    for strength, mu in results["mus"].items():
        first = next(p for p in probes if p["pass@1"] >= float(strength))
        assert (mu["iteration"], mu["probe_pass@1"]) == (first["iteration"], first["pass@1"]), strength
    assert set(results["mus"]) | set(results.get("dropped", {})) == {"0.2", "0.4", "0.6"}
    # one dataset per strength and seed, each sampled anew (8,192 records; no two alike in their counts)
    expected = {f"{strength}/{s}" for strength in results["mus"] for s in design["seeds"]}
    assert set(results["datasets"]) == expected
    assert {d["records"] for d in results["datasets"].values()} == {512 * 16}
    counts = {(d["correct"], d["wrong"], d["prompts_with_both"]) for d in results["datasets"].values()}
    assert len(counts) == len(expected)
    study_runs = [run for run in results["runs"].values() if run["stage"] == "study"]
    skipped = len(results.get("skipped", []))
    assert len(study_runs) + skipped == 6 * len(expected)
    assert all({"test", "validation"} <= set(run) for run in study_runs)
    assert {(run["lr"], run["warmup"]) for run in study_runs} == {(1e-4, 0)}


def test_committed_study2_report_is_the_rendering_of_its_results():
    assert (STUDY2_DOCS / "results.md").read_text() == study2_report.table(committed_study2())
    assert (STUDY2_DOCS / study2_report.PLOT).is_file()


def test_readme_states_each_study2_claim_as_the_rules_decided():
    """README's H4-H7 lines give, for every strength, the status the registered rules decided."""
    analysis = study2_report.analyse(committed_study2())
    lines = (REPO / "README.md").read_text().splitlines()
    statuses = {stats.SUPPORTED, stats.REFUTED, stats.INCONCLUSIVE}
    [h4] = [line for line in lines if line.startswith("- **H4**")]
    assert f"**{analysis['H4'].status}**" in h4 and not any(f"**{s}**" in h4 for s in statuses - {analysis["H4"].status})
    for h in ("H5", "H6", "H7"):
        [line] = [line for line in lines if line.startswith(f"- **{h}**")]
        for strength, decision in analysis[h].items():
            assert f"{strength}: **{decision.status}**" in line, (h, strength, decision, line)
        assert line.count("**") == 2 + 2 * len(analysis[h]), line


def untabulated_study2_sentences(results: dict) -> list[str]:
    """What docs/miniature.md quotes from study 2's runs beyond its report, recomputed from results.json:
    the token_sum control (positives-only under token_sum against positives-only under sequence_mean, and
    TOPR p~ = 0.8 against positives-only under token_sum; above = more seeds with A - B > 0) and the
    p~ = 0.1 malformed rate at its worst strength with its worst seed."""
    runs, seeds = results["runs"], results["design"]["seeds"]
    strengths = sorted(results["mus"], key=float)

    def run(key: str, strength: str, seed: int) -> dict:
        return runs[f"{key}_mu{strength}_s{seed}"]["test"]

    def deltas(a: str, b: str, strength: str) -> list[float]:
        return [run(a, strength, s)["pass@1"] - run(b, strength, s)["pass@1"] for s in seeds]

    def signed(x: float) -> str:
        return f"{x:+.3f}".replace("-", "−")

    def three(items: list[str]) -> str:
        return f"{items[0]}, {items[1]} and {items[2]}"

    control = [deltas("sft_positive_token_sum", "sft_positive", s) for s in strengths]
    above = {sum(d > 0 for d in ds) for ds in control}
    ptilde = [deltas("topr_ptilde0.8", "sft_positive_token_sum", s) for s in strengths]
    counts = [sum(d > 0 for d in ds) for ds in ptilde]
    malformed = {s: [run("topr_ptilde0.1", s, seed)["malformed_rate"] for seed in seeds] for s in strengths}
    worst = max(strengths, key=lambda s: sum(malformed[s]))
    rate, seed = max(zip(malformed[worst], seeds))
    return [
        "positives-only under `token_sum` − positives-only under `sequence_mean` was "
        + three([signed(sum(ds) / len(ds)) for ds in control])
        + f" (above on {' or '.join(map(str, sorted(above)))} of {len(seeds)} seeds at each strength)",
        "TOPR p̃ = 0.8 − positives-only under `token_sum` was "
        + three([f"{signed(sum(ds) / len(ds))} ({'above on ' if i == 0 else ''}{n} of {len(seeds)}"
                 f"{' seeds' if i == 0 else ''})" for i, (ds, n) in enumerate(zip(ptilde, counts))]),
        f"mean malformed rate over seeds up to {sum(malformed[worst]) / len(seeds):.3f} at μ {worst}, "
        f"where seed {seed} reached {rate:.3f}",
    ]


def test_docs_quote_the_untabulated_study2_figures_as_the_runs_give_them():
    text = " ".join((REPO / "docs" / "miniature.md").read_text().split())
    for sentence in untabulated_study2_sentences(committed_study2()):
        assert sentence in text, sentence


def test_figures_in_the_study2_results_section_come_from_the_report():
    """Every three-decimal figure the docs quote from study 2 is in its committed report, or is one of the
    figures recomputed from its runs above."""
    recomputed = {f for sentence in untabulated_study2_sentences(committed_study2()) for f in FIGURE.findall(sentence)}
    missing = figures_not_in_report("### Results of study 2", "\n## ", STUDY2_DOCS / "results.md")
    assert not set(missing) - recomputed, missing
