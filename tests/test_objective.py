"""Tests of nemo_topr.objective against the paper's gradient written out by hand.

`reference` is deliberately written element by element with Python floats and `math`, from
the formulas of the TOPR paper (and PPO / AsymRE), sharing no code with the module.
"""

import math

import pytest
import torch

from nemo_topr.objective import (
    NORMALIZATIONS,
    RATIO_LEVELS,
    VARIANTS,
    ObjectiveConfig,
    ObjectiveError,
    baseline_for_share,
    dataset_positive_share,
    effective_positive_share,
    policy_loss,
)

pytestmark = pytest.mark.guards_objective  # every test here guards the loss

INF = math.inf
# The paper's table: ((a+, b+), (a-, b-)) with weight [rho]_a^b on each side.
PAPER_BOUNDS = {
    "sft_positive": ((1, 1), (0, 0)),
    "reinforce": ((1, 1), (1, 1)),
    "importance_sampling": ((0, INF), (0, INF)),
    "tis": ((0, 1), (0, 1)),
    "topr": ((1, 1), (0, 1)),
    "asymre": ((1, 1), (1, 1)),
}
CUSTOM_BOUNDS = {"pos_lower": 0.5, "pos_upper": 2.0, "neg_lower": 0.1, "neg_upper": 1.5}


def reference(logp, mask, behavior, rewards, config, baselines=None, bounds=None):
    """(loss, d loss / d logp) from the closed-form per-token gradient, in Python floats.

    baselines: per-sequence b_i (c_i = b_i, asymre: b_i + deltaV), else the scalar config.baseline.
    bounds: ((a+, b+), (a-, b-)), by default the paper's for config.variant.
    """
    B, T = len(logp), len(logp[0])
    n = [sum(mask[i]) for i in range(B)]
    N = sum(n)
    s = [sum(logp[i][t] for t in range(T) if mask[i][t]) for i in range(B)]
    per_token_behavior = isinstance(behavior[0], list)
    b = [sum(behavior[i][t] for t in range(T) if mask[i][t]) if per_token_behavior else behavior[i] for i in range(B)]
    if baselines is not None:
        c = [b_i + (config.asymre_delta_v if config.variant == "asymre" else 0.0) for b_i in baselines]
    else:
        c = [config.baseline] * B
    eps = config.ppo_epsilon
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        A = rewards[i] - c[i]
        negative = (A if config.negative_rule == "advantage" else rewards[i]) < 0
        scale = {"sequence_mean": 1 / (B * n[i]), "token_sum": 1 / B, "batch_token_mean": 1 / N}[config.normalization]
        if config.variant != "ppo_clip":
            lower, upper = (bounds or PAPER_BOUNDS[config.variant])[negative]
        for t in range(T):
            if not mask[i][t]:
                continue
            if config.ratio_level == "sequence":
                rho, d_log_rho = math.exp(s[i] - b[i]), 1.0  # d log rho / d logp_it
            elif config.ratio_level == "geometric_mean":
                rho, d_log_rho = math.exp((s[i] - b[i]) / n[i]), 1.0 / n[i]
            else:
                rho, d_log_rho = math.exp(logp[i][t] - behavior[i][t]), 1.0
            if config.variant == "ppo_clip":
                clipped = (A > 0 and rho > 1 + eps) or (A < 0 and rho < 1 - eps)
                grad[i][t] = -scale * (0.0 if clipped else rho * A * d_log_rho)
                if config.ratio_level == "token" or t == next(k for k in range(T) if mask[i][k]):
                    loss -= scale * min(rho * A, min(max(rho, 1 - eps), 1 + eps) * A)
            else:
                w = min(max(rho, lower), upper)
                grad[i][t] = -scale * w * A
                loss -= scale * w * A * logp[i][t]
    return loss, grad


