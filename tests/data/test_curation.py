"""Curation: target p / p~ within one record, per-prompt balancing, Anna Karenina, determinism."""

import random
from collections import Counter

import pytest

from nemo_topr.data.curation import Curation, CurationError, anna_karenina, curate, deduplicate
from nemo_topr.data.records import Record, is_positive
from nemo_topr.objective import effective_positive_share


def _sampled(prompts: int = 60, samples: int = 16, seed: int = 0) -> list[Record]:
    """Records like sampled data: each prompt has its own success rate, rewards +-1."""
    rng = random.Random(seed)
    records = []
    for prompt in range(prompts):
        success = rng.random()
        for sample in range(samples):
            reward = 1.0 if rng.random() < success else -1.0
            records.append(Record(prompt=f"q{prompt}", completion=f"answer {prompt}.{sample}", reward=reward,
                                  prompt_id=prompt, sample_id=sample, index=len(records)))
    return records


def _counts(records: list[Record]) -> tuple[int, int]:
    positives = sum(is_positive(r.reward) for r in records)
    return positives, len(records) - positives


def _check_accounting(records: list[Record], result) -> None:
    assert result.stats["records_in"] == len(records)
    assert result.stats["records_out"] == len(result.records)
    assert len(records) == len(result.records) + sum(result.stats["dropped"].values())


@pytest.mark.parametrize("target", [0.1, 0.2, 0.8, 0.95])
def test_target_p_is_reached_within_one_record(target):
    records = _sampled()
    n_pos, n_neg = _counts(records)
    result = curate(records, Curation(target_p=target))
    kept_pos, kept_neg = _counts(result.records)
    if target < n_pos / (n_pos + n_neg):  # positives are sub-sampled: kept_pos / (kept_pos + n_neg) = target
        assert kept_neg == n_neg and abs(kept_pos - target * n_neg / (1 - target)) <= 1
        assert result.stats["dropped"] == {"subsample_positive": n_pos - kept_pos}
    else:
        assert kept_pos == n_pos and abs(kept_neg - n_pos * (1 - target) / target) <= 1
        assert result.stats["dropped"] == {"subsample_negative": n_neg - kept_neg}
    assert result.stats["after"]["p"] == pytest.approx(target, abs=1 / len(result.records))
    _check_accounting(records, result)


@pytest.mark.parametrize("target, baseline", [(0.15, 0.2), (0.1, -0.3), (0.7, 0.5)])
def test_target_p_tilde_is_the_nearest_reachable(target, baseline):
    records = _sampled()
    result = curate(records, Curation(target_p_tilde=target, baseline=baseline))
    kept_pos, kept_neg = _counts(result.records)

    def error(pos: int, neg: int) -> float:
        return abs(effective_positive_share(pos / (pos + neg), baseline) - target)

    side_is_positive = "subsample_positive" in result.stats["dropped"]
    for step in (-1, 1):  # one record more or fewer on the sub-sampled side would be no closer
        pos, neg = (kept_pos + step, kept_neg) if side_is_positive else (kept_pos, kept_neg + step)
        assert error(kept_pos, kept_neg) <= error(pos, neg)
    assert result.stats["after"]["p_tilde"] == pytest.approx(target, abs=0.01)


def test_per_prompt_balancing_caps_the_most_represented_prompts():
    records = _sampled()
    result = curate(records, Curation(target_p=0.1, per_prompt=True))
    before = Counter(r.prompt_id for r in records if is_positive(r.reward))
    after = Counter(r.prompt_id for r in result.records if is_positive(r.reward))
    cap = min(after[p] for p in before if after[p] < before[p])  # the smallest share of a cut prompt
    for prompt, count in before.items():  # prompts under the cap keep all, the others cap or cap + 1
        assert after[prompt] == count if count <= cap else after[prompt] in (cap, cap + 1)
    assert _counts(result.records)[1] == _counts(records)[1]  # every negative kept


