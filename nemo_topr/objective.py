"""Tapered off-policy REINFORCE objectives (pure torch).

TOPR (Le Roux et al., 2025, arXiv 2503.14286) trains a policy pi on completions sampled from
a frozen behaviour policy mu. For a batch of B sequences with completion mask m_it, token
log-probs log pi_it, rewards R_i and baseline c (a scalar, or c_i per sequence, below):

    s_i   = sum_t m_it log pi_it                 (completion log-likelihood; carries the gradient)
    n_i   = sum_t m_it                           (completion length)
    rho_i = exp(s_i - log mu(y_i | x_i))         (sequence-level importance ratio)
    w_i   = 1                   if R_i >= 0      (positives: SFT-like)
          = clamp(rho_i, 0, 1)  if R_i <  0      (negatives: truncated ratio)
    loss  = -(1/B) sum_i stop_grad(w_i) (R_i - c) s_i / n_i   (default normalisation, below)

so that d loss / d log pi_it = -w_i (R_i - c) m_it / (B n_i). Positive vs negative is decided
on the reward R_i (the paper); `negative_rule="advantage"` decides on R_i - c instead.

The whole family is one loss: w_i = clamp(rho_i, a, b) with per-side bounds [a, b]
(`ObjectiveConfig.weight_bounds`), a detached weight that never carries gradient:

    variant               positives [a+, b+]   negatives [a-, b-]
    sft_positive          [1, 1]               [0, 0]     (negatives dropped)
    reinforce             [1, 1]               [1, 1]     (naive off-policy REINFORCE)
    importance_sampling   [0, inf]             [0, inf]   (w = rho)
    tis                   [0, 1]               [0, 1]     (truncated IS)
    topr                  [1, 1]               [0, 1]
    asymre                [1, 1]               [1, 1]     with c_i = mean_{j: prompt(j) = prompt(i)} R_j + deltaV
                                                              (the whole group's mean, passed as b_i)
    ppo_clip              surrogate -min(rho A, clip(rho, 1-eps, 1+eps) A), A = R - c; rho carries grad

Baselines. `baseline=b` ([B], per sequence) makes c_i = b_i for every variant, and
c_i = b_i + deltaV for asymre, where b_i is the mean reward of sequence i's whole prompt group
(all samples of that prompt in the dataset, computed before batching: `nemo_topr.data.packing.
set_group_mean_rewards`) or a baseline the data supplies per record (e.g. leave-one-out). A
batch rarely holds a whole group, so b_i is never computed from the batch. Without `baseline`,
c = `ObjectiveConfig.baseline` (a scalar); asymre needs `baseline`.

Ratio levels (`sequence` is the paper's; the others are unfaithful ablations seen elsewhere):

    sequence        rho_i  = exp(s_i - log mu_i)                          (paper; TRIBE)
    geometric_mean  rho_i  = exp((s_i - log mu_i) / n_i)                  (verl's open TOPR PR)
    token           rho_it = exp(log pi_it - log mu_it), weights token t  (ROLL, Trinity-RFT)

Normalisations of the per-sequence objective J_i (J_i = w_i (R_i - c) s_i for the family):

    sequence_mean     loss = -(1/B) sum_i J_i / n_i          (default: our choice, see below)
    token_sum         loss = -(1/B) sum_i J_i                (the paper's equation, on log pi(tau))
    batch_token_mean  loss = -sum_i J_i / sum_i n_i

The paper writes its objective on log pi(tau), the sum over the completion's tokens; how its code
normalises is not stated. `sequence_mean` is this recipe's default, not the paper's: every
sequence counts equally whatever its length, and the gradient norm does not grow with the
completion length (docs/objective.md).

Numerics: everything runs in fp32 (fp64 input stays fp64). log rho is computed in log space and
the truncation is decided there (log rho >= 0 => min(rho, 1) = 1 exactly); `max_log_ratio`
clamps log rho only as the argument of exp(), after truncation, so log-ratios of +-1e4 give
finite losses and gradients (exp(-1e4) = 0 exactly).
"""

import math
from dataclasses import dataclass

import torch

from nemo_topr.errors import UserError