def random_batch(seed: int, per_token_behavior: bool, B: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(seed)
    logp = -0.05 - 2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[torch.arange(B), torch.randint(T, (B,), generator=g)] = True
    behavior_tokens = torch.where(mask, logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64), 0.0)
    behavior = behavior_tokens if per_token_behavior else behavior_tokens.sum(-1)
    choices = torch.tensor([-1.0, 1.0, 0.5, -0.25, 0.0], dtype=torch.float64)
    rewards = choices[torch.randint(len(choices), (B,), generator=g)]
    baselines = 2 * torch.rand(B, generator=g, dtype=torch.float64) - 1  # per-sequence b_i, e.g. group means
    return logp, mask, behavior, rewards, baselines


def loss_and_grad(logp, mask, behavior, rewards, config, baselines=None):
    logp = logp.detach().clone().requires_grad_(True)
    loss, metrics = policy_loss(logp, mask, behavior, rewards, config, baselines)
    loss.backward()
    return loss.detach(), logp.grad, {name: float(value) for name, value in metrics.items()}


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("variant", [*VARIANTS, "custom_bounds"])
def test_gradient_matches_closed_form(variant, ratio_level, normalization):
    custom = variant == "custom_bounds"
    bounds = ((CUSTOM_BOUNDS["pos_lower"], CUSTOM_BOUNDS["pos_upper"]),
              (CUSTOM_BOUNDS["neg_lower"], CUSTOM_BOUNDS["neg_upper"])) if custom else None
    for seed in range(4):
        per_sequence = variant == "asymre" or seed == 3  # per-sequence baselines b_i, else a scalar c
        config = ObjectiveConfig(
            **(dict(CUSTOM_BOUNDS, variant="topr") if custom else {"variant": variant}),
            ratio_level=ratio_level, normalization=normalization,
            baseline=0.0 if per_sequence else (0.0, 0.3, -0.4)[seed],
            negative_rule=("reward", "advantage")[seed % 2],
        )
        logp, mask, behavior, rewards, baselines = random_batch(seed, ratio_level == "token" or seed % 2 == 0)
        baselines = baselines if per_sequence else None
        loss, grad, _ = loss_and_grad(logp, mask, behavior, rewards, config, baselines)
        expected_loss, expected_grad = reference(logp.tolist(), mask.tolist(), behavior.tolist(), rewards.tolist(),
                                                 config, None if baselines is None else baselines.tolist(), bounds)
        torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), rtol=1e-6, atol=1e-12)
        assert loss.item() == pytest.approx(expected_loss, rel=1e-6, abs=1e-12)


# --- reductions -------------------------------------------------------------------------------

@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_topr_on_all_positive_batch_is_sft(normalization):
    logp, mask, behavior, _, _ = random_batch(0, per_token_behavior=False)
    rewards = torch.ones(len(logp), dtype=torch.float64)
    loss, grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(normalization=normalization))
    token_nll = -(logp * mask).sum(-1)
    expected = {"sequence_mean": (token_nll / mask.sum(-1)).mean(), "token_sum": token_nll.mean(),
                "batch_token_mean": token_nll.sum() / mask.sum()}[normalization]
    torch.testing.assert_close(loss, expected)
    sft_loss, sft_grad, _ = loss_and_grad(logp, mask, behavior, rewards,
                                          ObjectiveConfig(variant="sft_positive", normalization=normalization))
    torch.testing.assert_close((loss, grad), (sft_loss, sft_grad))


def test_topr_and_tis_agree_on_negatives():
    logp, mask, behavior, rewards, _ = random_batch(1, per_token_behavior=False)
    topr = loss_and_grad(logp, mask, behavior, -rewards.abs() - 0.1, ObjectiveConfig(variant="topr"))
    tis = loss_and_grad(logp, mask, behavior, -rewards.abs() - 0.1, ObjectiveConfig(variant="tis"))
    torch.testing.assert_close(topr[:2], tis[:2])
    # On a mixed batch the negative rows still agree.
    _, topr_grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant="topr"))
    _, tis_grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant="tis"))
    negative = rewards < 0
    assert negative.any() and (~negative).any()
    torch.testing.assert_close(topr_grad[negative], tis_grad[negative])


