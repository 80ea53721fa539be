"""The pre-registered studies' statistics and decision rules: study 1 (docs/miniature.md,
"Pre-registered study (issue 19)"): paired per-seed differences, the exact two-sided sign test, and
the rules that turn them into supported / refuted / inconclusive; study 2
(docs/miniature/study2_preregistration.md) adds the paired-t TOST at delta and the eight registered
outcomes of a comparison. Pure Python, no I/O; the numbers below are the pre-registrations' and may
not change after the studies' results are seen."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from math import comb

ALPHA = 0.05             # two-sided
MIN_EFFECT = 0.02        # delta: smallest pass@1 difference of interest
MANIPULATION_MARGIN = 0.03
DEGENERATE_MALFORMED = 0.5
DEGENERATE_PASS_FRACTION = 0.5  # of mu's pass@1

SUPPORTED, REFUTED, INCONCLUSIVE = "supported", "refuted", "inconclusive"
A_BETTER, B_BETTER, NO_DECISION = "A > B", "A < B", "no decision"


def sign_test_p(n_positive: int, n_negative: int) -> float:
    """Exact two-sided sign test, ties already dropped: min(1, 2 P(Bin(n, 1/2) <= min(n+, n-)))."""
    n = n_positive + n_negative
    tail = sum(comb(n, i) for i in range(min(n_positive, n_negative) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


@dataclass(frozen=True)
class Paired:
    """Per-seed differences A - B and their summary; `outcome` is the pre-registered comparison."""

    deltas: tuple[float, ...]
    mean: float
    sd: float | None  # sample sd (n - 1); None with one seed
    positive: int
    negative: int
    tied: int
    p: float
    outcome: str  # A_BETTER, B_BETTER or NO_DECISION


def compare(a: list[float], b: list[float], *, margin: float = MIN_EFFECT, alpha: float = ALPHA) -> Paired:
    """A vs B paired by seed (same order). A > B iff the sign test is significant in A's favour
    and mean(A - B) >= margin; A < B mirrors it; anything else is no decision."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired comparison needs equally many seeds on both sides; got {len(a)} and {len(b)}")
    deltas = tuple(x - y for x, y in zip(a, b))
    positive, negative = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    p = sign_test_p(positive, negative)
    mean = statistics.fmean(deltas)
    outcome = NO_DECISION
    if p <= alpha and positive > negative and mean >= margin:
        outcome = A_BETTER
    elif p <= alpha and negative > positive and mean <= -margin:
        outcome = B_BETTER
    return Paired(deltas, mean, statistics.stdev(deltas) if len(deltas) > 1 else None, positive, negative,
                  len(deltas) - positive - negative, p, outcome)


def not_worse(a: list[float], b: list[float], *, margin: float = MIN_EFFECT, alpha: float = ALPHA) -> bool:
    """Non-inferiority: the sign test of (A - B + margin) is significant in A's favour and mean(A - B) >= 0."""
    shifted = compare([x + margin for x in a], b, margin=0.0, alpha=alpha)
    return shifted.outcome == A_BETTER and statistics.fmean(x - y for x, y in zip(a, b)) >= 0.0


def degenerated(pass_at_1: float, malformed_rate: float, mu_pass_at_1: float) -> bool:
    return malformed_rate >= DEGENERATE_MALFORMED or pass_at_1 < DEGENERATE_PASS_FRACTION * mu_pass_at_1


@dataclass(frozen=True)
class Check:
    passed: bool
    mean: float
    improved: int  # seeds with positives-only above mu
    seeds: int


def manipulation_check(positives_only: list[float], mu: float) -> Check:
    """Passed iff mean(positives-only - mu) >= 0.03 and positives-only > mu on all seeds but at most one."""
    deltas = [x - mu for x in positives_only]
    improved = sum(d > 0 for d in deltas)
    mean = statistics.fmean(deltas)
    return Check(mean >= MANIPULATION_MARGIN and improved >= len(deltas) - 1, mean, improved, len(deltas))


@dataclass(frozen=True)
class Decision:
    status: str
    reason: str


