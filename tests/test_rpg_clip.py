"""RPG-Style Clip (paper 3.3, Appendix G, Algorithms 1-2; docs/math.md section 3).

The gradient coefficient g (loss gradient = -g * grad logp) is checked token by token against the section 3
table, written out independently here.
"""

import math

import pytest
import torch

from trl_rpg.objectives.per_token import DIVERGENCES, rpg_per_token_loss

EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0
CLIP = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=C)


def kl_weight(divergence, w, log_rho, beta):
    """C_KL of docs/math.md section 2, as a function of the ratio w (log r = log w - log rho)."""
    rho, log_r = math.exp(log_rho), math.log(w) - log_rho
    return {"fkl": beta * rho, "ufkl": beta * (rho - w), "rkl": -beta * w * (log_r + 1), "urkl": -beta * w * log_r}[
        divergence
    ]


def coefficient(log_w, adv, divergence, estimator="reinforce", log_rho=0.0, beta=0.5, **clip):
    """-d loss / d logp for one token with the given log-ratio."""
    logp = torch.tensor([[log_w]], dtype=torch.float64, requires_grad=True)
    loss, stats = rpg_per_token_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64), ref_logps=torch.full((1, 1), log_rho, dtype=torch.float64),
        divergence=divergence, estimator=estimator, beta=beta, **clip,
    )
    loss.sum().backward()
    return -logp.grad.item(), stats


def clip_ratio(x):
    return min(max(x, 1 - EPS_LOW), 1 + EPS_HIGH)