@pytest.mark.parametrize("variant", ["topr", "reinforce", "sft_positive"])
def test_baseline_minus_one_is_twice_sft_positive(variant):
    # R = +1: weight 1, advantage 1 - (-1) = 2. R = -1: advantage -1 - (-1) = 0, dropped.
    logp, mask, behavior, _, _ = random_batch(2, per_token_behavior=False)
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    loss, grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant=variant, baseline=-1.0))
    sft_loss, sft_grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant="sft_positive"))
    torch.testing.assert_close((loss, grad), (2 * sft_loss, 2 * sft_grad))


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_importance_sampling_at_rho_one_is_reinforce(ratio_level):
    logp, mask, _, rewards, _ = random_batch(3, per_token_behavior=True)
    behavior = logp.clone()  # mu = pi: rho = 1 exactly
    results = [loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant=v, ratio_level=ratio_level))
               for v in ("importance_sampling", "reinforce")]
    torch.testing.assert_close(results[0][:2], results[1][:2])


def test_negative_rule_reward_vs_advantage():
    # R = 0.2 with c = 0.5: positive by reward (weight 1), negative by advantage (weight rho).
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    mask, rewards, behavior = torch.ones(1, 2), torch.tensor([0.2]), torch.tensor([0.0])  # log rho = -2
    for rule, weight in (("reward", 1.0), ("advantage", math.exp(-2.0))):
        config = ObjectiveConfig(baseline=0.5, negative_rule=rule)
        _, grad, metrics = loss_and_grad(logp, mask, behavior, rewards, config)
        torch.testing.assert_close(grad, torch.full((1, 2), weight * 0.3 / 2, dtype=torch.float64))
        assert metrics["num_negative"] == (rule == "advantage")


def test_asymre_baseline_is_the_given_group_mean_plus_delta_v():
    logp = torch.full((4, 1), -1.0, dtype=torch.float64)
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    group_means = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # groups {0, 1} and {2, 3}
    config = ObjectiveConfig(variant="asymre", normalization="token_sum")
    _, grad, _ = loss_and_grad(logp, torch.ones(4, 1), torch.zeros(4), rewards, config, group_means)
    advantages = torch.tensor([1.1, -0.9, 0.1, 0.1], dtype=torch.float64)  # V = 0 - 0.1 and 1 - 0.1
    torch.testing.assert_close(grad[:, 0], -advantages / 4)


def test_ppo_clip_ratio_carries_gradient_and_clipping_stops_it():
    logp = torch.full((4, 1), -1.0, dtype=torch.float64)
    behavior = torch.tensor([-1.0 - math.log(2.0)] * 2 + [-1.0 - math.log(1.1)] * 2, dtype=torch.float64)
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0])  # rho = 2, 2, 1.1, 1.1
    config = ObjectiveConfig(variant="ppo_clip", normalization="token_sum")
    loss, grad, metrics = loss_and_grad(logp, torch.ones(4, 1), behavior, rewards, config)
    # rho = 2, A > 0: clipped, no gradient. rho = 2, A < 0: unclipped, d(rho A)/d logp = rho A.
    torch.testing.assert_close(grad[:, 0], -torch.tensor([0.0, -2.0, 1.1, -1.1], dtype=torch.float64) / 4)
    assert loss.item() == pytest.approx(-(1.2 - 2.0 + 1.1 - 1.1) / 4)
    assert metrics["positive_weight_mean"] == pytest.approx(0.55)


# --- stability and detached weights -------------------------------------------------------------