def decide_h1(reinforce_degenerated: list[bool], topr_degenerated: list[bool], topr_vs_reinforce: Paired) -> Decision:
    """H1: REINFORCE degenerates (all seeds but at most one), TOPR does not (at most one seed), and
    TOPR > REINFORCE; refuted if REINFORCE degenerates on at most one seed or TOPR on all but one."""
    n, r, t = len(reinforce_degenerated), sum(reinforce_degenerated), sum(topr_degenerated)
    counts = f"REINFORCE degenerated on {r}/{n} seeds, TOPR on {t}/{n}; TOPR vs REINFORCE: {topr_vs_reinforce.outcome}"
    if r <= 1 or t >= n - 1:
        return Decision(REFUTED, counts)
    if r >= n - 1 and t <= 1 and topr_vs_reinforce.outcome == A_BETTER:
        return Decision(SUPPORTED, counts)
    return Decision(INCONCLUSIVE, counts)


def decide_h2(check: Check, topr: list[float], positives_only: list[float]) -> Decision:
    if not check.passed:
        return Decision(INCONCLUSIVE, "manipulation check failed")
    paired = compare(topr, positives_only)
    if paired.outcome == A_BETTER:
        return Decision(SUPPORTED, "TOPR better than positives-only")
    if not_worse(topr, positives_only):
        return Decision(SUPPORTED, f"TOPR not worse than positives-only by more than {MIN_EFFECT}")
    if paired.outcome == B_BETTER:
        return Decision(REFUTED, "TOPR worse than positives-only")
    return Decision(INCONCLUSIVE, "no decision")


def best_interior(validation: dict[float, list[float]], endpoints: tuple[float, float]) -> float:
    """The interior grid point with the highest mean validation pass@1 (ties: the smaller p~)."""
    interior = sorted(x for x in validation if x not in endpoints)
    if not interior:
        raise ValueError(f"the p~ grid {sorted(validation)} has no point between its endpoints {endpoints}")
    return max(interior, key=lambda x: (statistics.fmean(validation[x]), -x))


def decide_h3(check: Check, validation: dict[float, list[float]], test: dict[float, list[float]]) -> tuple[Decision, float]:
    """H3 on the TOPR p~ grid ({p~: per-seed pass@1}); endpoints are the grid's smallest and largest
    points. I* = best interior point on validation; supported iff I* > both endpoints on test,
    refuted iff I* < either. Returns (decision, I*)."""
    low, high = min(test), max(test)
    star = best_interior(validation, (low, high))
    if not check.passed:
        return Decision(INCONCLUSIVE, "manipulation check failed"), star
    outcomes = {end: compare(test[star], test[end]).outcome for end in (low, high)}
    reason = f"I* = {star:g}: vs {low:g} {outcomes[low]}, vs {high:g} {outcomes[high]}"
    if all(o == A_BETTER for o in outcomes.values()):
        return Decision(SUPPORTED, reason), star
    if any(o == B_BETTER for o in outcomes.values()):
        return Decision(REFUTED, reason), star
    return Decision(INCONCLUSIVE, reason), star


# ---------------------------------------------------------------------------------------------
# Study 2 (docs/miniature/study2_preregistration.md, "Statistics"): equivalence and the eight outcomes

BETTER, WORSE = "better", "worse"
WORSE_WITHIN, BETTER_WITHIN = "worse by less than δ", "better by less than δ"
EQUIVALENT = "equivalent"
NOT_WORSE, NOT_BETTER = "not worse by more than δ", "not better by more than δ"
UNDECIDED = "inconclusive"


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer df >= 1, by the closed-form series (Abramowitz and
    Stegun 26.7.3 / 26.7.4) in theta = atan(t / sqrt(df)): exact up to rounding, no special functions."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer; got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 in the last power
        term, series = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            series += term
        signed = 2.0 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
    else:       # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), df - 2 in the last power
        term = series = 1.0
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            series += term
        signed = math.sin(theta) * series
    return 0.5 + 0.5 * signed


@dataclass(frozen=True)
class Tost:
    """Paired-t two one-sided tests at +-margin: p_low tests H0 mean <= -margin, p_high H0 mean >= +margin."""

    p_low: float
    p_high: float

    @property
    def p(self) -> float:
        return max(self.p_low, self.p_high)


