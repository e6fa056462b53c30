"""Numerics and argument checking of `rpg_per_token_loss`: extreme ratios, NaN inputs, masking, ValueErrors."""

import math

import pytest
import torch

from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, LOG_RATIO_BOUND, rpg_per_token_loss

PAIRS = [(d, e) for d in DIVERGENCES for e in ESTIMATORS]
CLIPS = [{}, dict(epsilon_low=0.2, epsilon_high=0.28, dual_clip_c=10.0)]


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clip", CLIPS)
def test_extreme_log_ratios_give_finite_loss_and_gradient(divergence, estimator, dtype, clip):
    log_w = torch.tensor([-80.0, -40.0, -20.0, -1.0, 0.0, 1.0, 20.0, 40.0, 80.0])
    logmu = torch.full_like(log_w, -3.0)
    logp = (logmu + log_w).to(dtype).unsqueeze(0).repeat(2, 1).requires_grad_(True)
    ref = torch.stack([logmu + 80.0, logmu - 80.0]).to(dtype)  # rho = e^80 and e^-80
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    loss, stats = rpg_per_token_loss(logp, logmu.expand(2, -1).to(dtype), adv, torch.ones_like(logp),
                                     ref_logps=ref, divergence=divergence, estimator=estimator, beta=0.1, **clip)
    loss.sum().backward()
    assert torch.isfinite(loss).all()
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("which", ["sampling", "ref", "advantage"])
def test_nan_inputs_are_excluded_and_counted(divergence, estimator, which):
    torch.manual_seed(0)
    logp = (torch.randn(3, 5, dtype=torch.float64) - 2).requires_grad_(True)
    logmu = logp.detach() + 0.1 * torch.randn(3, 5, dtype=torch.float64)
    ref = logp.detach() + 0.1 * torch.randn(3, 5, dtype=torch.float64)
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    mask[2, 3:] = 0
    bad = torch.zeros(3, 5, dtype=torch.bool)
    bad[0, 1] = bad[1, 4] = bad[2, 4] = True  # (2, 4) is masked out anyway: excluded but not counted
    tensors = {"sampling": logmu, "ref": ref, "advantage": adv}
    corrupted = {k: v.clone() for k, v in tensors.items()}
    corrupted[which][bad] = float("nan")
    kwargs = dict(divergence=divergence, estimator=estimator, beta=0.3)

    loss, stats = rpg_per_token_loss(logp, corrupted["sampling"], corrupted["advantage"], mask,
                                     ref_logps=corrupted["ref"], **kwargs)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert stats["excluded_tokens"].item() == 2
    assert stats["valid_tokens"].item() == mask.sum().item() - 2
    assert (loss[bad] == 0).all() and (logp.grad[bad] == 0).all()

    # the remaining tokens are untouched: same loss as with the bad tokens masked out
    clean_mask = mask.clone()
    clean_mask[bad] = 0
    ref_loss, ref_stats = rpg_per_token_loss(logp.detach(), logmu, adv, clean_mask, ref_logps=ref, **kwargs)
    torch.testing.assert_close(loss.detach(), ref_loss)
    torch.testing.assert_close(stats["divergence"], ref_stats["divergence"])


def test_loss_is_exactly_zero_outside_the_mask():
    torch.manual_seed(1)
    logp = torch.randn(4, 6, requires_grad=True)
    mask = (torch.rand(4, 6) > 0.4).float()
    loss, _ = rpg_per_token_loss(logp, logp.detach() - 0.2, torch.randn(4), mask, beta=0.1)
    assert (loss[mask == 0] == 0).all()
    assert (loss[mask == 1] != 0).all()


def test_bfloat16_inputs_are_computed_in_float32():
    logp = torch.randn(2, 3).to(torch.bfloat16)
    loss, _ = rpg_per_token_loss(logp, logp, torch.ones(2), torch.ones(2, 3))
    assert loss.dtype == torch.float32


def _args():
    logp = torch.zeros(2, 3)
    return (logp, logp.clone(), torch.zeros(2), torch.ones(2, 3))