@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_extreme_log_ratios_and_all_negative_batches_are_finite(variant, ratio_level):
    logp, mask, _, rewards, baselines = random_batch(4, per_token_behavior=True)
    offsets = torch.tensor([1e4, -1e4], dtype=torch.float64).repeat(logp.numel() // 2 + 1)[: logp.numel()]
    behavior = logp + offsets.view_as(logp)
    for batch_rewards in (rewards, -rewards.abs() - 1):
        loss, grad, metrics = loss_and_grad(logp, mask, behavior, batch_rewards,
                                            ObjectiveConfig(variant=variant, ratio_level=ratio_level), baselines)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_upcast(dtype):
    logp, mask, behavior, rewards, baselines = random_batch(5, per_token_behavior=False)
    logp = logp.to(dtype).requires_grad_(True)
    for variant in VARIANTS:
        loss, _ = policy_loss(logp, mask, behavior.to(dtype), rewards.to(dtype), ObjectiveConfig(variant=variant),
                              baselines)
        # Upcasting is exact, so fp32 input of the same values gives the same fp32 loss.
        fp32_loss, _ = policy_loss(logp.detach().float(), mask, behavior.to(dtype).float(), rewards.to(dtype).float(),
                                   ObjectiveConfig(variant=variant), baselines)
        assert loss.dtype == torch.float32 and loss.item() == fp32_loss.item()
        (grad,) = torch.autograd.grad(loss, logp)
        assert grad.dtype == dtype and torch.isfinite(grad).all()
        # Untruncated weights reach exp(max_log_ratio) = 4.9e8: past fp16's 65504 once cast back to the
        # input's dtype, hence the documented smaller max_log_ratio for fp16 importance sampling.
        fp16_safe = {"max_log_ratio": 10.0} if dtype == torch.float16 and variant == "importance_sampling" else {}
        extreme_behavior = (logp.detach().float() * mask).sum(-1) + torch.tensor([1e4, -1e4] * 3)
        loss, _ = policy_loss(logp, mask, extreme_behavior.to(dtype), rewards.to(dtype),
                              ObjectiveConfig(variant=variant, **fp16_safe), baselines)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_fp64_input_stays_fp64():
    logp, mask, behavior, rewards, _ = random_batch(5, per_token_behavior=False)
    assert policy_loss(logp, mask, behavior, rewards)[0].dtype == torch.float64


def test_padding_values_do_not_leak():
    logp, mask, behavior, rewards, _ = random_batch(6, per_token_behavior=True)
    padded = torch.where(mask, logp, -math.inf)
    for ratio_level in RATIO_LEVELS:
        config = ObjectiveConfig(ratio_level=ratio_level)
        expected = loss_and_grad(logp, mask, behavior, rewards, config)
        padded_behavior = torch.where(mask, behavior, math.nan)
        torch.testing.assert_close(loss_and_grad(padded, mask, padded_behavior, rewards, config)[:2], expected[:2])


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_gradient_reaches_behavior_logprobs(variant):
    logp, mask, behavior, rewards, baselines = random_batch(7, per_token_behavior=False)
    behavior = behavior.clone().requires_grad_(True)
    logp = logp.clone().requires_grad_(True)
    policy_loss(logp, mask, behavior, rewards, ObjectiveConfig(variant=variant), baselines)[0].backward()
    assert behavior.grad is None and logp.grad is not None


def test_topr_weight_is_a_constant():
    # Each negative row's gradient is rho_i (a number) times its REINFORCE gradient; a weight that
    # carried gradient would add a term rho_i (R_i - c) s_i d(log rho_i) / n_i to every token.
    logp, mask, _, _, _ = random_batch(8, per_token_behavior=False)
    rewards = torch.tensor([1.0, -1.0, -0.5, 1.0, -1.0, -2.0], dtype=torch.float64)
    behavior = (logp * mask).sum(-1) + torch.tensor([0.5, 1.0, 0.3, -0.5, -1.0, 2.0], dtype=torch.float64)
    _, topr_grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant="topr"))
    _, reinforce_grad, _ = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(variant="reinforce"))
    rho = torch.exp((logp * mask).sum(-1) - behavior)
    weights = torch.where(rewards < 0, rho.clamp(max=1.0), 1.0)
    torch.testing.assert_close(topr_grad, weights[:, None] * reinforce_grad)


# --- effective positive share -------------------------------------------------------------------

