"""A run that trains on nothing is never silent: rewards never scored (a warning at the first such batch, then the
verdict at the end: an error with `rpg_require_learning_signal=True`, as these tests set it; the default's warning
and metrics: tests/test_learning_signal_verdict.py), no optimizer step carrying a learning signal (a constant
reward, greedy sampling, every step skipped, every completion masked: a warning after 3 such steps, then the verdict
at the end; see `trl_rpg.run.learning_signal`), reward-model scores that would overflow TRL's std (an error at once), a
configuration with no training step (an error naming the field), no optimizer step taken (the verdict); a resume
from a checkpoint already at the last step says what happens (a warning)."""

import logging

import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer

WARNING = "no reward function scored any completion"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def unscored(completions, **kwargs):
    return [None] * len(completions)


def test_a_run_with_no_scored_reward_fails_after_one_warning(tmp_path, model_path, caplog):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=4, steps_per_generation=2,  # 2 generation batches
                                rpg_require_learning_signal=True))
    trainer = RPGTrainer(model=model_path, reward_funcs=unscored, args=args, train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        with pytest.raises(RuntimeError, match=r"none of the 2 training batches had a single scored reward.*"
                                               r"trained on nothing.*\['unscored'\].*\['prompt'\]"):
            trainer.train()
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1


def test_a_run_with_some_unscored_batches_warns_once_and_trains(tmp_path, model_path, caplog):
    calls = []

    def scored_after_first_batch(completions, **kwargs):
        calls.append(len(completions))
        return [None] * len(completions) if len(calls) == 1 else [float(len(c)) for c in completions]

    args = RPGConfig(**cpu_args(tmp_path, max_steps=6, steps_per_generation=2))  # 3 generation batches
    trainer = RPGTrainer(model=model_path, reward_funcs=scored_after_first_batch, args=args,
                         train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        trainer.train()
    assert len(calls) == 3 and trainer.state.global_step == 6
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1


def test_reward_functions_that_cannot_find_their_columns_fail_before_the_model_loads(tmp_path):
    from trl_rpg.rewards import math_reward

    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, steps_per_generation=2))
    with pytest.raises(ValueError, match=r"'math_reward' reads one of the columns \['ground_truth', 'reward_model', "
                                         r"'answer'\].*has the columns \['prompt'\]"):
        RPGTrainer(model="no-model-is-loaded", reward_funcs=math_reward, args=args, train_dataset=tiny_dataset())


@pytest.mark.parametrize("max_steps,epochs", [(-1, 0), (0, 0.0), (-1, float("nan"))])
def test_a_configuration_with_no_training_step_is_refused(tmp_path, max_steps, epochs):
    with pytest.raises(ValueError, match=rf"RPGConfig: `num_train_epochs`={epochs!r} is not allowed; with "
                                         rf"max_steps={max_steps} the run would train nothing"):
        RPGConfig(**cpu_args(tmp_path, max_steps=max_steps, num_train_epochs=epochs))
    RPGConfig(**cpu_args(tmp_path, max_steps=-1, num_train_epochs=0.5))  # a fraction of an epoch trains


def test_a_run_that_takes_no_optimizer_step_fails(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, rpg_require_learning_signal=True))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.args.max_steps, trainer.args.num_train_epochs = -1, 0  # changed after the config's own check
    with pytest.raises(RuntimeError, match="the run took no optimizer step"):
        trainer.train()


