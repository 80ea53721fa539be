"""pass@k, majority votes and benchmark metrics against hand-computed values."""

import math
import subprocess
import sys
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_topr.evaluation.evaluate import default_ks
from nemo_topr.evaluation.metrics import SampleOutcome, benchmark_metrics, majority_vote, pass_at_k
from nemo_topr.grading import same_answer


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 1 / 4),  # pass@1 = c / n
        (5, 2, 2, 1 - 3 / 10),  # C(3,2) / C(5,2) = 3 / 10
        (10, 3, 5, 1 - 21 / 252),  # C(7,5) / C(10,5) = 21 / 252 = 1 / 12
        (16, 0, 4, 0.0),  # no correct sample
        (8, 5, 4, 1.0),  # n - c = 3 < k = 4: every 4 samples hold a correct one
        (8, 8, 8, 1.0),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(n=st.integers(1, 400), data=st.data())
def test_pass_at_k_equals_the_binomial_ratio(n, data):
    c, k = data.draw(st.integers(0, n)), data.draw(st.integers(1, n))
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # exact integers, one rounding
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-9)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_majority_vote_by_hand():
    # "3": samples 0 and 4 (2 votes); "5": samples 1 and 2 (2 votes); the invalid sample 3 does
    # not vote. Tie: "3" appeared first, so its first sample, 0, wins.
    assert majority_vote(["3", "5", "5", None, "3"]) == 0
    assert majority_vote(["5", "3", "3"]) == 1  # "3" has 2 votes against 1
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_weighted_vote_sums_scores_per_answer():
    # "3": 0.9; "5": 0.3 + 0.4 = 0.7 -> "3" wins although "5" has more samples.
    assert majority_vote(["3", "5", "5"], [0.9, 0.3, 0.4]) == 0
    # "3": 0.2; "5": 0.3 + 0.4 = 0.7 -> "5" (first sample 1).
    assert majority_vote(["3", "5", "5"], [0.2, 0.3, 0.4]) == 1
    # Equal sums (0.5 each): the answer seen first.
    assert majority_vote(["5", "3"], [0.5, 0.5]) == 0


def test_vote_clusters_equivalent_math_answers():
    # \frac{1}{2} and 0.5 are one answer (2 votes) against \frac{1}{3} (1 vote).
    answers = ["\\frac{1}{3}", "\\frac{1}{2}", "0.5"]
    assert majority_vote(answers) == 0  # plain equality: three answers of 1 vote, the first wins
    assert majority_vote(answers, same=partial(same_answer, "math")) == 1


def _problems(scored: bool) -> list[list[SampleOutcome]]:
    def outcome(answer, correct, score):
        return SampleOutcome(answer, correct, score if scored else None)

    return [
        # n = 4, c = 1; sample answers 7 (correct), 8, 8, invalid
        [outcome("7", True, 0.9), outcome("8", False, 0.2), outcome("8", False, 0.2), outcome(None, False, 0.5)],
        # n = 4, c = 2; invalid, invalid, 12 (correct), 12 (correct)
        [outcome(None, False, 0.3), outcome(None, False, 0.3), outcome("12", True, 0.1), outcome("12", True, 0.1)],
    ]


def test_benchmark_metrics_by_hand():
    metrics = benchmark_metrics(_problems(scored=False), [1, 2, 4])
    # pass@1: (1/4 + 2/4) / 2 = 0.375
    # pass@2: problem 1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; problem 2: 1 - C(2,2)/C(4,2) = 5/6
    #         mean (1/2 + 5/6) / 2 = 2/3
    # pass@4: both problems have a correct sample -> 1
    # maj@2:  problem 1: 7 vs 8, one vote each, 7 came first -> correct; problem 2: no valid
    #         answer in the first two samples -> wrong. Mean 1/2.
    # maj@4:  problem 1: 8 (2 votes) beats 7 (1) -> wrong; problem 2: 12 -> correct. Mean 1/2.
    # invalid rate: 3 of 8 samples.
    assert metrics == pytest.approx(
        {"pass@1": 0.375, "pass@2": 2 / 3, "pass@4": 1.0, "maj@2": 0.5, "maj@4": 0.5, "invalid_rate": 0.375}
    )


def test_verifier_weighted_metrics_by_hand():
    metrics = benchmark_metrics(_problems(scored=True), [4])
    # weighted maj@4: problem 1: 7 has 0.9, 8 has 0.2 + 0.2 = 0.4 -> 7, correct (the plain vote
    # picked 8); problem 2: 12 is the only answer -> correct. Mean 1.
    assert metrics["weighted_maj@4"] == 1.0
    assert metrics["maj@4"] == 0.5
    assert "weighted_maj@4" not in benchmark_metrics(_problems(scored=False), [4])


def test_the_weighted_vote_needs_the_scores_of_the_samples_that_vote_only():
    empty = SampleOutcome(None, False)  # an empty completion: no answer, no record, so no score
    voters = [SampleOutcome("7", True, 0.9), SampleOutcome("8", False, 0.2), SampleOutcome("8", False, 0.2)]
    assert benchmark_metrics([[*voters, empty]], [4])["weighted_maj@4"] == 1.0  # 7: 0.9 > 8: 0.4
    assert "weighted_maj@4" not in benchmark_metrics([[*voters[:2], SampleOutcome("8", False), empty]], [4])
    assert "weighted_maj@2" not in benchmark_metrics([[empty, empty]], [2])  # no score at all: no verifier


def test_default_ks_are_powers_of_two_and_n():
    assert default_ks(1) == [1]
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]


def test_metrics_module_is_pure_python():
    code = "import sys, nemo_topr.evaluation.metrics; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
