"""docs/math.md, "The KL vocabulary": other libraries' KL options in RPG's terms, proved by exact enumeration.

Float64, one-token completions over a 7-way categorical (tests/_enumeration.py).

Other libraries' KL options are written here from their documented definitions, as a per-token term `ell` that
the library multiplies by its KL coefficient and adds to the loss (or, for a penalty in the reward, the part of
the policy-gradient loss `-w * A` that the penalty contributes):

- TRL's `GRPOTrainer`: `k3(pi_ref / pi_theta)`, times `w` with `use_bias_correction_kl=True` (TRL 1.16's default).
- verl's `actor.kl_loss_type` (`use_kl_loss=True`) and OpenRLHF's `--algo.kl.estimator` with `--algo.kl.use_loss`:
  k1, k2, k3 (= verl's `low_var_kl`) of `log r = logp - logref`; verl's `k1+` / `k3+`: the value of k1 / k3 with
  the gradient of k2 (straight-through); verl's `abs`.
- A penalty in the reward (verl's `algorithm.use_kl_in_reward`, OpenRLHF without `use_loss`): `k(log mu - logref)`
  computed at the sampler when the batch is generated, subtracted from the reward, so the loss gains
  `w * SG(k)` through the ratio `w` of the PPO term.

For each, the expected gradient `E_mu[grad ell]` is compared with the gradient of the divergence the table names,
on-policy (the sampler is the current policy, `w = 1` in value) and off-policy (`mu != pi`, `w != 1`), for a
softmax policy and for an unnormalised measure `pi = exp(theta)` (which separates KL from UKL: their gradients
agree when `sum pi = 1`).
"""

import pytest
import torch
from _enumeration import analytic_objective, grad_of, make_problem

from trl_rpg.objectives.per_token import DIVERGENCES, rpg_per_token_loss


def k3(log_y):
    """Schulman's k3(y) = y - log y - 1, from log y."""
    return log_y.exp() - log_y - 1.0


def straight_through(value, gradient_of):
    """`value` in the forward pass, the gradient of `gradient_of` in the backward pass (verl's `+` suffix)."""
    return gradient_of - gradient_of.detach() + value.detach()


# name -> ell(logp, logmu, logref); logmu and logref are constants, logp carries the gradient.
TERMS = {
    "trl_k3": lambda lp, lmu, lref: k3(lref - lp),  # also verl k3/low_var_kl and OpenRLHF k3 as a loss
    "trl_k3_w": lambda lp, lmu, lref: (lp - lmu).exp() * k3(lref - lp),
    "k1_loss": lambda lp, lmu, lref: lp - lref,
    "k2_loss": lambda lp, lmu, lref: 0.5 * (lp - lref) ** 2,
    "k1plus_loss": lambda lp, lmu, lref: straight_through(lp - lref, 0.5 * (lp - lref) ** 2),
    "k3plus_loss": lambda lp, lmu, lref: straight_through(k3(lref - lp), 0.5 * (lp - lref) ** 2),
    "abs_loss": lambda lp, lmu, lref: (lp - lref).abs(),
    "k1_reward": lambda lp, lmu, lref: (lp - lmu).exp() * (lmu - lref),
    "k2_reward": lambda lp, lmu, lref: (lp - lmu).exp() * 0.5 * (lmu - lref) ** 2,
    "k3_reward": lambda lp, lmu, lref: (lp - lmu).exp() * k3(lref - lmu),
}

# name -> the per-token coefficient c of its gradient, grad ell = c * grad logp, in w, rho, log r (the table)
COEFFICIENTS = {
    "trl_k3": lambda w, rho, log_r: 1.0 - rho / w,
    "trl_k3_w": lambda w, rho, log_r: w * log_r,
    "k1_loss": lambda w, rho, log_r: torch.ones_like(w),
    "k2_loss": lambda w, rho, log_r: log_r,
    "k1plus_loss": lambda w, rho, log_r: log_r,
    "k3plus_loss": lambda w, rho, log_r: log_r,
    "abs_loss": lambda w, rho, log_r: torch.sign(log_r),
    "k1_reward": lambda w, rho, log_r: -w * rho.log(),
    "k2_reward": lambda w, rho, log_r: 0.5 * w * rho.log() ** 2,
    "k3_reward": lambda w, rho, log_r: w * (rho - rho.log() - 1.0),
}


