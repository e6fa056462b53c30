"""RPG-Style Clip with a reference that is not the sampler (docs/math.md section 3, issue 27 section 1).

Every KL part is C_KL = beta * w * h(r); the clip evaluates it exactly inside the trust region and, outside it, at
the clipped pair (w_bar, r_bar), both ratios clipped to [1 - eps_low, 1 + eps_high]. Checked by exact enumeration
over a categorical (tests/_enumeration.py), for the four divergences, inside and outside the trust region, with the
reference equal to the sampler (rho = 1) and distinct from it (rho != 1):

- inside the trust region the clipped surrogate's expected gradient is the exact gradient of J;
- outside it, C_bar is bounded however far pi_theta is from pi_ref; for UFKL and URKL it has the exact C_KL's sign
  and is 0 where pi_theta = pi_ref (so a reference equal to the policy leaves the gradient independent of beta);
- with rho = 1 it is Remark F.2 (w -> w_bar, log w -> log w_bar), as before.

The per-token C_bar is read from the library's gradient in a cell of the clip table that keeps it (A chosen so that
the token is live: g = w * A + C_bar).
"""

import math

import pytest
import torch
from _enumeration import analytic_objective, grad_of, make_problem

from trl_rpg.objectives.per_token import DIVERGENCES, rpg_per_token_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28  # the paper's trust region
BETA = 0.5
#: h(r) of docs/math.md section 3, written from the table: C_KL = beta * w * h(r).
H = {"fkl": lambda r: 1 / r, "ufkl": lambda r: 1 / r - 1, "rkl": lambda r: -(r.log() + 1), "urkl": lambda r: -r.log()}


def clip_ratio(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(1 - EPS_LOW, 1 + EPS_HIGH)


def kl_part(logp, logmu, logref, divergence, beta=BETA):
    """Per-token C_bar of the library (one token per row), from -d loss / d logp in a live cell of the clip table:
    A = -10 where w >= 1 (A' < 0, no dual clip), A = 10 / w where w < 1 (A' >= 0 while C_bar > -10)."""
    logp = logp.detach().clone().requires_grad_(True)
    w = (logp - logmu).exp().detach()
    adv = torch.where(w >= 1, torch.full_like(w, -10.0), 10.0 / w)
    loss, _ = rpg_per_token_loss(logp.unsqueeze(1), logmu.unsqueeze(1), adv, torch.ones_like(logp).unsqueeze(1),
                                 ref_logps=None if logref is None else logref.unsqueeze(1), divergence=divergence,
                                 beta=beta, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=None)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return -grad - w * adv


def spec_kl_part(w, r, divergence, beta=BETA):
    """docs/math.md section 3: beta * w * h(r) inside the trust region (1 - eps_low < w < 1 + eps_high, strict),
    beta * w_bar * h(r_bar) outside it."""
    inside = (w > 1 - EPS_LOW) & (w < 1 + EPS_HIGH)
    return torch.where(inside, beta * w * H[divergence](r), beta * clip_ratio(w) * H[divergence](clip_ratio(r)))


def expected_loss(theta, mu, ref, rewards, baseline, divergence, pass_ref, beta=BETA):
    logp = torch.log_softmax(theta, 0).unsqueeze(1)
    loss, _ = rpg_per_token_loss(logp, mu.log().unsqueeze(1), rewards - baseline, torch.ones_like(logp),
                                 ref_logps=ref.log().unsqueeze(1) if pass_ref else None, divergence=divergence,
                                 beta=beta, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=10.0)
    return (mu * loss.squeeze(1)).sum()


def near_sampler(seed: int):
    """An enumeration problem whose every ratio w = pi/mu lies inside the trust region, with a reference far from
    pi (r = pi/pi_ref well outside [1 - eps_low, 1 + eps_high] for some outcomes)."""
    theta, _, ref, rewards, baseline = make_problem(seed, distinct_reference=True)
    gen = torch.Generator().manual_seed(100 + seed)
    mu = torch.softmax(theta + 0.08 * torch.randn(len(theta), generator=gen, dtype=torch.float64), 0)
    return theta, mu, ref, rewards, baseline


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("reference", ["sampling", "distinct"])
@pytest.mark.parametrize("seed", [0, 1])
def test_clipped_surrogate_gradient_is_exact_inside_the_trust_region(divergence, reference, seed):
    theta, mu, ref, rewards, baseline = near_sampler(seed)
    ref = mu if reference == "sampling" else ref
    pi = torch.softmax(theta, 0)
    w, r = pi / mu, pi / ref
    assert bool(((w > 1 - EPS_LOW) & (w < 1 + EPS_HIGH)).all())  # every token inside the trust region
    if reference == "distinct":  # the reference ratio itself is far outside the box: it must not be clipped
        assert bool(((r < 1 - EPS_LOW) | (r > 1 + EPS_HIGH)).any())
    surrogate = grad_of(lambda t: expected_loss(t, mu, ref, rewards, baseline, divergence, reference == "distinct"),
                        theta)
    exact = grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, rewards, BETA, divergence), theta)
    torch.testing.assert_close(surrogate, -exact, rtol=0, atol=1e-10)


