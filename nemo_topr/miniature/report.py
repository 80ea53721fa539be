"""The miniature's Markdown table and PNG plots, from results.json (re-runnable on its own:
`python -m nemo_topr.miniature.report results/miniature`)."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

PLOTS = ("variants.png", "telemetry.png", "p_tilde.png")


def _grouped(results: dict) -> dict[str, list[dict]]:
    """Runs grouped by configuration (key), seeds together, in plan order."""
    groups: dict[str, list[dict]] = {}
    for name, run in results["runs"].items():
        groups.setdefault(run.get("key", name), []).append(run)
    return groups


def _stat(runs: list[dict], metric: str) -> str:
    values = [run["eval"][metric] for run in runs]
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def _last(runs: list[dict], tag: str) -> str:
    values = [run["telemetry"][tag][-1] for run in runs if run.get("telemetry", {}).get(tag)]
    return f"{statistics.fmean(values):.3f}" if values else "–"


def table(results: dict) -> str:
    args = results["args"]
    n = args["eval_samples"]
    d = results.get("dataset", {})
    lines = [
        f"Test split: {args['test_prompts']} problems x {n} samples (temperature 1). Offline dataset: "
        f"{args['train_prompts']} train prompts x k={args['k']} samples from mu, {d.get('records')} records, "
        f"positive share p = {d.get('positive_share', float('nan')):.3f} ({d.get('correct')} correct, "
        f"{d.get('wrong')} wrong, {d.get('invalid')} invalid). Seeds: {args['seeds']} "
        f"(mean ± sd over seeds when more than one). Evaluated once, at the end of training.",
        "",
        f"| model | pass@1 | maj@{n} | invalid | chars/completion | final pos. NLL | final neg. NLL "
        f"| final neg. weight | eff. pos. share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, runs in _grouped(results).items():
        lines.append(
            f"| {runs[0]['name']} | {_stat(runs, 'pass@1')} | {_stat(runs, f'maj@{n}')} | "
            f"{_stat(runs, 'invalid_rate')} | {statistics.fmean(r['eval']['mean_chars'] for r in runs):.0f} | "
            f"{_last(runs, 'positive_nll')} | {_last(runs, 'negative_nll')} | "
            f"{_last(runs, 'negative_weight_mean')} | {_last(runs, 'effective_positive_share')} |")
    pre = results.get("pretrain", [])
    if pre:
        lines += ["", "Pretraining rounds (SFT on gold solutions, probe: "
                  f"{args['probe_prompts']} train prompts x 8 samples):", "",
                  "| round | iterations | train pass@1 | invalid |", "|---|---|---|---|"]
        lines += [f"| {r['round']} | {r['iterations']} | {r['pass@1']:.3f} | {r['invalid_rate']:.3f} |" for r in pre]
    lines += ["", f"Wall time: {results.get('wall_time_s', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def plots(out: Path, results: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = results["args"]["eval_samples"]
    groups = _grouped(results)
    written = []

    # 1. test metrics per variant (points: seeds)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = [runs[0]["name"] for runs in groups.values()]
    for ax, metric in zip(axes, ("pass@1", f"maj@{n}", "invalid_rate")):
        for x, runs in enumerate(groups.values()):
            values = [r["eval"][metric] for r in runs]
            ax.bar(x, statistics.fmean(values), color="tab:blue", alpha=0.6)
            ax.scatter([x] * len(values), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"test {metric}")
    fig.tight_layout()
    fig.savefig(out / PLOTS[0], dpi=110)
    plt.close(fig)
    written.append(out / PLOTS[0])

    # 2. telemetry per iteration (first seed of each configuration)
    tags = ("topr_loss", "positive_nll", "negative_nll", "negative_weight_mean")
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, tag in zip(axes, tags):
        for runs in groups.values():
            series = runs[0].get("telemetry", {}).get(tag)
            if series:
                ax.plot(series, label=runs[0]["name"], lw=1)
        ax.set_title(tag)
        ax.set_xlabel("iteration")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / PLOTS[1], dpi=110)
    plt.close(fig)
    written.append(out / PLOTS[1])

    # 3. TOPR p~ sweep (p~ = p for plain TOPR, c = 0)
    p = results.get("dataset", {}).get("positive_share")
    points = []
    for key, runs in groups.items():
        if key == "topr" and p is not None:
            points.append((p, runs))
        elif key.startswith("topr_ptilde"):
            points.append((float(key.removeprefix("topr_ptilde")), runs))
    if points:
        points.sort(key=lambda item: item[0])
        fig, ax = plt.subplots(figsize=(5, 3.8))
        for metric in ("pass@1", f"maj@{n}"):
            xs = [x for x, _ in points]
            ax.plot(xs, [statistics.fmean(r["eval"][metric] for r in runs) for _, runs in points], "o-", label=metric)
        ax.set_xlabel("effective positive share p~")
        ax.set_title("TOPR, dataset-composition sweep")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / PLOTS[2], dpi=110)
        plt.close(fig)
        written.append(out / PLOTS[2])
    return written


def write_report(out: Path, results: dict, docs: Path | None = None) -> str:
    text = table(results)
    (out / "results.md").write_text(text)
    written = plots(out, results)
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        for path in [out / "results.md", *written]:
            if path.is_file():
                shutil.copy(path, docs / path.name)
    return text


if __name__ == "__main__":
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "results/miniature")
    docs = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    print(write_report(directory, json.loads((directory / "results.json").read_text()), docs))
