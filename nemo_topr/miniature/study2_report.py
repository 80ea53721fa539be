"""Study 2's report (docs/miniature/study2_preregistration.md), from its results.json: the
manipulation check per strength, every registered comparison (sign test, δ, TOST, outcome), H4-H7
by the rules in stats.py, tables of every run, mu and dataset, and the registered figure
(re-runnable on its own:
`python -m nemo_topr.miniature.study2_report results/miniature_study2 [docs/miniature/study2]`)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from nemo_topr.miniature import stats
from nemo_topr.miniature.study_report import (check_text, dataset_rows, footer_lines, pass_table, rerender, save_report,
                                              secondary_rows)

PLOT = "study2.png"
POSITIVES, TOPR = "sft_positive", "topr"
POSITIVES_TS, TOPR_TS = "sft_positive_token_sum", "topr_token_sum"


def _runs(results: dict, strength: str, key: str) -> dict[int, dict]:
    """{seed: run} of one configuration at one strength."""
    return {run["seed"]: run for run in results["runs"].values()
            if run["stage"] == "study" and run["strength"] == strength and run["key"] == key}


def _per_seed(results: dict, strength: str, key: str, split: str = "test") -> list[float] | None:
    """Final pass@1 per study seed in seed order, or None if the configuration did not run on every seed."""
    runs = _runs(results, strength, key)
    seeds = results["design"]["seeds"]
    return [runs[s][split]["pass@1"] for s in seeds] if all(s in runs for s in seeds) else None


def _gap(results: dict, strength: str, a: str, b: str) -> list[float] | None:
    """Per-seed A - B at one strength (None unless both ran on every seed)."""
    x, y = _per_seed(results, strength, a), _per_seed(results, strength, b)
    return None if x is None or y is None else [u - v for u, v in zip(x, y)]


def curated_share(results: dict, strength: str) -> float | None:
    """p~*: the curated share with the higher mean validation pass@1 at this strength (ties: the smaller)."""
    means = {t: statistics.fmean(v) for t in results["design"]["p_tilde"]
             if (v := _per_seed(results, strength, f"topr_ptilde{t:g}", "validation")) is not None}
    return max(means, key=lambda t: (means[t], -t)) if means else None


def _missing(what: str) -> stats.Decision:
    return stats.Decision(stats.INCONCLUSIVE, f"{what} did not run on every seed")


def analyse(results: dict) -> dict:
    """{"checks": {strength: Check}, "p*": {strength: p~*}, "comparisons": [(strength, A, B, Outcome)],
    "H4": Decision, "H5"/"H6"/"H7": {strength: Decision}}."""
    analysis: dict = {"checks": {}, "p*": {}, "comparisons": [], "H5": {}, "H6": {}, "H7": {}}

    def compare(strength: str, a_name: str, a: list[float], b_name: str, b: list[float]) -> stats.Outcome:
        outcome = stats.classify(a, b)
        analysis["comparisons"].append((strength, a_name, b_name, outcome))
        return outcome

    for strength, mu in results["mus"].items():
        sft = _per_seed(results, strength, POSITIVES)
        if sft is None:
            analysis["checks"][strength] = None
            for h in ("H5", "H6", "H7"):
                analysis[h][strength] = _missing(POSITIVES)
            continue
        check = analysis["checks"][strength] = stats.manipulation_check(sft, mu["test"]["pass@1"])
        topr = _per_seed(results, strength, TOPR)
        analysis["H5"][strength] = (stats.decide_at_least_as_good(check, compare(strength, TOPR, topr, POSITIVES, sft))
                                    if topr is not None else _missing(TOPR))
        star = analysis["p*"][strength] = curated_share(results, strength)
        for t in results["design"]["p_tilde"]:
            values = _per_seed(results, strength, f"topr_ptilde{t:g}")
            if values is None:
                continue
            name = f"topr p~={t:g}" + (" (p~*)" if t == star else "")
            outcome = compare(strength, name, values, POSITIVES, sft)
            if t == star:
                analysis["H6"][strength] = stats.decide_at_least_as_good(check, outcome)
            if topr is not None:
                compare(strength, name, values, TOPR, topr)
        if strength not in analysis["H6"]:
            analysis["H6"][strength] = _missing("the curated p~ grid")
        token_sum, sequence_mean = _gap(results, strength, TOPR_TS, POSITIVES_TS), _gap(results, strength, TOPR, POSITIVES)
        if token_sum is not None and sequence_mean is not None:
            compare(strength, TOPR_TS, _per_seed(results, strength, TOPR_TS), POSITIVES_TS,
                    _per_seed(results, strength, POSITIVES_TS))
            analysis["H7"][strength] = stats.decide_normalisation(
                check, compare(strength, "gap under token_sum", token_sum, "gap under sequence_mean", sequence_mean))
        else:
            analysis["H7"][strength] = _missing("the token_sum or sequence_mean pair")

    # H4: the weakest and the strongest strength whose check passed
    passing = sorted((s for s, check in analysis["checks"].items() if check is not None and check.passed
                      and _gap(results, s, TOPR, POSITIVES) is not None), key=float)
    trend = None
    if len(passing) >= 2:
        weak, strong = passing[0], passing[-1]

        def star(strength: str) -> str | None:
            return None if analysis["p*"].get(strength) is None else f"topr_ptilde{analysis['p*'][strength]:g}"

        def trend_of(label: str, x: str, y: str, a_of, b: str) -> stats.Outcome | None:
            """The gap A - B at strength x against the gap at y; A = a_of(strength)."""
            gaps = [None if a_of(s) is None else _gap(results, s, a_of(s), b) for s in (x, y)]
            return None if None in gaps else compare(f"{x} vs {y}", f"{label} gap at {x}", gaps[0], f"at {y}", gaps[1])

        trend = trend_of("topr", weak, strong, lambda s: TOPR, POSITIVES)
        # reported, never decisive: the middle strength against each end; p~* and token_sum in place of topr
        for middle in passing[1:-1]:
            trend_of("topr", weak, middle, lambda s: TOPR, POSITIVES)
            trend_of("topr", middle, strong, lambda s: TOPR, POSITIVES)
        trend_of("topr p~*", weak, strong, star, POSITIVES)
        trend_of("token_sum topr", weak, strong, lambda s: TOPR_TS, POSITIVES_TS)
    analysis["H4"] = stats.decide_strength_trend(trend)
    return analysis


def degenerated(results: dict, strength: str, key: str) -> tuple[int, int]:
    """(runs degenerated, runs) of one configuration at one strength (study 1's criterion)."""
    mu = results["mus"][strength]["test"]["pass@1"]
    runs = _runs(results, strength, key).values()
    return sum(stats.degenerated(r["test"]["pass@1"], r["test"]["malformed_rate"], mu) for r in runs), len(runs)


def _p(value: float) -> str:
    return f"{value:.4g}"


def table(results: dict) -> str:
    design, analysis = results["design"], analyse(results)
    seeds, n = design["seeds"], design["eval_samples"]
    lines = []
    if results.get("deviations"):
        lines += [f"**Not the pre-registered design**: differs in {', '.join(results['deviations'])} "
                  "(values in results.json). The decisions below apply the pre-registered rules to it.", ""]
    for strength, reason in results.get("dropped", {}).items():
        lines += [f"**Deviation**: strength {strength} dropped: {reason}.", ""]
    lines += ["| hypothesis | strength | status | outcome |", "|---|---|---|---|",
              f"| H4 (gap grows as mu weakens) | all | **{analysis['H4'].status}** | {analysis['H4'].reason} |"]
    for h, what in (("H5", "TOPR >= positives-only"), ("H6", "TOPR p~* >= positives-only"),
                    ("H7", "token_sum keeps the comparison")):
        for strength, decision in analysis[h].items():
            star = f" (p~* = {analysis['p*'][strength]:g})" if h == "H6" and analysis["p*"].get(strength) else ""
            lines.append(f"| {h} ({what}) | {strength}{star} | **{decision.status}** | {decision.reason} |")

    lines += ["", "mu at each strength (the first pretraining checkpoint with train pass@1 >= the target):", "",
              "| strength | iteration | probe train pass@1 | test pass@1 | validation pass@1 |", "|---|---|---|---|---|"]
    for strength, mu in results["mus"].items():
        lines.append(f"| {strength} | {mu['iteration']} | {mu['probe_pass@1']:.3f} | {mu['test']['pass@1']:.3f} | "
                     f"{mu['validation']['pass@1']:.3f} |")

    labels = {key: label for key, label in _labels(results)}
    for strength, mu in results["mus"].items():
        groups = {labels[key]: runs for key in labels if (runs := _runs(results, strength, key))}
        lines += ["", f"### Strength {strength}", ""]
        if analysis["checks"].get(strength) is not None:
            lines += [check_text(analysis["checks"][strength], mu["test"]["pass@1"],
                                 _per_seed(results, strength, POSITIVES)), ""]
        lines += [f"Final test pass@1 per seed ({design['test_prompts']} problems x {n} samples):", "",
                  *pass_table(groups, seeds, n, mu), "", "Secondary metrics (never decisive), mean over seeds:", "",
                  *secondary_rows(groups), "", "Degenerated (final malformed rate >= 0.5 or pass@1 < half of mu's): "
                  + "; ".join(f"{labels[key]} {'/'.join(map(str, degenerated(results, strength, key)))}"
                              for key in labels if _runs(results, strength, key)) + "."]

    lines += ["", f"Comparisons (A − B per seed on test pass@1; exact two-sided sign test, ties dropped; paired-t TOST "
              f"at ±{stats.MIN_EFFECT}, p_low: H0 mean <= −δ, p_high: H0 mean >= +δ; α = {stats.ALPHA}):", "",
              "| strength | A | B | A − B per seed | mean ± sd | + / − / tie | sign-test p | TOST p_low | TOST p_high "
              "| outcome |", "|---|---|---|---|---|---|---|---|---|---|"]
    for strength, a, b, outcome in analysis["comparisons"]:
        paired = outcome.paired
        lines.append(f"| {strength} | {a} | {b} | {', '.join(f'{d:+.3f}' for d in paired.deltas)} | {paired.mean:+.3f}"
                     f"{f' ± {paired.sd:.3f}' if paired.sd is not None else ''} | {paired.positive} / "
                     f"{paired.negative} / {paired.tied} | {_p(paired.p)} | {_p(outcome.tost.p_low)} | "
                     f"{_p(outcome.tost.p_high)} | {outcome.outcome} |")

    failed = [name for name, run in results["runs"].items() if "failed" in run]
    if failed:
        lines += ["", "Failed twice and scored as degenerated (pass@1 0, malformed 1): " + ", ".join(failed) + "."]
    lines += ["", "Offline datasets (one per strength and seed, sampled from that strength's mu):", "",
              *dataset_rows(results["datasets"], "strength/seed"),
              "", f"Pretraining checkpoints probed (train pass@1, {design['probe_prompts']} prompts x 8): " + ", ".join(
                  f"{p['iteration']}: {p['pass@1']:.3f}" for p in results.get("pretrain", [])) + "."]
    if results.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(results["skipped"]) + "."]
    lines += ["", *footer_lines(results)]
    return "\n".join(lines) + "\n"


