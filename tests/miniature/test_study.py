"""The pre-registered study (docs/miniature.md, issue 19): its statistics and decision rules against
hand-computed values, its plan and time estimate against the pre-registration's own arithmetic,
and the driver on the fake pipeline (fake_pipeline.py): a smoke run at minimal sizes and --resume."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from tests.conftest import REPO
from tests.miniature.fake_pipeline import KilledRun, fake_pipeline, trained_objective

from nemo_topr.errors import UserError
from nemo_topr.miniature import stats, study

STUDY_DOCS = REPO / "docs" / "miniature" / "study"  # the committed report of the study as run

# Differences built from dyadic fractions so that A - B is exact in floating point.
BASE = [0.5] * 6


def shifted(deltas):
    return [b + d for b, d in zip(BASE, deltas)]


@pytest.mark.parametrize(("positive", "negative", "p"), [
    (5, 0, 0.0625),      # 2 * 1/32
    (4, 1, 0.375),       # 2 * (1 + 5)/32
    (6, 0, 0.03125),     # 2 * 1/64
    (5, 1, 0.21875),     # 2 * (1 + 6)/64
    (0, 6, 0.03125),
    (3, 3, 1.0),         # 2 * 42/64 > 1
    (0, 0, 1.0),         # no untied seed: no evidence
    (9, 1, 0.021484375),  # 2 * (1 + 10)/1024
])
def test_sign_test_hand_values(positive, negative, p):
    assert stats.sign_test_p(positive, negative) == pytest.approx(p, abs=1e-15)


def test_compare_needs_a_unanimous_direction_and_the_effect_size():
    better = stats.compare(shifted([0.125] * 6), BASE)
    assert better.outcome == stats.A_BETTER and better.p == 0.03125
    assert (better.positive, better.negative, better.tied, better.mean, better.sd) == (6, 0, 0, 0.125, 0.0)
    assert stats.compare(BASE, shifted([0.125] * 6)).outcome == stats.B_BETTER
    # one tie leaves n = 5: the smallest attainable p is 0.0625 > 0.05
    tie = stats.compare(shifted([0.125] * 5 + [0.0]), BASE)
    assert (tie.tied, tie.p, tie.outcome) == (1, 0.0625, stats.NO_DECISION)
    # unanimous but below delta = 0.02 on average: no decision
    small = stats.compare(shifted([0.015625] * 6), BASE)
    assert small.p == 0.03125 and small.outcome == stats.NO_DECISION
    # 5 of 6 with a large mean: p = 0.21875, no decision
    assert stats.compare(shifted([0.25] * 5 + [-0.0625]), BASE).outcome == stats.NO_DECISION


def test_compare_mean_and_sample_sd():
    paired = stats.compare([0.625, 0.875], [0.5, 0.5])  # deltas 0.125, 0.375
    assert paired.mean == 0.25 and paired.sd == pytest.approx(math.sqrt(2 * 0.125**2))
    assert stats.compare([0.75], [0.5]).sd is None
    with pytest.raises(ValueError, match="equally many seeds"):
        stats.compare([0.5, 0.5], [0.5])


def test_not_worse_within_the_margin():
    # every seed above -0.02 and the mean >= 0: non-inferior, though not better
    assert stats.not_worse(shifted([-0.015625, 0.015625, 0.0, 0.0078125, 0.0, 0.0]), BASE)
    # one seed 0.03125 below: 5 of 6 -> p = 0.21875
    assert not stats.not_worse(shifted([-0.03125, 0.015625, 0.0, 0.0078125, 0.0, 0.015625]), BASE)
    # every seed within the margin but the mean below 0
    assert not stats.not_worse(shifted([-0.015625] * 6), BASE)


def test_degenerated_and_manipulation_check():
    assert stats.degenerated(0.30, 0.5, 0.4)        # malformed rate reaches 0.5
    assert stats.degenerated(0.19, 0.1, 0.4)        # below half of mu's 0.4
    assert not stats.degenerated(0.20, 0.49, 0.4)   # exactly half is not below half
    mu = 0.5
    passed = stats.manipulation_check([0.55, 0.54, 0.53, 0.49, 0.56, 0.55], mu)  # mean +0.0367, 5 of 6 above
    assert passed.passed and passed.improved == 5 and passed.mean == pytest.approx(0.22 / 6)
    assert not stats.manipulation_check([0.56, 0.58, 0.49, 0.49, 0.58, 0.57], mu).passed  # mean 0.045, 4 of 6
    assert not stats.manipulation_check([0.52, 0.53, 0.52, 0.53, 0.52, 0.53], mu).passed  # 6 of 6, mean 0.025


PASS = stats.Check(True, 0.05, 6, 6)
FAIL = stats.Check(False, 0.0, 3, 6)


def test_h1_rules():
    better = stats.compare(shifted([0.25] * 6), BASE)
    assert stats.decide_h1([True] * 6, [False] * 6, better).status == stats.SUPPORTED
    assert stats.decide_h1([True] * 5 + [False], [True] + [False] * 5, better).status == stats.SUPPORTED
    assert stats.decide_h1([True] * 4 + [False] * 2, [False] * 6, better).status == stats.INCONCLUSIVE
    assert stats.decide_h1([True] + [False] * 5, [False] * 6, better).status == stats.REFUTED
    assert stats.decide_h1([True] * 6, [True] * 5 + [False], better).status == stats.REFUTED
    no_decision = stats.compare(shifted([0.25] * 5 + [-0.0625]), BASE)
    assert stats.decide_h1([True] * 6, [False] * 6, no_decision).status == stats.INCONCLUSIVE


def test_h2_rules():
    sft = BASE
    assert stats.decide_h2(FAIL, shifted([0.25] * 6), sft) == stats.Decision(stats.INCONCLUSIVE,
                                                                              "manipulation check failed")
    assert stats.decide_h2(PASS, shifted([0.25] * 6), sft).reason == "TOPR better than positives-only"
    close = stats.decide_h2(PASS, shifted([0.0078125, 0.0, -0.0078125, 0.015625, 0.0, 0.0]), sft)
    assert close.status == stats.SUPPORTED and "not worse" in close.reason
    assert stats.decide_h2(PASS, shifted([-0.0625] * 6), sft).status == stats.REFUTED
    assert stats.decide_h2(PASS, shifted([-0.0625] * 5 + [0.0625]), sft).status == stats.INCONCLUSIVE


def grid(values: dict[float, float], noise=(0.0,) * 6) -> dict[float, list[float]]:
    return {t: [v + e for e in noise] for t, v in values.items()}


def test_h3_rules():
    peak = {0.05: 0.25, 0.1: 0.375, 0.2: 0.5, 0.5: 0.4375, 0.8: 0.375, 0.95: 0.3125}
    decision, star = stats.decide_h3(PASS, grid(peak), grid(peak))
    assert (decision.status, star) == (stats.SUPPORTED, 0.2)
    monotone = {0.05: 0.25, 0.1: 0.3125, 0.2: 0.375, 0.5: 0.4375, 0.8: 0.5, 0.95: 0.5625}
    decision, star = stats.decide_h3(PASS, grid(monotone), grid(monotone))
    assert (decision.status, star) == (stats.REFUTED, 0.8)
    # I* is chosen on validation: 0.2 there, but on test 0.2 only ties the upper endpoint
    test = {**peak, 0.95: 0.5}
    decision, star = stats.decide_h3(PASS, grid(peak), grid(test))
    assert (decision.status, star) == (stats.INCONCLUSIVE, 0.2)
    assert stats.decide_h3(FAIL, grid(peak), grid(peak))[0].status == stats.INCONCLUSIVE
    # ties on validation go to the smaller p~
    assert stats.best_interior({0.05: [0.1], 0.1: [0.5], 0.5: [0.5], 0.95: [0.1]}, (0.05, 0.95)) == 0.1
    with pytest.raises(ValueError, match="no point between"):
        stats.best_interior({0.05: [0.1], 0.95: [0.2]}, (0.05, 0.95))


def test_lr_selection_ties_prefer_the_smaller_lr_then_warm_up():
    validation = {(1e-3, 0): [0.50, 0.52], (3e-4, 0): [0.50, 0.515], (3e-4, 12): [0.49, 0.525], (1e-4, 12): [0.40, 0.41]}
    # best mean 0.51; 3e-4 (0.5075 both) lies within 0.005 of it; warm-up 12 breaks the tie
    assert study.select_settings(validation) == (3e-4, 12)
    assert study.select_settings({(1e-3, 0): [0.6], (3e-4, 0): [0.5]}) == (1e-3, 0)


def test_plan_matches_the_preregistration():
    design = study.PREREGISTERED
    assert study.deviations(design) == {}
    assert len(study.tuning_runs(design)) == 16 and len(study.study_runs(design)) == 12
    assert len(design.seeds) * len(study.study_runs(design)) == 72
    # docs/miniature.md's hand arithmetic: 378 + 32 + 1,835 + 1,167 + 6,923 = 10,335 s (rounded unit costs)
    seconds = study.estimate(design)
    assert seconds["study runs"] == pytest.approx(6923, rel=0.01)
    assert seconds["tuning runs"] == pytest.approx(1167, rel=0.01)
    assert sum(seconds.values()) == pytest.approx(10335, rel=0.01) and sum(seconds.values()) < 3 * 3600


def test_dry_run_prints_the_plan_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    assert study.main(["--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Pre-registered design") and "study runs in all: 72" in text and "total: 10," in text
    assert not out.exists()
    assert study.main(["--dry-run", "--seeds", "1", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("NOT the pre-registered design; differs in: seeds")
    with pytest.raises(UserError) as unknown:
        study.main(["--dry-run", "--variants", "topr", "grpo"])
    assert unknown.value.key == "--variants.unknown"


def synthetic_results(sft: float) -> dict:
    """Six seeds with exact per-seed values: mu 0.5; reinforce 0.0625 and malformed (degenerate);
    topr 0.75; the p~ grid 0.25 / 0.75 / 0.625 (interior peak at 0.2, also on validation)."""
    values = {"sft_positive": sft, "reinforce": 0.0625, "topr": 0.75,
              "topr_ptilde0.05": 0.25, "topr_ptilde0.2": 0.75, "topr_ptilde0.95": 0.625}
    metrics = lambda v, malformed=0.0: {"pass@1": v, "maj@8": v, "malformed_rate": malformed}  # noqa: E731
    runs = {f"{key}_s{seed}": {"stage": "study", "key": key, "seed": seed, "lr": 3e-4, "warmup": 12,
                               "test": metrics(v, 0.75 if key == "reinforce" else 0.0), "validation": metrics(v)}
            for key, v in values.items() for seed in range(1, 7)}
    runs["tune_lr0.0003_wu12_s101"] = {"stage": "tuning", "key": "sft_positive", "seed": 101, "lr": 3e-4,
                                       "warmup": 12, "validation": metrics(0.5)}
    return {"design": {"seeds": list(range(1, 7)), "variants": ["sft_positive", "reinforce", "topr"],
                       "p_tilde": [0.05, 0.2, 0.95], "eval_samples": 8, "test_prompts": 500, "probe_prompts": 64,
                       "mu_target": 0.6},
            "deviations": {"variants": {}}, "mu_target_met": True, "mu": {"test": metrics(0.5), "validation": metrics(0.5)},
            "pretrain": [{"iteration": 30, "pass@1": 0.625}],
            "datasets": {"1": {"records": 16, "positive_share": 0.5, "correct": 8, "wrong": 8, "invalid": 0,
                               "prompts_with_both": 4}},
            "runs": runs, "selected": {"lr": 3e-4, "warmup": 12}, "stage_seconds": {"study": 10.0},
            "estimate_s": {"study runs": 20.0}, "wall_time_s": 12.0}


def test_report_decisions_from_results(tmp_path):
    from nemo_topr.miniature import study_report

    text = study_report.write_report(tmp_path, synthetic_results(sft=0.625), docs=tmp_path / "docs")
    assert text.startswith("**Not the pre-registered design**: differs in variants")
    assert "| H1 | **supported** | REINFORCE degenerated on 6/6 seeds, TOPR on 0/6; TOPR vs REINFORCE: A > B |" in text
    assert "| H2 | **supported** | TOPR better than positives-only |" in text
    assert "| H3 | **supported** | I* = 0.2: vs 0.05 A > B, vs 0.95 A > B |" in text
    assert "mean gain +0.125, above mu on 6/6 seeds: **passed**" in text
    assert ("| topr | sft_positive | +0.125, +0.125, +0.125, +0.125, +0.125, +0.125 | +0.125 ± 0.000 | 6 / 0 / 0 "
            "| 0.03125 | A > B |") in text
    # 0.0625 rounds half-to-even to 0.062; malformed 0.75 -> degenerated on every seed
    assert "| reinforce | 0.062 | 0.062 | 0.062 | 0.062 | 0.062 | 0.062 | 0.062 ± 0.000 | 0.062 | 0.750 | 0.062 |" in text
    assert "or pass@1 < half of mu's): topr 0/6 seeds; reinforce 6/6 seeds." in text
    assert "| topr p~=0.05 | 0.250 | 0.250 | 0.250 | 0.250 | 0.250 | 0.250 | 0.250 ± 0.000 |" in text
    assert "| 0.0003 | 12 | 0.500 | 0.500 | **yes** |" in text
    # secondary metrics: means over seeds of what each run recorded, "–" where nothing was
    assert "| topr | – | – | – | – | – | – |" in text
    results = synthetic_results(sft=0.625)
    for seed in range(1, 7):
        run = results["runs"][f"topr_s{seed}"]
        run["test"].update(invalid_rate=seed / 64, mean_chars=40.0 + seed)
        run["telemetry"] = {"negative_weight_mean": [1.0, seed / 8], "positive_nll": []}
    assert "| topr | 0.055 | 43.5 | – | – | 0.438 | – |" in study_report.table(results)
    assert (tmp_path / "docs" / "results.md").is_file() and (tmp_path / "docs" / study_report.PLOT).is_file()
    assert json.loads((tmp_path / "docs" / "results.json").read_text()) == synthetic_results(sft=0.625)
    # positives-only no better than mu: H2 and H3 inconclusive whatever TOPR did; H1 still judged
    failed = study_report.table(synthetic_results(sft=0.5))
    assert "above mu on 0/6 seeds: **failed**" in failed and "| H1 | **supported** |" in failed
    assert "| H2 | **inconclusive** | manipulation check failed |" in failed
    assert "| H3 | **inconclusive** | manipulation check failed |" in failed


def test_study_smoke(tmp_path, monkeypatch):
    """The driver on the fake pipeline at minimal sizes: mu the first probed checkpoint reaching
    --mu-target 0, a dataset per tuning and study seed, the tuning run evaluated on validation only,
    the H1-H3 variants and a three-point p~ grid at the selected settings, the grid where a seed's
    data have both signs (101) and skipped with the reason where they have one (102), the report
    with its decisions in --out and --docs."""
    out = tmp_path / "study"
    calls: dict[str, int] = {}
    trained = fake_pipeline(monkeypatch, calls, positive_share={102: 0.0})
    assert study.main(["--out", str(out), "--docs", str(tmp_path / "docs"), "--pretrain-problems", "64",
                       "--train-prompts", "8", "--validation-prompts", "4", "--test-prompts", "4",
                       "--probe-prompts", "4", "--k", "2", "--eval-samples", "2", "--pretrain-epochs", "1",
                       "--pretrain-save-interval", "1", "--mu-target", "0", "--seeds", "101", "102",
                       "--tuning-seeds", "1", "--lr-grid", "1e-3", "--warmup-grid", "0",
                       "--variants", "sft_positive", "reinforce", "topr", "--p-tilde", "0.2", "0.5", "0.8",
                       "--hidden-size", "32", "--max-new-tokens", "16"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["mu_target_met"] and [p["iteration"] for p in results["pretrain"]] == [1]
    assert results["mu"]["path"].endswith("iter_0000001") and set(results["mu"]) == {"path", "test", "validation"}
    assert set(results["datasets"]) == {"1", "101", "102"} and results["selected"] == {"lr": 1e-3, "warmup": 0}
    runs = results["runs"]
    assert set(runs["tune_lr0.001_wu0_s1"]) >= {"validation", "iterations"} and "test" not in runs["tune_lr0.001_wu0_s1"]
    grid = ["topr_ptilde0.2", "topr_ptilde0.5", "topr_ptilde0.8"]
    assert list(runs) == ["tune_lr0.001_wu0_s1", *[f"{key}_s{seed}" for seed, keys in (
        (101, ["sft_positive", "reinforce", "topr", *grid]), (102, ["sft_positive", "reinforce", "topr"]))
        for key in keys]]
    assert calls == {"build": 1, "pretrain": 1, "dataset": 3, "train": len(runs)}
    for name, run in runs.items():
        assert (run["lr"], run["warmup"]) == (1e-3, 0)
        assert set(run["validation"]) == {"pass@1", "maj@2", "malformed_rate"}
        assert ("test" in run) == (run["stage"] == "study") and run["iterations"] == 123
    assert results["skipped"] == [f"{key} on seed 102: positive share p = 0.0" for key in grid]
    # what each run trains: the variant, or TOPR with c = (p - p~) / (p + p~ (1 - 2p)) = 1 - 2 p~ at p = 0.5
    for name, variant, baseline in (("sft_positive_s101", "sft_positive", 0.0), ("reinforce_s102", "reinforce", 0.0),
                                    ("topr_ptilde0.2_s101", "topr", 0.6), ("topr_ptilde0.8_s101", "topr", -0.6)):
        objective = trained_objective(trained[name][1])
        assert (objective.variant, objective.baseline) == (variant, pytest.approx(baseline)), name
    text = (out / "results.md").read_text()
    assert "**Not the pre-registered design**" in text and "Manipulation check" in text
    assert "| A | B | A − B per seed | mean ± sd | + / − / tie | sign-test p | outcome |" in text
    assert "| topr | sft_positive |" in text and "| H1 |" in text and "| H3 |" in text
    from nemo_topr.miniature.study_report import PLOT

    assert (tmp_path / "docs" / "results.md").read_text() == text and (tmp_path / "docs" / PLOT).is_file()


def test_resume_keeps_mu_datasets_and_finished_runs(tmp_path, monkeypatch):
    """A study killed in its 20th training (16 tuning runs, then the study runs; one job at a time)
    resumes with mu, the datasets and the 19 finished runs kept, and trains only the other 53."""
    options = ["--out", str(tmp_path / "study"), "--docs", "", "--jobs", "1"]
    calls: dict[str, int] = {}
    fake_pipeline(monkeypatch, calls, kill_at=20)
    with pytest.raises(KilledRun, match="sft_positive_s1|reinforce_s1|tis_s1|topr_s1"):
        study.main(options)
    kept = json.loads((tmp_path / "study" / "results.json").read_text())
    assert calls == {"build": 1, "pretrain": 1, "dataset": 8, "train": 19} and len(kept["runs"]) == 19
    assert kept["selected"] == {"lr": 3e-5, "warmup": 12}  # every tuning run tied: smallest lr, then warm-up

    with pytest.raises(UserError) as other:
        study.main([*options, "--resume", "--seeds", "1", "2"])
    assert other.value.key == "--resume.other_options"
    calls.clear()
    fake_pipeline(monkeypatch, calls)
    assert study.main([*options, "--resume"]) == 0
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    assert calls == {"train": 16 + 72 - 19}
    assert len(results["runs"]) == 16 + 72 and results["resumed"][0]["runs_kept"] == 19
    assert {k: results["runs"][k] for k in kept["runs"]} == kept["runs"]
    assert list(results["stage_seconds"]) == ["pretraining", "datasets", "tuning", "study"]
    assert "Resumed (`--resume`)" in (tmp_path / "study" / "results.md").read_text()


# ---------------------------------------------------------------------------------------------
# The committed study: its report, the README's claim lines and the docs' figures


def committed_study() -> dict:
    return json.loads((STUDY_DOCS / "results.json").read_text())


def test_committed_study_ran_the_preregistered_design_on_six_fresh_datasets():
    results = committed_study()
    assert results["deviations"] == {} and results["mu_target_met"]
    assert results["design"]["seeds"] == [1, 2, 3, 4, 5, 6] and results["design"]["k"] == 16
    assert set(results["datasets"]) == {"1", "2", "3", "4", "5", "6", "101", "102"}
    # each seed sampled its own dataset from mu (8,192 records), not a reshuffle of one
    counts = [(d["records"], d["correct"]) for d in results["datasets"].values()]
    assert {r for r, _ in counts} == {512 * 16} and len({c for _, c in counts}) == len(counts)
    study_runs = [run for run in results["runs"].values() if run["stage"] == "study"]
    assert len(study_runs) == 72 and all({"test", "validation"} <= set(run) for run in study_runs)
    assert {(run["lr"], run["warmup"]) for run in study_runs} == {tuple(results["selected"].values())}


def test_committed_report_is_the_rendering_of_its_results():
    from nemo_topr.miniature import study_report

    assert (STUDY_DOCS / "results.md").read_text() == study_report.table(committed_study())


def test_readme_states_each_claims_status_as_the_study_decided():
    from nemo_topr.miniature import study_report

    analysis = study_report.analyse(committed_study())
    lines = (REPO / "README.md").read_text().splitlines()
    for h in ("H1", "H2", "H3"):
        [line] = [line for line in lines if line.startswith(f"- **{h}**")]
        assert f"**{analysis[h].status}**" in line, (h, analysis[h], line)
        others = {stats.SUPPORTED, stats.REFUTED, stats.INCONCLUSIVE} - {analysis[h].status}
        assert not any(f"**{status}**" in line for status in others), line


FIGURE = re.compile(r"(?<![\d.])[+−-]?\d\.\d{3}(?!\d)")  # a three-decimal figure, signed or not


def figures_not_in_report(heading: str, ends_at: str, report: Path) -> list[str]:
    """The three-decimal figures that docs/miniature.md quotes in the section from `heading` up to the
    next `ends_at` and that `report` does not contain (asserting that the section quotes some)."""
    text = (REPO / "docs" / "miniature.md").read_text()
    start = text.index(heading)
    end = text.find(ends_at, start + 1)
    section = text[start:end if end != -1 else None]
    figures = set(FIGURE.findall(section))
    assert figures, "the section quotes no figures"
    quoted = report.read_text()
    return sorted(f for f in figures if f.replace("−", "-") not in quoted)


def test_figures_in_the_study_results_section_come_from_the_report():
    """Every three-decimal figure the docs quote from the study is in the committed report."""
    assert not figures_not_in_report("### Results of the pre-registered study", "\n#", STUDY_DOCS / "results.md")
