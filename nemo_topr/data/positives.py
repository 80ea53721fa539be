"""The baseline c against the rewards: which records count as positives, and which sign their
advantage R - c takes.

- 0/1 grades have no negatives. With the paper's rule (a record is negative when R < 0;
  `nemo_topr.data.records.is_positive`), a file graded 0/1 has only positives. A baseline above
  the smallest reward then gives the wrong answers a negative advantage R - c, yet the
  untruncated weight of a positive: naive REINFORCE on them, with none of TOPR's truncation. At
  the default baseline 0 they get R - c = 0 and train nothing: SFT on the correct answers, not
  TOPR's push-down of the wrong ones.
- A baseline at or beyond the rewards' range flips one side: c >= the largest reward gives every
  record R - c <= 0 (the best completions pushed down, or no signal), c <= the smallest negative
  reward gives every record R - c >= 0 (the worst pushed up).
- Every reward equal to its baseline (0/1 grades with no correct answer, at c = 0) gives every
  record R - c = 0: nothing trains.

`nemo-topr data stats` and `data validate` print each as a warning; `train` (`recipe.check_baseline`,
`recipe.prepare`) warns of the first and refuses the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from nemo_topr.data.schema import DataError

if TYPE_CHECKING:
    from nemo_topr.data.records import RecordSet

MAP_TO_SIGNS = "map 0/1 grades to -1/+1 (reward = 2 * grade - 1; docs/data.md, 'Rewards graded 0/1')"
MAP_GRADES = f"{MAP_TO_SIGNS}, or set objective.negative_rule=advantage to mark R - c < 0 as negative"
# The objective is A x weight x log pi for every variant: with every A = 0 the loss and its
# gradients are 0. A run on such data (0/1 grades, none correct) trained and saved, loss 0.
NO_ADVANTAGE = ("every record's advantage R - c is 0 (each reward equals its baseline c): the loss and its gradients "
                "are 0 for every variant, so training would change nothing; if these are 0/1 grades with no correct "
                f"answer, sample more or {MAP_TO_SIGNS}")


def no_negatives_warning(rewards: Iterable[float], baseline: float, negative_rule: str = "reward") -> str | None:
    """The warning text when no reward is negative while `baseline` is above the smallest one
    (and negatives are decided on the reward), or equal to it (those records train nothing);
    None otherwise. `baseline` is the scalar c every record gets (not asymre's group means, not
    the records' own baselines)."""
    rewards = list(rewards)
    if not rewards or min(rewards) < 0 or baseline < min(rewards):
        return None
    if baseline == min(rewards):
        if baseline == max(rewards):
            return None  # one reward, equal to c: `sign_flipping_baseline`'s case
        return (f"no record is negative (reward < 0), and the records with the smallest reward {baseline:g}, the "
                f"baseline, get an advantage R - c = 0: they train nothing, so only the others train (SFT on them) "
                f"and no wrong answer is pushed down; if they are wrong answers, {MAP_TO_SIGNS}, or set "
                "objective.negative_rule=advantage with a baseline between the grades (objective.baseline=0.5)")
    if negative_rule != "reward":
        return None
    return (f"no record is negative (reward < 0), yet the baseline {baseline:g} is above the smallest reward "
            f"{min(rewards):g}: the records with reward below {baseline:g} get a negative advantage R - c but the "
            f"untruncated weight of a positive (naive REINFORCE on them); {MAP_GRADES}")


def every_advantage_zero(rewards: Iterable[float], baselines: Iterable[float]) -> bool:
    """Whether each reward equals its record's baseline c (and there is one): see NO_ADVANTAGE."""
    pairs = list(zip(rewards, baselines, strict=True))
    return bool(pairs) and all(reward == baseline for reward, baseline in pairs)


def require_signed_grades(records: RecordSet, consequence: str) -> None:
    """Refuse rewards that take two or more values with none negative (0/1, a rubric in [0, 1]),
    naming the files: a reader that decides sides by the sign alone (the verifier's correct
    answers, `data curate --anna-karenina`'s positives) would read every grade, the wrong
    answers' too, as positive; `consequence` says what that reader would then do. One value
    throughout reads one way only and is kept, but for 0: 0/1 grades with no correct answer."""
    values = {record.reward for record in records.records}
    if len(values) > 1 and min(values) >= 0:
        raise DataError(",".join(records.report.files), 0, "reward",
                        f"no reward is negative, yet the rewards take {len(values)} values ({min(values):g} to "
                        f"{max(values):g}): {consequence}; {MAP_TO_SIGNS}",
                        key="reward.grades_without_sign", where=f"{','.join(records.report.files)}: reward")
    if values == {0.0}:  # `verifier build` made every wrong answer a "correct" judge example
        raise DataError(",".join(records.report.files), 0, "reward",
                        f"every reward is 0, which the sign reads as correct (0/1 grades with no correct answer?): "
                        f"{consequence}; {MAP_TO_SIGNS}",
                        key="reward.all_zero", where=f"{','.join(records.report.files)}: reward")


def sign_flipping_baseline(rewards: Iterable[float], baseline: float) -> str | None:
    """Why `baseline` gives every record an advantage of one sign (see the module docstring); None
    when it lies strictly inside the rewards' range (or at 0 for rewards that are never negative)."""
    rewards = list(rewards)
    if not rewards:
        return None
    low, high = min(rewards), max(rewards)
    if high > 0 and baseline >= high:
        return (f"the baseline {baseline:g} is not below the largest reward {high:g}: every record gets an advantage "
                "R - c <= 0, so the best completions get no signal or are pushed down")
    if low < 0 and baseline <= low:
        return (f"the baseline {baseline:g} is not above the smallest reward {low:g}: every record gets an advantage "
                "R - c >= 0, so the worst completions get no signal or are pushed up")
    return None