def test_per_prompt_without_a_target_is_refused_not_ignored():
    """`data curate --per-prompt` (or with --anna-karenina) wrote every record, as without it."""
    for modes in ({}, {"anna_karenina": True}):
        with pytest.raises(CurationError) as refused:
            Curation(per_prompt=True, **modes)
        assert refused.value.key == "curation.per_prompt.without_target"
    Curation(target_p_tilde=0.2, per_prompt=True)


def test_anna_karenina_keeps_the_first_positive_and_all_negatives_per_prompt():
    rows = [("a", 1), ("a", -1), ("a", 1), ("b", -1), ("a", -1), ("b", -1), ("c", 1), ("c", 1), ("b", 1)]
    records = [Record(prompt=p, completion=f"y{i}", reward=r, index=i) for i, (p, r) in enumerate(rows)]
    kept = anna_karenina(records)
    assert [r.index for r in kept] == [0, 1, 3, 4, 5, 6, 8]
    result = curate(records, Curation(anna_karenina=True))
    assert [r.index for r in result.records] == [0, 1, 3, 4, 5, 6, 8]
    assert result.stats["dropped"] == {"anna_karenina": 2}
    _check_accounting(records, result)


def test_exact_duplicates_are_dropped_first():
    rows = [("q", "x", 1), ("q", "x", 1), ("q", "y", -1), ("r", "x", 1), ("q", "y", -1)]
    records = [Record(prompt=p, completion=c, reward=r, index=i) for i, (p, c, r) in enumerate(rows)]
    assert [r.index for r in deduplicate(records)] == [0, 2, 3]
    result = curate(records, Curation())
    assert [r.index for r in result.records] == [0, 2, 3] and result.stats["dropped"] == {"duplicate": 2}
    assert [r.index for r in curate(records, Curation(dedup=False)).records] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("per_prompt", [False, True])
def test_same_seed_same_output(per_prompt):
    records = _sampled()

    def kept(seed: int) -> list[int]:
        return [r.index for r in curate(records, Curation(target_p=0.2, per_prompt=per_prompt, seed=seed)).records]

    assert kept(3) == kept(3)
    assert kept(3) != kept(4)
    assert kept(3) == sorted(kept(3))  # input order is kept


def test_invalid_settings_and_unreachable_targets():
    positives_only = [Record(prompt="q", completion=str(i), reward=1.0, index=i) for i in range(4)]
    for refuse, key in ((lambda: Curation(target_p=0.2, anna_karenina=True), "curation.mode.several_chosen"),
                        (lambda: Curation(target_p=1.5), "curation.target_p.outside_0_1"),
                        (lambda: Curation(target_p_tilde=0.2, baseline=1.0),
                         "curation.baseline.outside_open_minus_1_1"),
                        (lambda: curate(positives_only, Curation(target_p=0.5)), "curation.reward.one_side_only")):
        with pytest.raises(CurationError) as refused:
            refuse()
        assert refused.value.key == key


def test_target_p_tilde_is_refused_where_its_closed_form_does_not_hold():
    """p~ = p(1 - c) / (1 + c(1 - 2p)) is for +-1 rewards and one c: with other rewards, or the
    records' own baselines (training's c then), steering p through it aims at another share."""
    def records(rewards, baseline=None):
        return [Record(prompt=f"q{i}", completion="a", reward=r, baseline=baseline, index=i)
                for i, r in enumerate(rewards)]

    with pytest.raises(CurationError) as other_rewards:
        curate(records([1.0, -1.0, 0.5, 0.0]), Curation(target_p_tilde=0.2))
    assert other_rewards.value.key == "curation.target_p_tilde.rewards_not_plus_minus_1"
    with pytest.raises(CurationError) as own_baselines:
        curate(records([1.0, -1.0, -1.0], baseline=0.3), Curation(target_p_tilde=0.2))
    assert own_baselines.value.key == "curation.target_p_tilde.records_carry_baseline"
    # target_p counts records: it holds for any rewards and baselines
    assert _counts(curate(records([1.0, 1.0, -1.0, 0.5], baseline=0.3), Curation(target_p=0.5)).records) == (1, 1)