def expected_g(log_w, adv, divergence, log_rho=0.0, beta=0.5):
    """The section 3 table, from its definition: C_bar is C_KL inside the trust region (1 - eps_low < w < 1 + eps_high,
    strict: a token on a bound is outside) and, outside it, C_KL at the clipped pair (w_bar, r_bar), i.e. at w_bar with
    log rho_bar = log w_bar - log r_bar."""
    w = math.exp(log_w)
    w_bar = clip_ratio(w)
    if 1 - EPS_LOW < w < 1 + EPS_HIGH:
        c_bar = kl_weight(divergence, w, log_rho, beta)
    else:
        r_bar = clip_ratio(math.exp(log_w - log_rho))
        c_bar = kl_weight(divergence, w_bar, math.log(w_bar) - math.log(r_bar), beta)
    effective = adv + c_bar / w
    if effective >= 0:
        return 0.0 if w >= 1 + EPS_HIGH else w * adv + c_bar
    if w <= 1 - EPS_LOW or w >= C:
        return 0.0
    return w * adv + c_bar


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("log_rho", [0.0, 0.3])
def test_inside_trust_region_clip_changes_nothing(divergence, log_rho):
    for w in [0.81, 0.95, 1.0, 1.1, 1.27]:
        for adv in [-1.0, -0.01, 0.0, 0.02, 1.5]:
            clipped, _ = coefficient(math.log(w), adv, divergence, log_rho=log_rho, **CLIP)
            unclipped, _ = coefficient(math.log(w), adv, divergence, log_rho=log_rho)
            assert clipped == pytest.approx(unclipped, abs=1e-12)
            assert unclipped == pytest.approx(w * adv + kl_weight(divergence, w, log_rho, 0.5), abs=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("log_rho", [0.0, -0.2, 0.9])
def test_reinforce_clip_follows_the_table(divergence, log_rho):
    for w in [0.3, 0.79, 0.8, 0.9, 1.2, 1.28, 1.5, 2.9, 3.0, 6.0]:
        for adv in [-2.0, -0.3, -0.05, 0.0, 0.05, 0.3, 2.0]:
            g, _ = coefficient(math.log(w), adv, divergence, log_rho=log_rho, **CLIP)
            assert g == pytest.approx(expected_g(math.log(w), adv, divergence, log_rho), abs=1e-12), (w, adv)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_each_zero_gradient_region_gives_zero_gradient(divergence):
    beta = 1e-3  # small: A' has the sign of A here
    high, s_high = coefficient(math.log(1.5), 1.0, divergence, beta=beta, **CLIP)
    low, s_low = coefficient(math.log(0.5), -1.0, divergence, beta=beta, **CLIP)
    dual, s_dual = coefficient(math.log(5.0), -1.0, divergence, beta=beta, **CLIP)
    assert (high, low, dual) == (0.0, 0.0, 0.0)
    assert (s_high["clip_frac_high"], s_low["clip_frac_low"], s_dual["clip_frac_dual"]) == (1.0, 1.0, 1.0)
    # the mirror regions keep their gradient: A > 0 with small w, A < 0 with 1 + eps_high <= w < c
    assert coefficient(math.log(0.5), 1.0, divergence, beta=beta, **CLIP)[0] != 0.0
    assert coefficient(math.log(2.0), -1.0, divergence, beta=beta, **CLIP)[0] != 0.0
    # without a dual-clip bound, large w with negative advantage keeps its gradient
    no_dual = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    assert coefficient(math.log(5.0), -1.0, divergence, beta=beta, **no_dual)[0] != 0.0


def test_branch_follows_effective_advantage_not_reward_advantage():
    """A > 0 but the KL component makes A' < 0: with w beyond 1 + eps_high the token keeps its gradient
    (A' < 0 and w < c), whereas branching on A would have zeroed it."""
    w, adv, beta = 1.5, 0.05, 1.0
    w_bar = 1 + EPS_HIGH
    c_bar = -beta * w_bar * math.log(w_bar)  # URKL, rho = 1
    assert adv + c_bar / w < 0 < adv
    g, stats = coefficient(math.log(w), adv, "urkl", beta=beta, **CLIP)
    assert g == pytest.approx(w * adv + c_bar, abs=1e-12) and g != 0.0
    assert stats["clip_frac_high"] == 0.0
    # and the converse: A < 0 but A' >= 0 (FKL adds +beta*rho) with w <= 1 - eps_low keeps its gradient
    w, adv = 0.5, -0.1
    g, stats = coefficient(math.log(w), adv, "fkl", beta=beta, **CLIP)
    assert g == pytest.approx(w * adv + beta, abs=1e-12) and g != 0.0
    assert stats["clip_frac_low"] == 0.0


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_differentiable_estimator_dual_clip(divergence):
    """Algorithm 1: dual-clip PPO on the reward term, unclipped KL term."""
    beta = 0.1

    def kl_grad(w):  # gradient coefficient of the differentiable KL term alone: -C_KL
        return kl_weight(divergence, w, 0.0, beta)

    for w, adv, reward_part in [
        (1.1, 1.0, 1.1),  # inside: -w*A flows
        (1.5, 1.0, 0.0),  # A > 0 above 1 + eps_high: clipped
        (0.5, 1.0, 0.5),  # A > 0 below 1 - eps_low: min picks w*A, flows
        (0.5, -1.0, 0.0),  # A < 0 below 1 - eps_low: clipped
        (2.0, -1.0, -2.0),  # A < 0 between 1 + eps_high and c: flows
        (5.0, -1.0, 0.0),  # A < 0 beyond c: dual clip
    ]:
        g, _ = coefficient(math.log(w), adv, divergence, "differentiable", beta=beta, **CLIP)
        assert g == pytest.approx(reward_part + kl_grad(w), abs=1e-12), (w, adv)


# The table's boundaries are inclusive (w >= 1 + eps_high, w <= 1 - eps_low and w >= c give g = 0). To test them,
# w must equal the bound bit for bit: each bound below is exp(x) of a float x computed by torch in the test's dtype,
# and the token's log-ratio is exactly x (logp - logmu with logmu = 0), so the objective's exp(log w) is the bound.


def _exp(x: float, dtype) -> float:
    return torch.tensor(x, dtype=dtype).exp().item()


def _boundary_coefficient(log_w, adv, divergence, dtype, **clip):
    logp = torch.tensor([[log_w]], dtype=dtype, requires_grad=True)
    loss, stats = rpg_per_token_loss(logp, torch.zeros(1, 1, dtype=dtype), torch.tensor([adv], dtype=dtype),
                                     torch.ones(1, 1, dtype=dtype), divergence=divergence, estimator="reinforce",
                                     beta=0.0, **clip)
    loss.sum().backward()
    return -logp.grad.item(), stats


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dual_clip_bound_is_inclusive_at_w_equal_c(divergence, dtype):
    """A' < 0 and w == c exactly: the table's `w >= c` row, g = 0 (a `w > c` test would let it through)."""
    c = _exp(1.0, dtype)  # c = e, and log w = 1.0 exactly
    assert torch.tensor(1.0, dtype=dtype).exp().item() == c
    g, stats = _boundary_coefficient(1.0, -1.0, divergence, dtype, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                                     dual_clip_c=c)
    assert g == 0.0 and stats["clip_frac_dual"].item() == 1.0
    # just below c the token keeps its gradient g = w * A
    below = 0.999
    assert _exp(below, dtype) < c
    g, stats = _boundary_coefficient(below, -1.0, divergence, dtype, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                                     dual_clip_c=c)
    assert g == pytest.approx(-_exp(below, dtype), rel=1e-6) and stats["clip_frac_dual"].item() == 0.0


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_trust_region_bounds_are_inclusive(divergence):
    """A' >= 0 with w == 1 + eps_high and A' < 0 with w == 1 - eps_low, exactly: g = 0 (float64, where
    1 + (e^x - 1) and 1 - (1 - e^-x) round back to e^x and e^-x exactly)."""
    dtype = torch.float64
    upper, lower = _exp(0.25, dtype), _exp(-0.25, dtype)
    eps_high, eps_low = upper - 1.0, 1.0 - lower
    assert 1.0 + eps_high == upper and 1.0 - eps_low == lower
    clip = {"epsilon_low": eps_low, "epsilon_high": eps_high, "dual_clip_c": 10.0}
    g, stats = _boundary_coefficient(0.25, 1.0, divergence, dtype, **clip)
    assert g == 0.0 and stats["clip_frac_high"].item() == 1.0
    g, stats = _boundary_coefficient(-0.25, -1.0, divergence, dtype, **clip)
    assert g == 0.0 and stats["clip_frac_low"].item() == 1.0


def test_dual_clip_bound_is_for_negative_effective_advantages_only():
    """A' > 0 with c < w < 1 + eps_high (c = 1.2, w = 1.25 < 1.28): the dual-clip row is for A' < 0, so the token
    keeps g = w * A (d loss / d logp = -1.25) and is not counted as dual-clipped."""
    clip = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=1.2)
    g, stats = coefficient(math.log(1.25), 1.0, "urkl", beta=0.0, **clip)
    assert g == pytest.approx(1.25, abs=1e-12)
    assert stats["clip_frac_dual"].item() == 0.0 and stats["clip_frac_high"].item() == 0.0
    # the same w with A' < 0 is dual-clipped
    g, stats = coefficient(math.log(1.25), -1.0, "urkl", beta=0.0, **clip)
    assert g == 0.0 and stats["clip_frac_dual"].item() == 1.0


def test_zero_advantage_token_is_not_counted_as_clipped():
    """A = 0 and beta = 0 (A' = 0) with w = 1.5 above 1 + eps_high: g is 0 whatever the clip, so the token is in no
    clip region (`clip_frac_high` 0); with A > 0 the same w is counted."""
    g, stats = coefficient(math.log(1.5), 0.0, "urkl", beta=0.0, **CLIP)
    assert g == 0.0
    assert stats["clip_frac_high"].item() == 0.0 and stats["clip_frac_high_seq_max"].item() == 0.0
    g, stats = coefficient(math.log(1.5), 1.0, "urkl", beta=0.0, **CLIP)
    assert g == 0.0 and stats["clip_frac_high"].item() == 1.0
