"""Study 3's report (docs/miniature/study3_preregistration.md), from its results.json and
outcomes.json.gz: the lr selected per arm, the manipulation check, H8-H10 by the registered rules
(stats.py: sign test and TOST over seeds, bootstrap over problems), every reported comparison and
check, and the registered figure (re-runnable on its own:
`python -m nemo_topr.miniature.study3_report results/miniature_study3 [docs/miniature/study3]`)."""

from __future__ import annotations

import random
import shutil
import statistics
import sys
from pathlib import Path

from nemo_topr.miniature import stats
from nemo_topr.miniature.study3_checks import check_lines
from nemo_topr.miniature.study_report import (check_text, dataset_rows, footer_lines, pass_table, rerender, save_report,
                                              secondary_rows)
from nemo_topr.miniature.study_run import OUTCOMES, read_outcomes

PLOT = "study3.png"
# the arms' keys (run names are KEY_lrLR_sSEED; the p~ arms' keys end in p~, e.g. topr_ptilde0.8)
POSITIVES, POSITIVES_TS, TOPR, REAL, PLACEBO = (
    "sft_positive", "sft_positive_token_sum", "topr", "topr_ptilde", "placebo_ptilde")


class Study:
    """One study's runs by (arm, lr, seed), its per-problem outcomes and the selected lrs."""

    def __init__(self, results: dict, outcomes: dict):
        self.results, self.outcomes = results, outcomes
        self.seeds, self.samples = results["design"]["seeds"], results["design"]["eval_samples"]
        t = f"{results['design']['p_tilde']:g}"
        self.real, self.placebo = REAL + t, PLACEBO + t
        self.arms = [POSITIVES, POSITIVES_TS, TOPR, self.real, self.placebo]
        self.names: dict[tuple[str, float, int], str] = {}
        for name, run in results["runs"].items():
            self.names[run["key"], run["lr"], run["seed"]] = name
        self.selected = {arm: stats.select_lr(grid) for arm in self.arms if (grid := self.validation(arm))}

    def label(self, arm: str) -> str:
        return arm.replace("_ptilde", " p~=").replace("_token_sum", " token_sum")

    def run(self, arm: str, lr: float, seed: int) -> dict | None:
        name = self.names.get((arm, lr, seed))
        return None if name is None else self.results["runs"][name]

    def validation(self, arm: str) -> dict[float, list[float]]:
        """{lr: validation pass@1 per seed} over the lrs the arm ran at on every seed."""
        grid = {lr: [self.run(arm, lr, s) for s in self.seeds] for lr in self.results["design"]["lr_grid"]}
        return {lr: [r["validation"]["pass@1"] for r in runs] for lr, runs in grid.items() if None not in runs}

    def lr_of(self, arm: str, lr: float | None) -> float | None:
        return self.selected.get(arm) if lr is None else lr

    def per_seed(self, arm: str, lr: float | None = None, split: str = "test") -> list[float] | None:
        """pass@1 per seed at `lr` (default: the arm's selected lr); None unless it ran on every seed."""
        lr = self.lr_of(arm, lr)
        runs = [self.run(arm, lr, s) for s in self.seeds]
        return None if lr is None or None in runs else [r[split]["pass@1"] for r in runs]

    def correct(self, arm: str, lr: float | None = None) -> list[list[int]]:
        lr = self.lr_of(arm, lr)
        return [self.outcomes[self.names[arm, lr, s]]["test"]["correct"] for s in self.seeds]

    def groups(self) -> dict[str, dict[int, dict]]:
        """{label (selected lr): {seed: run}} of every arm that has a selected lr."""
        return {f"{self.label(arm)} (lr {lr:g})": {s: self.run(arm, lr, s) for s in self.seeds}
                for arm, lr in self.selected.items()}


