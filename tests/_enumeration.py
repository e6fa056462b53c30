"""Exact enumeration over a small categorical distribution (one-token completions), in float64.

Each outcome k of a K-way categorical is one "completion". Expectations under the sampler mu are sums over k
weighted by mu_k, so gradients are exact (no Monte Carlo). The analytic objectives are written here from their
definitions (docs/math.md section 2), independently of the library.
"""

import torch

K = 7


def make_problem(seed: int = 0, distinct_reference: bool = False):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(K, generator=gen, dtype=torch.float64)
    mu = torch.softmax(torch.randn(K, generator=gen, dtype=torch.float64), 0)
    ref = torch.softmax(torch.randn(K, generator=gen, dtype=torch.float64), 0) if distinct_reference else mu.clone()
    rewards = torch.rand(K, generator=gen, dtype=torch.float64)
    baseline = 0.37  # any constant baseline leaves the expected gradient unchanged
    return theta, mu, ref, rewards, baseline


def analytic_objective(pi: torch.Tensor, ref: torch.Tensor, rewards: torch.Tensor, beta: float, divergence: str):
    """J = E_pi[R] - beta * D, with D written from its definition."""
    expected_reward = (pi * rewards).sum()
    if divergence == "fkl":  # KL(ref || pi)
        d = (ref * (ref.log() - pi.log())).sum()
    elif divergence == "ufkl":  # UKL(ref || pi) = sum ref log(ref/pi) - ref + pi
        d = (ref * (ref.log() - pi.log()) - ref + pi).sum()
    elif divergence == "rkl":  # KL(pi || ref)
        d = (pi * (pi.log() - ref.log())).sum()
    elif divergence == "urkl":  # UKL(pi || ref) = sum pi log(pi/ref) - pi + ref
        d = (pi * (pi.log() - ref.log()) - pi + ref).sum()
    else:
        raise AssertionError(divergence)
    return expected_reward - beta * d


def grad_of(fn, theta: torch.Tensor) -> torch.Tensor:
    theta = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(theta), theta)
    return g
