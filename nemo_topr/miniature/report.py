"""The miniature's Markdown table and PNG plots, from results.json (re-runnable on its own:
`python -m nemo_topr.miniature.report results/miniature [docs/miniature]`)."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

PLOTS = ("variants.png", "curves.png", "telemetry.png", "p_tilde.png")


def _grouped(results: dict) -> dict[str, list[dict]]:
    """Runs grouped by configuration (key), seeds together, in plan order."""
    groups: dict[str, list[dict]] = {}
    for name, run in results["runs"].items():
        groups.setdefault(run.get("key", name), []).append(run)
    return groups


def _stat(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def _last(runs: list[dict], tag: str) -> str:
    values = [run["telemetry"][tag][-1] for run in runs if run.get("telemetry", {}).get(tag)]
    return f"{statistics.fmean(values):.3f}" if values else "–"


def _best(runs: list[dict], metric: str) -> list[float]:
    """Each run's best value of `metric` over its evaluated checkpoints (start excluded)."""
    return [max(point[metric] for point in run["curve"][1:]) for run in runs if len(run.get("curve", [])) > 1]


def table(results: dict) -> str:
    args = results["args"]
    n = args["eval_samples"]
    d = results.get("dataset", {})
    lines = [
        f"Test split: {args['test_prompts']} problems x {n} samples (temperature 1). Offline dataset: "
        f"{args['train_prompts']} train prompts x k={args['k']} samples from mu, {d.get('records')} records, "
        f"positive share p = {d.get('positive_share', float('nan')):.3f} ({d.get('correct')} correct, "
        f"{d.get('wrong')} wrong, {d.get('invalid')} invalid; {d.get('prompts_with_both')} prompts with both). "
        f"Seeds: {args['seeds']} (mean ± sd over seeds when more than one). Final = the last checkpoint; "
        f"best = the best of the evaluated checkpoints (every {args['eval_interval']} iterations and the last).",
        "",
        f"| model | final pass@1 | final maj@{n} | best pass@1 | malformed | chars/completion "
        f"| final pos. NLL | final neg. NLL | final neg. weight | eff. pos. share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for runs in _grouped(results).values():
        best = _best(runs, "pass@1")
        lines.append(
            f"| {runs[0]['name']} | {_stat([r['eval']['pass@1'] for r in runs])} | "
            f"{_stat([r['eval'][f'maj@{n}'] for r in runs])} | {_stat(best) if best else '–'} | "
            f"{_stat([r['eval']['malformed_rate'] for r in runs])} | "
            f"{statistics.fmean(r['eval']['mean_chars'] for r in runs):.0f} | "
            f"{_last(runs, 'positive_nll')} | {_last(runs, 'negative_nll')} | "
            f"{_last(runs, 'negative_weight_mean')} | {_last(runs, 'effective_positive_share')} |")
    pre = results.get("pretrain", [])
    if pre:
        lines += ["", "Pretraining checkpoints (SFT on gold solutions from a random initialisation; probe: "
                  f"{args['probe_prompts']} train prompts x 8 samples; the first with pass@1 >= 0.30 is mu):", "",
                  "| iteration | train pass@1 | maj@8 | malformed |", "|---|---|---|---|"]
        lines += [f"| {r['iteration']} | {r['pass@1']:.3f} | {r['maj@8']:.3f} | {r['malformed_rate']:.3f} |"
                  for r in pre]
        if not results.get("pretrain_target_met", True):
            lines += ["", f"**The pretraining target was not reached**: mu is the last checkpoint "
                      f"(iteration {pre[-1]['iteration']}, train pass@1 {pre[-1]['pass@1']:.3f})."]
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in results.get("stage_seconds", {}).items())
    lines += ["", f"Wall time: {results.get('wall_time_s', 0):.0f} s ({stages})."]
    return "\n".join(lines) + "\n"