def analyse(results: dict, outcomes: dict) -> dict:
    """{"study", "check", "comparisons": [(A, B, lrs, Outcome, ProblemLevel, agree)], "H8", "H9", "H10"}."""
    study = Study(results, outcomes)
    analysis: dict = {"study": study, "comparisons": []}
    mu = results["mu"]["test"]["pass@1"]
    sft = study.per_seed(POSITIVES)
    analysis["check"] = check = (stats.manipulation_check(sft, mu) if sft is not None else
                                 stats.Check(False, float("nan"), 0, len(study.seeds)))

    def compare(a: str, b: str, margin: float = stats.MIN_EFFECT, lr: float | None = None):
        x, y = study.per_seed(a, lr), study.per_seed(b, lr)
        if x is None or y is None:
            return None
        outcome = stats.classify(x, y, margin=margin)
        problems = stats.bootstrap(stats.problem_differences(study.correct(a, lr), study.correct(b, lr), study.samples))
        agree = None if margin != stats.MIN_EFFECT else stats.intervals_agree(outcome.outcome, problems)
        lrs = f"{lr:g}" if lr is not None else f"{study.selected[a]:g} / {study.selected[b]:g}"
        analysis["comparisons"].append((study.label(a), study.label(b), lrs, outcome, problems, agree))
        return outcome, problems

    def missing(what: str) -> stats.Decision:
        return stats.Decision(stats.INCONCLUSIVE, f"{what} did not run on every seed at every lr")

    h8 = compare(study.real, study.placebo, stats.PLACEBO_MARGIN)
    analysis["H8"] = stats.decide_h8(check, *h8) if h8 else missing("a p~ arm")
    for name, a, b in (("H9", TOPR, POSITIVES), ("H10", study.real, POSITIVES_TS)):
        decided = compare(a, b)
        analysis[name] = stats.decide_at_least_as_good(check, decided[0]) if decided else missing(f"{a} or {b}")
    # reported, never decisive
    for lr in results["design"]["lr_grid"]:
        compare(study.real, study.placebo, stats.PLACEBO_MARGIN, lr)
    for a, b in ((study.real, POSITIVES), (POSITIVES_TS, POSITIVES), (study.placebo, POSITIVES),
                 (study.placebo, POSITIVES_TS)):
        compare(a, b)
    return analysis


def _interval(pair: tuple[float, float]) -> str:
    return f"[{pair[0]:+.4f}, {pair[1]:+.4f}]"


def _agree(agree: bool | None) -> str:
    return "–" if agree is None else ("yes" if agree else "**no**")