def _labels(results: dict) -> list[tuple[str, str]]:
    """(key, label) of every configuration that ran, in the order the runs were made."""
    seen: dict[str, str] = {}
    for run in results["runs"].values():
        if run["stage"] == "study":
            seen.setdefault(run["key"], run["key"].replace("topr_ptilde", "topr p~=").replace("_token_sum", " token_sum"))
    return list(seen.items())


# The figure's series: (label, A, B) with y = A - B per seed
LEFT = [("topr (c = 0) − sft_positive", TOPR, POSITIVES)]


def _right(results: dict) -> list[tuple[str, str, str]]:
    return ([(f"topr p~={t:g} − sft_positive", f"topr_ptilde{t:g}", POSITIVES) for t in results["design"]["p_tilde"]]
            + [("topr − sft_positive, both token_sum", TOPR_TS, POSITIVES_TS)])


def figure_points(results: dict, a: str, b: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The registered figure's data for one series: per-seed points (x = the seed's dataset positive
    share p_s, y = A - B on test pass@1) and per-strength means (x = mean p_s, y = mean A - B)."""
    points, means = [], []
    for strength in results["mus"]:
        runs_a, runs_b = _runs(results, strength, a), _runs(results, strength, b)
        seeds = [s for s in results["design"]["seeds"] if s in runs_a and s in runs_b]
        xy = [(results["datasets"][f"{strength}/{s}"]["positive_share"],
               runs_a[s]["test"]["pass@1"] - runs_b[s]["test"]["pass@1"]) for s in seeds]
        points += xy
        if xy:
            means.append((statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)))
    return points, means


def plot(out: Path, results: dict) -> Path:
    """TOPR − positives-only against mu's strength (the pre-registration's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for axis, series, title in ((axes[0], LEFT, "TOPR (c = 0) vs positives-only"),
                                (axes[1], _right(results), "curated p~ and token_sum")):
        for (label, a, b), color in zip(series, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
            points, means = figure_points(results, a, b)
            if points:
                axis.scatter(*zip(*points), s=12, color=color, alpha=0.6)
                axis.plot(*zip(*means), "o-", color=color, label=label)
        axis.axhspan(-stats.MIN_EFFECT, stats.MIN_EFFECT, color="gray", alpha=0.15, label=f"±δ = {stats.MIN_EFFECT}")
        axis.axhline(0.0, color="gray", lw=0.8)
        axis.set_xlabel("positive share p_s of the seed's dataset (mu's strength)")
        axis.set_title(title)
        axis.legend(fontsize=7)
    axes[0].set_ylabel("final test pass@1, A − B (points: seeds; line: means)")
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=110)
    plt.close(fig)
    return out / PLOT


def write_report(out: Path, results: dict, docs: Path | None = None) -> str:
    return save_report(out, results, docs, table(results), [plot(out, results)])


if __name__ == "__main__":
    rerender(write_report, "results/miniature_study2", sys.argv[1:])
