"""The pre-registered study's report, from its results.json: the manipulation check, the paired
comparisons with their sign tests, the H1-H3 decisions by the rules in stats.py, and tables of
every run, the lr selection, the datasets and mu's pretraining (re-runnable on its own:
`python -m nemo_topr.miniature.study_report results/miniature_study [docs/miniature/study]`)."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from nemo_topr.miniature import stats

PLOT = "study.png"


def _study_runs(results: dict, key: str) -> dict[int, dict]:
    """{seed: run} of one study configuration."""
    return {run["seed"]: run for run in results["runs"].values() if run["stage"] == "study" and run["key"] == key}


def _per_seed(results: dict, key: str, split: str = "test", metric: str = "pass@1") -> list[float] | None:
    """One value per study seed in seed order, or None if the key did not run on every seed."""
    runs = _study_runs(results, key)
    seeds = results["design"]["seeds"]
    return [runs[s][split][metric] for s in seeds] if all(s in runs for s in seeds) else None


def _grid(results: dict, split: str) -> dict[float, list[float]]:
    values = {t: _per_seed(results, f"topr_ptilde{t:g}", split) for t in results["design"]["p_tilde"]}
    return {t: v for t, v in values.items() if v is not None}


# (column, value of one run, format): test metrics by name; "telemetry:" the last logged value of a series
SECONDARY = (("grader-invalid", "invalid_rate", ".3f"), ("chars / completion", "mean_chars", ".1f"),
             ("positive NLL / token", "telemetry:positive_nll", ".3f"),
             ("negative NLL / token", "telemetry:negative_nll", ".3f"),
             ("mean negative weight", "telemetry:negative_weight_mean", ".3f"),
             ("effective positive share", "telemetry:effective_positive_share", ".3f"))


def _secondary(runs: list[dict], field: str, fmt: str) -> str:
    if field.startswith("telemetry:"):
        series = [run.get("telemetry", {}).get(field.removeprefix("telemetry:")) for run in runs]
        values = [s[-1] for s in series if s]
    else:
        values = [run["test"][field] for run in runs if field in run["test"]]
    return format(statistics.fmean(values), fmt) if values else "–"


def _sd(values) -> str:
    return f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""


def analyse(results: dict) -> dict:
    """The pre-registered decisions: {"check", "comparisons", "H1", "H2", "H3"}."""
    mu = results["mu"]["test"]["pass@1"]
    sft, topr, reinforce = (_per_seed(results, k) for k in ("sft_positive", "topr", "reinforce"))
    analysis: dict = {"comparisons": []}

    def pair(a_name: str, a: list[float], b_name: str, b: list[float]) -> stats.Paired:
        paired = stats.compare(a, b)
        analysis["comparisons"].append((a_name, b_name, paired))
        return paired

    if sft is None:
        analysis["check"] = None
        for h in ("H1", "H2", "H3"):
            analysis[h] = stats.Decision(stats.INCONCLUSIVE, "sft_positive did not run on every seed")
        return analysis
    check = analysis["check"] = stats.manipulation_check(sft, mu)
    for key in results["design"]["variants"]:
        values = _per_seed(results, key)
        if key != "sft_positive" and values is not None:
            pair(key, values, "sft_positive", sft)
    if topr is not None and reinforce is not None:
        malformed = {k: _per_seed(results, k, metric="malformed_rate") for k in ("topr", "reinforce")}
        degenerate = {k: [stats.degenerated(p, m, mu) for p, m in zip(v, malformed[k])]
                      for k, v in (("topr", topr), ("reinforce", reinforce))}
        analysis["degenerated"] = degenerate
        analysis["H1"] = stats.decide_h1(degenerate["reinforce"], degenerate["topr"],
                                         pair("topr", topr, "reinforce", reinforce))
    else:
        analysis["H1"] = stats.Decision(stats.INCONCLUSIVE, "topr or reinforce did not run on every seed")
    analysis["H2"] = (stats.decide_h2(check, topr, sft) if topr is not None else
                      stats.Decision(stats.INCONCLUSIVE, "topr did not run on every seed"))
    test, validation = _grid(results, "test"), _grid(results, "validation")
    if len(test) == len(results["design"]["p_tilde"]) >= 3:
        analysis["H3"], star = stats.decide_h3(check, validation, test)
        analysis["I*"] = star
        low, high = min(test), max(test)
        for t in sorted(test):
            if t not in (low, high):
                for end in (low, high):
                    pair(f"p~={t:g}", test[t], f"p~={end:g}", test[end])
    else:
        analysis["H3"] = stats.Decision(stats.INCONCLUSIVE, "the p~ grid (>= 3 points) did not run on every seed")
    return analysis


def table(results: dict) -> str:
    design, analysis = results["design"], analyse(results)
    seeds, n = design["seeds"], design["eval_samples"]
    mu = results["mu"]["test"]
    lines = []
    if results.get("deviations"):
        lines += [f"**Not the pre-registered design**: differs in {', '.join(results['deviations'])} "
                  "(values in results.json). The decisions below apply the pre-registered rules to it.", ""]
    if not results.get("mu_target_met", True):
        lines += [f"**Deviation**: no pretraining checkpoint reached train pass@1 {design['mu_target']}; "
                  "mu is the last one.", ""]
    lines += ["| hypothesis | status | why |", "|---|---|---|"]
    for h in ("H1", "H2", "H3"):
        lines.append(f"| {h} | **{analysis[h].status}** | {analysis[h].reason} |")

    check = analysis["check"]
    if check is not None:
        sft = _per_seed(results, "sft_positive")
        lines += ["", check_text(check, mu["pass@1"], sft)]

    lines += ["", f"Final test pass@1 per seed ({design['test_prompts']} problems x {n} samples), mean ± sd over seeds:",
              ""]
    keys = list(dict.fromkeys(run["key"] for run in results["runs"].values() if run["stage"] == "study"))
    groups = {key if key in design["variants"] else key.replace("topr_ptilde", "topr p~="): _study_runs(results, key)
              for key in keys}
    lines += pass_table(groups, seeds, n, results["mu"])
    lines += ["", "Secondary metrics (pre-registered, never decisive), mean over seeds: the test split's grader-invalid "
              "rate and characters per completion, and the last logged training batch's telemetry:", ""]
    lines += secondary_rows(groups)

    lines += ["", f"Paired comparisons (A − B per seed on test pass@1; exact two-sided sign test, ties dropped; "
              f"A > B needs p <= {stats.ALPHA} and mean >= {stats.MIN_EFFECT}):", "",
              "| A | B | A − B per seed | mean ± sd | + / − / tie | sign-test p | outcome |", "|---|---|---|---|---|---|---|"]
    for a, b, paired in analysis["comparisons"]:
        lines.append(f"| {a} | {b} | {', '.join(f'{d:+.3f}' for d in paired.deltas)} | {paired.mean:+.3f}"
                     f"{f' ± {paired.sd:.3f}' if paired.sd is not None else ''} | {paired.positive} / {paired.negative} / "
                     f"{paired.tied} | {paired.p:.4g} | {paired.outcome} |")
    if "degenerated" in analysis:
        lines += ["", "Degenerated (final malformed rate >= 0.5 or pass@1 < half of mu's): " + "; ".join(
            f"{k} {sum(v)}/{len(v)} seeds" for k, v in analysis["degenerated"].items()) + "."]

    tuning = [run for run in results["runs"].values() if run["stage"] == "tuning"]
    selected = results.get("selected", {})
    lines += ["", "lr / warm-up selection (sft_positive, final validation pass@1 per tuning seed):", "",
              "| lr | warm-up | validation pass@1 | mean | selected |", "|---|---|---|---|---|"]
    configs = list(dict.fromkeys((run["lr"], run["warmup"]) for run in tuning))
    for lr, warmup in configs:
        values = [run["validation"]["pass@1"] for run in tuning if (run["lr"], run["warmup"]) == (lr, warmup)]
        chosen = (lr, warmup) == (selected.get("lr"), selected.get("warmup"))
        lines.append(f"| {lr:g} | {warmup} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.fmean(values):.3f} "
                     f"| {'**yes**' if chosen else ''} |")

    lines += ["", "Offline datasets (one per seed, sampled from mu):", "", *dataset_rows(results["datasets"], "seed")]
    lines += ["", f"mu: pretraining checkpoints probed (train pass@1, {design['probe_prompts']} prompts x 8): " + ", ".join(
        f"{p['iteration']}: {p['pass@1']:.3f}" for p in results.get("pretrain", [])) + "."]
    if results.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(results["skipped"]) + "."]
    lines += ["", *footer_lines(results)]
    return "\n".join(lines) + "\n"


def check_text(check: stats.Check, mu: float, positives_only: list[float]) -> str:
    return (f"Manipulation check (pre-registered: mean gain >= {stats.MANIPULATION_MARGIN} and positives-only "
            f"above mu on all seeds but at most one): mu test pass@1 {mu:.3f}; positives-only "
            f"{', '.join(f'{v:.3f}' for v in positives_only)}; mean gain {check.mean:+.3f}, above mu on "
            f"{check.improved}/{check.seeds} seeds: **{'passed' if check.passed else 'failed'}**.")


def pass_table(groups: dict[str, dict[int, dict]], seeds: list[int], n: int, mu: dict) -> list[str]:
    """Final test pass@1 per seed, mean ± sd, maj@n, malformed and validation pass@1 of mu ({"test":
    metrics, "validation": metrics}) and of each configuration ({label: {seed: run}})."""
    test = mu["test"]
    lines = [f"| model | {' | '.join(f'seed {s}' for s in seeds)} | mean ± sd | maj@{n} | malformed | validation pass@1 |",
             "|---|" + "---|" * (len(seeds) + 4),
             f"| mu (start, one model) | {' | '.join('–' for _ in seeds)} | {test['pass@1']:.3f} | "
             f"{test[f'maj@{n}']:.3f} | {test['malformed_rate']:.3f} | {mu['validation']['pass@1']:.3f} |"]
    for label, values in groups.items():
        passes = [r["test"]["pass@1"] for r in values.values()]
        cells = [f"{values[s]['test']['pass@1']:.3f}" if s in values else "–" for s in seeds]
        lines.append(f"| {label} | {' | '.join(cells)} | {statistics.fmean(passes):.3f}{_sd(passes)} | "
                     f"{statistics.fmean(r['test'][f'maj@{n}'] for r in values.values()):.3f} | "
                     f"{statistics.fmean(r['test']['malformed_rate'] for r in values.values()):.3f} | "
                     f"{statistics.fmean(r['validation']['pass@1'] for r in values.values()):.3f} |")
    return lines


def secondary_rows(groups: dict[str, dict[int, dict]]) -> list[str]:
    """The secondary-metrics table ({label: {seed: run}}), header included."""
    lines = [f"| model | {' | '.join(column for column, *_ in SECONDARY)} |", "|---|" + "---|" * len(SECONDARY)]
    for label, values in groups.items():
        runs = list(values.values())
        lines.append(f"| {label} | {' | '.join(_secondary(runs, field, fmt) for _, field, fmt in SECONDARY)} |")
    return lines


def dataset_rows(datasets: dict[str, dict], key_name: str) -> list[str]:
    """The offline datasets' table, header included; `key_name` names what identifies a dataset."""
    lines = [f"| {key_name} | records | positive share p | correct | wrong | invalid | prompts with both |",
             "|---|---|---|---|---|---|---|"]
    for key, d in datasets.items():
        lines.append(f"| {key} | {d['records']} | {d['positive_share']:.3f} | {d['correct']} | {d['wrong']} | "
                     f"{d['invalid']} | {d['prompts_with_both']} |")
    return lines