def tost(deltas: list[float] | tuple[float, ...], margin: float = MIN_EFFECT) -> Tost:
    """TOST on the mean of paired differences with df = n - 1; with sd = 0 each p is 0 or 1 (the mean
    either is or is not inside the bound); with one difference nothing can be shown (both p = 1)."""
    n = len(deltas)
    if n < 2:
        return Tost(1.0, 1.0)
    mean, sd = statistics.fmean(deltas), statistics.stdev(deltas)
    if sd == 0.0:
        return Tost(0.0 if mean > -margin else 1.0, 0.0 if mean < margin else 1.0)
    se = sd / math.sqrt(n)
    return Tost(1.0 - t_cdf((mean + margin) / se, n - 1), t_cdf((mean - margin) / se, n - 1))


@dataclass(frozen=True)
class Outcome:
    """A study-2 comparison: the paired sign test (study 1's), the TOST and the registered outcome."""

    paired: Paired
    tost: Tost
    outcome: str


def classify(a: list[float], b: list[float], *, margin: float = MIN_EFFECT, alpha: float = ALPHA) -> Outcome:
    """A vs B paired by seed: the first of the eight registered outcomes that applies."""
    paired, equivalence = compare(a, b, margin=margin, alpha=alpha), tost([x - y for x, y in zip(a, b)], margin)
    signed = paired.p <= alpha and paired.positive != paired.negative
    if paired.outcome == A_BETTER:
        outcome = BETTER
    elif paired.outcome == B_BETTER:
        outcome = WORSE
    elif equivalence.p <= alpha and signed:
        outcome = WORSE_WITHIN if paired.negative > paired.positive else BETTER_WITHIN
    elif equivalence.p <= alpha:
        outcome = EQUIVALENT
    elif equivalence.p_low <= alpha:
        outcome = NOT_WORSE
    elif equivalence.p_high <= alpha:
        outcome = NOT_BETTER
    else:
        outcome = UNDECIDED
    return Outcome(paired, equivalence, outcome)


def _reading(outcome: Outcome, readings: dict[str, tuple[str, str]]) -> Decision:
    status, note = readings.get(outcome.outcome, (INCONCLUSIVE, ""))
    return Decision(status, outcome.outcome + (f": {note}" if note else ""))


def decide_at_least_as_good(check: Check, outcome: Outcome) -> Decision:
    """H5 / H6 at one strength: A (a TOPR configuration) at least as good as positives-only."""
    if not check.passed:
        return Decision(INCONCLUSIVE, "manipulation check failed")
    return _reading(outcome, {BETTER: (SUPPORTED, ""), BETTER_WITHIN: (SUPPORTED, ""), EQUIVALENT: (SUPPORTED, ""),
                              NOT_WORSE: (SUPPORTED, ""), WORSE: (REFUTED, ""),
                              WORSE_WITHIN: (REFUTED, "refuted within δ")})


def decide_strength_trend(outcome: Outcome | None) -> Decision:
    """H4: the gap TOPR - positives-only at the weakest passing strength vs at the strongest."""
    if outcome is None:
        return Decision(INCONCLUSIVE, "fewer than two strengths passed the manipulation check")
    same = (REFUTED, "no change within δ")
    return _reading(outcome, {BETTER: (SUPPORTED, "the gap grows as mu weakens"),
                              WORSE: (REFUTED, "the gap shrinks as mu weakens"),
                              WORSE_WITHIN: same, BETTER_WITHIN: same, EQUIVALENT: same})


def decide_normalisation(check: Check, outcome: Outcome) -> Decision:
    """H7 at one strength: the token_sum gap TOPR - positives-only vs the sequence_mean gap."""
    if not check.passed:
        return Decision(INCONCLUSIVE, "manipulation check failed")
    same = (SUPPORTED, "the normalisation does not change the comparison")
    return _reading(outcome, {WORSE_WITHIN: same, BETTER_WITHIN: same, EQUIVALENT: same,
                              BETTER: (REFUTED, "token_sum favours TOPR"),
                              WORSE: (REFUTED, "token_sum disfavours TOPR")})


# ---------------------------------------------------------------------------------------------
# Study 3 (docs/miniature/study3_preregistration.md, "Statistics" and "Decision rules"): the
# bootstrap over test problems and H8's outcomes

PLACEBO_MARGIN = 0.01     # m
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 96

INFORMATIVE = "negatives informative"
INFORMATIVE_WITHIN = "negatives informative, by less than m"
PLACEBO_BETTER = "placebo better"
MECHANICAL = "mechanical"


def select_lr(validation: dict[float, list[float]]) -> float:
    """Study 3's lr of an arm: the highest mean validation pass@1 over the seeds ({lr: per seed});
    exact ties go to the smaller lr."""
    means = {lr: statistics.fmean(values) for lr, values in validation.items()}
    return min(means, key=lambda lr: (-means[lr], lr))