def divergence(name: str, pi, ref):
    """The objectives of the table, from their definitions (pi may be an unnormalised measure)."""
    if name in DIVERGENCES:  # analytic_objective returns E_pi[R] - beta * D; with R = 0 and beta = 1 it is -D
        return -analytic_objective(pi, ref, torch.zeros_like(pi), 1.0, name)
    log_r = pi.log() - ref.log()
    if name == "mass":  # total mass sum pi: its gradient is 0 on the softmax family
        return pi.sum()
    if name == "l1":  # sum |pi - ref| = 2 TV(pi, ref)
        return (pi - ref).abs().sum()
    if name == "k2_reward":  # sum_x ref F(pi/ref) with F' = k2 = log^2/2: E_pi[log^2 r / 2 - log r] + sum pi
        return (pi * (0.5 * log_r**2 - log_r) + pi).sum()
    if name == "urkl_minus_ufkl":  # k3 in the reward: F' = k3(1/t) = 1/t + log t - 1
        return divergence("urkl", pi, ref) - divergence("ufkl", pi, ref)
    raise AssertionError(name)


# name -> (what its on-policy gradient is on an unnormalised measure, on the softmax family, exact off-policy?)
ON_POLICY = {
    "trl_k3": ("ufkl", "fkl", False),
    "trl_k3_w": ("urkl", "rkl", True),
    "k1_loss": ("mass", None, False),  # None: zero on the softmax family
    "k2_loss": ("urkl", "rkl", False),
    "k1plus_loss": ("urkl", "rkl", False),
    "k3plus_loss": ("urkl", "rkl", False),
    "abs_loss": ("l1", "l1", False),
    "k1_reward": ("urkl", "rkl", False),
    "k2_reward": ("k2_reward", "k2_reward", False),
    "k3_reward": ("urkl_minus_ufkl", "urkl_minus_ufkl", False),
}


def policy(theta, normalised: bool):
    """log pi: a softmax policy, or the unnormalised measure exp(theta) (total mass e^0.3 at theta below)."""
    return torch.log_softmax(theta, 0) if normalised else theta


def expected_gradient(theta, term, ref, mu=None, normalised=True):
    """E_mu[grad ell] by enumeration; mu=None is on-policy (weights SG(pi), so w = 1 in value)."""

    def expectation(t):
        logp = policy(t, normalised)
        weights = logp.detach().exp() if mu is None else mu
        logmu = weights.log()
        return (weights * TERMS[term](logp, logmu, ref.log())).sum()

    return grad_of(expectation, theta)


def problem(seed):
    theta, mu, ref, _, _ = make_problem(seed, distinct_reference=True)
    return theta, mu, ref


def analytic_gradient(name, theta, ref, normalised):
    if name is None:
        return torch.zeros_like(theta)
    return grad_of(lambda t: divergence(name, policy(t, normalised).exp(), ref), theta)