def test_resuming_a_finished_run_says_that_transformers_takes_one_more_step(tmp_path, model_path, caplog):
    """transformers' Trainer, under GRPOTrainer as under RPGTrainer, takes one optimizer step past `max_steps` when
    it resumes a checkpoint already at `max_steps`; RPGTrainer keeps that behaviour (drop-in) and says so."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2))
    RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset()).train()
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 3
    assert any("is already at step 2 (max_steps=2); transformers' Trainer still takes one more optimizer step"
               in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------------------------------
# No learning signal (issue 20, section 1)
# ------------------------------------------------------------------------------------------------------------------

NO_SIGNAL = "the last 3 optimizer steps carried no learning signal"


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def train_without_signal(trainer, caplog, error: str):
    """Train with `rpg_require_learning_signal=True`; the run must log the no-signal warning once and raise `error`
    (a regex) at the end."""
    trainer.args.rpg_require_learning_signal = True
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        with pytest.raises(RuntimeError, match=error):
            trainer.train()
    assert trainer.state.global_step == trainer.args.max_steps  # it ran to the end, then failed
    assert sum(NO_SIGNAL in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("reward,options", [
    (constant_reward, {}),
    (digit_reward, {"top_k": 1}),  # greedy: the completions of a prompt are all the same
], ids=["constant_reward", "greedy_sampling"])
def test_a_run_whose_groups_never_differ_in_reward_fails(tmp_path, model_path, caplog, reward, options):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=4, steps_per_generation=2, **options))
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    train_without_signal(trainer, caplog, r"none of the 4 optimizer steps carried a learning signal \(4 steps: zero "
                                          r"reward spread in every group\), so the model was trained on nothing")


def test_a_run_whose_every_step_is_skipped_fails(tmp_path, model_path, caplog):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.model.lm_head.weight.register_hook(lambda grad: grad * float("nan"))  # every gradient norm is NaN
    train_without_signal(trainer, caplog, r"none of the 3 optimizer steps carried a learning signal \(3 steps: "
                                          r"skipped by the non-finite-gradient guard\)")
    assert trainer.skipped_steps == 3


def test_a_run_whose_every_completion_is_masked_fails(tmp_path, model_path, caplog):
    # no EOS (nor pad) can be generated: every completion is truncated, and masked
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, mask_truncated_completions=True,
                                generation_kwargs={"suppress_tokens": [0, 1]}))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    train_without_signal(trainer, caplog, r"none of the 3 optimizer steps carried a learning signal \(3 steps: every "
                                          r"completion token masked\).*raise max_completion_length")


def test_a_run_with_signal_in_some_steps_trains(tmp_path, model_path, caplog):
    calls = []

    def constant_then_informative(completions, **kwargs):
        calls.append(len(completions))
        return [1.0] * len(completions) if len(calls) <= 3 else digit_reward(completions)

    args = RPGConfig(**cpu_args(tmp_path, max_steps=4, steps_per_generation=1))  # a new batch every step
    trainer = RPGTrainer(model=model_path, reward_funcs=constant_then_informative, args=args,
                         train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        trainer.train()  # step 4 carried signal
    assert sum(NO_SIGNAL in r.getMessage() for r in caplog.records) == 1  # after steps 1-3
    assert trainer.state.stateful_callbacks["RPGLearningSignal"] == {"steps": 4, "steps_with_signal": 1}


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


class ConstantAfter(TrainerCallback):
    """Makes `reward` constant from optimizer step `step` on."""

    def __init__(self, reward, step):
        self.reward, self.step = reward, step

    def on_step_begin(self, args, state, control, **kwargs):
        self.reward.constant = state.global_step + 1 >= self.step


class SwitchableReward:
    def __init__(self):
        self.constant = False
        self.__name__ = "switchable_reward"

    def __call__(self, completions, **kwargs):
        return constant_reward(completions) if self.constant else digit_reward(completions)


def test_a_resumed_run_that_had_signal_before_its_checkpoint_does_not_fail(tmp_path, model_path, caplog):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=5, steps_per_generation=1, save_strategy="steps", save_steps=2))
    reward = SwitchableReward()
    first = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    first.add_callback(ConstantAfter(reward, 2))
    first.add_callback(StopAt(2))
    first.train()  # step 1 carried signal, step 2 none; checkpoint-2
    resumed = RPGTrainer(model=model_path, reward_funcs=constant_reward, args=args, train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        resumed.train(resume_from_checkpoint=True)  # steps 3-5: none
    assert resumed.state.stateful_callbacks["RPGLearningSignal"] == {"steps": 5, "steps_with_signal": 1}
    assert sum(NO_SIGNAL in r.getMessage() for r in caplog.records) == 1


def save_reward_model(path, model_path, scale: float) -> str:
    """A local sequence-classification reward model on the tiny model's config whose scores are about `scale`."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    config.pad_token_id = AutoTokenizer.from_pretrained(model_path).pad_token_id
    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.score.weight.mul_(scale)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(path)
    return str(path)


def test_reward_model_scores_that_overflow_the_std_are_refused(tmp_path, model_path):
    """Scores of ~1e27 overflow TRL's float32 group std (every advantage 0); like a reward function's, a reward
    model's scores must stay within 1e15, and the error names the model."""
    reward_model = save_reward_model(tmp_path / "huge_scores", model_path, 1e27)
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, scale_rewards="group"))
    trainer = RPGTrainer(model=model_path, reward_funcs=reward_model, args=args, train_dataset=tiny_dataset())
    with pytest.raises(ValueError, match=r"Reward model `huge_scores` scored completion 0 of the batch \(of 32, all "
                                         r"processes\) -?\d.*e\+2\d.*at most 1e\+15 in magnitude"):
        trainer.train()
    assert trainer.state.global_step == 0


class MaskedHere(RPGTrainer):
    """Every completion of this process is masked (its completion mask zeroed after TRL's scoring)."""

    def _rpg_generate_and_score(self, batch):
        output, rewards = super()._rpg_generate_and_score(batch)
        output["completion_mask"] = torch.zeros_like(output["completion_mask"])
        return output, rewards


def test_token_counts_are_summed_over_processes(tmp_path, model_path):
    """This process's completions are all masked, but the sum over processes (accelerate's `reduce`, stood in for
    by one that adds another process's trained-on tokens) has some: every process trains on, as under DDP; decided
    from its own tokens, this one would fail alone. (Rewards are gathered: the spread is the same on every process.)
    A real two-process run of this case passed (commit ca95448; ~50 s, so not kept in the suite)."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, steps_per_generation=1))
    trainer = MaskedHere(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    reduce, counts = trainer.accelerator.reduce, []

    def with_another_process(tensor, reduction="mean", **kwargs):
        if tensor.dtype == torch.long:  # the learning-signal token counts (the metrics are float)
            counts.append((reduction, tensor.tolist()))
            return tensor + torch.tensor([10, 10])
        return reduce(tensor, reduction=reduction, **kwargs)

    trainer.accelerator.reduce = with_another_process
    clip = trainer.accelerator.clip_grad_norm_  # and the other process's gradient, which DDP adds to this one's
    trainer.accelerator.clip_grad_norm_ = lambda *args, **kwargs: clip(*args, **kwargs) + 1.0
    trainer.train()
    assert counts == [("sum", [0, 0])] * 2  # one reduction per generation batch, of this process's counts
    assert trainer.state.stateful_callbacks["RPGLearningSignal"] == {"steps": 2, "steps_with_signal": 2}


def test_a_run_whose_parameters_never_move_fails(tmp_path, model_path, caplog):
    """learning_rate=0 (issue 34 section 5): the rewards differ and the gradient is not 0, but no parameter moves; the
    verdict sees that no update happened (before: 3 of 3 steps "with signal")."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, learning_rate=0.0))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    train_without_signal(trainer, caplog, r"none of the 3 optimizer steps carried a learning signal \(3 steps: "
                                          r"learning rate 0: no update\).*the parameters did not move")
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
