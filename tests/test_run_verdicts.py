"""What a run says about itself holds in the cases no training test reached (issue 33 section 1): a step whose
gradient norm is unknown, the count of steps with signal after a resume, the advantage-scale warning with one
outlier group, the batch layout's description when a generation batch spans a fraction of optimizer steps, the
reference updates on the plot, more rewards than completions, a trust region with no lower bound, and a picture that
fails to draw. Pure functions and hand-made inputs: nothing is trained."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from trl_rpg.evaluation import plots
from trl_rpg.objectives.per_token import rpg_per_token_loss
from trl_rpg.run import learning_signal as ls
from trl_rpg.run.reward_calls import checked_reward_function
from trl_rpg.run.reward_scale import RewardScaleCheck, batch_reward_scale
from trl_rpg.trainers.describe import batch_layout

_SIGNAL = ls.BatchFacts(groups=2, groups_with_spread=2, tokens=16, tokens_with_advantage=16)


def test_a_step_whose_gradient_norm_is_unknown_still_carries_signal():
    """DeepSpeed reports no gradient norm before its first step (and with its norm computation off): None is
    unknown, not 0, so such steps count with their batch's signal and the run is not 'trained on nothing'."""
    assert ls.gradient_is_zero(None) is False and ls.gradient_is_zero(0.0) and ls.gradient_is_zero(torch.tensor(0.0))
    tally = ls.SignalTally()
    for _ in range(2):
        tally.add_batch(_SIGNAL)
        tally.end_step(skipped=False, zero_gradient=ls.gradient_is_zero(None))
    assert tally.state_dict()["steps_with_signal"] == 2 and tally.final_error() is None


def test_steps_with_signal_after_a_resume_count_the_whole_run():
    """`rpg/steps_with_learning_signal` in `train()`'s metrics counts the run's steps, the resumed checkpoint's
    included (as its docs say), not only this `train()` call's."""
    tally = ls.SignalTally()
    tally.add_batch(ls.BatchFacts(groups=2, groups_with_spread=0, tokens=16, tokens_with_advantage=0))
    tally.end_step(skipped=False, saved={"steps": 6, "steps_with_signal": 5})
    metrics = ls.verdict_metrics(ls.trained_on_nothing(7, 8, SimpleNamespace(batches=1, scored=1), tally, ["f"], None),
                                 tally)
    assert metrics[ls.STEPS_WITH_SIGNAL] == 5.0 and metrics[ls.TRAINED_ON_NOTHING] == 0.0


def test_one_outlier_group_does_not_make_a_unit_scale_reward_warn():
    """The scale is the median in-group std: seven 0/1 groups (std ~0.5) and one group scored 0 / 1000 read as 0.5,
    no warning; the mean would read ~80 and warn."""
    groups = [[0.0, 1.0, 0.0, 1.0]] * 7 + [[0.0, 1000.0, 0.0, 1000.0]]
    rewards = torch.tensor([r for group in groups for r in group]).unsqueeze(1)
    weights = torch.ones(1)
    scale, counted = batch_reward_scale([rewards], weights, 4, "sum_then_normalize")
    assert counted == 8 and 0.4 < scale < 0.7
    check = RewardScaleCheck(checked=True, beta=1e-4, max_grad_norm=1.0)
    assert check.add([rewards], weights, 4, "sum_then_normalize") is None and check.done


def test_a_generation_batch_of_one_and_a_half_optimizer_steps_is_not_described_as_one():
    """steps_per_generation=3, gradient_accumulation_steps=2: a batch lasts 1.5 optimizer steps, so the start-up
    line must not say each batch is used for 1 optimizer step."""
    args = SimpleNamespace(steps_per_generation=3, num_iterations=1, gradient_accumulation_steps=2)
    layout = batch_layout(args)
    assert layout.optimizer_steps_per_generation is None
    text = layout.describe(args)
    assert "for 1 optimizer step" not in text and "every 3 micro-batches" in text, text


class _Axes:
    """Records what a plot panel draws (no matplotlib)."""

    def __init__(self):
        self.vertical = []

    def axvline(self, x, **kwargs):
        self.vertical.append(x)

    def plot(self, *args, **kwargs):
        pass

    def set_ylabel(self, *args, **kwargs):
        pass


def test_a_reference_update_is_marked_at_the_step_that_logged_it():
    """`rpg/reference_updates` grew between the entries of steps 2 and 3: the update is marked at step 3."""
    history = [{"step": step, "rpg/divergence": 0.1, "rpg/reference_updates": updates}
               for step, updates in ((1, 0), (2, 0), (3, 1), (4, 1), (5, 2))]
    ax = _Axes()
    plots._divergence_panel(ax, history)
    assert ax.vertical == [3, 5]


def test_more_rewards_than_completions_is_an_error_naming_the_function():
    """A reward function returning one reward too many would silently misalign rewards and completions."""
    wrapped = checked_reward_function(lambda completions, **kwargs: [1.0] * (len(completions) + 1), "extra")
    with pytest.raises(ValueError, match="`extra` returned 4 rewards for 3 completions"):
        wrapped(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=[[1]] * 3)


def test_a_lower_clip_width_of_one_means_no_lower_clip_not_a_math_error():
    """`epsilon=1.0` (RPGConfig accepts it: the trust region [0, 1 + eps_high], no lower bound) trains: the clipped
    KL arguments take log(1 - 1) as -inf, not `math.log(0)`."""
    torch.manual_seed(0)
    logps = (torch.randn(2, 5) - 1.0).requires_grad_()
    sampling = logps.detach() + torch.randn(2, 5)  # off-policy: w outside the trust region for some tokens
    loss, stats = rpg_per_token_loss(logps, sampling, torch.tensor([1.0, -1.0]), torch.ones(2, 5),
                                     ref_logps=logps.detach() + 0.3, divergence="ufkl", estimator="reinforce",
                                     beta=0.1, epsilon_low=1.0, epsilon_high=0.28, dual_clip_c=10.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logps.grad).all()
    assert float(stats["clip_frac_low"]) == 0.0 and not math.isnan(float(stats["divergence"]))


def test_a_picture_that_fails_to_draw_does_not_end_the_run(tmp_path, monkeypatch, caplog):
    """Any error while drawing (matplotlib's own, not only a file error) is logged; training goes on."""
    from trl_rpg.evaluation import plot_callback
    def broken(*args, **kwargs):
        raise ValueError("Image size of 700x9999999 pixels is too large")

    monkeypatch.setattr(plot_callback, "draw_run", broken)
    callback = plot_callback.RPGPlotCallback()
    state = SimpleNamespace(is_world_process_zero=True, global_step=3, log_history=[])
    with caplog.at_level(logging.WARNING, logger="trl_rpg.evaluation.plot_callback"):
        callback.on_save(SimpleNamespace(output_dir=str(tmp_path)), state, None)
    assert "could not draw" in caplog.text and "ValueError: Image size" in caplog.text
    assert callback.drawn_at is None
