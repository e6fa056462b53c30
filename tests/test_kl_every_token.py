"""docs/math.md section 4b: the KL term regularises every completion token; TRL's token gates act on the reward term.

- TRL's high-entropy mask (`top_entropy_quantile < 1`) and off-policy sequence mask (`off_policy_mask_threshold`)
  zero the advantage of the tokens they drop: a masked token carries exactly the gradient of `-beta * D`.
- Sequence-level importance sampling (GSPO) changes the reward term's ratio only; the KL term keeps its exact
  per-token gradient.

Each claim is checked twice: by exact enumeration on the objective library, and through `RPGTrainer` against the
per-token gradient the objective library gives for the same batch. On the code before the fix (the masks multiplied
the whole per-token loss; the sequence ratio fed the KL term too) the masked tokens got no gradient at all and the
sequence-level KL gradient was constant along each row, so every test here failed.
"""

import pytest
import torch
from _enumeration import analytic_objective, grad_of, make_problem
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.objectives.loss import sequence_level_logps
from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, rpg_per_token_loss

PAIRS = [(d, e) for d in DIVERGENCES for e in ESTIMATORS]
BETA = 0.7


# ----------------------------------------------------------------------------------------------------------------
# The objective library, by exact enumeration
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("divergence,estimator", PAIRS)
@pytest.mark.parametrize("clip", [False, True])
def test_masked_tokens_carry_exactly_the_kl_gradient(divergence, estimator, clip):
    """With a gate m (per outcome) on the advantage, E_mu[grad loss] = -grad(E_pi[m * A] - beta * D): the gated-off
    outcomes contribute the KL gradient only. With RPG-Style Clip on, the sampler is close enough to the policy that
    every ratio lies inside the trust region, where the clipped gradient is the exact one (docs/math.md section 3)."""
    theta, mu, ref, rewards, baseline = make_problem(4, distinct_reference=True)
    if clip:  # ratios pi/mu within [0.95, 1.05]
        mu = torch.softmax(theta + 0.02 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(1),
                                                      dtype=theta.dtype), 0)
    gate = torch.tensor([1, 0, 1, 0, 0, 1, 0], dtype=theta.dtype)
    options = dict(epsilon_low=0.2, epsilon_high=0.28, dual_clip_c=3.0) if clip else {}

    def expected_loss(t, advantages):
        logp = torch.log_softmax(t, 0).unsqueeze(1)
        loss, _ = rpg_per_token_loss(logp, mu.log().unsqueeze(1), advantages.unsqueeze(1), torch.ones_like(logp),
                                     ref_logps=ref.log().unsqueeze(1), divergence=divergence, estimator=estimator,
                                     beta=BETA, **options)
        return (mu * loss.squeeze(1)).sum()

    if clip:
        w = torch.softmax(theta, 0) / mu
        assert (w - 1).abs().max() < 0.05  # inside the trust region: the clip does not act
    got = grad_of(lambda t: expected_loss(t, gate * (rewards - baseline)), theta)
    want = grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, gate * (rewards - baseline), BETA,
                                                divergence), theta)
    torch.testing.assert_close(got, -want, rtol=0, atol=1e-10)
    # every outcome gated off: the gradient is the KL's alone, and it is not zero
    kl_only = grad_of(lambda t: expected_loss(t, torch.zeros_like(rewards)), theta)
    kl_want = grad_of(lambda t: analytic_objective(torch.softmax(t, 0), ref, torch.zeros_like(rewards), BETA,
                                                   divergence), theta)
    assert kl_want.abs().max() > 1e-2
    torch.testing.assert_close(kl_only, -kl_want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("divergence,estimator", PAIRS)
def test_sequence_ratio_leaves_the_kl_gradient_per_token(divergence, estimator):
    """GSPO's sequence ratio (`reward_logps`) weighs the reward term only: with A = 0 the per-token gradient is the
    token-level one (not the row's mean); with A != 0 the reward part is GSPO's, -s * A on every token of the row."""
    gen = torch.Generator().manual_seed(0)
    logmu = torch.log_softmax(torch.randn(3, 5, 6, generator=gen, dtype=torch.float64), -1)[..., 0]
    logref = logmu + 0.3 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    logp0 = logmu + 0.05 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    mask[1, 3:] = 0

    def per_token_grad(advantages, sequence):
        logp = logp0.clone().requires_grad_(True)
        reward_logps = sequence_level_logps(logp, logmu, mask) if sequence else None
        loss, _ = rpg_per_token_loss(logp, logmu, advantages, mask, ref_logps=logref, reward_logps=reward_logps,
                                     divergence=divergence, estimator=estimator, beta=BETA)
        (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
        return grad

    zero = torch.zeros(3, dtype=torch.float64)
    token_level = per_token_grad(zero, sequence=False)
    torch.testing.assert_close(per_token_grad(zero, sequence=True), token_level, rtol=0, atol=1e-12)
    assert (token_level[0] - token_level[0].mean()).abs().max() > 1e-3  # per-token values, not a row constant

    advantages = torch.tensor([0.5, -0.3, 0.2], dtype=torch.float64)
    s = (((logp0 - logmu) * mask).sum(-1) / mask.sum(-1)).exp()
    reward_part = per_token_grad(advantages, sequence=True) - token_level
    torch.testing.assert_close(reward_part, -(s * advantages).unsqueeze(1) * mask, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Through the trainer
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def trained(tmp_path, model_path, **overrides):
    """Three optimizer steps on one generation batch of four (so its last micro-batch is off-policy), with a
    distinct fixed reference (the initial model) and a large beta."""
    settings = dict(max_steps=3, steps_per_generation=4, beta=0.5, rpg_reference="initial", learning_rate=0.05,
                    rpg_dual_clip_c=None, epsilon=10.0, epsilon_high=10.0)  # the clip never acts here
    settings.update(overrides)
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=RPGConfig(**cpu_args(tmp_path, **settings)),
                         train_dataset=tiny_dataset())
    trainer.train()
    trainer.model.train()
    return trainer


def trainer_token_gradient(trainer, inputs):
    """d loss / d per-token log-prob as the trainer computes it, and the log-probs and entropies it used."""
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        logps.retain_grad()
        captured.update(logps=logps, entropies=entropies)
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    try:
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    trainer.model.zero_grad()
    return captured["logps"].grad, captured["logps"].detach(), captured["entropies"].detach()


def library_token_gradient(trainer, inputs, logps, advantages, reward_logps_fn=None):
    """The same derivative from the objective library on a leaf copy of the log-probs, with `advantages` given."""
    args = trainer.args
    leaf = logps.clone().requires_grad_(True)
    mask = inputs["completion_mask"].float()
    loss, _ = rpg_per_token_loss(
        leaf, inputs["old_per_token_logps"], advantages, mask, ref_logps=inputs["ref_per_token_logps"],
        reward_logps=None if reward_logps_fn is None else reward_logps_fn(leaf),
        divergence=args.rpg_divergence, estimator=args.rpg_estimator, beta=args.beta, epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high, dual_clip_c=args.rpg_dual_clip_c)
    normalizer = inputs["num_items_in_batch"] * args.gradient_accumulation_steps / args.steps_per_generation  # dapo
    (grad,) = torch.autograd.grad((loss * mask).sum() / normalizer, leaf)
    return grad


def assert_masked_tokens_carry_kl(trainer, inputs, gate):
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    mask = inputs["completion_mask"].bool()
    masked = mask & (gate == 0)
    assert masked.sum() >= 4 and (mask & (gate == 1)).sum() >= 4, "the test needs gated and ungated tokens"
    advantages = inputs["advantages"].unsqueeze(1).expand_as(logps)
    kl_only = library_token_gradient(trainer, inputs, logps, torch.zeros_like(advantages))
    assert kl_only[masked].abs().min() > 0  # the KL gradient is there on every masked token
    torch.testing.assert_close(grad[masked], kl_only[masked], rtol=1e-5, atol=1e-9)
    # and every token, gated or not, gets the library's gradient with the gate on the advantage
    torch.testing.assert_close(grad[mask], library_token_gradient(trainer, inputs, logps, advantages * gate)[mask],
                               rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("divergence,estimator", [("urkl", "reinforce"), ("fkl", "differentiable")])
def test_high_entropy_mask_leaves_kl_on_every_token(tmp_path, model_path, divergence, estimator):
    trainer = trained(tmp_path, model_path, top_entropy_quantile=0.5, rpg_divergence=divergence,
                      rpg_estimator=estimator)
    inputs = trainer._buffered_inputs[3]
    _, _, entropies = trainer_token_gradient(trainer, inputs)
    mask = inputs["completion_mask"].float()
    gate = trainer.get_high_entropy_mask(entropies, mask, 0.5)
    assert_masked_tokens_carry_kl(trainer, inputs, gate)


def test_off_policy_mask_leaves_kl_on_every_token(tmp_path, model_path):
    trainer = trained(tmp_path, model_path, off_policy_mask_threshold=1e-4, learning_rate=0.2)
    inputs = trainer._buffered_inputs[3]
    _, logps, _ = trainer_token_gradient(trainer, inputs)
    mask = inputs["completion_mask"].float()
    gate = trainer.get_off_policy_mask(advantages=inputs["advantages"].unsqueeze(1), per_token_logps=logps,
                                       sampling_per_token_logps=inputs["old_per_token_logps"], mask=mask,
                                       off_policy_threshold=1e-4).expand_as(mask)
    assert_masked_tokens_carry_kl(trainer, inputs, gate)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_sequence_level_sampling_keeps_the_per_token_kl_gradient(tmp_path, model_path, estimator):
    trainer = trained(tmp_path, model_path, importance_sampling_level="sequence", rpg_divergence="rkl",
                      rpg_estimator=estimator)
    inputs = dict(trainer._buffered_inputs[3])
    mask = inputs["completion_mask"].float()
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    advantages = inputs["advantages"].unsqueeze(1).expand_as(logps)
    want = library_token_gradient(trainer, inputs, logps, advantages,
                                  lambda leaf: sequence_level_logps(leaf, inputs["old_per_token_logps"], mask))
    torch.testing.assert_close(grad * mask, want * mask, rtol=1e-5, atol=1e-9)
    # with no reward signal the gradient is the token-level KL gradient, which varies along each row
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    kl_only = library_token_gradient(trainer, inputs, logps, torch.zeros_like(advantages))
    torch.testing.assert_close(grad * mask, kl_only * mask, rtol=1e-5, atol=1e-9)
    row = mask[0].bool()
    assert (grad[0][row] - grad[0][row].mean()).abs().max() > 1e-4 * grad[0][row].abs().max()


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_sampler_correction_weighs_every_term(tmp_path, model_path, mode):
    """vLLM's correction `importance_sampling_ratio = pi_old / mu` (truncated, or 0 where rejected) multiplies the
    reward term AND the KL term: the expectation is over the generator mu, so every term's weight is
    pi_theta / mu (docs/math.md section 4b). In the masking modes a rejected token or sequence gets no gradient at
    all; in the truncating modes every token keeps ratio x its gradient. The ratio is TRL's tensor as its
    generation step would hand it over (per token, or one column per sequence)."""
    trainer = trained(tmp_path, model_path)
    inputs = dict(trainer._buffered_inputs[3])
    mask = inputs["completion_mask"].float()
    gen = torch.Generator().manual_seed(0)
    sequence = mode.startswith("sequence")
    ratio = 0.5 + torch.rand((mask.size(0), 1) if sequence else mask.shape, generator=gen)
    if mode.endswith("mask"):
        ratio = torch.where(torch.rand(ratio.shape, generator=gen) < 0.4, torch.zeros_like(ratio), ratio)
    inputs["importance_sampling_ratio"] = ratio
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    advantages = inputs["advantages"].unsqueeze(1).expand_as(logps)
    want = ratio * library_token_gradient(trainer, inputs, logps, advantages)
    torch.testing.assert_close(grad * mask, want * mask, rtol=1e-5, atol=1e-9)
    # the KL term is weighed too: with no reward signal the gradient is ratio x the KL gradient, zero where rejected
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    kl_only = library_token_gradient(trainer, inputs, logps, torch.zeros_like(advantages))
    assert (kl_only * mask).abs().max() > 0
    torch.testing.assert_close(grad * mask, ratio * kl_only * mask, rtol=1e-5, atol=1e-9)
    if mode.endswith("mask"):
        rejected = (ratio.expand_as(mask) == 0) & mask.bool()
        assert rejected.any() and (grad[rejected] == 0).all()