def far_from_sampler(seed: int, log_r_scale: float = 0.6):
    """Per-token (log pi, log mu, log pi_ref) with most ratios w outside the trust region and r on both sides."""
    gen = torch.Generator().manual_seed(seed)
    n = 400
    logmu = torch.zeros(n, dtype=torch.float64)
    logp = 1.2 * torch.randn(n, generator=gen, dtype=torch.float64)
    logref = logp - log_r_scale * torch.randn(n, generator=gen, dtype=torch.float64)
    return logp, logmu, logref


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_clipped_kl_part_is_the_spec_rule_in_and_out_of_the_trust_region(divergence):
    logp, logmu, logref = far_from_sampler(0)
    w, r = (logp - logmu).exp(), (logp - logref).exp()
    outside = clip_ratio(w) != w
    assert 0.3 < outside.double().mean() < 0.9
    library = kl_part(logp, logmu, logref, divergence)
    torch.testing.assert_close(library, spec_kl_part(w, r, divergence), rtol=0, atol=1e-12)
    # inside the trust region that is the exact C_KL (section 2, written as a function of w and rho = w / r)
    rho = w / r
    exact = {"fkl": BETA * rho, "ufkl": BETA * (rho - w), "rkl": -BETA * w * (r.log() + 1),
             "urkl": -BETA * w * r.log()}[divergence]
    torch.testing.assert_close(library[~outside], exact[~outside], rtol=0, atol=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_clipped_kl_part_with_the_sampler_as_reference_is_remark_f2(divergence):
    """rho = 1 (ref_logps None): C_bar = beta * kl_weight(w_bar, log w_bar, rho = 1), the paper's rule."""
    logp, logmu, _ = far_from_sampler(1)
    w_bar = clip_ratio((logp - logmu).exp())
    remark_f2 = {"fkl": BETA * torch.ones_like(w_bar), "ufkl": BETA * (1 - w_bar),
                 "rkl": -BETA * w_bar * (w_bar.log() + 1), "urkl": -BETA * w_bar * w_bar.log()}[divergence]
    torch.testing.assert_close(kl_part(logp, logmu, None, divergence), remark_f2, rtol=0, atol=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_clipped_kl_part_is_bounded_however_far_the_policy_is_from_its_reference(divergence):
    """|C_bar| <= beta * (1 + eps_high) * max |h| over the box, for log r from -18 to 18 (the exact C_KL is not
    bounded: FKL's beta * rho = beta * w / r grows as pi_theta / pi_ref falls)."""
    logp, logmu, logref = far_from_sampler(2, log_r_scale=6.0)
    assert float((logp - logref).abs().max()) > 15
    box = torch.linspace(1 - EPS_LOW, 1 + EPS_HIGH, 1001, dtype=torch.float64)
    bound = BETA * (1 + EPS_HIGH) * float(H[divergence](box).abs().max())
    library = kl_part(logp, logmu, logref, divergence)
    outside = clip_ratio((logp - logmu).exp()) != (logp - logmu).exp()
    assert float(library[outside].abs().max()) <= bound * (1 + 1e-12)


@pytest.mark.parametrize("divergence", ["ufkl", "urkl"])
def test_clipped_kl_part_of_the_unnormalised_divergences_keeps_the_exact_sign(divergence):
    """UFKL and URKL (h(1) = 0): outside the trust region C_bar has the exact C_KL's sign, and is 0 where
    pi_theta = pi_ref, so the KL term never pushes the policy away from its reference."""
    logp, logmu, logref = far_from_sampler(3)
    logref[:50] = logp[:50]  # pi_theta = pi_ref on 50 tokens
    w, r = (logp - logmu).exp(), (logp - logref).exp()
    outside = clip_ratio(w) != w
    assert outside[:50].sum() > 10 and outside[50:].sum() > 100
    library = kl_part(logp, logmu, logref, divergence)
    exact = BETA * w * H[divergence](r)
    assert bool((library[:50] == 0).all())
    assert bool((torch.sign(library[outside]) == torch.sign(exact[outside])).all())


def test_kl_part_outside_the_trust_region_never_pushes_away_from_the_reference():
    """Issue 27's tokens (urkl, beta = 0.5, the default clip, w = 1.99, A = -1). Before the fix the clipped KL part
    was C_KL at (w_bar, log w_bar - log rho): +0.282 where pi_theta = pi_ref (exact: 0) and +0.250 with
    log r = +0.05 (exact: -0.0498, the opposite sign). The issue's figures (-5.7e-2 vs 0, -5.0e-2 vs +1.0e-2) are
    these times the same factor -0.20 (a logit's share of d logp)."""
    w = 1.99
    for log_r, expected in [(0.0, 0.0), (0.05, -BETA * (1 + EPS_HIGH) * 0.05)]:
        logp = torch.tensor([[math.log(w)]], dtype=torch.float64, requires_grad=True)
        ref = torch.tensor([[math.log(w) - log_r]], dtype=torch.float64)
        coefficients = []
        for beta in (BETA, 0.0):
            loss, _ = rpg_per_token_loss(logp, torch.zeros(1, 1, dtype=torch.float64),
                                         torch.tensor([-1.0], dtype=torch.float64),
                                         torch.ones(1, 1, dtype=torch.float64), ref_logps=ref, divergence="urkl",
                                         beta=beta, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=10.0)
            (grad,) = torch.autograd.grad(loss.sum(), logp)
            coefficients.append(-grad.item())
        assert coefficients[0] - coefficients[1] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("divergence", ["ufkl", "urkl"])
def test_reference_equal_to_the_policy_leaves_the_clipped_gradient_independent_of_beta(divergence):
    """Enumeration: pi_ref = pi_theta, the sampler far from both (most ratios outside the trust region, and in
    every cell of the clip table): the expected gradient is the same for beta = 0.5 and beta = 0."""
    theta, mu, _, rewards, baseline = make_problem(7, distinct_reference=False)
    mu = torch.softmax(2.5 * torch.log_softmax(theta, 0) - 2.5 * mu.log() + mu.log(), 0)  # far from pi
    pi = torch.softmax(theta, 0)
    w = pi / mu
    assert bool((w > 1 + EPS_HIGH).any()) and bool((w < 1 - EPS_LOW).any())

    def expected_gradient(beta):
        return grad_of(lambda t: expected_loss(t, mu, torch.softmax(t, 0).detach(), rewards, baseline, divergence,
                                               True, beta=beta), theta)

    assert expected_gradient(0.0).abs().max() > 1e-3
    torch.testing.assert_close(expected_gradient(BETA), expected_gradient(0.0), rtol=0, atol=1e-15)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from _tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize("divergence", ["urkl", "ufkl"])
def test_reference_refreshed_every_step_trains_the_same_for_any_beta(tmp_path, model_path, divergence):
    """End to end, the default clip and batch reuse: with pi_ref <- pi_theta after every optimizer step (pi_theta =
    pi_ref at every micro-step), UFKL's and URKL's KL parts are 0 at every token, so beta = 0.5 and beta = 1e-12
    train to the same parameters although many tokens leave the trust region. (Before the fix: 0.124 and 0.128.)"""
    import warnings

    from _tiny import cpu_args, length_reward, tiny_dataset

    from trl_rpg import RPGConfig, RPGTrainer

    trained = []
    for beta in (0.5, 1e-12):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*regularises nothing", category=UserWarning)
            args = RPGConfig(**cpu_args(tmp_path / str(beta), max_steps=4, learning_rate=0.05, beta=beta,
                                        rpg_divergence=divergence, rpg_reference="periodic",
                                        rpg_reference_update_steps=1))
        trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert all(h["rpg/divergence"] == 0.0 for h in logs)  # pi_theta = pi_ref at every token
        assert max(h["clip_ratio/region_mean"] for h in logs) > 0.1  # tokens outside the trust region
        trained.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    assert max((trained[0][n] - trained[1][n]).abs().max().item() for n in trained[0]) == 0.0
