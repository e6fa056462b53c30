"""An optimizer step whose gradient norm is not finite is skipped (parameters and optimizer state untouched) and
counted, whatever the order of gradient clipping and guard, including a gradient whose elements are all finite but
whose norm overflows; fp16 overflow is left to the gradient scaler and DeepSpeed to its own handling."""

import math

import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.gradient_guard import should_skip


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


class Snapshots(TrainerCallback):
    """Parameters and AdamW state after every optimizer step."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.after = {}

    def on_step_end(self, args, state, control, **kwargs):
        optimizer = self.trainer.optimizer
        self.after[state.global_step] = {
            "params": [p.detach().clone() for p in self.trainer.model.parameters()],
            "exp_avg": [optimizer.state[p]["exp_avg"].clone() for p in self.trainer.model.parameters()
                        if p in optimizer.state],
            "steps": [float(optimizer.state[p]["step"]) for p in self.trainer.model.parameters()
                      if p in optimizer.state],
        }


def poison_gradient_at(trainer, step, factor):
    """Multiply one parameter's gradient by `factor` during optimizer step `step` (1-based)."""
    param = trainer.model.lm_head.weight
    active = {"on": False}
    param.register_hook(lambda grad: grad * factor if active["on"] else grad)

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            active["on"] = state.global_step + 1 == step

    trainer.add_callback(Switch())


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])  # clipping before the guard, and no clipping
@pytest.mark.parametrize("factor", [1e30, float("nan")])  # finite elements whose norm overflows; NaN elements
def test_non_finite_gradient_norm_skips_the_step(tmp_path, model_path, max_grad_norm, factor):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, max_grad_norm=max_grad_norm, steps_per_generation=4))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    poison_gradient_at(trainer, 2, factor)
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    trainer.train()
    before, skipped, after = snapshots.after[1], snapshots.after[2], snapshots.after[3]
    for a, b in zip(before["params"], skipped["params"]):
        assert torch.equal(a, b)  # the skipped step moved nothing (not even on stale momentum)
    for a, b in zip(before["exp_avg"], skipped["exp_avg"]):
        assert torch.equal(a, b)
    assert skipped["steps"] == before["steps"]
    assert any(not torch.equal(a, b) for a, b in zip(skipped["params"], after["params"]))  # step 3 trains again
    assert all(math.isfinite(float(p.sum())) for p in after["params"])
    logged = [h["rpg/skipped_steps"] for h in trainer.state.log_history if "rpg/skipped_steps" in h]
    assert logged == [1.0] and trainer.skipped_steps == 1
    if factor == 1e30:  # every element of the poisoned gradient was finite
        norm = next(h["grad_norm"] for h in trainer.state.log_history if h.get("step") == 2)
        assert norm == float("inf")


def test_finite_steps_are_never_skipped(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, steps_per_generation=4))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    assert trainer.skipped_steps == 0
    assert not any("rpg/skipped_steps" in h for h in trainer.state.log_history)


def test_fp16_overflow_is_left_to_the_gradient_scaler(tmp_path, model_path):
    """With fp16 and a gradient scaler an overflowing step is ordinary: the scaler sees the inf, skips the step and
    lowers its scale; the guard neither touches the gradients nor reports a fault. Accelerate gives no scaler on CPU,
    so the test installs torch's CPU `GradScaler` (and fp16 autocast) where accelerate puts its CUDA one: the
    optimizer is wrapped with it, `backward` scales, clipping unscales, `step` skips and updates the scale."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, steps_per_generation=4, fp16=True))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    trainer.accelerator.native_amp = True
    poison_gradient_at(trainer, 2, float("inf"))
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    trainer.train()
    assert trainer.optimizer.scaler is trainer.accelerator.scaler  # the scaler really drove the steps
    before, overflowed, after = snapshots.after[1], snapshots.after[2], snapshots.after[3]
    for a, b in zip(before["params"], overflowed["params"]):
        assert torch.equal(a, b)  # the scaler skipped the overflowing step
    for a, b in zip(before["exp_avg"], overflowed["exp_avg"]):
        assert torch.equal(a, b)
    assert trainer.accelerator.scaler.get_scale() == 2.0 ** 9  # ... and halved its scale: it saw the inf
    assert any(not torch.equal(a, b) for a, b in zip(overflowed["params"], after["params"]))
    assert trainer.skipped_steps == 0  # not reported as a fault
    assert not any("rpg/skipped_steps" in h for h in trainer.state.log_history)


@pytest.mark.parametrize("norm,deepspeed,scaler,skip", [
    (torch.tensor(float("inf")), False, False, True),
    (float("nan"), False, False, True),
    (torch.tensor(3.0), False, False, False),
    (torch.tensor(float("inf")), False, True, False),  # fp16: the scaler skips it and lowers its scale
    (float("inf"), True, False, False),  # DeepSpeed owns its gradients
    (None, False, False, False),
])
def test_guard_decision(norm, deepspeed, scaler, skip):
    assert should_skip(norm, deepspeed, scaler) is skip