VARIANTS = ("topr", "sft_positive", "reinforce", "importance_sampling", "tis", "asymre", "ppo_clip")
RATIO_LEVELS = ("sequence", "token", "geometric_mean")
NORMALIZATIONS = ("sequence_mean", "token_sum", "batch_token_mean")
NEGATIVE_RULES = ("reward", "advantage")
# A negative counts as truncated when its weight is below 1 - this: rho = pi/mu computed twice
# for the same model (step 0, mu scored by the starting checkpoint) differs from 1 by float
# rounding summed over the completion's tokens, which is no truncation.
TRUNCATION_TOLERANCE = 1e-3

# (pos_lower, pos_upper, neg_lower, neg_upper): the weight on a side is clamp(rho, lower, upper).
_VARIANT_BOUNDS: dict[str, tuple[float, float, float, float]] = {
    "sft_positive": (1.0, 1.0, 0.0, 0.0),
    "reinforce": (1.0, 1.0, 1.0, 1.0),
    "importance_sampling": (0.0, math.inf, 0.0, math.inf),
    "tis": (0.0, 1.0, 0.0, 1.0),
    "topr": (1.0, 1.0, 0.0, 1.0),
    "asymre": (1.0, 1.0, 1.0, 1.0),
}


class ObjectiveError(UserError, ValueError):
    """An objective setting or a `policy_loss` input that cannot work: `key` names the problem
    (``"objective.ppo_epsilon.outside_0_1"``), `where` the setting or input it is about."""


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ObjectiveError(f"{name} must be one of {', '.join(choices)}; got {value!r}",
                             key=f"objective.{name}.not_a_choice", where=f"objective.{name}")


@dataclass(frozen=True)
class ObjectiveConfig:
    """Which member of the tapered family `policy_loss` computes (see the module docstring).

    variant: one of VARIANTS; sets the default weight bounds of each side.
    pos_lower, pos_upper, neg_lower, neg_upper: explicit bounds [a, b] that override the
        variant's, side by side: the weight becomes clamp(rho, a, b) ([rho]_a^b in the paper);
        a = b = 1 gives weight 1. Need 0 <= a <= b (b may be inf). Not used by ppo_clip.
    baseline: scalar c, the advantage is R - c. Must stay 0 when per-sequence baselines are
        passed to `policy_loss` (asymre always gets them: its c_i = b_i + asymre_delta_v).
    negative_rule: "reward" (the paper) marks R_i < 0 as negative; "advantage" marks R_i - c < 0.
    ratio_level: one of RATIO_LEVELS.
    normalization: one of NORMALIZATIONS.
    ppo_epsilon: clip window [1 - eps, 1 + eps] of ppo_clip.
    asymre_delta_v: deltaV of AsymRE, added to the per-sequence baseline b_i, the whole group's
        mean reward (paper: -0.1 for +-1 rewards).
    max_log_ratio: log rho is clamped to at most this only inside exp(), after the truncation
        has been decided in log space, so that exp() stays finite; it caps untruncated weights
        (importance_sampling, ppo_clip) at exp(max_log_ratio) = 4.9e8 by default. Gradients
        are returned in the input's dtype: with fp16 inputs and untruncated weights, lower it
        (e.g. 10) so that exp(max_log_ratio) |A| / normaliser fits fp16's 65504.
    """

    variant: str = "topr"
    pos_lower: float | None = None
    pos_upper: float | None = None
    neg_lower: float | None = None
    neg_upper: float | None = None
    baseline: float = 0.0
    negative_rule: str = "reward"
    ratio_level: str = "sequence"
    normalization: str = "sequence_mean"
    ppo_epsilon: float = 0.2
    asymre_delta_v: float = -0.1
    max_log_ratio: float = 20.0

    def __post_init__(self) -> None:
        _check_choice("variant", self.variant, VARIANTS)
        _check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        _check_choice("normalization", self.normalization, NORMALIZATIONS)
        _check_choice("negative_rule", self.negative_rule, NEGATIVE_RULES)
        if self.variant == "ppo_clip":
            if any(bound is not None for bound in (self.pos_lower, self.pos_upper, self.neg_lower, self.neg_upper)):
                raise ObjectiveError("ppo_clip clips rho to [1 - ppo_epsilon, 1 + ppo_epsilon]; "
                                     "pos_lower/pos_upper/neg_lower/neg_upper do not apply",
                                     key="objective.weight_bounds.with_ppo_clip", where="objective.variant")
        else:
            pos_lower, pos_upper, neg_lower, neg_upper = self.weight_bounds
            for side, lower, upper in (("pos", pos_lower, pos_upper), ("neg", neg_lower, neg_upper)):
                if not 0.0 <= lower <= upper:
                    raise ObjectiveError(f"need 0 <= {side}_lower <= {side}_upper; got {lower}, {upper}",
                                         key=f"objective.{side}_bounds.out_of_order", where=f"objective.{side}_lower")
        if not math.isfinite(self.baseline):
            raise ObjectiveError(f"baseline must be finite; got {self.baseline}",
                                 key="objective.baseline.not_finite", where="objective.baseline")
        if self.variant == "asymre" and self.baseline != 0.0:
            raise ObjectiveError("asymre uses the whole group's mean reward + asymre_delta_v as its baseline; "
                                 f"leave baseline at 0.0 (got {self.baseline})",
                                 key="objective.baseline.with_asymre", where="objective.baseline")
        if not math.isfinite(self.asymre_delta_v):
            raise ObjectiveError(f"asymre_delta_v must be finite; got {self.asymre_delta_v}",
                                 key="objective.asymre_delta_v.not_finite", where="objective.asymre_delta_v")
        if not 0.0 < self.ppo_epsilon < 1.0:
            raise ObjectiveError(f"ppo_epsilon must be in (0, 1); got {self.ppo_epsilon}",
                                 key="objective.ppo_epsilon.outside_0_1", where="objective.ppo_epsilon")
        if not 0.0 < self.max_log_ratio < math.inf:
            raise ObjectiveError(f"max_log_ratio must be positive and finite; got {self.max_log_ratio}",
                                 key="objective.max_log_ratio.not_positive_finite", where="objective.max_log_ratio")

    @property
    def weight_bounds(self) -> tuple[float, float, float, float]:
        """(pos_lower, pos_upper, neg_lower, neg_upper): the variant's, overridden where set."""
        explicit = (self.pos_lower, self.pos_upper, self.neg_lower, self.neg_upper)
        return tuple(float(d if e is None else e) for d, e in zip(_VARIANT_BOUNDS[self.variant], explicit, strict=True))

    @property
    def weights_use_ratio(self) -> bool:
        """Whether rho decides any weight: not for sft_positive, reinforce and asymre, whose bounds fix them."""
        if self.variant == "ppo_clip":
            return True
        pos_lower, pos_upper, neg_lower, neg_upper = self.weight_bounds
        return pos_lower < pos_upper or neg_lower < neg_upper


