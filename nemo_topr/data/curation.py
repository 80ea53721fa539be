"""Dataset curation by sub-sampling: target p or p~, per-prompt balancing, "Anna Karenina".

The paper finds TOPR works best with an effective share of positives p~ around 10-20 %;
sub-sampling one side of the data moves p (and p~ at a given baseline) there. Every step keeps
the input order of the records it keeps and is deterministic under the seed; every record
removed is counted under its reason, so records_in = records_out + sum(dropped).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_topr.errors import UserError
from nemo_topr.data.records import Record, is_positive
from nemo_topr.data.stats import composition
from nemo_topr.objective import effective_positive_share


class CurationError(UserError, ValueError):
    """A curation the records or settings cannot give (a share of positives with one side missing)."""


@dataclass
class Curation:
    """What to do, in this order: de-duplicate, then at most one of the three sub-samplings."""

    dedup: bool = True
    target_p: float | None = None  # share of positives to reach
    target_p_tilde: float | None = None  # effective share of positives to reach at `baseline`
    baseline: float = 0.0
    anna_karenina: bool = False  # per prompt, the first positive plus all negatives
    per_prompt: bool = False  # spread a sub-sampling evenly over prompts
    seed: int = 0

    def __post_init__(self) -> None:
        modes = [self.target_p is not None, self.target_p_tilde is not None, self.anna_karenina]
        if sum(modes) > 1:
            raise CurationError("choose at most one of target_p, target_p_tilde and anna_karenina",
                                key="curation.mode.several_chosen", where="target_p, target_p_tilde, anna_karenina")
        for name in ("target_p", "target_p_tilde"):
            target = getattr(self, name)
            if target is not None and not 0.0 <= target <= 1.0:
                raise CurationError(f"{name} must be in [0, 1]; got {target}", key=f"curation.{name}.outside_0_1",
                                    where=name)
        if not -1.0 < self.baseline < 1.0:
            raise CurationError(f"baseline must be in (-1, 1); got {self.baseline}",
                                key="curation.baseline.outside_open_minus_1_1", where="baseline")
        if self.per_prompt and self.target_p is None and self.target_p_tilde is None:  # was a silent no-op
            raise CurationError("per_prompt spreads the sub-sampling to target_p or target_p_tilde over the prompts: "
                                "give one of them (anna_karenina is per prompt already)",
                                key="curation.per_prompt.without_target", where="per_prompt")


@dataclass
class CurationResult:
    records: list[Record]
    stats: dict[str, Any]


def deduplicate(records: Sequence[Record]) -> list[Record]:
    """Keep the first record of each exact (prompt, completion) pair."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for record in records:
        key = (record.prompt_key, record.completion)
        if key not in seen:
            seen.add(key)
            kept.append(record)
    return kept


def anna_karenina(records: Sequence[Record]) -> list[Record]:
    """Per prompt, the first positive (in input order) and all negatives."""
    prompts_with_positive: set[str] = set()
    kept = []
    for record in records:
        if not is_positive(record.reward):
            kept.append(record)
        elif record.prompt_key not in prompts_with_positive:
            prompts_with_positive.add(record.prompt_key)
            kept.append(record)
    return kept


def _balanced_choice(groups: Sequence[Sequence[int]], k: int, rng: random.Random) -> set[int]:
    """`k` items drawn as evenly as possible across groups (water-filling), at random within."""
    shuffled = [rng.sample(group, len(group)) for group in groups]
    largest = max(map(len, groups))
    cap = max(c for c in range(largest + 1) if sum(min(len(g), c) for g in groups) <= k)
    chosen = {i for group in shuffled for i in group[:cap]}
    unfilled = [group for group in shuffled if len(group) > cap]
    chosen.update(group[cap] for group in rng.sample(unfilled, k - len(chosen)))
    return chosen


def _closest_count(n_side: int, share_at: Callable[[int], float], target: float) -> int:
    """How many records of one side to keep so that the achieved share is nearest `target`."""
    return min(range(n_side + 1), key=lambda k: (abs(share_at(k) - target), -k))