def problem_differences(a: list[list[int]], b: list[list[int]], samples: int) -> list[float]:
    """D_j = (1/n) sum over the n seeds of (a[s][j] - b[s][j]) / samples, from the correct samples of
    A and of B per seed (same seed order) and problem (split order)."""
    if len(a) != len(b) or not a or len({len(row) for row in (*a, *b)}) != 1:
        raise ValueError(f"problem-level differences need the same seeds and problems on both sides; got "
                         f"{[len(row) for row in a]} and {[len(row) for row in b]}")
    return [sum(x[j] - y[j] for x, y in zip(a, b)) / (samples * len(a)) for j in range(len(a[0]))]


@dataclass(frozen=True)
class ProblemLevel:
    """The mean of D and its bootstrap intervals over problems (95 % and 90 %, percentile)."""

    mean: float
    ci95: tuple[float, float]
    ci90: tuple[float, float]


def bootstrap(d: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> ProblemLevel:
    """The registered bootstrap: one random.Random(seed) per call; each resample draws len(d) problem
    indices with `rng.choices`; of the sorted resample means the 95 % interval runs from the
    (0.025 R + 1)-th to the 0.975 R-th value (251st to 9,750th of 10,000), the 90 % interval from
    the (0.05 R + 1)-th to the 0.95 R-th."""
    import random

    rng, problems = random.Random(seed), range(len(d))
    means = sorted(math.fsum(d[j] for j in rng.choices(problems, k=len(d))) / len(d) for _ in range(resamples))

    def interval(tail: float) -> tuple[float, float]:
        return means[round(tail * resamples)], means[round((1.0 - tail) * resamples) - 1]

    return ProblemLevel(math.fsum(d) / len(d), interval(0.025), interval(0.05))


def inside(interval: tuple[float, float], margin: float) -> bool:
    return -margin < interval[0] and interval[1] < margin


def decide_h8(check: Check, outcome: Outcome, problems: ProblemLevel, margin: float = PLACEBO_MARGIN,
              alpha: float = ALPHA) -> Decision:
    """H8, real (A) against placebo (B): `outcome` is `classify(A, B, margin=m)` (its sign test and its
    TOST at m), `problems` the bootstrap of D; the first registered outcome that applies."""
    if not check.passed:
        return Decision(INCONCLUSIVE, "manipulation check failed")
    paired, signed = outcome.paired, outcome.paired.p <= alpha
    equivalent = outcome.tost.p <= alpha and inside(problems.ci90, margin)
    if signed and paired.positive > paired.negative and problems.ci95[0] > 0.0:
        return Decision(SUPPORTED, INFORMATIVE_WITHIN if equivalent else INFORMATIVE)
    if signed and paired.negative > paired.positive and problems.ci95[1] < 0.0:
        return Decision(REFUTED, PLACEBO_BETTER)
    if equivalent:
        return Decision(REFUTED, MECHANICAL)
    return Decision(INCONCLUSIVE, UNDECIDED)


DIRECTIONAL = {BETTER: 1, BETTER_WITHIN: 1, WORSE: -1, WORSE_WITHIN: -1}
EQUIVALENCE = (EQUIVALENT, BETTER_WITHIN, WORSE_WITHIN)


def intervals_agree(outcome: str, problems: ProblemLevel, margin: float = MIN_EFFECT) -> bool | None:
    """Whether a study-2 outcome's problem-level intervals agree with it: a directional outcome's 95 %
    interval excludes 0 on its side, an equivalence outcome's 90 % interval lies inside (−δ, +δ) (an
    outcome "by less than δ" is both); a one-sided bound's 90 % interval stays on its side of ∓δ.
    None for inconclusive, which the intervals cannot contradict."""
    checks = []
    if outcome in DIRECTIONAL:
        checks.append(problems.ci95[0] > 0.0 if DIRECTIONAL[outcome] > 0 else problems.ci95[1] < 0.0)
    if outcome in EQUIVALENCE:
        checks.append(inside(problems.ci90, margin))
    if outcome == NOT_WORSE:
        checks.append(problems.ci90[0] > -margin)
    if outcome == NOT_BETTER:
        checks.append(problems.ci90[1] < margin)
    return all(checks) if checks else None