def footer_lines(results: dict) -> list[str]:
    """Measured wall time per stage against the pre-registered estimate, the commit, any resumption."""
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in results.get("stage_seconds", {}).items())
    lines = [f"Wall time: {results.get('wall_time_s', 0):.0f} s ({stages}); pre-registered estimate "
             f"{sum(results.get('estimate_s', {}).values()):.0f} s. Commit: {results.get('commit')}."]
    for resumed in results.get("resumed", []):
        lines.append(f"Resumed (`--resume`) after {resumed['after_s']:.0f} s of measured time with "
                     f"{resumed['runs_kept']} runs kept; commit {resumed['commit']}.")
    return lines


def plot(out: Path, results: dict) -> Path:
    """Final test pass@1 per configuration (bars: mean, points: seeds) and the p~ grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mu = results["mu"]["test"]["pass@1"]
    groups: dict[str, list[float]] = {}
    for run in results["runs"].values():
        if run["stage"] == "study":
            groups.setdefault(run["key"], []).append(run["test"]["pass@1"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
    for x, values in enumerate(groups.values()):
        left.bar(x, statistics.fmean(values), color="tab:blue", alpha=0.6)
        left.scatter([x] * len(values), values, color="k", s=10, zorder=3)
    left.axhline(mu, color="gray", ls=":", label="mu")
    left.set_xticks(range(len(groups)), [k.replace("topr_ptilde", "p~=") for k in groups], rotation=60, ha="right",
                    fontsize=7)
    left.set_title("final test pass@1 (bars: mean; points: seeds)")
    left.legend(fontsize=7)
    test = _grid(results, "test")
    if test:
        xs = sorted(test)
        right.plot(xs, [statistics.fmean(test[x]) for x in xs], "o-", label="TOPR p~ grid (mean)")
        right.scatter([x for x in xs for _ in test[x]], [v for x in xs for v in test[x]], s=8, color="k")
        right.set_xscale("log")
        right.minorticks_off()
        right.set_xticks(xs, [f"{x:g}" for x in xs])
    right.axhline(mu, color="gray", ls=":", label="mu")
    if "sft_positive" in groups:
        right.axhline(statistics.fmean(groups["sft_positive"]), color="gray", ls="--", label="sft_positive")
    right.set_xlabel("effective positive share p~")
    right.set_title("TOPR p~ grid, final test pass@1")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=110)
    plt.close(fig)
    return out / PLOT


def save_report(out: Path, results: dict, docs: Path | None, text: str, plots: list[Path]) -> str:
    """results.md (`text`), results.json (the report's data goes with it) and the plots in `out`,
    copied to `docs` unless None; returns the text."""
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        for path in [out / "results.md", *plots, out / "results.json"]:
            shutil.copy(path, docs / path.name)
    return text


def write_report(out: Path, results: dict, docs: Path | None = None) -> str:
    return save_report(out, results, docs, table(results), [plot(out, results)])


def rerender(write_report, default_directory: str, argv: list[str]) -> None:
    """`python -m <report module> [RESULTS_DIR [DOCS_DIR]]`: the report again from a results.json."""
    directory = Path(argv[0] if argv else default_directory)
    docs = Path(argv[1]) if len(argv) > 1 else None
    print(write_report(directory, json.loads((directory / "results.json").read_text()), docs))


if __name__ == "__main__":
    rerender(write_report, "results/miniature_study", sys.argv[1:])