def subsample_to_share(
    records: Sequence[Record],
    target: float,
    share_of_p: Callable[[float], float],
    *,
    per_prompt: bool,
    rng: random.Random,
) -> tuple[list[Record], str]:
    """Drop positives or negatives at random until share_of_p(p) is as close to `target` as a
    whole number of records allows (within one record of the exact count).

    Returns the kept records and the side sub-sampled ("positive" or "negative").
    """
    positive = [i for i, r in enumerate(records) if is_positive(r.reward)]
    negative = [i for i, r in enumerate(records) if not is_positive(r.reward)]
    n_pos, n_neg = len(positive), len(negative)
    if n_pos == 0 or n_neg == 0:
        raise CurationError(f"sub-sampling changes p only when both sides exist ({n_pos} positives, {n_neg} negatives)",
                            key="curation.reward.one_side_only", where="reward")
    if share_of_p(n_pos / (n_pos + n_neg)) > target:  # keep k positives: p = k / (k + n_neg)
        name, side = "positive", positive
        keep = _closest_count(n_pos, lambda k: share_of_p(k / (k + n_neg)), target)
    else:  # keep k negatives: p = n_pos / (n_pos + k)
        name, side = "negative", negative
        keep = _closest_count(n_neg, lambda k: share_of_p(n_pos / (n_pos + k)), target)
    groups: dict[str, list[int]] = {}
    for i in side:
        groups.setdefault(records[i].prompt_key if per_prompt else "", []).append(i)
    chosen = _balanced_choice(list(groups.values()), keep, rng)
    dropped = set(side) - chosen
    return [r for i, r in enumerate(records) if i not in dropped], name


def _share_and_target(curation: Curation) -> tuple[Callable[[float], float], float]:
    """The share to steer (p itself, or p~ at the baseline) and its target."""
    if curation.target_p is not None:
        return (lambda p: p), curation.target_p
    return (lambda p: effective_positive_share(p, curation.baseline)), curation.target_p_tilde


def _check_closed_form_holds(records: Sequence[Record]) -> None:
    """target_p_tilde steers p through p~ = p(1 - c) / (1 + c(1 - 2p)), which holds for +-1 rewards
    and one c for all; otherwise p~ depends on which records are kept, and the loss would see
    another share than the one aimed at (the stats' p~ is computed from the records themselves)."""
    if records and records[0].baseline is not None:
        raise CurationError("target_p_tilde steers p~ at one baseline c, but these records carry their own baseline "
                            "field, which training uses instead: curate with target_p and read p~ in the stats",
                            key="curation.target_p_tilde.records_carry_baseline", where="baseline")
    others = sorted({r.reward for r in records} - {-1.0, 1.0})
    if others:
        shown = ", ".join(f"{reward:g}" for reward in others[:5]) + (", ..." if len(others) > 5 else "")
        raise CurationError(f"target_p_tilde steers p~ = p(1 - c) / (1 + c(1 - 2p)), which holds for rewards of +-1 "
                            f"only; these records also have rewards {shown}: curate with target_p and read p~ in the "
                            "stats", key="curation.target_p_tilde.rewards_not_plus_minus_1", where="reward")


def curate(records: Sequence[Record], curation: Curation) -> CurationResult:
    """Apply `curation`; `stats` holds the settings, drops by reason, and the composition
    (counts, p, p~ at the baseline) before and after."""
    rng = random.Random(curation.seed)
    dropped: Counter[str] = Counter()
    kept = list(records)

    def step(reason: str, result: list[Record]) -> list[Record]:
        dropped[reason] += len(kept) - len(result)
        return result

    if curation.dedup:
        kept = step("duplicate", deduplicate(kept))
    if curation.anna_karenina:
        kept = step("anna_karenina", anna_karenina(kept))
    elif curation.target_p is not None or curation.target_p_tilde is not None:
        if curation.target_p_tilde is not None:
            _check_closed_form_holds(kept)
        share_of_p, target = _share_and_target(curation)
        result, side = subsample_to_share(kept, target, share_of_p, per_prompt=curation.per_prompt, rng=rng)
        kept = step(f"subsample_{side}", result)

    stats = {
        "settings": vars(curation).copy(),
        "records_in": len(records),
        "records_out": len(kept),
        "dropped": {reason: n for reason, n in dropped.items() if n},
        "before": composition(records, curation.baseline),
        "after": composition(kept, curation.baseline),
    }
    return CurationResult(kept, stats)
