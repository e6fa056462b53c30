"""The divergence registry: a fifth divergence registered by a user is used exactly like the four built-ins.

The fifth divergence here is the (unnormalised) chi-square divergence, written in this file:

    D = sum_y ref(y) * (r(y) - 1)^2,    r = pi / ref,

a KL-like f-divergence (f(r) = (r - 1)^2: f(1) = 0, f >= 0, so D >= 0 with equality iff pi = pi_ref). Per token
under the sampler mu (ref = rho * mu): D = E_mu[rho * (r - 1)^2], so ``value = rho * (exp(log r) - 1)^2``. Its
gradient: grad D = sum_y pi * 2 (r - 1) * grad log pi = E_mu[w * 2 (r - 1) * grad logp], so the REINFORCE weight's
KL part is ``kl_weight = -2 w (r - 1)`` (= w * h(r) with h(r) = -2 (r - 1), 0 at r = 1, of the sign that pulls pi
back towards pi_ref), and the fully differentiable surrogate ``beta * value`` has gradient
``beta * 2 rho (r - 1) r * grad logp = beta * 2 w (r - 1) * grad logp``: the same. Checked below by exact enumeration.
"""

import math

import pytest
import torch
from _enumeration import grad_of, make_problem
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

from trl_rpg.objectives import per_token as objectives
from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, Divergence, get_divergence, register_divergence

NAME = "chi2_test"
BETA = 0.7


def chi_square() -> Divergence:
    return Divergence(
        NAME, "chi^2(pi_theta || pi_ref)",
        value=lambda w, log_r, rho: rho * (log_r.exp() - 1.0) ** 2,
        kl_weight=lambda w, log_r, rho: -2.0 * w * (log_r.exp() - 1.0),
        value_formula="rho*(r - 1)^2", weight_formula="w*(A - 2*beta*(r - 1))",
    )


@pytest.fixture(scope="module")
def registered():
    row = register_divergence(chi_square())
    yield row
    objectives._REGISTRY.pop(NAME)  # the registry has no public removal; keep other test modules' view clean


def analytic_chi_square(pi, ref, rewards, beta):
    return (pi * rewards).sum() - beta * (ref * (pi / ref - 1.0) ** 2).sum()


def expected_surrogate(theta, mu, ref, rewards, baseline, estimator, **clip):
    logp = torch.log_softmax(theta, 0).unsqueeze(1)
    loss, stats = objectives.rpg_per_token_loss(
        logp, mu.log().unsqueeze(1), rewards - baseline, torch.ones_like(logp), ref_logps=ref.log().unsqueeze(1),
        divergence=NAME, estimator=estimator, beta=BETA, **clip,
    )
    return (mu * loss.squeeze(1)).sum(), stats


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("distinct", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_registered_divergence_gradient_is_exact(registered, estimator, distinct, seed):
    theta, mu, ref, rewards, baseline = make_problem(seed, distinct_reference=distinct)
    surrogate_grad = grad_of(lambda t: expected_surrogate(t, mu, ref, rewards, baseline, estimator)[0], theta)
    objective_grad = grad_of(lambda t: analytic_chi_square(torch.softmax(t, 0), ref, rewards, BETA), theta)
    # the KL part matters: without it the two gradients differ by more than the tolerance
    reward_only = grad_of(lambda t: analytic_chi_square(torch.softmax(t, 0), ref, rewards, 0.0), theta)
    assert (objective_grad - reward_only).abs().max() > 1e-3
    torch.testing.assert_close(surrogate_grad, -objective_grad, rtol=0, atol=1e-10)


def test_registered_divergence_value_is_logged(registered):
    theta, mu, ref, rewards, baseline = make_problem(0, distinct_reference=True)
    _, stats = expected_surrogate(theta, mu, ref, rewards, baseline, "reinforce")
    # one token per row, all weights equal: the stat is the plain mean of rho * (r - 1)^2 over the K rows
    pi = torch.softmax(theta, 0)
    want = ((ref / mu) * (pi / ref - 1.0) ** 2).mean()
    torch.testing.assert_close(stats["divergence"], want, rtol=1e-12, atol=1e-12)


def test_registry_view_is_live_and_read_only(registered):
    assert NAME in DIVERGENCES and get_divergence(NAME) is registered
    assert list(DIVERGENCES)[:4] == ["fkl", "ufkl", "rkl", "urkl"]
    with pytest.raises(TypeError):
        DIVERGENCES["x"] = registered  # type: ignore[index]


def test_config_accepts_a_registered_name_and_lists_them_for_an_unknown_one(registered, tmp_path):
    from trl_rpg import RPGConfig

    RPGConfig(**cpu_args(tmp_path, rpg_divergence=NAME))
    with pytest.raises(ValueError) as info:
        RPGConfig(**cpu_args(tmp_path, rpg_divergence="nope"))
    assert "rpg_divergence" in str(info.value) and NAME in str(info.value) and "urkl" in str(info.value)


def test_unknown_name_error_lists_registered_names(registered):
    with pytest.raises(ValueError, match=f"one of .*'urkl'.*'{NAME}'.*got 'nope'"):
        get_divergence("nope")


@pytest.mark.parametrize("name", ["urkl", NAME])
def test_a_name_cannot_be_registered_twice(registered, name):
    before = dict(DIVERGENCES)
    with pytest.raises(ValueError, match="already registered"):
        register_divergence(Divergence(name, "t", value=lambda w, r, p: w, kl_weight=lambda w, r, p: w,
                                       value_formula="w", weight_formula="w"))
    assert dict(DIVERGENCES) == before  # the built-in (or first) entry is not replaced


@pytest.mark.parametrize("bad,match", [
    ("not a row", "takes a Divergence"),
    (Divergence("", "t", lambda w, r, p: w, lambda w, r, p: w, "w", "w"), "Divergence.name"),
    (Divergence(7, "t", lambda w, r, p: w, lambda w, r, p: w, "w", "w"), "Divergence.name"),
    (Divergence("m1", "t", None, lambda w, r, p: w, "w", "w"), "Divergence.value"),
    (Divergence("m2", "t", lambda w, r, p: w, "w", "w", "w"), "Divergence.kl_weight"),
    (Divergence("m3", "t", lambda w, r, p: w, lambda w, r, p: w, "", "w"), "Divergence.value_formula"),
])
def test_a_malformed_entry_is_refused(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        register_divergence(bad)
    assert set(DIVERGENCES) <= {"fkl", "ufkl", "rkl", "urkl", NAME}


def test_trainer_trains_with_a_registered_divergence(registered, tmp_path):
    from trl_rpg import RPGConfig, RPGTrainer

    model_path = save_tiny_model(str(tmp_path / "model"))
    args = RPGConfig(**cpu_args(tmp_path / "out", max_steps=2, beta=0.05, rpg_divergence=NAME,
                                steps_per_generation=2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    after = list(trainer.model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    logged = [h["rpg/divergence"] for h in trainer.state.log_history if "rpg/divergence" in h]
    assert logged and all(math.isfinite(v) and v >= 0 for v in logged)