@pytest.mark.parametrize("num_positive", [1, 3, 7, 9])
@pytest.mark.parametrize("c", [-0.9, -0.5, 0.0, 0.4, 0.8])
def test_effective_positive_share_counts_gradient_mass(num_positive, c):
    B = 10
    rewards = torch.tensor([1.0] * num_positive + [-1.0] * (B - num_positive))
    logp = torch.full((B, 1), -0.7, dtype=torch.float64)
    behavior = logp[:, 0].clone()  # on-policy: rho = 1, TOPR weight 1 on both sides
    config = ObjectiveConfig(baseline=c, normalization="token_sum")
    _, grad, metrics = loss_and_grad(logp, torch.ones(B, 1), behavior, rewards, config)
    mass = grad[:, 0].abs()  # |w_i (R_i - c)| / B
    share = (mass[:num_positive].sum() / mass.sum()).item()
    p = num_positive / B
    assert effective_positive_share(p, c) == pytest.approx(share, rel=1e-12)
    assert metrics["effective_positive_share"] == pytest.approx(share, rel=1e-12)
    assert metrics["positive_share"] == pytest.approx(p)


@pytest.mark.parametrize("c", [-0.9, -0.5, 0.0, 0.4, 0.8])
def test_a_datasets_positive_share_at_a_scalar_baseline_is_the_closed_form(c):
    rewards = torch.tensor([1.0] * 3 + [-1.0] * 7, dtype=torch.float64)
    assert dataset_positive_share(rewards, ObjectiveConfig(baseline=c)) == pytest.approx(
        effective_positive_share(0.3, c), rel=1e-12)


def test_a_datasets_positive_share_with_per_sequence_baselines_is_the_batch_metric():
    # per-sequence c (asymre: b_i + deltaV), any rewards: the batch metric of policy_loss on the same
    # sequences, and by hand for c = b + 0.1 = (0.6, -0.4, 0.1): |0.4| / (|0.4| + |-0.1| + |-0.6|)
    rewards, group_means = torch.tensor([1.0, -0.5, -0.5]), torch.tensor([0.5, -0.5, 0.0])
    config = ObjectiveConfig(variant="asymre", asymre_delta_v=0.1)
    logp = torch.full((3, 1), -0.7, dtype=torch.float64)
    _, metrics = policy_loss(logp, torch.ones(3, 1), logp[:, 0], rewards, config, baseline=group_means)
    share = dataset_positive_share(rewards, config, group_means)
    assert share == pytest.approx(0.4 / 1.1, rel=1e-12) == pytest.approx(metrics["effective_positive_share"].item())
    # negative_rule="advantage": -0.5 with c = -0.9 (A = 0.4) is a positive
    by_advantage = ObjectiveConfig(variant="asymre", asymre_delta_v=0.1, negative_rule="advantage")
    assert dataset_positive_share(rewards, by_advantage, torch.tensor([0.5, -1.0, 0.0])) == pytest.approx(
        (0.4 + 0.4) / (0.4 + 0.4 + 0.6), rel=1e-12)
    assert dataset_positive_share(torch.tensor([1.0, 1.0]), ObjectiveConfig(baseline=1.0)) is None


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("target", [0.1, 0.15, 0.5, 0.95])
def test_baseline_for_share_inverts(p, target):
    c = baseline_for_share(p, target)
    assert -1 < c < 1
    assert effective_positive_share(p, c) == pytest.approx(target, rel=1e-12)
    assert (c > 0) == (target < p)


def test_effective_positive_share_limits():
    assert effective_positive_share(0.3, 0.0) == pytest.approx(0.3)
    assert effective_positive_share(0.3, -1.0) == 1.0  # c = -1 discards the negatives
    assert effective_positive_share(0.3, 1.0) == 0.0


@pytest.mark.parametrize("p, c, problem", [
    (-0.1, 0.0, "outside_domain"), (1.1, 0.0, "outside_domain"), (0.5, 1.5, "outside_domain"),
    (0.5, -1.01, "outside_domain"), (0.0, -1.0, "undefined"), (1.0, 1.0, "undefined"),  # 1 + c (1 - 2p) = 0
])
def test_effective_positive_share_domain(p, c, problem):
    with pytest.raises(ObjectiveError) as refused:
        effective_positive_share(p, c)
    assert refused.value.key == f"effective_positive_share.{problem}"


