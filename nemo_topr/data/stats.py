"""Dataset statistics: composition (p, p~), per-prompt positives, lengths, rewards; JSON and PNG.

The summary is plain JSON; the plot is drawn from the summary alone, so the two never disagree.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nemo_topr.data.packing import TokenizedSequence
from nemo_topr.data.records import Record, is_positive
from nemo_topr.objective import ObjectiveConfig, dataset_positive_share
from nemo_topr.utils.outputs import write_whole

HISTOGRAM_BINS = 20
RECORD_BASELINES = "the records' own baseline field"  # composition's "baseline" where the data has one
MAX_DISTINCT_REWARDS = 20  # up to this many distinct rewards are counted value by value


def composition(records: Sequence[Record], baseline: float = 0.0) -> dict[str, Any]:
    """Counts, p (share of positives, R >= 0) and p~, the share of sum |R - c| on positives as
    TOPR's loss weighs them (`nemo_topr.objective.dataset_positive_share`; for +-1 rewards the
    closed form p(1 - c) / (1 + c(1 - 2p))). c is the records' own baseline field where they have
    one, as training takes it in place of objective.baseline, else `baseline`. p~ is None where
    every R - c is 0."""
    positives = sum(is_positive(r.reward) for r in records)
    own_baselines = bool(records) and records[0].baseline is not None  # all or none: part of the schema
    p_tilde = None
    if records:
        rewards = torch.tensor([r.reward for r in records], dtype=torch.float64)
        per_record = torch.tensor([r.baseline for r in records], dtype=torch.float64) if own_baselines else None
        objective = ObjectiveConfig() if own_baselines else ObjectiveConfig(baseline=baseline)
        p_tilde = dataset_positive_share(rewards, objective, per_record)
    return {
        "records": len(records),
        "prompts": len({r.prompt_key for r in records}),
        "positives": positives,
        "negatives": len(records) - positives,
        "p": positives / len(records) if records else None,
        "p_tilde": p_tilde,
        "baseline": RECORD_BASELINES if own_baselines else baseline,
    }


def distribution(values: Sequence[float], bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Summary statistics and a histogram {edges, counts} of `values`."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"count": 0}
    counts, edges = np.histogram(array, bins=bins)
    return {
        "count": int(array.size),
        "min": float(array.min()),
        "max": float(array.max()),
        "mean": float(array.mean()),
        "median": float(np.median(array)),
        "p95": float(np.percentile(array, 95)),
        "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
    }


def _reward_distribution(rewards: Sequence[float]) -> dict[str, Any]:
    values = Counter(rewards)
    if len(values) > MAX_DISTINCT_REWARDS:
        return distribution(rewards)
    return {"count": len(rewards), "values": {repr(v): n for v, n in sorted(values.items())}}


def _prompt_chars(record: Record) -> int:
    if isinstance(record.prompt, str):
        return len(record.prompt)
    return sum(len(message["content"]) for message in record.prompt)


def _per_prompt_histogram(counts_by_prompt: dict[str, int]) -> dict[int, int]:
    """k -> number of prompts with k (positives, or samples)."""
    return dict(sorted(Counter(counts_by_prompt.values()).items()))


def sequence_token_lengths(sequences: Sequence[TokenizedSequence]) -> tuple[list[int], list[int]]:
    """(prompt, completion) token counts of each sequence; the completion's count includes EOS."""
    completion = [sum(seq.loss_mask) for seq in sequences]
    return [len(seq.input_ids) - n for seq, n in zip(sequences, completion)], completion


def summarize(
    records: Sequence[Record], *, baseline: float = 0.0,
    token_lengths: tuple[Sequence[int], Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The statistics of a dataset; token lengths only when its sequences' (prompt, completion)
    `token_lengths` are given (`sequence_token_lengths`, or a prepared set's)."""
    positives_by_prompt: Counter[str] = Counter()
    samples_by_prompt: Counter[str] = Counter()
    for record in records:
        samples_by_prompt[record.prompt_key] += 1
        positives_by_prompt[record.prompt_key] += is_positive(record.reward)
    summary: dict[str, Any] = {
        "composition": composition(records, baseline),
        "positives_per_prompt": _per_prompt_histogram({k: positives_by_prompt[k] for k in samples_by_prompt}),
        "samples_per_prompt": _per_prompt_histogram(samples_by_prompt),
        "reward": _reward_distribution([r.reward for r in records]),
        "chars": {
            "prompt": distribution([_prompt_chars(r) for r in records]),
            "completion": distribution([len(r.completion) for r in records]),
        },
    }
    logprobs = [r.behavior_logprob for r in records if r.behavior_logprob is not None]
    if logprobs:
        summary["behavior_logprob"] = distribution(logprobs)
    if token_lengths is not None:
        prompt, completion = (np.asarray(lengths, np.int64) for lengths in token_lengths)
        summary["tokens"] = {"prompt": distribution(prompt), "completion": distribution(completion),
                             "total": distribution(prompt + completion)}
    return summary


def _bar_histogram(axis, histogram: dict[str, list], title: str) -> None:
    edges = histogram["edges"]
    widths = [b - a for a, b in zip(edges, edges[1:])]
    axis.bar(edges[:-1], histogram["counts"], width=widths, align="edge")
    axis.set_title(title)


def plot_summary(summary: dict[str, Any], path: str | Path) -> None:
    """Four panels: positives per prompt, rewards, completion and prompt lengths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(10, 7))
    comp = summary["composition"]
    p_tilde = "n/a" if comp["p_tilde"] is None else f"{comp['p_tilde']:.3f}"
    figure.suptitle(f"{comp['records']} records, {comp['prompts']} prompts, p = {comp['p']:.3f}, "
                    f"p~ = {p_tilde} at c = {comp['baseline']}")

    positives = summary["positives_per_prompt"]
    axes[0, 0].bar([int(k) for k in positives], list(positives.values()))  # int: keys are str in JSON
    axes[0, 0].set_title("prompts by number of positives")

    reward = summary["reward"]
    if "values" in reward:
        axes[0, 1].bar(list(reward["values"]), list(reward["values"].values()))
        axes[0, 1].set_title("rewards")
    else:
        _bar_histogram(axes[0, 1], reward["histogram"], "rewards")

    unit = "tokens" if "tokens" in summary else "chars"
    for axis, part in ((axes[1, 0], "completion"), (axes[1, 1], "prompt")):
        _bar_histogram(axis, summary[unit][part]["histogram"], f"{part} length ({unit})")

    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_summary(summary: dict[str, Any], path: str | Path) -> None:
    write_whole(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")