def _curve(runs: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """Mean over seeds per evaluated iteration (seeds share the checkpoint schedule)."""
    iterations = [point["iteration"] for point in runs[0]["curve"]]
    return iterations, [statistics.fmean(run["curve"][i][metric] for run in runs) for i in range(len(iterations))]


def plots(out: Path, results: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = results["args"]["eval_samples"]
    groups = _grouped(results)
    metrics = ("pass@1", f"maj@{n}", "malformed_rate")
    variants = {key: runs for key, runs in groups.items() if key != "mu" and not key.startswith("topr_ptilde")}
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    # 1. final test metrics per configuration (bars: mean over seeds, points: seeds)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = [runs[0]["name"] for runs in groups.values()]
    for ax, metric in zip(axes, metrics):
        for x, runs in enumerate(groups.values()):
            values = [r["eval"][metric] for r in runs]
            ax.bar(x, statistics.fmean(values), color="tab:blue", alpha=0.6)
            ax.scatter([x] * len(values), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"test {metric}, end of training")
    save(fig, PLOTS[0])

    # 2. test metrics over training (mean over seeds), the variants
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric in zip(axes, metrics):
        for runs in variants.values():
            if runs[0].get("curve"):
                ax.plot(*_curve(runs, metric), "o-", ms=3, lw=1, label=runs[0]["name"])
        ax.set_title(f"test {metric}")
        ax.set_xlabel("iteration")
    axes[0].legend(fontsize=7)
    save(fig, PLOTS[1])

    # 3. telemetry per iteration (first seed of each variant)
    tags = ("topr_loss", "positive_nll", "negative_nll", "negative_weight_mean")
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, tag in zip(axes, tags):
        for runs in variants.values():
            series = runs[0].get("telemetry", {}).get(tag)
            if series:
                ax.plot(series, label=runs[0]["name"], lw=1)
        ax.set_title(tag)
        ax.set_xlabel("iteration")
        if tag.endswith("_nll"):
            ax.set_yscale("log")
    axes[0].legend(fontsize=6)
    save(fig, PLOTS[2])

    # 4. TOPR p~ sweep (p~ = p for plain TOPR, c = 0): final metrics vs p~, and pass@1 over training
    p = results.get("dataset", {}).get("positive_share")
    points = [(p, runs) for key, runs in groups.items() if key == "topr" and p is not None]
    points += [(float(key.removeprefix("topr_ptilde")), runs) for key, runs in groups.items()
               if key.startswith("topr_ptilde")]
    if points:
        points.sort(key=lambda item: item[0])
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for metric in ("pass@1", f"maj@{n}"):
            xs = [x for x, _ in points]
            left.plot(xs, [statistics.fmean(r["eval"][metric] for r in runs) for _, runs in points], "o-",
                      label=f"{metric} (mean)")
            left.scatter([x for x, runs in points for _ in runs],
                         [r["eval"][metric] for _, runs in points for r in runs], s=8, color="k")
        for key, style in (("mu", ":"), ("sft_positive", "--")):  # references: the start, positives only
            if key in groups:
                left.axhline(statistics.fmean(r["eval"]["pass@1"] for r in groups[key]), color="gray", ls=style,
                             label=f"{groups[key][0]['name']} pass@1")
        if min(x for x, _ in points) > 0:
            left.set_xscale("log")
            left.minorticks_off()
        left.set_xticks([x for x, _ in points], [f"{x:.2g}" for x, _ in points])
        left.set_xlabel("effective positive share p~")
        left.set_title("TOPR, end of training")
        left.legend(fontsize=7)
        for x, runs in points:
            if runs[0].get("curve"):
                right.plot(*_curve(runs, "pass@1"), "o-", ms=3, lw=1, label=f"p~={x:.3g}")
        right.set_xlabel("iteration")
        right.set_title("TOPR test pass@1 over training")
        right.legend(fontsize=7)
        save(fig, PLOTS[3])
    return written


def write_report(out: Path, results: dict, docs: Path | None = None) -> str:
    text = table(results)
    (out / "results.md").write_text(text)
    written = plots(out, results)
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        for path in [out / "results.md", *written]:
            shutil.copy(path, docs / path.name)
    return text


if __name__ == "__main__":
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "results/miniature")
    docs = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    print(write_report(directory, json.loads((directory / "results.json").read_text()), docs))
