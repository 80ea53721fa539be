"""The one warning about which records count as positives: 0/1 grades have no negatives.

With the paper's rule (a record is negative when R < 0; `nemo_topr.data.records.is_positive`),
a file graded 0/1 has only positives. A baseline c above the smallest reward then gives the
wrong answers a negative advantage R - c, yet the untruncated weight of a positive: naive
REINFORCE on them, with none of TOPR's truncation. `nemo-topr data stats`, `data validate` and
`train` (`recipe.check_baseline`) print this warning.
"""

from __future__ import annotations

from collections.abc import Iterable

MAP_GRADES = ("map 0/1 grades to -1/+1 (reward = 2 * grade - 1; docs/data.md, 'Rewards graded 0/1'), "
              "or set objective.negative_rule=advantage to mark R - c < 0 as negative")


def no_negatives_warning(rewards: Iterable[float], baseline: float, negative_rule: str = "reward") -> str | None:
    """The warning text when no reward is negative while `baseline` is above the smallest one
    (and negatives are decided on the reward); None otherwise."""
    rewards = list(rewards)
    if negative_rule != "reward" or not rewards or min(rewards) < 0 or baseline <= min(rewards):
        return None
    return (f"no record is negative (reward < 0), yet the baseline {baseline:g} is above the smallest reward "
            f"{min(rewards):g}: the records with reward below {baseline:g} get a negative advantage R - c but the "
            f"untruncated weight of a positive (naive REINFORCE on them); {MAP_GRADES}")
