"""The paper's contribution (iii), as a regression test (docs/math.md section 2, last paragraphs).

GRPO adds beta * k3(pi_ref / pi_theta) to its loss without the importance weight. On-policy, the expected gradient
of that unweighted term is the gradient of the FORWARD KL(pi_ref || pi_theta), not of the reverse KL the k3 penalty
estimates; weighted by w (TRL's `use_bias_correction_kl`), it becomes the reverse-KL gradient.
"""

import torch
from _enumeration import analytic_objective, grad_of, make_problem

from trl_rpg.objectives.per_token import rpg_per_token_loss


def k3(logp, logref):
    return torch.exp(logref - logp) - (logref - logp) - 1


def expected_grpo_penalty(theta, ref, weighted):
    logp = torch.log_softmax(theta, 0)
    mu = logp.detach().exp()  # on-policy: the sampler is the current policy
    w = torch.exp(logp - logp.detach())  # 1 in value, carries grad logp
    term = k3(logp, ref.log()) * (w if weighted else 1.0)
    return (mu * term).sum()


def test_unweighted_k3_gradient_is_forward_kl_gradient():
    theta, _, ref, _, _ = make_problem(11, distinct_reference=True)
    grpo = grad_of(lambda t: expected_grpo_penalty(t, ref, weighted=False), theta)
    zero = torch.zeros(len(theta), dtype=torch.float64)
    fkl = -grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, zero, 1.0, "fkl"), theta)
    rkl = -grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, zero, 1.0, "rkl"), theta)
    torch.testing.assert_close(grpo, fkl, rtol=0, atol=1e-12)
    assert (grpo - rkl).abs().max() > 1e-3  # and it is NOT the reverse-KL gradient


def test_w_weighted_k3_gradient_is_reverse_kl_gradient():
    theta, _, ref, _, _ = make_problem(12, distinct_reference=True)
    weighted = grad_of(lambda t: expected_grpo_penalty(t, ref, weighted=True), theta)
    zero = torch.zeros(len(theta), dtype=torch.float64)
    rkl = -grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, zero, 1.0, "rkl"), theta)
    torch.testing.assert_close(weighted, rkl, rtol=0, atol=1e-12)


def test_k3_is_the_unnormalised_forward_kl_estimate_with_rho_one():
    """With rho = 1 the UFKL value estimate is w - log w - 1 = k3(pi_theta / pi_old), the paper's identity."""
    log_w = torch.linspace(-2, 2, 9, dtype=torch.float64).unsqueeze(1)
    _, stats = rpg_per_token_loss(log_w, torch.zeros_like(log_w), torch.zeros(9, dtype=torch.float64),
                                  torch.ones_like(log_w), divergence="ufkl", beta=1.0)
    k3_mean = (log_w.exp() - log_w - 1).mean()
    torch.testing.assert_close(stats["divergence"], k3_mean, rtol=1e-12, atol=1e-12)
