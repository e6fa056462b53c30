"""Proposition 4.1 and Tables 1/2/4: every surrogate's expected gradient equals minus the gradient of its objective.

Exact enumeration (see tests/_enumeration.py): E_mu[grad per_token_loss] == -grad J, in float64 to 1e-10, for all
8 divergence x estimator pairs, with the reference equal to the sampler (rho = 1) and with a distinct reference.
"""

import pytest
import torch
from _enumeration import analytic_objective, grad_of, make_problem

from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, OBJECTIVES, rpg_per_token_loss

PAIRS = [(d, e) for d in DIVERGENCES for e in ESTIMATORS]
BETA = 0.7  # large, so that a wrong KL term cannot hide behind the reward term


def expected_surrogate(theta, mu, ref, rewards, baseline, divergence, estimator, pass_ref, normalised=True, **clip):
    # (K, 1): K one-token completions; unnormalised: pi = exp(theta) is a positive measure, not a distribution
    logp = (torch.log_softmax(theta, 0) if normalised else theta).unsqueeze(1)
    logmu = mu.log().unsqueeze(1)
    loss, _ = rpg_per_token_loss(
        logp, logmu, rewards - baseline, torch.ones_like(logp),
        ref_logps=ref.log().unsqueeze(1) if pass_ref else None,
        divergence=divergence, estimator=estimator, beta=BETA, **clip,
    )
    return (mu * loss.squeeze(1)).sum()


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("reference", ["sampling", "distinct"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_surrogate_gradient_matches_objective_gradient(divergence, estimator, reference, seed):
    theta, mu, ref, rewards, baseline = make_problem(seed, distinct_reference=reference == "distinct")
    # with reference == "sampling" the library is called with ref_logps=None (rho = 1 exactly)
    surrogate_grad = grad_of(
        lambda t: expected_surrogate(t, mu, ref, rewards, baseline, divergence, estimator, reference == "distinct"),
        theta,
    )
    objective_grad = grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, rewards, BETA, divergence), theta)
    assert objective_grad.abs().max() > 1e-3  # the check is not vacuous
    torch.testing.assert_close(surrogate_grad, -objective_grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("reference", ["sampling", "distinct"])
def test_surrogate_gradient_matches_objective_gradient_for_unnormalised_policy(divergence, estimator, reference):
    """On an unnormalised measure pi = exp(theta) the KL and UKL gradients differ, so this separates RKL from URKL
    and FKL from UFKL, which share their gradient when pi sums to one (E_mu[w grad logp] = grad sum pi = 0)."""
    theta, mu, ref, rewards, baseline = make_problem(6, distinct_reference=reference == "distinct")
    theta = torch.log_softmax(theta, 0) + 0.3  # total mass e^0.3
    surrogate_grad = grad_of(
        lambda t: expected_surrogate(t, mu, ref, rewards, baseline, divergence, estimator, reference == "distinct",
                                     normalised=False),
        theta,
    )
    objective_grad = grad_of(lambda t: analytic_objective(t.exp(), ref, rewards - baseline, BETA, divergence), theta)
    torch.testing.assert_close(surrogate_grad, -objective_grad, rtol=0, atol=1e-10)
    for other in DIVERGENCES:
        if other != divergence:
            other_grad = grad_of(
                lambda t, o=other: analytic_objective(t.exp(), ref, rewards - baseline, BETA, o), theta)
            assert (surrogate_grad + other_grad).abs().max() > 1e-3


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_wrong_divergence_is_detected(divergence):
    """The enumeration separates the divergences: each surrogate fails against every other objective."""
    theta, mu, ref, rewards, baseline = make_problem(3, distinct_reference=True)
    surrogate_grad = grad_of(
        lambda t: expected_surrogate(t, mu, ref, rewards, baseline, divergence, "reinforce", True), theta
    )
    for other in DIVERGENCES:
        # FKL and UFKL share their gradient for normalised distributions (sum pi = 1); so do RKL and URKL
        if other == divergence or {other, divergence} in ({"fkl", "ufkl"}, {"rkl", "urkl"}):
            continue
        other_grad = grad_of(lambda t, o=other: analytic_objective(torch.softmax(t, 0), ref, rewards, BETA, o), theta)
        assert (surrogate_grad + other_grad).abs().max() > 1e-4


@pytest.mark.parametrize("divergence,estimator", PAIRS)
def test_trust_region_covering_everything_is_unclipped(divergence, estimator):
    """With a trust region wide enough to contain every ratio, clipping changes nothing."""
    theta, mu, ref, rewards, baseline = make_problem(4, distinct_reference=True)
    w = torch.softmax(theta, 0) / mu
    clip = dict(epsilon_low=0.999, epsilon_high=float(w.max()) + 1.0, dual_clip_c=float(w.max()) + 2.0)
    clipped = grad_of(lambda t: expected_surrogate(t, mu, ref, rewards, baseline, divergence, estimator, True, **clip),
                      theta)
    objective_grad = grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, rewards, BETA, divergence), theta)
    torch.testing.assert_close(clipped, -objective_grad, rtol=0, atol=1e-10)


def test_registry_holds_every_pair():
    assert set(OBJECTIVES) == set(PAIRS)
    for fn in OBJECTIVES.values():
        assert fn.__doc__, f"{fn.__name__} needs a docstring citing the paper"


@pytest.mark.parametrize("divergence,estimator", PAIRS)
def test_divergence_statistic_estimates_the_divergence(divergence, estimator):
    """stats['divergence'] is the sampler-weighted mean of an unbiased per-token estimate of D."""
    theta, mu, ref, rewards, baseline = make_problem(5, distinct_reference=True)
    pi = torch.softmax(theta, 0)
    # enumerate: a batch holding every outcome, weighted by how often mu draws it, via a fractional-free trick:
    # the mean of the estimate over a batch whose rows are outcome k repeated n_k ~ mu_k times.
    counts = torch.round(mu / mu.min() * 50).long()
    rows = torch.repeat_interleave(torch.arange(len(mu)), counts)
    _, stats = rpg_per_token_loss(
        pi.log()[rows].unsqueeze(1), mu.log()[rows].unsqueeze(1), torch.zeros(len(rows), dtype=torch.float64),
        torch.ones(len(rows), 1, dtype=torch.float64), ref_logps=ref.log()[rows].unsqueeze(1), divergence=divergence,
        estimator=estimator, beta=BETA,
    )
    mu_hat = counts.double() / counts.sum()
    d_true = -(analytic_objective(pi, ref, torch.zeros_like(pi), 1.0, divergence))
    # the estimate is exact for the empirical sampler mu_hat; recompute D's estimator expectation under mu_hat
    w, rho = pi / mu, ref / mu
    log_r = (pi / ref).log()
    est = {"fkl": -rho * log_r, "ufkl": -rho * log_r + w - rho, "rkl": w * log_r, "urkl": w * log_r + rho - w}
    torch.testing.assert_close(stats["divergence"], (mu_hat * est[divergence]).sum(), rtol=1e-12, atol=1e-12)
    # and under the true mu that expectation is D itself
    torch.testing.assert_close((mu * est[divergence]).sum(), d_true, rtol=1e-12, atol=1e-12)
