"""The trainer's loss is the objective library's per-token loss, aggregated as `loss_type` says."""

import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, rpg_per_token_loss

PAIRS = [(d, e) for d in DIVERGENCES for e in ESTIMATORS]


def manual_logps(model, inputs, temperature):
    """log pi(completion token) from the raw logits, independently of TRL's helper."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / temperature
    t = inputs["completion_ids"].size(1)
    logits = logits[:, -t:]
    return torch.log_softmax(logits.float(), -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def manual_loss(trainer, inputs, ref_logps=None):
    args = trainer.args
    model = trainer.model
    logps = manual_logps(model, inputs, args.temperature)
    mask = inputs["completion_mask"].float()
    sampling = inputs.get("old_per_token_logps", logps.detach())
    loss, _ = rpg_per_token_loss(logps, sampling, inputs["advantages"], mask, ref_logps=ref_logps,
                                 divergence=args.rpg_divergence, estimator=args.rpg_estimator, beta=args.beta,
                                 epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                                 dual_clip_c=args.rpg_dual_clip_c)
    ga, spg = args.gradient_accumulation_steps, args.steps_per_generation
    if args.loss_type == "dapo":
        return (loss * mask).sum() / (inputs["num_items_in_batch"] * ga / spg)
    if args.loss_type == "bnpo":
        return (loss * mask).sum() / mask.sum() / ga
    if args.loss_type == "grpo":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean() / ga
    return (loss * mask).sum() / (loss.size(0) * args.max_completion_length) / ga


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize("divergence,estimator", PAIRS)
def test_trainer_loss_equals_objective_library_loss(tmp_path, model_path, divergence, estimator):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, beta=0.05, rpg_divergence=divergence,
                                rpg_estimator=estimator, steps_per_generation=4))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    # after 3 optimizer steps on one generation batch, the 4th micro-batch is off-policy (w != 1)
    inputs = trainer._buffered_inputs[3]
    assert "old_per_token_logps" in inputs
    trainer.model.train()
    got = trainer.compute_loss(trainer.model, inputs)
    want = manual_loss(trainer, inputs)
    assert (manual_logps(trainer.model, inputs, 1.0) - inputs["old_per_token_logps"]).abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and the gradients agree too
    grad_got = torch.autograd.grad(got, list(trainer.model.parameters()), allow_unused=True)
    grad_want = torch.autograd.grad(manual_loss(trainer, inputs), list(trainer.model.parameters()),
                                    allow_unused=True)
    for a, b in zip(grad_got, grad_want):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_loss_type_keeps_its_aggregation_meaning(tmp_path, model_path, loss_type):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, loss_type=loss_type, steps_per_generation=2,
                                rpg_reference="initial", beta=0.1))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    inputs = trainer._buffered_inputs[1]
    trainer.model.train()
    got = trainer.compute_loss(trainer.model, inputs)
    torch.testing.assert_close(got, manual_loss(trainer, inputs, ref_logps=inputs["ref_per_token_logps"]),
                               rtol=1e-5, atol=1e-6)


def test_rpg_metrics_are_logged(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in ["divergence", "w_mean", "w_max", "clip_frac_high", "clip_frac_low", "clip_frac_dual",
                "excluded_tokens", "reference_updates"]:
        assert f"rpg/{key}" in logged, key
    assert logged["rpg/w_mean"] == pytest.approx(1.0)  # first step of a generation batch is on-policy