def table(results: dict, outcomes: dict, analysis: dict | None = None) -> str:
    """results.md; `analysis` is `analyse(results, outcomes)` when the caller has it."""
    design = results["design"]
    lines = []
    if results.get("deviations"):
        lines += [f"**Not the pre-registered design**: differs in {', '.join(results['deviations'])} "
                  "(values in results.json). The decisions below apply the pre-registered rules to it.", ""]
    probes = ", ".join(f"{p['iteration']}: {p['pass@1']:.3f}" for p in results.get("pretrain", []))
    if not results.get("mu_target_met"):
        return "\n".join(lines + [f"**No pretraining checkpoint reached train pass@1 {design['mu_target']}**: by the "
                                  "registered rule nothing else ran; H8-H10 are not decided.", "",
                                  f"Checkpoints probed (train pass@1): {probes}.", "", *footer_lines(results)]) + "\n"
    analysis = analysis or analyse(results, outcomes)
    study, check, mu = analysis["study"], analysis["check"], results["mu"]
    lines += ["| hypothesis | status | outcome |", "|---|---|---|"]
    for h, what in (("H8", "real negatives > placebo"), ("H9", "TOPR c = 0 >= positives-only"),
                    ("H10", f"TOPR p~={design['p_tilde']:g} >= positives-only token_sum")):
        lines.append(f"| {h} ({what}) | **{analysis[h].status}** | {analysis[h].reason} |")
    sft = study.per_seed(POSITIVES)
    lines += ["", check_text(check, mu["test"]["pass@1"], sft) if sft is not None else
              "Manipulation check: positives-only did not run on every seed: **failed**."]
    lines += ["", f"mu: pretraining iteration {mu['iteration']} (the first probed checkpoint with train pass@1 >= "
              f"{design['mu_target']}: {mu['probe_pass@1']:.3f}); test pass@1 {mu['test']['pass@1']:.3f}, validation "
              f"pass@1 {mu['validation']['pass@1']:.3f}. Checkpoints probed: {probes}."]

    grid = design["lr_grid"]
    lines += ["", "lr selection (mean validation pass@1 over the seeds; exact ties: the smaller lr):", "",
              f"| arm | {' | '.join(f'lr {lr:g}' for lr in grid)} | selected |", "|---|" + "---|" * (len(grid) + 1)]
    for arm in study.arms:
        validation = study.validation(arm)
        cells = [f"{statistics.fmean(validation[lr]):.4f}" if lr in validation else "–" for lr in grid]
        chosen = study.selected.get(arm)
        end = " (an end of the grid)" if chosen in (min(grid), max(grid)) else ""
        lines.append(f"| {study.label(arm)} | {' | '.join(cells)} | {'–' if chosen is None else f'{chosen:g}{end}'} |")

    groups, n = study.groups(), design["eval_samples"]
    lines += ["", f"Final test pass@1 per seed at each arm's selected lr ({design['test_prompts']} problems x {n}):",
              "", *pass_table(groups, study.seeds, n, mu), "",
              "Secondary metrics (never decisive), mean over seeds at the selected lr:", "", *secondary_rows(groups)]
    degenerated = []
    for arm in study.arms:
        for lr in grid:
            runs = [r for s in study.seeds if (r := study.run(arm, lr, s)) is not None]
            count = sum(stats.degenerated(r["test"]["pass@1"], r["test"]["malformed_rate"], mu["test"]["pass@1"])
                        for r in runs)
            degenerated.append(f"{study.label(arm)} at {lr:g} {count}/{len(runs)}")
    lines += ["", "Degenerated (final malformed rate >= 0.5 or pass@1 < half of mu's): " + "; ".join(degenerated) + "."]

    lines += ["", f"Comparisons (A − B per seed on test pass@1, each arm at its selected lr unless one lr is named; "
              f"exact two-sided sign test, ties dropped; paired-t TOST at ±margin (m = {stats.PLACEBO_MARGIN} for real "
              f"vs placebo, else δ = {stats.MIN_EFFECT}); Δ̄ and its bootstrap intervals over the "
              f"{design['test_prompts']} test problems, {stats.BOOTSTRAP_RESAMPLES:,} resamples, "
              f"random.Random({stats.BOOTSTRAP_SEED}); α = {stats.ALPHA}):", "",
              "| A | B | lr A / B | A − B per seed | mean ± sd | + / − / tie | sign-test p | TOST p_low | TOST p_high "
              "| outcome (over seeds) | Δ̄ | 95 % interval | 90 % interval | intervals agree |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, b, lrs, outcome, problems, agree in analysis["comparisons"]:
        paired = outcome.paired
        lines.append(f"| {a} | {b} | {lrs} | {', '.join(f'{d:+.4f}' for d in paired.deltas)} | {paired.mean:+.4f}"
                     f"{f' ± {paired.sd:.4f}' if paired.sd is not None else ''} | {paired.positive} / {paired.negative} / {paired.tied} | {paired.p:.4g} | "
                     f"{outcome.tost.p_low:.4g} | {outcome.tost.p_high:.4g} | {outcome.outcome} | "
                     f"{problems.mean:+.4f} | {_interval(problems.ci95)} | {_interval(problems.ci90)} | {_agree(agree)} |")
    lines += ["", "(For real vs placebo the over-seeds outcome column applies study 2's names at m; H8's outcome is "
              "the table above's. \"Intervals agree\" is reported for the δ comparisons only.)"]
    h8 = figure_data(analysis)["right"]
    if h8 is not None:
        lines += ["", f"H8 against δ = {stats.MIN_EFFECT} (reported, never decisive): Δ̄ = {h8[1]:+.4f}, |Δ̄| "
                  f"{'<' if abs(h8[1]) < stats.MIN_EFFECT else '>='} δ; 95 % interval {_interval(h8[3])}."]

    lines += ["", "Every arm against mu (test pass@1 at the selected lr − mu's, mean over seeds; seeds above mu):", ""]
    for arm in study.arms:
        values = study.per_seed(arm)
        if values is not None:
            gains = [v - mu["test"]["pass@1"] for v in values]
            lines.append(f"- {study.label(arm)}: {statistics.fmean(gains):+.4f}, above mu on "
                         f"{sum(g > 0 for g in gains)}/{len(gains)} seeds")

    lines += ["", *check_lines(study, results)]
    failed = [name for name, run in results["runs"].items() if "failed" in run]
    if failed:
        lines += ["", "Failed twice and scored as degenerated (pass@1 0, malformed 1): " + ", ".join(failed) + "."]
    lines += ["", "Offline datasets (one per seed, sampled from mu):", "", *dataset_rows(results["datasets"], "seed")]
    if results.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(results["skipped"]) + "."]
    lines += ["", *footer_lines(results)]
    return "\n".join(lines) + "\n"


