"""Benchmark metrics over graded samples, in pure Python.

For a problem with n samples of which c are correct:

    pass@k  = 1 - C(n - c, k) / C(n, k)     unbiased estimator (Chen et al., 2021), all n samples
    maj@k   = 1 if the majority answer of the first k samples is correct, else 0
    weighted_maj@k: the same vote, each sample weighted by its verifier score
    invalid_rate = share of samples with no parseable answer (the model's failure)

and the benchmark's value of each is the mean over problems. Samples the grader itself failed
on (grade "error") never reach these metrics: `nemo-topr eval` leaves them out and reports them
as `grader_error_rate`.

Votes: answers are grouped into clusters of equal answers (`same`, plain equality by default;
math-verify equivalence for MATH), in order of first appearance. A cluster's weight is its
number of samples (or the sum of its verifier scores). The heaviest cluster wins; a tie goes to
the cluster whose first sample comes first. Invalid samples (answer None) do not vote; when no
sample of the k has an answer, the vote is wrong. The winning cluster is correct when its
first sample is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from nemo_topr.errors import UserError

Same = Callable[[str, str], bool]


@dataclass(frozen=True)
class SampleOutcome:
    """One graded sample: its extracted answer (None: invalid), correctness, optional verifier score."""

    answer: str | None
    correct: bool
    verifier_score: float | None = None


class MetricsError(UserError, ValueError):
    """Counts no metric is defined for (`eval` refuses the ones a user can give first)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k), the chance that k of the n samples drawn without replacement
    include a correct one.

    Computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), which equals the ratio of binomials
    without forming them (they overflow floats for n in the hundreds).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise MetricsError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}",
                           key="pass@k.out_of_range", where="k")
    if n - c < k:
        return 1.0
    none_correct = 1.0
    for i in range(n - c + 1, n + 1):
        none_correct *= 1.0 - k / i
    return 1.0 - none_correct


def majority_vote(answers: Sequence[str | None], weights: Sequence[float] | None = None,
                  same: Same = operator.eq) -> int | None:
    """Index of the first sample of the winning answer cluster, or None when no sample has one.

    Cluster weight W_j = sum of the weights (default 1) of its samples; the winner is argmax_j W_j,
    ties going to the cluster that appeared first. `same(first answer of a cluster, answer)`
    decides membership.
    """
    clusters: list[list] = []  # [index of the first sample, total weight], in order of appearance
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        weight = 1.0 if weights is None else weights[index]
        cluster = next((c for c in clusters if same(answers[c[0]], answer)), None)
        if cluster is None:
            clusters.append([index, weight])
        else:
            cluster[1] += weight
    if not clusters:
        return None
    return max(clusters, key=operator.itemgetter(1))[0]  # max keeps the first of equal weights


def vote_is_correct(samples: Sequence[SampleOutcome], *, weighted: bool = False, same: Same = operator.eq) -> bool:
    """Whether the (verifier-weighted when `weighted`) majority answer of `samples` is correct."""
    weights = [sample.verifier_score for sample in samples] if weighted else None
    winner = majority_vote([sample.answer for sample in samples], weights, same)
    return winner is not None and samples[winner].correct


def scored_voters(problems: Sequence[Sequence[SampleOutcome]]) -> tuple[int, int]:
    """(samples that vote and have a verifier score, samples that vote): a sample votes when it has
    an answer; an empty completion, never scored, does not."""
    voters = [sample for samples in problems for sample in samples if sample.answer is not None]
    return sum(sample.verifier_score is not None for sample in voters), len(voters)


def has_verifier_scores(problems: Sequence[Sequence[SampleOutcome]]) -> bool:
    """Whether samples were scored by a verifier: some sample has a score, and every sample that
    votes has one (`scored_voters`)."""
    scored, voters = scored_voters(problems)
    return scored == voters and any(sample.verifier_score is not None for samples in problems for sample in samples)


def benchmark_metrics(problems: Sequence[Sequence[SampleOutcome]], ks: Sequence[int],
                      same: Same = operator.eq) -> dict[str, float]:
    """pass@k for each k, maj@k (and weighted_maj@k when every voting sample has a verifier score) for
    each k > 1, and the invalid rate; each k must be at most the smallest number of samples of a
    problem."""
    if not problems or not all(problems):
        raise MetricsError("metrics need at least one problem, each with at least one sample",
                           key="problems.none_sampled", where="problems")
    weighted = has_verifier_scores(problems)
    metrics: dict[str, float] = {}
    for k in ks:
        metrics[f"pass@{k}"] = fmean(pass_at_k(len(s), sum(x.correct for x in s), k) for s in problems)
        if k == 1:  # a vote of one sample is pass@1 estimated from the first sample only
            continue
        metrics[f"maj@{k}"] = fmean(vote_is_correct(s[:k], same=same) for s in problems)
        if weighted:
            metrics[f"weighted_maj@{k}"] = fmean(vote_is_correct(s[:k], weighted=True, same=same) for s in problems)
    samples = [sample for samples in problems for sample in samples]
    metrics["invalid_rate"] = sum(sample.answer is None for sample in samples) / len(samples)
    return metrics