@pytest.mark.parametrize("p, target", [(0.0, 0.5), (1.0, 0.5), (0.5, 0.0), (0.5, 1.0), (1.5, 0.2)])
def test_baseline_for_share_domain(p, target):
    with pytest.raises(ObjectiveError) as refused:
        baseline_for_share(p, target)
    assert refused.value.key == "baseline_for_share.outside_domain"


# --- metrics ------------------------------------------------------------------------------------

def test_metrics_values():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, 0.0], [-0.5, -0.5], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0])
    behavior = torch.tensor([-4.0, -1.0, -1.0, -1.0], dtype=torch.float64)  # log rho = 0, -1, 0, -1
    _, metrics = policy_loss(logp, mask, behavior, rewards)
    # 0-dim tensors on the input's device: reading them is the caller's choice (a device sync)
    assert all(value.dim() == 0 and value.device == logp.device for value in metrics.values())
    metrics = {name: float(value) for name, value in metrics.items()}
    weights = [1.0, math.exp(-1.0), 1.0, 1.0]
    expected = {
        "num_sequences": 4, "num_positive": 2, "num_negative": 2, "num_tokens": 7,
        "positive_share": 0.5, "effective_positive_share": 0.5,
        "log_ratio_abs_mean": 0.5, "log_ratio_abs_max": 1.0,
        "negative_truncated_share": 0.5, "negative_weight_mean": (weights[1] + 1) / 2, "positive_weight_mean": 1.0,
        "weight_ess": sum(weights) ** 2 / sum(w * w for w in weights),
        "positive_logprob_mean": (-2.0 - 1.0) / 2, "negative_logprob_mean": (-2.0 - 0.5) / 2,
    }
    assert metrics == pytest.approx(expected)


def test_float_noise_in_rho_at_step_0_is_not_counted_as_truncation():
    """rho = exp(-1e-6) (pi and mu the same model, computed twice) is not a truncated weight;
    rho = 0.99 is."""
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -1.0], [-0.5, -0.5]], dtype=torch.float64)
    mask = torch.ones_like(logp, dtype=torch.long)
    rewards = torch.tensor([-1.0, -1.0, -1.0])
    behavior = logp.sum(-1) + torch.tensor([1e-6, 1e-6, -math.log(0.99)], dtype=torch.float64)
    _, metrics = policy_loss(logp, mask, behavior, rewards)
    assert float(metrics["negative_truncated_share"]) == pytest.approx(1 / 3)
    assert float(metrics["negative_weight_mean"]) == pytest.approx((2 * math.exp(-1e-6) + 0.99) / 3)


def test_metrics_of_empty_groups_are_zero():
    logp, mask, behavior, _, _ = random_batch(9, per_token_behavior=False)
    _, metrics = policy_loss(logp, mask, behavior, torch.ones(len(logp)))
    assert metrics["num_negative"] == 0
    assert metrics["negative_weight_mean"] == metrics["negative_logprob_mean"] == 0.0
    _, metrics = policy_loss(logp, mask, behavior, -torch.ones(len(logp)), ObjectiveConfig(variant="sft_positive"))
    assert metrics["num_positive"] == 0 and metrics["weight_ess"] == 0.0


# --- weight bounds (the objective's refusals: rows of tests/training/test_refusals_run.py) -------

def test_explicit_bounds_override_one_side_only():
    config = ObjectiveConfig(variant="topr", neg_upper=2.0, pos_lower=0.0)
    assert config.weight_bounds == (0.0, 1.0, 0.0, 2.0)
    assert ObjectiveConfig(variant="tis", pos_lower=1.0, pos_upper=1.0).weight_bounds == ObjectiveConfig().weight_bounds


@pytest.mark.parametrize("kwargs, uses", [
    ({"variant": "topr"}, True), ({"variant": "tis"}, True), ({"variant": "importance_sampling"}, True),
    ({"variant": "ppo_clip"}, True), ({"variant": "sft_positive"}, False), ({"variant": "reinforce"}, False),
    ({"variant": "asymre"}, False),
    ({"variant": "topr", "neg_lower": 1.0}, False),  # [1, 1] on both sides: reinforce's weights
    ({"variant": "reinforce", "pos_upper": 2.0}, True),  # positives in [1, 2]: rho decides them
])
def test_weights_use_the_ratio_unless_both_sides_bounds_fix_them(kwargs, uses):
    assert ObjectiveConfig(**kwargs).weights_use_ratio is uses


