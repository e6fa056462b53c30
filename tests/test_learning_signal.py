"""`trl_rpg.run.learning_signal`: which batches and optimizer steps carry a learning signal, when the trainer warns,
what
the end-of-run verdict says (also across a resume), and the bounds on reward-model scores. The end-to-end cases
through the trainer are in tests/test_training_on_nothing.py and tests/test_learning_signal_verdict.py."""

import math
import re

import pytest
import torch
from torch import nn

from trl_rpg.run.learning_signal import (
    ALL_MASKED,
    SKIPPED,
    WARN_AFTER,
    ZERO_ADVANTAGE,
    ZERO_SPREAD,
    BatchFacts,
    SignalTally,
    batch_facts,
    check_reward_model_scores,
    step_cause,
)

G = 4
ONE = torch.ones(1)
NAN = math.nan
SIGNAL = BatchFacts(groups=2, groups_with_spread=1, tokens=10, tokens_with_advantage=4)
FLAT = BatchFacts(groups=2, groups_with_spread=0, tokens=10, tokens_with_advantage=0)
MASKED = BatchFacts(groups=2, groups_with_spread=2, tokens=0, tokens_with_advantage=0)


def column(*values):
    return torch.tensor(values, dtype=torch.float32).unsqueeze(1)


def facts(rewards, advantages=None, mask=None, **kwargs):
    rounds = rewards if isinstance(rewards, list) else [rewards]
    n = rounds[-1].size(0)
    advantages = torch.ones(n) if advantages is None else advantages
    mask = torch.ones(n, 3) if mask is None else mask
    return batch_facts(rounds, advantages, mask, kwargs.pop("weights", ONE), G,
                       kwargs.pop("aggregation", "sum_then_normalize"), **kwargs)


# ------------------------------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------------------------------


def test_a_group_carries_signal_only_if_its_scored_rewards_differ():
    assert facts(column(1, 1, 1, 1, 0.3, 0.3, 0.3, 0.3)).groups_with_spread == 0  # constant (non-binary too)
    assert facts(column(1, 1, 1, 1, 0, 1, 1, 1)) == BatchFacts(2, 1, 24, 24)
    assert facts(column(1, NAN, 1, NAN, NAN, NAN, NAN, NAN)).groups_with_spread == 0  # unscored rows left out
    assert facts(column(1, 1, 1, 1 + 1e-9, 0, 0, 0, 0)).groups_with_spread == 0  # float rounding is not spread
    # several reward functions: their weighted sum (sum_then_normalize) or each one (normalize_then_sum)
    opposite = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert facts(opposite, weights=torch.tensor([1.0, 1.0])).groups_with_spread == 0
    assert facts(opposite, weights=torch.tensor([1.0, 2.0])).groups_with_spread == 1
    assert facts(opposite, weights=torch.tensor([1.0, 1.0]), aggregation="normalize_then_sum").groups == 1


def test_dynamic_sampling_rounds_are_all_read():
    flat, varied = column(1, 1, 1, 1), column(0, 1, 0, 1)
    assert facts([flat, flat, flat]) == BatchFacts(3, 0, 12, 12)
    assert facts([flat, varied, flat]).groups_with_spread == 1


def test_tokens_count_only_trained_on_tokens_of_completions_with_an_advantage():
    rewards = column(0, 1, 0, 1)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    got = facts(rewards, advantages=torch.tensor([0.0, 0.5, 0.0, -1.0]), mask=mask)
    assert (got.tokens, got.tokens_with_advantage) == (6, 1)  # row 3's advantage is on masked tokens only
    per_token = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    got = facts(rewards, advantages=per_token, mask=mask)  # (B, T) advantages of subclasses
    assert (got.tokens, got.tokens_with_advantage) == (6, 2)
    assert facts(rewards, mask=torch.zeros(4, 3)).cause == ALL_MASKED


def test_token_counts_are_summed_over_processes_in_one_call():
    calls = []

    def reduce_sum(t):
        calls.append(t.clone())
        return t * 2  # two processes with the same counts

    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    got = facts(column(0, 1, 0, 1), advantages=torch.tensor([0.0, 1.0, 1.0, 1.0]), mask=mask, reduce_sum=reduce_sum)
    assert (got.tokens, got.tokens_with_advantage) == (6, 2)
    assert len(calls) == 1 and calls[0].tolist() == [3, 1]


def test_batch_cause():
    assert SIGNAL.cause is None
    assert FLAT.cause == ZERO_SPREAD
    assert MASKED.cause == ALL_MASKED
    assert BatchFacts(2, 0, 0, 0).cause == ALL_MASKED  # both: masking named first
    assert BatchFacts(2, 1, 10, 0).cause == ZERO_ADVANTAGE  # e.g. an overflowed std divided every advantage to 0


# ------------------------------------------------------------------------------------------------------------------
# Steps
# ------------------------------------------------------------------------------------------------------------------


def test_step_cause():
    assert step_cause([SIGNAL], skipped=False) is None
    assert step_cause([SIGNAL], skipped=True) == SKIPPED
    assert step_cause([FLAT, SIGNAL], skipped=False) is None  # any batch the step trained on
    assert step_cause([FLAT, MASKED], skipped=False) == ALL_MASKED  # the latest batch's cause
    assert step_cause([FLAT], skipped=True) == ZERO_SPREAD  # the batch is the root cause
    assert step_cause([], skipped=False) is None  # nothing to judge: not counted against the run
    assert step_cause([], skipped=True) == SKIPPED


