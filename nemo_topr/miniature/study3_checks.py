"""Study 3's reported checks, real against placebo (never decisive; docs/miniature/study3_preregistration.md,
"Metrics"): the placebo's integrity per seed, the negatives' log mu percentiles, log rho at step 0
of every p~ run, the truncation over training at each arm's selected lr, and the set-up check
against study 2's committed runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

STUDY2_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "miniature" / "study2" / "results.json"
STUDY2_STRENGTH = "0.2"
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)  # of a run's iterations: first, 25 %, 50 %, 75 %, last
TRAJECTORY = (("truncated share", "negative_truncated_share"), ("mean negative weight", "negative_weight_mean"),
              ("mean abs(log ρ)", "log_ratio_abs_mean"))  # no "|" in a table cell


def _first(run: dict | None, tag: str) -> float | None:
    series = (run or {}).get("telemetry", {}).get(tag) or []
    return series[0] if series else None


def at_fraction(series: list[float], fraction: float) -> float:
    """The value at `fraction` of the run: index round(fraction x (iterations − 1))."""
    return series[round(fraction * (len(series) - 1))]


def integrity_lines(study, results: dict) -> list[str]:
    placebos, tokens = results.get("placebos", {}), results.get("dataset_checks", {}).get("tokens", {})
    lines = ["Placebo integrity per seed (own prompt must be 0, positives' log mu change ≈ 0, completion tokens equal; "
             "iterations of the two p~ arms at each one's selected lr):", "",
             "| seed | records | negatives | G | completions unchanged | kept own prompt | repair swaps | positives' "
             "largest log mu change | completion tokens real / placebo | prompt tokens real / placebo | iterations "
             "real / placebo |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for seed, p in placebos.items():
        t = tokens.get(seed, {})
        runs = [study.run(arm, study.selected.get(arm), int(seed)) for arm in (study.real, study.placebo)]
        iterations = " / ".join(str(r.get("iterations", "–")) if r else "–" for r in runs)
        lines.append(f"| {seed} | {p['records']} | {p['negatives']} | {p['G']} | {p['completions_unchanged']} | "
                     f"{p['own_prompt']} | {p['swaps']} | {p['positive_log_mu_max_change']:.2e} | "
                     f"{t.get('real', {}).get('completion_tokens', '–')} / "
                     f"{t.get('placebo', {}).get('completion_tokens', '–')} | "
                     f"{t.get('real', {}).get('prompt_tokens', '–')} / {t.get('placebo', {}).get('prompt_tokens', '–')} "
                     f"| {iterations} |")
    return lines


def log_mu_lines(results: dict) -> list[str]:
    percentiles = results.get("dataset_checks", {}).get("negative_log_mu", {})
    if not percentiles:
        return []
    names = list(next(iter(percentiles.values())))
    return ["", "The negatives' log mu, pooled over seeds (percentiles):", "",
            f"| | {' | '.join(names)} |", "|---|" + "---|" * len(names),
            *[f"| {what} | {' | '.join(f'{v:.3f}' for v in values.values())} |" for what, values in percentiles.items()]]


def step0_lines(study, results: dict) -> list[str]:
    lines = ["", "log ρ at step 0 (the first iteration's batch; float noise expected for real and placebo alike): "
             "mean |log ρ| / largest |log ρ| per seed:", "",
             f"| arm | lr | {' | '.join(f'seed {s}' for s in study.seeds)} |", "|---|---|" + "---|" * len(study.seeds)]
    for arm in (study.real, study.placebo):
        for lr in results["design"]["lr_grid"]:
            cells = []
            for seed in study.seeds:
                run = study.run(arm, lr, seed)
                mean, largest = _first(run, "log_ratio_abs_mean"), _first(run, "log_ratio_abs_max")
                cells.append("–" if mean is None else f"{mean:.1e} / {'–' if largest is None else f'{largest:.1e}'}")
            lines.append(f"| {study.label(arm)} | {lr:g} | {' | '.join(cells)} |")
    return lines


def trajectory_lines(study) -> list[str]:
    lines = ["", "Over training, real against placebo at each one's selected lr, mean over seeds:", "",
             f"| arm | metric | {' | '.join('first' if f == 0 else 'last' if f == 1 else f'{f:.0%}' for f in FRACTIONS)} |",
             "|---|---|" + "---|" * len(FRACTIONS)]
    for arm in (study.real, study.placebo):
        lr = study.selected.get(arm)
        runs = [r for s in study.seeds if (r := study.run(arm, lr, s)) is not None]
        for name, tag in TRAJECTORY:
            series = [s for r in runs if (s := r.get("telemetry", {}).get(tag))]
            cells = [f"{statistics.fmean(at_fraction(s, f) for s in series):.3f}" if series else "–" for f in FRACTIONS]
            lines.append(f"| {study.label(arm)} | {name} | {' | '.join(cells)} |")
    return lines


def setup_lines(study, results: dict, study2_results: Path = STUDY2_RESULTS) -> list[str]:
    """The set-up check: if mu is study 2's mu 0.2 model (same iteration and test pass@1), the lr 1e-4
    runs of the four arms study 2 had, on the seeds both ran, against study 2's committed values."""
    if not study2_results.is_file():
        return ["", f"Set-up check: {study2_results} is missing."]
    theirs = json.loads(study2_results.read_text())
    mu2, mu = theirs["mus"].get(STUDY2_STRENGTH, {}), results["mu"]
    if (mu2.get("iteration"), mu2.get("test", {}).get("pass@1")) != (mu["iteration"], mu["test"]["pass@1"]):
        return ["", f"Set-up check: mu (iteration {mu['iteration']}, test pass@1 {mu['test']['pass@1']:.3f}) is not "
                f"study 2's mu {STUDY2_STRENGTH} (iteration {mu2.get('iteration')}, test pass@1 "
                f"{mu2.get('test', {}).get('pass@1', float('nan')):.3f}); no run repeats study 2's."]
    lines = ["", f"Set-up check: mu is study 2's mu {STUDY2_STRENGTH}; runs at lr 1e-4 that repeat study 2's, test "
             "pass@1 study 3 / study 2:", ""]
    for arm in (study.arms[0], study.arms[1], study.arms[2], study.real):
        pairs = []
        for seed in study.seeds:
            old, new = theirs["runs"].get(f"{arm}_mu{STUDY2_STRENGTH}_s{seed}"), study.run(arm, 1e-4, seed)
            if old is not None and new is not None:
                pairs.append(f"seed {seed} {new['test']['pass@1']:.4f} / {old['test']['pass@1']:.4f}")
        lines.append(f"- {study.label(arm)}: {'; '.join(pairs) if pairs else 'no run in common'}")
    return lines


def check_lines(study, results: dict) -> list[str]:
    return [*integrity_lines(study, results), *log_mu_lines(results), *step0_lines(study, results),
            *trajectory_lines(study), *setup_lines(study, results)]