@pytest.mark.parametrize("term", list(TERMS))
@pytest.mark.parametrize("normalised", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_on_policy_gradient_is_the_tables_objective(term, normalised, seed):
    theta, _, ref = problem(seed)
    if not normalised:
        theta = torch.log_softmax(theta, 0) + 0.3  # a measure of mass e^0.3: KL and UKL gradients differ
    measure_target, softmax_target, _ = ON_POLICY[term]
    target = softmax_target if normalised else measure_target
    got = expected_gradient(theta, term, ref, normalised=normalised)
    torch.testing.assert_close(got, analytic_gradient(target, theta, ref, normalised), rtol=0, atol=1e-10)
    # and it is none of the other divergences' gradient
    for other in DIVERGENCES:
        same = other == target or (normalised and {other, target} in ({"fkl", "ufkl"}, {"rkl", "urkl"}))
        if not same:
            assert (got - analytic_gradient(other, theta, ref, normalised)).abs().max() > 1e-3, other


@pytest.mark.parametrize("term", list(TERMS))
@pytest.mark.parametrize("normalised", [False, True])
def test_off_policy_only_the_weighted_k3_stays_exact(term, normalised):
    """With mu != pi (w != 1) only TRL's w-weighted k3 keeps its on-policy objective's gradient; every other term's
    expected gradient is then the gradient of none of the four divergences."""
    theta, mu, ref = problem(4)
    if not normalised:
        theta = torch.log_softmax(theta, 0) + 0.3
    measure_target, softmax_target, exact = ON_POLICY[term]
    target = softmax_target if normalised else measure_target
    got = expected_gradient(theta, term, ref, mu=mu, normalised=normalised)
    target_gradient = analytic_gradient(target, theta, ref, normalised)
    if exact:
        torch.testing.assert_close(got, target_gradient, rtol=0, atol=1e-10)
        return
    assert (got - target_gradient).abs().max() > 1e-3
    for other in DIVERGENCES:
        assert (got - analytic_gradient(other, theta, ref, normalised)).abs().max() > 1e-3, other


def test_k1_as_a_loss_pushes_away_from_the_sampler_off_policy():
    """k1 as a loss: E_mu[grad log pi] = grad sum mu log pi = -grad KL(mu || pi) with mu frozen. Minimising the
    loss therefore increases the divergence from the SAMPLER; the reference does not enter the gradient at all."""
    theta, mu, ref = problem(5)
    got = expected_gradient(theta, "k1_loss", ref, mu=mu)
    kl_from_sampler = grad_of(lambda t: (mu * (mu.log() - torch.log_softmax(t, 0))).sum(), theta)
    torch.testing.assert_close(got, -kl_from_sampler, rtol=0, atol=1e-12)
    other_ref = torch.softmax(torch.randn(len(theta), dtype=torch.float64), 0)
    torch.testing.assert_close(expected_gradient(theta, "k1_loss", other_ref, mu=mu), got, rtol=0, atol=1e-12)


@pytest.mark.parametrize("term", list(TERMS))
def test_per_token_coefficients(term):
    """The c column of the table: grad ell = c(w, rho, log r) * grad logp, token by token (any w, rho)."""
    gen = torch.Generator().manual_seed(7)
    logp = torch.randn(64, generator=gen, dtype=torch.float64).requires_grad_(True)
    logmu = torch.randn(64, generator=gen, dtype=torch.float64)
    logref = torch.randn(64, generator=gen, dtype=torch.float64)
    (grad,) = torch.autograd.grad(TERMS[term](logp, logmu, logref).sum(), logp)
    w, rho, log_r = (logp - logmu).exp().detach(), (logref - logmu).exp(), (logp - logref).detach()
    torch.testing.assert_close(grad, COEFFICIENTS[term](w, rho, log_r), rtol=0, atol=1e-12)


def test_unweighted_k3_is_ufkl_weight_divided_by_w():
    """TRL's k3 without the bias correction, token by token: RPG's exact UFKL coefficient (w - rho) divided by w."""
    w = torch.tensor([0.5, 0.9, 1.0, 1.3, 2.0], dtype=torch.float64)
    rho = torch.tensor([0.7, 1.1, 0.4, 1.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(COEFFICIENTS["trl_k3"](w, rho, None), (w - rho) / w, rtol=0, atol=1e-15)


def test_trl_bias_corrected_k3_is_rpg_urkl_differentiable():
    """TRL's w * k3(pi_ref / pi_theta) is, value and gradient, RPG's `urkl` x `differentiable` KL term (A = 0)."""
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(4, 6, generator=gen, dtype=torch.float64).requires_grad_(True)
    logmu = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    logref = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    rpg, _ = rpg_per_token_loss(logp, logmu, torch.zeros(4, dtype=torch.float64), torch.ones_like(logmu),
                                ref_logps=logref, divergence="urkl", estimator="differentiable", beta=1.0)
    trl = TERMS["trl_k3_w"](logp, logmu, logref)
    torch.testing.assert_close(rpg, trl, rtol=1e-12, atol=1e-12)
    (g_rpg,) = torch.autograd.grad(rpg.sum(), logp)
    (g_trl,) = torch.autograd.grad(trl.sum(), logp)
    torch.testing.assert_close(g_rpg, g_trl, rtol=1e-12, atol=1e-12)


def test_k3_in_the_reward_is_not_bounded_below():
    """k3 as a reward penalty is not a divergence: RKL - FKL (its objective on the softmax family) is 0 at the
    reference and decreases without bound as a token the reference gives mass to loses its probability, so the
    'penalty' is lowered by leaving the reference."""
    ref = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    values = [divergence("urkl_minus_ufkl", torch.tensor([1 - 2 * eps, eps, eps], dtype=torch.float64), ref).item()
              for eps in (1e-3, 1e-6, 1e-12)]
    assert divergence("urkl_minus_ufkl", ref, ref).abs().item() < 1e-15
    assert values[0] > values[1] > values[2] and values[2] < -10, values