def run(tally, steps, saved=None):
    """Feed `steps` (a list of (batch or None, skipped)) to `tally`; the warnings and the last saved entry."""
    warnings = []
    for batch, skipped in steps:
        if batch is not None:
            tally.add_batch(batch)
        saved, warning = tally.end_step(skipped, saved)
        warnings.append(warning)
    return warnings, saved


def test_warns_after_warn_after_steps_in_a_row_without_signal_once_per_streak():
    assert WARN_AFTER == 3
    tally = SignalTally()
    warnings, _ = run(tally, [(FLAT, False)] * 2 + [(SIGNAL, False)] + [(FLAT, False), (MASKED, False), (SIGNAL, True)]
                      + [(SIGNAL, False)] + [(SIGNAL, True)] * 2 + [(FLAT, False)] * 2)
    said = [(i, w) for i, w in enumerate(warnings) if w]
    assert [i for i, _ in said] == [5, 9]  # steps 3-5 (FLAT, MASKED, skipped), then 7-9; not again at 10
    assert "the last 3 optimizer steps carried no learning signal" in said[0][1]
    for cause in (ZERO_SPREAD, ALL_MASKED, SKIPPED):
        assert f"1 step: {cause}" in said[0][1]
    assert "2 steps: skipped by the non-finite-gradient guard" in said[1][1]
    assert "mask_truncated_completions=True and every completion truncated" in said[0][1]
    assert (tally.steps, tally.steps_with_signal) == (11, 2)
    assert tally.final_error() is None  # two steps carried signal


def test_a_reused_batch_judges_every_step_it_feeds():
    tally = SignalTally()
    run(tally, [(FLAT, False), (None, False), (None, False), (SIGNAL, False), (None, False)])
    assert (tally.steps, tally.steps_with_signal) == (5, 2)
    tally = SignalTally()
    run(tally, [(None, False)] * 2)  # no batch seen: nothing to judge
    assert tally.steps_with_signal == 2


def test_final_error_names_every_cause_with_its_count():
    tally = SignalTally()
    assert tally.final_error() is None  # no step judged
    run(tally, [(FLAT, False), (FLAT, False), (MASKED, False), (SIGNAL, True)])
    error = tally.final_error()
    assert error.startswith("RPGTrainer: none of the 4 optimizer steps carried a learning signal (2 steps: zero "
                            "reward spread in every group; 1 step: every completion token masked; 1 step: skipped by "
                            "the non-finite-gradient guard), so the model was trained on nothing.")
    assert "the KL penalty and the entropy bonus do not count" in error
    assert "greedy sampling (top_k=1, temperature ~0)" in error and "raise max_completion_length" in error


def test_the_counts_survive_a_resume_through_the_saved_entry():
    first = SignalTally()
    _, saved = run(first, [(SIGNAL, False), (FLAT, False)])
    assert saved == {"steps": 2, "steps_with_signal": 1}
    resumed = SignalTally()
    warnings, saved = run(resumed, [(FLAT, False)] * 3, saved)
    assert saved == {"steps": 5, "steps_with_signal": 1}
    assert warnings[-1] is not None  # still warned
    assert resumed.final_error() is None  # the run as a whole carried signal
    without = SignalTally()
    run(without, [(FLAT, False)] * 2, {"steps": 4, "steps_with_signal": 0})
    assert "none of the 2 optimizer steps (and none of the 4 before the resumed checkpoint)" in without.final_error()


def test_the_saved_entry_is_read_at_the_first_step_only():
    tally = SignalTally()
    tally.add_batch(FLAT)
    saved, _ = tally.end_step(False, None)
    saved, _ = tally.end_step(False, {"steps": 100, "steps_with_signal": 50})  # not a resume: ignored
    assert saved == {"steps": 2, "steps_with_signal": 0} and tally.final_error() is not None


# ------------------------------------------------------------------------------------------------------------------
# Reward-model scores
# ------------------------------------------------------------------------------------------------------------------


def reward_func(completions, **kwargs):
    return [0.0] * len(completions)


MODEL = nn.Linear(1, 1)


@pytest.mark.parametrize("bad,shown", [(1e27, "1e+27"), (-2e15, "-2e+15"), (math.inf, "inf"), (NAN, "NaN")])
def test_reward_model_scores_must_be_finite_and_bounded(bad, shown):
    rewards = torch.tensor([[0.5, 1e27], [bad, 2.0], [1e15, 3.0]])  # column 1 is a reward function's: not read
    with pytest.raises(ValueError, match=rf"Reward model `rm` scored completion 1 of the batch \(of 3, all "
                                         rf"processes\) {re.escape(shown)} \(1 scores out of bounds\); "
                                         r"reward-model scores must be finite and at most 1e\+15 in magnitude"):
        check_reward_model_scores(rewards, [MODEL, reward_func], ["rm", "reward_func"])


def test_reward_model_scores_within_the_bound_and_reward_function_columns_pass():
    check_reward_model_scores(torch.tensor([[1e15, 1e27], [-3.0, NAN]]), [MODEL, reward_func], ["rm", "f"])
    check_reward_model_scores(torch.tensor([[5.0]]), [MODEL], ["rm"], max_abs_reward=5.0)
    with pytest.raises(ValueError, match="at most 4 in magnitude"):
        check_reward_model_scores(torch.tensor([[5.0]]), [MODEL], ["rm"], max_abs_reward=4.0)
