"""Study 3's placebo dataset (docs/miniature/study3_preregistration.md, "Design", item 3): the
negatives of a scored offline dataset, each attached to a different prompt of the same dataset by
a seeded rotation, repaired so that none states its new prompt's answer, and re-scored for log mu;
the positives, the record count and order, every completion, reward and per-prompt count stay.
Also the registered real-against-placebo checks of the datasets (integrity, log mu percentiles)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from nemo_topr.errors import UserError

PLACEBO_SEED_BASE = 960_000  # the shuffle of seed s is random.Random(960000 + s)
PERCENTILES = (5, 25, 50, 75, 95)


class PlaceboError(UserError, ValueError):
    """The registered construction is impossible for this dataset: the study stops, naming the seed
    and, where one is at fault, the record (its index in the file)."""

    def __init__(self, seed: int, record: int | None, problem: str, *, key: str, where: str):
        self.seed, self.record = seed, record
        super().__init__(f"placebo dataset of {where}: {problem}", key=key, where=where)


def _train_index(prompt_id: str) -> int:
    """The train-split index of a prompt id "train-<index>"."""
    return int(prompt_id.rsplit("-", 1)[1])


def placebo_rows(rows: list[dict], seed: int, k: int) -> tuple[list[dict], dict]:
    """The placebo of a scored dataset's records (JSON rows in file order) for study seed `seed`;
    `k` samples per prompt were drawn, so sample ids from k on are free. Returns (rows without
    behavior_logprob, to be re-scored; counts: records, negatives, prompts with negatives, G, the
    repair's swaps, negatives that kept their own prompt)."""
    from nemo_topr.grading import graded_answer

    answers = {row["prompt_id"]: row["meta"]["reference_answer"] for row in rows}
    prompts = {row["prompt_id"]: row["prompt"] for row in rows}
    negatives_of: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        if row["reward"] < 0:
            negatives_of.setdefault(row["prompt_id"], []).append(index)
    order = sorted(negatives_of, key=_train_index)
    random.Random(PLACEBO_SEED_BASE + seed).shuffle(order)
    sequence = [index for prompt_id in order for index in negatives_of[prompt_id]]  # n_0 ... n_{K-1}
    size, widest = len(sequence), max((len(v) for v in negatives_of.values()), default=0)
    if size < 2 * widest or size == 0:
        raise PlaceboError(seed, None, f"K = {size} negatives, G = {widest} on one prompt: the rotation needs K >= 2G > 0",
                           key="placebo.negatives.too_few_for_rotation", where=f"seed {seed}")
    source = [rows[index]["prompt_id"] for index in sequence]
    assigned = [source[(position + widest) % size] for position in range(size)]

    def grade(position: int, prompt_id: str) -> str:
        row = rows[sequence[position]]
        return graded_answer(row["meta"]["task"], row["completion"], answers[prompt_id]).grade

    def valid(position: int, prompt_id: str) -> bool:
        return prompt_id != source[position] and grade(position, prompt_id) != "correct"

    swaps = 0
    for position in range(size):
        if grade(position, assigned[position]) != "correct":
            continue
        partners = ((position + step) % size for step in range(1, size))  # j = k+1, k+2, ... cyclically
        partner = next((j for j in partners if valid(position, assigned[j]) and valid(j, assigned[position])), None)
        if partner is None:
            raise PlaceboError(seed, sequence[position], "no negative to swap prompts with: every swap would leave "
                               "one of the two with its own prompt or stating its new prompt's answer",
                               key="placebo.negative.no_swap_partner",
                               where=f"seed {seed}, record {sequence[position]}")
        assigned[position], assigned[partner] = assigned[partner], assigned[position]
        swaps += 1

    placebo = [{key: value for key, value in row.items() if key != "behavior_logprob"} for row in rows]
    new_prompt = dict(zip(sequence, assigned))
    position_of = {index: position for position, index in enumerate(sequence)}
    taken: dict[str, int] = {}
    for index in sorted(new_prompt):  # file order
        row, prompt_id = rows[index], new_prompt[index]
        taken[prompt_id] = taken.get(prompt_id, 0) + 1
        placebo[index] = {**placebo[index], "prompt": prompts[prompt_id], "prompt_id": prompt_id,
                          "sample_id": k + taken[prompt_id] - 1,
                          "meta": {"task": row["meta"]["task"], "reference_answer": answers[prompt_id],
                                   "answer": row["meta"]["answer"], "grade": row["meta"]["grade"],
                                   "source_prompt_id": row["prompt_id"],
                                   "placebo_grade": grade(position_of[index], prompt_id)}}
    counts = {"records": len(rows), "negatives": size, "prompts_with_negatives": len(negatives_of), "G": widest,
              "swaps": swaps, "own_prompt": sum(p["prompt_id"] == r["prompt_id"]
                                                for p, r in zip(placebo, rows) if r["reward"] < 0)}
    return placebo, counts


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def placebo_dataset(real: Path, mu: Path, seed: int, k: int, directory: Path) -> tuple[Path, dict]:
    """The placebo of the scored dataset `real`, written to directory/graded.jsonl and scored by
    `nemo-topr score-logprobs` with mu into directory/scored.jsonl. Returns (scored, its integrity
    checks: the counts of `placebo_rows`, completions unchanged, and the largest change of a
    positive's log mu between the real and the placebo scoring)."""
    from nemo_topr.miniature import pipeline

    rows = _read(real)
    placebo, counts = placebo_rows(rows, seed, k)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graded.jsonl").write_text("".join(json.dumps(row) + "\n" for row in placebo))
    scored = pipeline.score_logprobs(mu, directory)
    rescored = _read(scored)
    counts["completions_unchanged"] = (len(rescored) == len(rows)
                                       and all(a["completion"] == b["completion"] for a, b in zip(rescored, rows)))
    counts["positive_log_mu_max_change"] = max(
        (abs(a["behavior_logprob"] - b["behavior_logprob"]) for a, b in zip(rescored, rows) if b["reward"] > 0),
        default=0.0)
    pipeline.log(f"placebo dataset (seed {seed}): {counts}")
    return scored, counts


def token_counts(scored: Path, tokenizer_dir: Path) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens incl. EOS) of each record, as training tokenizes them."""
    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import load_tokenizer, tokenize_records

    sequences = tokenize_records(load_records(scored), load_tokenizer(tokenizer_dir)).sequences
    return [(len(s.input_ids) - sum(s.loss_mask), sum(s.loss_mask)) for s in sequences]


def negatives_log_mu(scored: Path, tokenizer_dir: Path) -> tuple[list[float], list[float], int, int]:
    """The negatives' log mu per sequence and per completion token (incl. EOS, as scored), and the
    dataset's prompt and completion tokens in all."""
    rows, tokens = _read(scored), token_counts(scored, tokenizer_dir)
    negatives = [(row["behavior_logprob"], completion) for row, (_, completion) in zip(rows, tokens) if row["reward"] < 0]
    return ([value for value, _ in negatives], [value / count for value, count in negatives],
            sum(p for p, _ in tokens), sum(c for _, c in tokens))


def percentiles(values: list[float]) -> dict[str, float]:
    """The registered percentiles (linear interpolation between order statistics)."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {f"p{p}": cuts[p - 1] for p in PERCENTILES}


def dataset_checks(pairs: dict[int, tuple[Path, Path]], tokenizer_dir: Path) -> dict:
    """Real against placebo for {seed: (real scored, placebo scored)}: prompt and completion tokens
    in all per seed, and the negatives' log mu per sequence and per token pooled over seeds."""
    pooled: dict[str, list[float]] = {"real per sequence": [], "placebo per sequence": [],
                                      "real per token": [], "placebo per token": []}
    tokens = {}
    for seed, (real, placebo) in pairs.items():
        tokens[str(seed)] = {}
        for name, path in (("real", real), ("placebo", placebo)):
            per_sequence, per_token, prompt_tokens, completion_tokens = negatives_log_mu(path, tokenizer_dir)
            pooled[f"{name} per sequence"] += per_sequence
            pooled[f"{name} per token"] += per_token
            tokens[str(seed)][name] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return {"tokens": tokens, "negative_log_mu": {name: percentiles(values) for name, values in pooled.items()
                                                  if len(values) >= 2}}  # none without a placebo
