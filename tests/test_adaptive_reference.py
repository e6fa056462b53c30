"""The adaptive reference schedule, checked step by step against an independent computation (issue 11, section 4).

`rpg_reference="adaptive"`: after each optimizer step, the divergence of that step (token-weighted over all its
micro-batches) enters an exponential moving average, `ema <- decay * ema + (1 - decay) * divergence`, started
afresh from the step's divergence at the first step and after each reference update; when `ema` exceeds
`rpg_reference_kl_target`, pi_ref <- pi_theta. Checked only through what a user sees: `rpg/divergence`,
`rpg/divergence_ema` and `rpg/reference_updates` in `trainer.state.log_history`, and a resumed run's log.

Set-up that makes the logged per-step divergence exactly the step's divergence: gradient_accumulation_steps=2 and
every completion exactly max_completion_length tokens long (`full_length`), so the two micro-batches of a step hold
equally many tokens and the logged mean of their two divergences is the token-weighted step divergence. The data
are fixed completions (tests/_equivalence.py), so the divergence sequence is deterministic.

What each test catches: `decay` and `1 - decay` swapped, and the average updated at every micro-batch instead of
once per optimizer step (`test_adaptive_schedule_follows_the_moving_average`); the average not restored on resume
(`test_resume_restores_the_moving_average_that_decides_the_next_update`).
"""

from __future__ import annotations

import pytest
import torch
from _equivalence import FixedRPGTrainer, base_settings, logged, make_trainer, max_difference, parameters, prompts
from _tiny import digit_reward, save_tiny_model

from trl_rpg import RPGConfig

TARGET, DECAY = 0.025, 0.8  # DECAY != 0.5, so that swapping decay and 1 - decay changes the average
STEPS, SAVE_AT = 12, 6
RTOL = 1e-5  # logged float32 values vs the same quantities recomputed in double


class FullLengthRPGTrainer(FixedRPGTrainer):
    full_length = True


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("mutations_model")))


def adaptive_args(output_dir) -> RPGConfig:
    settings = base_settings(max_steps=STEPS, beta=0.1, save_strategy="steps", save_steps=SAVE_AT)
    return RPGConfig(output_dir=str(output_dir), **settings, rpg_reference="adaptive",
                     rpg_reference_kl_target=TARGET, rpg_reference_kl_decay=DECAY)


def train_adaptive(model_dir, output_dir, resume_from_checkpoint=None):
    trainer = make_trainer(FullLengthRPGTrainer, model_dir, adaptive_args(output_dir), prompts(32),
                           reward=digit_reward)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, model_dir):
    output_dir = tmp_path_factory.mktemp("adaptive")
    return train_adaptive(model_dir, output_dir), output_dir


def expected_schedule(divergence: dict[int, float], target: float, decay: float, ema=None, updates=0):
    """{step: (moving average after the step, reference updates before the step's own)}, from the per-step
    divergence; `ema`/`updates` are the state before the first step given (None: start afresh)."""
    schedule = {}
    for step in sorted(divergence):
        ema = divergence[step] if ema is None else decay * ema + (1 - decay) * divergence[step]
        schedule[step] = (ema, updates)
        if ema > target:
            updates, ema = updates + 1, None
    return schedule


def test_adaptive_schedule_follows_the_moving_average(uninterrupted):
    trainer, _ = uninterrupted
    divergence = logged(trainer, "rpg/divergence")
    ema, updates = logged(trainer, "rpg/divergence_ema"), logged(trainer, "rpg/reference_updates")
    assert sorted(divergence) == sorted(ema) == sorted(updates) == list(range(1, STEPS + 1))
    expected = expected_schedule(divergence, TARGET, DECAY)
    for step, (want_ema, want_updates) in expected.items():
        assert ema[step] == pytest.approx(want_ema, rel=RTOL, abs=1e-12), f"step {step}: moving average"
        assert updates[step] == want_updates, f"step {step}: reference updates so far"
        # no average sits so close to the target that float rounding could decide the comparison
        assert abs(want_ema - TARGET) > 1e-3 * TARGET, f"step {step}: average {want_ema} too close to the target"
    update_steps = [s for s, (value, _) in expected.items() if value > TARGET]
    print(f"[adaptive] reference updates after steps {update_steps}")
    # the schedule was exercised: updates happened, not at every step, and the divergence varied between steps
    assert 2 <= len(update_steps) <= STEPS // 2
    assert len({round(v, 6) for v in divergence.values() if v > 0}) >= STEPS // 2