def figure_data(analysis: dict) -> dict:
    """The registered figure's data, from the comparisons at the selected lrs. "left": {arm label:
    (per-seed A − positives-only, Δ̄, 95 % interval)}; "right": (per-seed real − placebo, Δ̄, 90 % and
    95 % intervals) or None."""
    study = analysis["study"]
    selected = {(a, b): (outcome.paired.deltas, problems) for a, b, lrs, outcome, problems, _ in analysis["comparisons"]
                if "/" in lrs}  # at each arm's selected lr (the per-lr ones name a single lr)
    left = {}
    for arm in study.arms[1:]:
        if (study.label(arm), study.label(POSITIVES)) in selected:
            deltas, problems = selected[study.label(arm), study.label(POSITIVES)]
            left[study.label(arm)] = (deltas, problems.mean, problems.ci95)
    real = selected.get((study.label(study.real), study.label(study.placebo)))
    return {"left": left, "right": None if real is None else (real[0], real[1].mean, real[1].ci90, real[1].ci95)}


def plot(out: Path, analysis: dict) -> Path:
    """Left: each arm − positives-only per seed, mean and 95 % problem-level interval; right: real −
    placebo per seed, Δ̄ with its 90 % and 95 % intervals, ±m; H8's outcome in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data, jitter = figure_data(analysis), random.Random(0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    for x, (label, (deltas, mean, ci95)) in enumerate(data["left"].items()):
        left.scatter([x + jitter.uniform(-0.15, 0.15) for _ in deltas], deltas, s=12, color="k", alpha=0.6)
        left.errorbar(x, mean, yerr=[[mean - ci95[0]], [ci95[1] - mean]], fmt="o", color="tab:blue", capsize=5)
    left.set_xticks(range(len(data["left"])), list(data["left"]), fontsize=8)
    left.axhspan(-stats.MIN_EFFECT, stats.MIN_EFFECT, color="gray", alpha=0.15, label=f"±δ = {stats.MIN_EFFECT}")
    left.axhline(0.0, color="gray", lw=0.8)
    left.set_ylabel("final test pass@1 − sft_positive (same seed)")
    left.set_title("each arm at its selected lr (points: seeds; bar: 95 % problem-level interval)", fontsize=9)
    left.legend(fontsize=7)
    if data["right"] is not None:
        deltas, mean, ci90, ci95 = data["right"]
        right.scatter([jitter.uniform(-0.15, 0.15) for _ in deltas], deltas, s=12, color="k", alpha=0.6)
        right.errorbar(0, mean, yerr=[[mean - ci95[0]], [ci95[1] - mean]], fmt="none", color="tab:orange",
                       capsize=8, label="95 %")
        right.errorbar(0, mean, yerr=[[mean - ci90[0]], [ci90[1] - mean]], fmt="o", color="tab:red", lw=3,
                       label="90 %")
    right.axhspan(-stats.PLACEBO_MARGIN, stats.PLACEBO_MARGIN, color="gray", alpha=0.15,
                  label=f"±m = {stats.PLACEBO_MARGIN}")
    right.axhline(0.0, color="gray", lw=0.8)
    right.set_xticks([0], ["real − placebo"])
    right.set_title(f"H8: {analysis['H8'].reason}", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=110)
    plt.close(fig)
    return out / PLOT


def write_report(out: Path, results: dict, docs: Path | None = None) -> str:
    """results.md, results.json and the figure in `out` (and `docs`), with the per-problem outcomes."""
    outcomes = read_outcomes(out)
    analysis = analyse(results, outcomes) if results.get("mu_target_met") else None
    plots = [] if analysis is None else [plot(out, analysis)]
    text = save_report(out, results, docs, table(results, outcomes, analysis), plots)
    if docs is not None and (out / OUTCOMES).is_file():
        shutil.copy(out / OUTCOMES, docs / OUTCOMES)
    return text


if __name__ == "__main__":
    rerender(write_report, "results/miniature_study3", sys.argv[1:])