def policy_loss(
    token_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    config: ObjectiveConfig | None = None,
    baseline: torch.Tensor | None = None,
    check_values: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss to minimise and metrics for one batch; formulas in the module docstring.

    token_logprobs: [B, T] float, log pi(y_t | x, y_<t) of the trained policy (carries grad).
    loss_mask: [B, T] bool or 0/1, nonzero on completion tokens. Every row needs one.
    behavior_logprobs: [B] log mu(y | x) summed over the completion tokens, or [B, T] per-token
        log mu (masked like token_logprobs). `sequence` and `geometric_mean` accept either;
        `token` needs [B, T]. Treated as data: no gradient flows into it.
    rewards: [B].
    config: ObjectiveConfig; default TOPR, sequence ratio, sequence-mean normalisation.
    baseline: [B] per-sequence baselines b_i (c_i = b_i, asymre: b_i + deltaV), or None for the
        scalar `config.baseline`. Treated as data. Needed by asymre.
    check_values: raise on rows without completion tokens. That check reads a value back to the
        host (a device synchronisation); a caller that validated its batch on the host before
        moving it to the device (`nemo_topr.training.step.check_batch`) passes False.

    Returns the scalar loss (fp32, fp64 for fp64 input) and `metrics`, 0-dim tensors on the
    input's device, so that nothing waits for the device (`float()` reads one; a side's mean is
    0.0 when the side is empty, its count says so):
        num_sequences, num_positive, num_negative, num_tokens: counts, the denominators of the
            means below, so that micro-batches can be aggregated exactly.
        positive_share: p, share of positives.
        effective_positive_share: p~ = sum_{pos} |A_i| / sum_i |A_i| for advantages A = R - c
            (the paper's p(1-c)/(1+c(1-2p)) for +-1 rewards); before importance weights; 0.0 if
            every A_i = 0.
        log_ratio_abs_mean, log_ratio_abs_max: mean and max of |log rho| over sequences (token
            level: per-sequence token means for the mean, all tokens for the max).
        negative_truncated_share: share of negatives whose weight is < 1 - TRUNCATION_TOLERANCE.
        negative_weight_mean, positive_weight_mean: mean weight per side.
        weight_ess: (sum_i w_i)^2 / sum_i w_i^2, the effective sample size of the weights, in
            [1, B] (B when all weights are equal); 0.0 when all weights are 0.
        positive_logprob_mean, negative_logprob_mean: mean over the side of s_i / n_i.
    A sequence's weight is the factor multiplying (R_i - c) grad s_i; at the token level it is
    the token mean, for ppo_clip it is rho_i where the unclipped term is active and 0 elsewhere.
    """
    if config is None:
        config = ObjectiveConfig()
    _check_inputs(token_logprobs, loss_mask, behavior_logprobs, rewards, baseline, config)
    dtype = torch.promote_types(token_logprobs.dtype, torch.float32)  # upcast half/bf16, keep fp64
    device = token_logprobs.device

    mask = loss_mask.to(device=device, dtype=torch.bool)
    lengths = mask.sum(-1)
    if check_values:
        empty = torch.nonzero(lengths == 0).flatten().tolist()
        if empty:
            raise ObjectiveError(f"sequences at batch indices {empty} have no completion tokens "
                                 "(loss_mask row all zero)", key="policy_loss.loss_mask.empty_row",
                                 where=f"loss_mask rows {empty}")
    lengths = lengths.to(dtype)
    # where(), not a product: padding positions may hold -inf or NaN.
    logprobs = torch.where(mask, token_logprobs.to(dtype), 0.0)
    seq_logprobs = logprobs.sum(-1)

    advantages, negative = _advantages(rewards, config, baseline, dtype, device)
    behavior_logprobs = behavior_logprobs.detach().to(device=device, dtype=dtype)
    log_ratio = _log_ratio(logprobs, seq_logprobs, lengths, mask, behavior_logprobs, config.ratio_level)

    if config.variant == "ppo_clip":
        objective, weights = _ppo_clip_objective(log_ratio, advantages, mask, config)
    else:
        weights = _tapered_weights(log_ratio.detach(), negative, config)
        if config.ratio_level == "token":
            objective = advantages * (weights * logprobs).sum(-1)
        else:
            objective = advantages * weights * seq_logprobs

    if config.normalization == "sequence_mean":
        loss = -(objective / lengths).mean()
    elif config.normalization == "token_sum":
        loss = -objective.mean()
    else:
        loss = -objective.sum() / lengths.sum()
    return loss, _metrics(weights, log_ratio.detach(), negative, advantages, seq_logprobs.detach(), lengths, mask)


def effective_positive_share(p: float, c: float) -> float:
    """p~ = p (1 - c) / (1 + c (1 - 2p)): the share of gradient mass on positives for +-1 rewards.

    With baseline c, positives get weight |1 - c| and negatives |-1 - c| = 1 + c. Needs p in
    [0, 1] and c in [-1, 1]; c = -1 gives 1 (negatives discarded), c = 0 gives p.
    """
    if not (0.0 <= p <= 1.0 and -1.0 <= c <= 1.0):
        raise ObjectiveError(f"need p in [0, 1] and c in [-1, 1]; got p={p}, c={c}",
                             key="effective_positive_share.outside_domain", where="p, c")
    denominator = 1.0 + c * (1.0 - 2.0 * p)
    if denominator == 0.0:
        raise ObjectiveError(f"p~ is undefined for p={p}, c={c}: neither side carries any weight",
                             key="effective_positive_share.undefined", where="p, c")
    return p * (1.0 - c) / denominator


def baseline_for_share(p: float, target: float) -> float:
    """The baseline c with effective_positive_share(p, c) = target, for +-1 rewards.

    c = (p - target) / (p + target (1 - 2p)); for p, target in (0, 1) it lies in (-1, 1).
    target < p gives c > 0 (weigh negatives up), target > p gives c < 0.
    """
    if not (0.0 < p < 1.0 and 0.0 < target < 1.0):
        raise ObjectiveError(f"need p in (0, 1) and target in (0, 1); got p={p}, target={target}",
                             key="baseline_for_share.outside_domain", where="p, target")
    c = (p - target) / (p + target * (1.0 - 2.0 * p))
    if not -1.0 < c < 1.0:  # guaranteed by the domains above; guards rounding at the edges
        raise ObjectiveError(f"no baseline in (-1, 1) reaches target={target} from p={p} (got c={c})",
                             key="baseline_for_share.unreachable", where="p, target")
    return c


def _check_inputs(
    token_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    baseline: torch.Tensor | None,
    config: ObjectiveConfig,
) -> None:
    if token_logprobs.dim() != 2 or not token_logprobs.is_floating_point():
        raise ObjectiveError(f"token_logprobs must be a float [B, T] tensor; got {token_logprobs.dtype} "
                             f"of shape {tuple(token_logprobs.shape)}",
                             key="policy_loss.token_logprobs.not_float_2d", where="token_logprobs")
    batch, length = token_logprobs.shape
    if batch == 0:
        raise ObjectiveError("empty batch: token_logprobs has no rows",
                             key="policy_loss.token_logprobs.no_rows", where="token_logprobs")
    if loss_mask.shape != token_logprobs.shape:
        raise ObjectiveError(f"loss_mask shape {tuple(loss_mask.shape)} != token_logprobs shape {(batch, length)}",
                             key="policy_loss.loss_mask.wrong_shape", where="loss_mask")
    if behavior_logprobs.shape not in ((batch,), (batch, length)):
        raise ObjectiveError(f"behavior_logprobs must be [B] = ({batch},) sequence sums or [B, T] = "
                             f"({batch}, {length}) per-token values; got {tuple(behavior_logprobs.shape)}",
                             key="policy_loss.behavior_logprobs.wrong_shape", where="behavior_logprobs")
    if config.ratio_level == "token" and behavior_logprobs.dim() != 2:
        raise ObjectiveError("ratio_level='token' needs per-token behavior_logprobs of shape [B, T]; "
                             f"got sequence sums of shape {tuple(behavior_logprobs.shape)}",
                             key="policy_loss.behavior_logprobs.sums_at_token_level", where="behavior_logprobs")
    if rewards.shape != (batch,):
        raise ObjectiveError(f"rewards must be [B] = ({batch},); got {tuple(rewards.shape)}",
                             key="policy_loss.rewards.wrong_shape", where="rewards")
    if baseline is not None and baseline.shape != (batch,):
        raise ObjectiveError(f"baseline must be [B] = ({batch},) per-sequence values; got {tuple(baseline.shape)}",
                             key="policy_loss.baseline.wrong_shape", where="baseline")
    if baseline is not None and config.baseline != 0.0:
        raise ObjectiveError(f"per-sequence baselines replace the scalar objective baseline; leave it at 0.0 "
                             f"(got {config.baseline})",
                             key="policy_loss.baseline.with_scalar_baseline", where="objective.baseline")
    if config.variant == "asymre" and baseline is None:
        raise ObjectiveError("variant='asymre' needs per-sequence baselines: the mean reward of each "
                             "sequence's whole prompt group (nemo_topr.data.packing.set_group_mean_rewards)",
                             key="policy_loss.baseline.missing_for_asymre", where="baseline")


def _advantages(rewards: torch.Tensor, config: ObjectiveConfig, baseline: torch.Tensor | None,
                dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(A = R - c, negative): c is the scalar config.baseline, or per sequence b_i (asymre: b_i +
    deltaV); `negative_rule` decides the sides on R or on A."""
    rewards = rewards.detach().to(device=device, dtype=dtype)
    if baseline is None:
        c = config.baseline
    else:
        c = baseline.detach().to(device=device, dtype=dtype)
        c = c + config.asymre_delta_v if config.variant == "asymre" else c
    advantages = rewards - c
    return advantages, (advantages if config.negative_rule == "advantage" else rewards) < 0


def dataset_positive_share(rewards: torch.Tensor, config: ObjectiveConfig,
                           baseline: torch.Tensor | None = None) -> float | None:
    """p~ of a whole dataset as `policy_loss` weighs it: sum_{pos} |A_i| / sum_i |A_i| over every
    sequence at once (its `effective_positive_share` metric, which is per batch), with `baseline`
    as there. None when every A_i = 0. Unlike `effective_positive_share(p, c)` it takes any
    rewards and per-sequence baselines (asymre's group means)."""
    advantages, negative = _advantages(rewards, config, baseline, torch.float64, rewards.device)
    total = advantages.abs().sum()
    return None if total == 0 else float(advantages.abs()[~negative].sum() / total)


def _log_ratio(
    logprobs: torch.Tensor,
    seq_logprobs: torch.Tensor,
    lengths: torch.Tensor,
    mask: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    ratio_level: str,
) -> torch.Tensor:
    """log rho: [B] for sequence/geometric_mean, [B, T] (0 off the mask) for token."""
    if ratio_level == "token":
        return logprobs - torch.where(mask, behavior_logprobs, 0.0)
    if behavior_logprobs.dim() == 2:
        behavior_logprobs = torch.where(mask, behavior_logprobs, 0.0).sum(-1)
    log_ratio = seq_logprobs - behavior_logprobs
    return log_ratio / lengths if ratio_level == "geometric_mean" else log_ratio


def _log(bound: float) -> float:
    return math.log(bound) if bound > 0 else -math.inf


def _tapered_weights(log_ratio: torch.Tensor, negative: torch.Tensor, config: ObjectiveConfig) -> torch.Tensor:
    """clamp(rho, lower, upper) per side, clamped in log space before the only exp()."""
    pos_lower, pos_upper, neg_lower, neg_upper = config.weight_bounds
    if log_ratio.dim() == 2:
        negative = negative[:, None]
    log_weights = torch.where(negative, log_ratio.clamp(_log(neg_lower), _log(neg_upper)),
                              log_ratio.clamp(_log(pos_lower), _log(pos_upper)))
    return torch.exp(log_weights.clamp(max=config.max_log_ratio))


def _ppo_clip_objective(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: ObjectiveConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence J_i = min(rho A, clip(rho, 1-eps, 1+eps) A) (token level: summed over tokens).

    rho carries the gradient, so d J / d log rho = rho A where the unclipped term is the min and
    0 where clipping binds; that factor is returned, detached, as the weight. Like the rest of
    the family J_i is then normalised, so sequence_mean divides the sequence surrogate by n_i.
    """
    ratio = torch.exp(log_ratio.clamp(max=config.max_log_ratio))
    if ratio.dim() == 2:
        advantages = advantages[:, None]
    eps = config.ppo_epsilon
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps, 1.0 + eps) * advantages)
    clipped = ((advantages > 0) & (ratio > 1.0 + eps)) | ((advantages < 0) & (ratio < 1.0 - eps))
    weights = torch.where(clipped, 0.0, ratio.detach())
    if ratio.dim() == 2:
        surrogate = torch.where(mask, surrogate, 0.0).sum(-1)
    return surrogate, weights


def _masked_mean(values: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    return _safe_divide(torch.where(select, values, 0.0).sum(), select.sum())


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return torch.where(denominator > 0, numerator / denominator, 0.0)


def _metrics(
    weights: torch.Tensor,
    log_ratio: torch.Tensor,
    negative: torch.Tensor,
    advantages: torch.Tensor,
    seq_logprobs: torch.Tensor,
    lengths: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    positive = ~negative

    def per_sequence(values: torch.Tensor) -> torch.Tensor:
        return values if values.dim() == 1 else torch.where(mask, values, 0.0).sum(-1) / lengths

    seq_weights = per_sequence(weights)
    abs_log_ratio = log_ratio.abs()
    abs_advantages = advantages.abs()
    positive_mass = torch.where(positive, abs_advantages, 0.0).sum()
    mean_logprobs = seq_logprobs / lengths
    values = {
        "num_sequences": torch.full((), len(lengths), dtype=lengths.dtype, device=lengths.device),
        "num_positive": positive.sum(),
        "num_negative": negative.sum(),
        "num_tokens": lengths.sum(),
        "positive_share": positive.to(lengths.dtype).mean(),
        "effective_positive_share": _safe_divide(positive_mass, abs_advantages.sum()),
        "log_ratio_abs_mean": per_sequence(abs_log_ratio).mean(),
        "log_ratio_abs_max": abs_log_ratio.max(),
        "negative_truncated_share": _masked_mean((seq_weights < 1 - TRUNCATION_TOLERANCE).to(lengths.dtype), negative),
        "negative_weight_mean": _masked_mean(seq_weights, negative),
        "positive_weight_mean": _masked_mean(seq_weights, positive),
        "weight_ess": _safe_divide(seq_weights.sum() ** 2, (seq_weights**2).sum()),
        "positive_logprob_mean": _masked_mean(mean_logprobs, positive),
        "negative_logprob_mean": _masked_mean(mean_logprobs, negative),
    }
    return {name: value.to(lengths.dtype) for name, value in values.items()}