def test_resume_restores_the_moving_average_that_decides_the_next_update(uninterrupted, model_dir, tmp_path):
    """Resumed at step SAVE_AT, the run repeats the uninterrupted one: the restored moving average decides whether
    the reference is updated at the next step, and here a freshly started average would decide otherwise."""
    full, output_dir = uninterrupted
    divergence, ema = logged(full, "rpg/divergence"), logged(full, "rpg/divergence_ema")
    updates = logged(full, "rpg/reference_updates")
    step = SAVE_AT + 1
    # precondition, from the uninterrupted log: no update at SAVE_AT (the average carries over), the restored
    # average stays below the target at the next step, and an average restarted at the resume would cross it
    assert updates[step] == updates[SAVE_AT] and ema[SAVE_AT] > 0
    assert ema[step] < TARGET < divergence[step]

    checkpoint = output_dir / f"checkpoint-{SAVE_AT}"
    resumed = train_adaptive(model_dir, tmp_path, resume_from_checkpoint=str(checkpoint))
    keys = ("rpg/reference_updates", "rpg/divergence_ema", "rpg/divergence")
    got, want = {k: logged(resumed, k) for k in keys}, {k: logged(full, k) for k in keys}
    for s in range(step, STEPS + 1):  # the first step that differs is reported
        for key in keys:
            assert got[key][s] == pytest.approx(want[key][s], rel=RTOL, abs=1e-12), f"{key} at step {s} (resumed)"
    assert max_difference(parameters(resumed), parameters(full)) <= 1e-6


class RNGNeutralEvaluation(FullLengthRPGTrainer):
    """Evaluation that leaves the global RNG as it found it: TRL shuffles each generation batch with the global RNG,
    which an evaluation in between would otherwise advance, so the runs with and without evaluation would train on
    differently shuffled micro-batches."""

    def evaluate(self, *args, **kwargs):
        with torch.random.fork_rng():
            return super().evaluate(*args, **kwargs)


def test_evaluation_batches_do_not_feed_the_trigger(uninterrupted, model_dir, tmp_path):
    """Evaluation between optimizer steps leaves the schedule alone: the moving average, the updates and the trained
    parameters are those of the same run without evaluation (evaluation batches feeding the trigger would add their
    divergence to the step's window and shift the average)."""
    full, _ = uninterrupted
    settings = base_settings(max_steps=STEPS, beta=0.1, eval_strategy="steps", eval_steps=2,
                             per_device_eval_batch_size=8)
    args = RPGConfig(output_dir=str(tmp_path), **settings, rpg_reference="adaptive", rpg_reference_kl_target=TARGET,
                     rpg_reference_kl_decay=DECAY)
    trainer = make_trainer(RNGNeutralEvaluation, model_dir, args, prompts(32), eval_dataset=prompts(8),
                           reward=digit_reward)
    trainer.train()
    assert len(logged(trainer, "eval_loss")) == STEPS // 2
    for key in ("rpg/divergence_ema", "rpg/reference_updates"):
        got, want = logged(trainer, key), logged(full, key)
        assert sorted(got) == sorted(want)
        for step in want:
            assert got[step] == pytest.approx(want[step], rel=RTOL, abs=1e-12), f"{key} at step {step}"
    assert max_difference(parameters(trainer), parameters(full)) <= 1e-6