@pytest.mark.parametrize(
    "change,argument",
    [
        (dict(divergence="kl"), "divergence"),
        (dict(estimator="ppo"), "estimator"),
        (dict(beta=-1.0), "beta"),
        (dict(beta=float("nan")), "beta"),
        (dict(epsilon_low=-0.1), "epsilon_low"),
        (dict(epsilon_low=0.0), "epsilon_low"),
        (dict(epsilon_low=0.2, epsilon_high=0.0), "epsilon_high"),
        (dict(epsilon_low=0.2, epsilon_high=-0.1), "epsilon_high"),
        (dict(epsilon_high=0.2), "epsilon_high"),
        (dict(epsilon_low=0.2, dual_clip_c=1.0), "dual_clip_c"),
        (dict(epsilon_low=0.2, dual_clip_c=0.5), "dual_clip_c"),
        (dict(dual_clip_c=3.0), "dual_clip_c"),
        (dict(ref_logps=torch.zeros(2, 4)), "ref_logps"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_argument(change, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        rpg_per_token_loss(*_args(), **change)


@pytest.mark.parametrize(
    "position,value,argument",
    [
        (1, torch.zeros(2, 4), "sampling_logps"),
        (2, torch.zeros(3), "advantages"),
        (3, torch.ones(2, 3, dtype=torch.long), "mask"),
        (3, torch.ones(2, 3, dtype=torch.bool), "mask"),
        (3, torch.ones(2, 4), "mask"),
        (0, torch.zeros(6), "logps"),
    ],
)
def test_bad_tensors_raise_value_error_naming_the_argument(position, value, argument):
    args = list(_args())
    args[position] = value
    with pytest.raises(ValueError, match=f"`{argument}`"):
        rpg_per_token_loss(*args)


def test_zero_clip_width_is_rejected_because_it_would_clip_w_equal_one():
    """With eps = 0 the trust region is the single point w = 1, which the clip table puts on the boundary: every
    on-policy token would get no gradient. Widths must be > 0 (docs/math.md section 3)."""
    with pytest.raises(ValueError, match="`epsilon_low` must be > 0"):
        rpg_per_token_loss(*_args(), epsilon_low=0.0, epsilon_high=0.28)
    # the smallest positive widths keep every on-policy token's gradient
    logp = torch.randn(2, 3, requires_grad=True)
    loss, stats = rpg_per_token_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 3),
                                     epsilon_low=1e-6, epsilon_high=1e-6, dual_clip_c=10.0)
    loss.sum().backward()
    assert (logp.grad != 0).all()
    assert stats["clip_frac_high"] == stats["clip_frac_low"] == 0.0


def _realistic_logps(log_ratio: torch.Tensor):
    """(logp, logmu) with logp - logmu = log_ratio and both log-probabilities <= 0."""
    logp = torch.where(log_ratio > 0, torch.full_like(log_ratio, -1.0), -1.0 + log_ratio)
    return logp, logp - log_ratio


#: Beyond float32's exp overflow (log 3.4e38 = 88.7) and float64's (709.8); |log w| = 80 reaches neither.
BEYOND_OVERFLOW = [-1000.0, -100.0, -89.0, 89.0, 100.0, 1000.0]


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("clip", CLIPS)
def test_log_ratio_beyond_exp_overflow_saturates(divergence, estimator, dtype, clip):
    """log w beyond the overflow of `exp`: without the clamp to LOG_RATIO_BOUND, w = inf (or 0 * inf = NaN).
    The ratio saturates at exp(LOG_RATIO_BOUND) and loss, gradient and statistics stay finite."""
    log_w = torch.tensor(BEYOND_OVERFLOW, dtype=torch.float64)
    logp, logmu = _realistic_logps(log_w)
    logp = logp.to(dtype).unsqueeze(0).repeat(2, 1).requires_grad_(True)
    logmu = logmu.to(dtype).unsqueeze(0).repeat(2, 1)
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    loss, stats = rpg_per_token_loss(logp, logmu, adv, torch.ones_like(logp), divergence=divergence,
                                     estimator=estimator, beta=0.1, **clip)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
    compute = torch.promote_types(dtype, torch.float32)
    assert stats["w_max"].item() == torch.tensor(LOG_RATIO_BOUND, dtype=compute).exp().item()


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_ratio_beyond_exp_overflow_stays_finite(divergence, estimator, dtype):
    """log rho = log(pi_ref / mu) beyond the overflow of `exp` (rho = inf unclamped): finite loss, gradient and
    divergence estimate."""
    log_rho = torch.tensor([[-1000.0, -100.0, 100.0, 1000.0]], dtype=torch.float64).repeat(2, 1)
    ref, logmu = _realistic_logps(log_rho)
    logp = (logmu + 0.5).to(dtype).requires_grad_(True)  # log w = 0.5: only rho is extreme
    ref, logmu = ref.to(dtype), logmu.to(dtype)
    loss, stats = rpg_per_token_loss(logp, logmu, torch.tensor([1.0, -1.0], dtype=dtype), torch.ones_like(logp),
                                     ref_logps=ref, divergence=divergence, estimator=estimator, beta=0.1)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


# ----------------------------------------------------------------------------------------------------------------
# Issue 34 section 4: the edges (docs/math.md section 3, numerics and the "inside" test)
# ----------------------------------------------------------------------------------------------------------------


def kl_coefficient(logp, logmu, logref, adv, divergence, estimator="reinforce", beta=0.5):
    """-d loss / d logp of single float32 tokens under the paper's clip (eps 0.2 / 0.28, c = 10)."""
    logp = torch.tensor([[logp]], dtype=torch.float32, requires_grad=True)
    loss, _ = rpg_per_token_loss(logp, torch.tensor([[logmu]]), torch.tensor([adv]), torch.ones(1, 1),
                                 ref_logps=torch.tensor([[logref]]), divergence=divergence, estimator=estimator,
                                 beta=beta, epsilon_low=0.2, epsilon_high=0.28, dual_clip_c=10.0)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return -grad.item()


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("divergence", ["rkl", "urkl"])
@pytest.mark.parametrize("ref_prob", [1e-10, 1e-13])
def test_kl_weight_inside_the_trust_region_uses_the_exact_log_r_beyond_the_exp_bound(divergence, estimator,
                                                                                        ref_prob):
    """A token the reference gave 1e-10 (1e-13) that the sampler now gives 0.5: |log rho| = 22.3 (29.2) > 20. With
    w = 1.05 (inside the trust region) the KL weight is the exact one, from log r = logp - logref; log r built from
    log-ratios clamped to +-20 gave 0.90x (0.70x) of it."""
    logmu, w = math.log(0.5), 1.05
    logp, logref = logmu + math.log(w), math.log(ref_prob)
    log_r = logp - logref
    assert abs(logref - logmu) > LOG_RATIO_BOUND
    exact = {"rkl": -0.5 * w * (log_r + 1), "urkl": -0.5 * w * log_r}[divergence]
    assert kl_coefficient(logp, logmu, logref, 0.0, divergence, estimator) == pytest.approx(exact, rel=2e-6)


@pytest.mark.parametrize("case", ["on the lower bound, fkl", "on the upper bound, urkl"])
def test_a_ratio_exactly_on_a_bound_is_outside_the_trust_region_for_the_kl_part_too(case):
    """w exactly float32(0.8) or float32(1.28): the clip table counts the token as outside (strict comparisons), so
    its KL part is the clipped one, bounded, evaluated on the same float32 w. The test in log space counted it inside
    and gave the exact, unbounded KL part (FKL with r = e^-18: 2.6e7 instead of 0.5)."""
    beta, eps_low, eps_high = 0.5, 0.2, 0.28
    if case.startswith("on the lower"):
        w, log_r, adv, divergence = 1 - eps_low, -18.0, 0.0, "fkl"
        expected = beta * w / (1 - eps_low)  # A' >= 0, w <= 1 - eps_low: live, C_bar = beta * w_bar * (1 / r_bar)
    else:
        w, log_r, adv, divergence = 1 + eps_high, 18.0, -1.0, "urkl"
        expected = w * adv - beta * w * math.log(1 + eps_high)  # A' < 0, 1 + eps_high <= w < c: live
    logp = float(torch.tensor(math.log(w), dtype=torch.float32))
    assert torch.exp(torch.tensor(logp)) == torch.tensor(w, dtype=torch.float32)  # exactly the bound in float32
    assert kl_coefficient(logp, 0.0, logp - log_r, adv, divergence) == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Issue 45: exp arguments bounded above only (docs/math.md section 3, numerics)
# ----------------------------------------------------------------------------------------------------------------


def kl_part(log_w, log_rho, divergence, estimator, dtype, clip):
    """-d loss / d logp of one token with A = 0 (the KL part alone), beta = 0.5, the sampler at log-prob -1."""
    logmu = torch.tensor([[-1.0]], dtype=dtype)
    logp = (logmu + log_w).requires_grad_(True)
    loss, stats = rpg_per_token_loss(logp, logmu, torch.zeros(1, dtype=dtype), torch.ones(1, 1, dtype=dtype),
                                     ref_logps=logmu + log_rho, divergence=divergence, estimator=estimator,
                                     beta=0.5, **clip)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return -grad.item(), stats


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["fkl, inside the trust region", "fkl, no clip", "ufkl, no clip"])
def test_a_tiny_rho_is_exact_no_lower_bound_on_exp(case, estimator, dtype):
    """log rho = -30 (a token the reference gives e^-30 of the sampler's probability): FKL's KL part beta*rho and
    UFKL's beta*(rho - w) (here with log w = -31) are exact to float rounding. A lower bound of -20 on the arguments
    of exp made them e^10 = 2.2e4 times too large (UFKL's: 0, both ratios at e^-20)."""
    divergence = case.split(",")[0]
    clip = CLIPS[1] if "inside" in case else CLIPS[0]
    log_w, log_rho = (0.05, -30.0) if divergence == "fkl" else (-31.0, -30.0)
    got, _ = kl_part(log_w, log_rho, divergence, estimator, dtype, clip)
    exact = 0.5 * math.exp(log_rho) if divergence == "fkl" else 0.5 * (math.exp(log_rho) - math.exp(log_w))
    assert got == pytest.approx(exact, rel=1e-4)


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("log_ratio", [30.0, 88.0, 100.0, 1000.0])
def test_a_large_positive_log_rho_or_log_w_stays_finite(divergence, estimator, log_ratio):
    """Above, the bound stays: exp(log rho) and exp(log w) overflow float32 near +88.7."""
    for log_w, log_rho in ((0.05, log_ratio), (log_ratio, 0.0)):
        for clip in CLIPS:
            got, stats = kl_part(log_w, log_rho, divergence, estimator, torch.float32, clip)
            assert math.isfinite(got) and all(torch.isfinite(v) for v in stats.values())