# --- boundaries, one row each (the random batches above rarely reach them) ------------------

# (reward R_i, baseline b_i, log rho_i): what each row is at the edge of
BOUNDARY_ROWS = [
    (0.0, 0.5, -0.75),      # R = 0 with a negative advantage, rho < 1
    (0.0, -0.5, -0.75),     # R = 0 with a positive advantage, rho < 1
    (0.0, 0.5, 0.0),        # R = 0, negative advantage, rho exactly 1
    (0.0, 0.0, 0.25),       # zero advantage: no gradient whatever the weight
    (-1.0, 0.0, -0.75),     # negative, rho < 1: weight rho under TOPR
    (-1.0, 0.0, 0.0),       # negative, rho exactly 1
    (-1.0, 0.0, 0.875),     # negative, rho > 1: truncated to 1
    (1.0, 0.0, -0.75),      # positive, rho < 1: weight 1 under TOPR, rho under TIS
    (1.0, 0.0, 2.5),        # positive, rho > 1: rho under importance sampling
    (-0.5, -0.75, -2.0),    # negative reward, positive advantage: the two negative rules disagree
]


def boundary_batch():
    """Rows of BOUNDARY_ROWS with different lengths and token log-probs; log mu set so that
    s_i - log mu_i is exactly the row's log rho (values exact in binary)."""
    B, T = len(BOUNDARY_ROWS), 4
    logp = torch.tensor([[-0.25 - 0.125 * ((i + t) % 5) for t in range(T)] for i in range(B)], dtype=torch.float64)
    mask = torch.tensor([[t < 1 + i % T for t in range(T)] for i in range(B)])
    s = (logp * mask).sum(-1)
    rewards, baselines, log_rho = (torch.tensor(column, dtype=torch.float64) for column in zip(*BOUNDARY_ROWS))
    assert torch.equal(s - (s - log_rho), log_rho)
    return logp, mask, s - log_rho, rewards, baselines


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("negative_rule", ["reward", "advantage"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_boundary_rows_match_closed_form(variant, negative_rule, normalization):
    config = ObjectiveConfig(variant=variant, negative_rule=negative_rule, normalization=normalization)
    logp, mask, behavior, rewards, baselines = boundary_batch()
    loss, grad, _ = loss_and_grad(logp, mask, behavior, rewards, config, baselines)
    expected_loss, expected_grad = reference(logp.tolist(), mask.tolist(), behavior.tolist(), rewards.tolist(),
                                             config, baselines.tolist())
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12, abs=1e-15)


def test_topr_boundary_weights_by_hand():
    """TOPR, reward rule, sequence mean: d loss / d log pi_it = -w_i A_i / (B n_i), with w_i
    written down per row (R = 0 counts as positive: weight 1 whatever rho)."""
    logp, mask, behavior, rewards, baselines = boundary_batch()
    _, grad, metrics = loss_and_grad(logp, mask, behavior, rewards, ObjectiveConfig(), baselines)
    weights = [1.0, 1.0, 1.0, 1.0, math.exp(-0.75), 1.0, 1.0, 1.0, 1.0, math.exp(-2.0)]
    advantages = [-0.5, 0.5, -0.5, 0.0, -1.0, -1.0, -1.0, 1.0, 1.0, 0.25]
    B, n = len(weights), mask.sum(-1).tolist()
    for i in range(B):
        expected = -weights[i] * advantages[i] / (B * n[i])
        assert grad[i][mask[i]].tolist() == pytest.approx([expected] * n[i], rel=1e-12, abs=0), i
        assert not grad[i][~mask[i]].any()
    assert grad[5][mask[5]].tolist() == [1.0 / (B * n[5])] * n[5]  # rho exactly 1: weight exactly 1
    assert metrics["num_negative"] == 4 and metrics["negative_truncated_share"] == pytest.approx(2 / 4)
