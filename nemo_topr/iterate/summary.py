"""The run's summary: per round, samples by grade, training records, p and p~, pass@1, maj@k (and
the verifier-weighted vote) and the invalid rate, read back from the stages' outputs into
OUT/summary.json and OUT/summary.md."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from nemo_topr.iterate.rounds import RoundFiles, RoundResult, read_graded


def summary_row(result: RoundResult, *, verified: bool = False) -> dict[str, Any]:
    """What one round did and scored, read back from its stages' outputs."""
    row: dict[str, Any] = {"round": result.label, "model": str(result.model), "note": result.note}
    files = RoundFiles(result.directory)
    if files.graded.is_file():
        row["samples"] = sample_counts(files.graded)
    if (files.run_dir / "data_report.json").is_file():
        row.update(training_composition(files.run_dir))
    if files.eval_results.is_file():
        results = json.loads(files.eval_results.read_text(encoding="utf-8"))
        row["eval"] = headline_metrics(results)
        if verified:
            row["eval"]["weighted_maj@k"] = verified_vote(files.verified_results, results)
    return row


def num_problems(results: Path) -> int:
    return json.loads(results.read_text(encoding="utf-8"))["num_problems"]


def verified_vote(verified: Path, results: dict[str, Any]) -> float | None:
    """weighted_maj@k over eval's problems (`results`). `eval --records` of the scored samples
    (`verified`) has no problem whose samples were all empty: such a problem has no record to score
    (or no file, when all were), and its vote, with no answer, is wrong: a 0 in eval's mean.
    None with one sample per problem (no vote)."""
    k = max(results["ks"])
    if k == 1:
        return None
    if not verified.is_file():
        return 0.0
    vote = json.loads(verified.read_text(encoding="utf-8"))
    return vote["metrics"][f"weighted_maj@{k}"] * vote["num_problems"] / results["num_problems"]


def sample_counts(graded: Path) -> dict[str, int | None]:
    """The round's samples by grade, from `generate`'s sample log: every sample drawn, empty
    completions (invalid samples) and grader errors (no verdict) included, which are no records.
    Without the log (deleted by hand) only the records' grades are known: `drawn` and `error` are None."""
    from nemo_topr.evaluation.sample_log import log_path, logged_samples

    records = read_graded(graded)
    if log_path(graded).is_file():
        grades = Counter(sample.grade for samples in logged_samples(log_path(graded)) for sample in samples)
        drawn, errors = sum(grades.values()), grades["error"]
    else:
        grades, drawn, errors = Counter((record.meta or {}).get("grade") for record in records), None, None
    return {"drawn": drawn, "records": len(records), "correct": grades["correct"], "wrong": grades["wrong"],
            "invalid": grades["invalid"], "error": errors}


def training_composition(run_dir: Path) -> dict[str, Any]:
    """Records training used, their share of positives p, and p~ with the c each record got, as the
    run's data report gives them (asymre's c is its group means, not `objective.baseline`). A report
    without p~ or baselines (an earlier version's) gives None, shown as "—"."""
    report = json.loads((run_dir / "data_report.json").read_text(encoding="utf-8"))
    return {"training_records": report["records_used"], "positives": report["positives"],
            "p": report["positives"] / report["sequences"], "baseline": report.get("baselines"),
            "p_tilde": report.get("p_tilde")}


def headline_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """pass@1, maj@k and weighted_maj@k at the largest k (None with one sample per problem, and
    without a verifier) and the invalid rate."""
    metrics, k = results["metrics"], max(results["ks"])
    return {"pass@1": metrics["pass@1"], "maj_k": k, "maj@k": metrics.get(f"maj@{k}"),
            "weighted_maj@k": metrics.get(f"weighted_maj@{k}"), "invalid_rate": metrics["invalid_rate"]}


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    def number(value: float | None, percent: bool = False) -> str:
        if value is None:
            return "—"
        return f"{100 * value:.1f}" if percent else f"{value:.3f}"

    ks = "/".join(map(str, sorted({row["eval"]["maj_k"] for row in rows if "eval" in row})))
    weighted = any(row.get("eval", {}).get("weighted_maj@k") is not None for row in rows)  # a verifier scored them
    lines = ["| round | samples: correct / wrong / invalid / grader error | training records | p | p̃ | pass@1 % | "
             f"maj@{ks} % |{f' weighted maj@{ks} % |' if weighted else ''} invalid % | note |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if weighted else "")]
    for row in rows:
        samples = row.get("samples")
        evaluation = row.get("eval", {})
        lines.append(" | ".join([
            f"| {row['round']}",
            " / ".join(str(samples[grade]) if samples[grade] is not None else "— (no sample log)"
                       for grade in ("correct", "wrong", "invalid", "error")) if samples else "—",
            str(row.get("training_records", "—")),
            number(row.get("p")), number(row.get("p_tilde")),
            number(evaluation.get("pass@1"), True), number(evaluation.get("maj@k"), True),
            *([number(evaluation.get("weighted_maj@k"), True)] if weighted else []),
            number(evaluation.get("invalid_rate"), True), row["note"] or "",
        ]) + " |")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, rows: list[dict[str, Any]]) -> None:
    markdown = summary_markdown(rows)
    (out / "summary.json").write_text(json.dumps({"rounds": rows, "plot": str(out / "rounds.png")}, indent=2) + "\n",
                                      encoding="utf-8")
    (out / "summary.md").write_text(f"{markdown}\n![rounds](rounds.png)\n", encoding="utf-8")
    print(f"\n{markdown}\nwrote {out / 'summary.md'}, {out / 'summary.json'} and {out / 'rounds.png'}", flush=True)
