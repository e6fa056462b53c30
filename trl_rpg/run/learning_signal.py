"""Whether a training run learns anything: a run in which no optimizer step carried a learning signal is told so.

RPG's policy gradient is `E[w * A * grad log pi]` (docs/math.md section 2): it moves the policy only through completion
tokens that are trained on (loss mask 1) and whose advantage `A` is not 0. Under TRL's group baseline a completion's
advantage is 0 whenever every completion of its prompt got the same reward. So a run can go through every step,
finite and error-free, and learn nothing: a constant reward (or `math_reward` when the model never writes an
answer), greedy sampling (`top_k=1`, temperature ~0: every completion of a prompt is the same), every completion
masked (`mask_truncated_completions=True` with every completion truncated), every optimizer step skipped by the
non-finite-gradient guard, rewards so large that TRL's float32 std overflows (every advantage 0), or a gradient
exactly 0 at every step (every trained-on token in a zero-gradient region of the clip).

Definitions (what the trainer feeds in, and what is decided):

- A generation batch carries signal when (1) at least one group of `num_generations` completions has rewards that
  are not all equal (`group_signal.group_reward_signal` with `rtol=0`: the weighted rewards of all processes, as
  TRL gathers them in float32, unscored completions left out, max - min above 0). Not a tolerance: rewards any distance
  apart get non-zero advantages from TRL and move the parameters (at most 1e-6 apart, learning rate 1e-2: by 0.012
  in 2 steps on the tests' tiny model), so they are a signal; rewards that are all equal are not, though TRL's
  float32 group mean can leave their advantages at rounding noise (up to 0.37 once divided by the group std, for a
  constant 1000.7 in groups of 8). And (2) at least one completion token of the batch is trained on (loss mask 1
  after TRL's truncation masking, tool mask included) and belongs to a completion whose advantage is not 0. Token
  counts are summed over processes, so every process decides the same. With dynamic sampling, (1) reads the groups of
  every round of the batch.
- An optimizer step carries signal when it was not skipped by the non-finite-gradient guard, its gradient norm is not
  exactly 0 (`gradient_is_zero`: then it changed nothing, whatever its batch offered), its learning rate is not 0
  (`learning_rate_is_zero`: `learning_rate=0`, or a schedule at 0, moves no parameter) and a generation batch it
  trained on carries signal: the batches generated since the previous optimizer step or, when none was (a batch
  reused for several steps), the latest one. The whole batch is judged, not the slice a step trains on.
- The KL penalty (`beta`) and TRL's entropy bonus are not counted as signal. Without reward signal they can only pull
  the policy towards the reference or towards higher entropy, which learns nothing about the task; and the KL term's
  gradient is 0 where the policy equals its reference, as it does at the start with `rpg_reference="initial"` and at
  every generation with `"sampling"`.
- The trainer warns after `WARN_AFTER` optimizer steps in a row without signal, naming the causes. When no step of
  the whole run carried signal (`trained_on_nothing`), `train()` returns, as `GRPOTrainer.train()` does, warning with
  `verdict_warning` and with the verdict in its metrics (`verdict_metrics`); with `rpg_require_learning_signal=True`
  it saves the final model and raises `NoLearningSignal` (`verdict_error`). The counts are kept in the trainer state
  (`STATE_KEY`, saved in `trainer_state.json` with every checkpoint), so a resumed run whose earlier steps carried
  signal does not fail because its remaining steps carry none; it still warns.

Reward models get no finite-and-bounded check from `reward_calls.checked_reward_function` (TRL calls them directly), so
`check_reward_model_scores` applies the same bounds to their scores, which would otherwise overflow TRL's std.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .group_signal import group_reward_signal
from .reward_calls import MAX_ABS_REWARD

__all__ = [
    "NoLearningSignal",
    "STEPS_WITH_SIGNAL",
    "TRAINED_ON_NOTHING",
    "TRAINED_ON_NOTHING_REASON",
    "verdict_error",
    "verdict_metrics",
    "verdict_warning",
    "trained_on_nothing",
    "ALL_MASKED",
    "SKIPPED",
    "STATE_KEY",
    "WARN_AFTER",
    "ZERO_ADVANTAGE",
    "ZERO_GRADIENT",
    "ZERO_SPREAD",
    "NO_UPDATE",
    "HINTS",
    "BatchFacts",
    "SignalTally",
    "batch_facts",
    "check_reward_model_scores",
    "gradient_is_zero",
    "learning_rate_is_zero",
    "step_cause",
]

class NoLearningSignal(RuntimeError):
    """`train()` finished without a single step that could change the policy by its rewards: no optimizer step,
    no scored batch, or no step with learning signal (`trained_on_nothing`)."""


def trained_on_nothing(global_step: int, max_steps: int, scoring, tally: SignalTally, reward_func_names,
                       columns) -> str | None:
    """Why a finished run trained on nothing, or None: it took no optimizer step; no training batch had a scored
    reward (`reward_calls.ScoringTally`); or no optimizer step carried learning signal (`SignalTally.final_error`)."""
    if global_step == 0:
        return ("RPGTrainer: the run took no optimizer step, so the model was trained on nothing "
                f"(max_steps={max_steps}).")
    if scoring.batches and not scoring.scored:
        return (f"RPGTrainer: none of the {scoring.batches} training batches had a single scored reward (every "
                f"reward function returned None or NaN for every completion), so the model was trained on nothing. "
                f"Reward functions: {list(reward_func_names)}; data set columns: {columns}.")
    return tally.final_error()


#: Keys of the verdict in the metrics `train()` returns (`TrainOutput.metrics`).
TRAINED_ON_NOTHING, TRAINED_ON_NOTHING_REASON, STEPS_WITH_SIGNAL = (
    "rpg/trained_on_nothing", "rpg/trained_on_nothing_reason", "rpg/steps_with_learning_signal")


def verdict_metrics(error: str | None, tally: SignalTally) -> dict:
    """The verdict of `trained_on_nothing` (`error`) as metrics: `rpg/trained_on_nothing` 1.0 or 0.0, the optimizer
    steps with signal in the whole run (a resumed checkpoint's included), and the reason when it trained on nothing."""
    metrics = {TRAINED_ON_NOTHING: float(error is not None),
               STEPS_WITH_SIGNAL: float(tally.state_dict()["steps_with_signal"])}
    if error is not None:
        metrics[TRAINED_ON_NOTHING_REASON] = error
    return metrics


def verdict_warning(error: str) -> str:
    """The end-of-training warning of a run that trained on nothing (`rpg_require_learning_signal=False`)."""
    return (f"{error} train() returns all the same, as GRPOTrainer.train() does (the verdict is in its metrics, "
            f"{TRAINED_ON_NOTHING!r}); set rpg_require_learning_signal=True to make it an error, as `trl-rpg train` "
            "does.")


def verdict_error(error: str, saved_to: str) -> str:
    """The `NoLearningSignal` message (`rpg_require_learning_signal=True`), saying where the final model was saved."""
    return (f"{error} The final model was saved to {saved_to} before this error (rpg_require_learning_signal=True), "
            "so nothing of the run is lost.")


#: Key of the tally's counts in `TrainerState.stateful_callbacks` (saved in `trainer_state.json`).
STATE_KEY = "RPGLearningSignal"

#: Optimizer steps in a row without learning signal after which the trainer warns.
WARN_AFTER = 3

# Causes of a step without signal, as the warning and the error name them.
ZERO_SPREAD = "zero reward spread in every group"
ALL_MASKED = "every completion token masked"
ZERO_ADVANTAGE = "every advantage 0 although rewards differ"
SKIPPED = "skipped by the non-finite-gradient guard"
ZERO_GRADIENT = "gradient exactly 0"
NO_UPDATE = "learning rate 0: no update"

#: What to check, per cause.
HINTS = {
    ZERO_SPREAD: ("every completion of a prompt got the same reward: a constant reward, a model that never writes an "
                  "answer, greedy sampling (top_k=1, temperature ~0) or a task already solved"),
    ALL_MASKED: ("mask_truncated_completions=True and every completion truncated: raise max_completion_length; or "
                 "every token's sampler log-prob from the vLLM engine excluded (not finite, or above 0: see the "
                 "engine's warning)"),
    ZERO_ADVANTAGE: "rewards differ but every advantage is 0: check the reward scale and scale_rewards",
    SKIPPED: "the gradient norm was not finite: see the skipped-step warnings",
    ZERO_GRADIENT: ("the gradient norm was 0.0: every trained-on token sat in a zero-gradient region of the clip "
                    "(epsilon, epsilon_high, rpg_dual_clip_c), or no trainable parameter reaches the loss"),
    NO_UPDATE: ("the optimizer's learning rate was 0 at that step (learning_rate=0, or a schedule at 0: warmup's "
                "first step, a decay's end), so the parameters did not move"),
}


# ------------------------------------------------------------------------------------------------------------------
# Facts of one generation batch
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchFacts:
    """What one training generation batch offers the policy gradient, over all processes (and all rounds)."""

    groups: int  #: groups of `num_generations` completions scored
    groups_with_spread: int  #: of those, groups whose rewards are not all equal
    tokens: int  #: completion tokens trained on (loss mask 1)
    tokens_with_advantage: int  #: of those, tokens of completions whose advantage is not 0

    @property
    def cause(self) -> str | None:
        """Why the batch carries no signal (None when it does). A batch with every token masked says so first."""
        if self.tokens == 0:
            return ALL_MASKED
        if self.groups_with_spread == 0:
            return ZERO_SPREAD
        if self.tokens_with_advantage == 0:
            return ZERO_ADVANTAGE
        return None


def batch_facts(rewards_per_round: Sequence[torch.Tensor], advantages: torch.Tensor, loss_mask: torch.Tensor,
                reward_weights: torch.Tensor, num_generations: int, aggregation: str,
                reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> BatchFacts:
    """The `BatchFacts` of a training batch.

    Args:
        rewards_per_round: the gathered `(N, F)` rewards of each generation round (one round without dynamic
            sampling), as `GRPOTrainer._calculate_rewards` returns them: the same on every process.
        advantages: this process's advantages, `(B,)` or `(B, T)`.
        loss_mask: this process's `(B, T)` loss mask (completion mask after truncation masking, times the tool mask).
        reward_weights, aggregation: TRL's `reward_weights` and `multi_objective_aggregation`.
        reduce_sum: sums a tensor over processes (`accelerator.reduce(t, "sum")`); one call per batch, on every
            process.
    """
    groups = spread = 0
    for rewards in rewards_per_round:
        informative, _ = group_reward_signal(rewards, reward_weights, num_generations, aggregation, rtol=0.0)
        groups += informative.numel()
        spread += int(informative.sum())
    mask = loss_mask.detach() != 0
    nonzero = advantages.detach() != 0
    nonzero = nonzero.unsqueeze(1) if nonzero.dim() == 1 else nonzero
    local = torch.stack([mask.sum(), (mask & nonzero).sum()]).long()
    tokens, with_advantage = (int(v) for v in reduce_sum(local).tolist())
    return BatchFacts(groups, spread, tokens, with_advantage)


# ------------------------------------------------------------------------------------------------------------------
# Optimizer steps and the run
# ------------------------------------------------------------------------------------------------------------------


def step_cause(batches: Sequence[BatchFacts], skipped: bool, zero_gradient: bool = False,
               no_update: bool = False) -> str | None:
    """Why an optimizer step that trained on `batches` carried no signal (None when it did). A batch cause comes
    before the step's own (skipped, a gradient exactly 0, or no update: a learning rate of 0; the batch is the root);
    a step with no batch to judge has only its own."""
    own = SKIPPED if skipped else ZERO_GRADIENT if zero_gradient else None
    own = NO_UPDATE if own is None and no_update else own
    if not batches:
        return own
    causes = [b.cause for b in batches]
    if any(c is None for c in causes):
        return own
    return causes[-1]


def learning_rate_is_zero(optimizer) -> bool:
    """Whether every parameter group of `optimizer` has learning rate 0 at the step being taken (read before
    `optimizer.step()`, after the previous scheduler step): the step then moves no parameter, whatever its gradient
    (decoupled weight decay is scaled by the learning rate too)."""
    return optimizer is not None and all(float(group["lr"]) == 0.0 for group in optimizer.param_groups)


def gradient_is_zero(grad_norm) -> bool:
    """Whether the total gradient norm of an optimizer step (a float, a 0-d tensor, or None when unknown, as under
    some DeepSpeed stages) is exactly 0: every process sees the same (all-reduced) norm."""
    return grad_norm is not None and float(grad_norm) == 0.0


def _counted(causes: Counter) -> str:
    return "; ".join(f"{n} step{'s' if n > 1 else ''}: {cause}" for cause, n in causes.most_common())


def _hints(causes: Counter) -> str:
    return " ".join(f"{cause.capitalize()}: {HINTS[cause]}." for cause in causes)


@dataclass
class SignalTally:
    """Optimizer steps with and without learning signal, in one `train()` call and (through the trainer state) in the
    checkpointed run before it. See the module docstring for the definitions.

    The trainer calls `add_batch` for every training generation batch and `end_step` once per optimizer step."""

    steps: int = 0  #: optimizer steps judged in this call
    steps_with_signal: int = 0
    prior_steps: int = 0  #: from the resumed checkpoint's trainer state
    prior_steps_with_signal: int = 0
    causes: Counter = field(default_factory=Counter)  #: cause -> steps, this call
    streak: Counter = field(default_factory=Counter)  #: causes of the current run of steps without signal
    _pending: list[BatchFacts] = field(default_factory=list)
    _latest: BatchFacts | None = None
    _loaded: bool = False

    def add_batch(self, facts: BatchFacts) -> None:
        """A training generation batch was generated and scored."""
        self._pending.append(facts)
        self._latest = facts

    def end_step(self, skipped: bool, saved: dict | None = None, zero_gradient: bool = False,
                 no_update: bool = False) -> tuple[dict, str | None]:
        """Judge the optimizer step being taken (`skipped`: by the non-finite-gradient guard; `zero_gradient`: its
        gradient norm is exactly 0, `gradient_is_zero`; `no_update`: its learning rate is 0, `learning_rate_is_zero`).

        `saved` is the trainer state's entry under `STATE_KEY`; it is read at the first step only (a resumed run's
        counts so far). Returns the entry to store back and the warning to log, if this step completes `WARN_AFTER`
        steps in a row without signal (once per such run of steps)."""
        if not self._loaded:
            self._loaded = True
            saved = saved or {}
            self.prior_steps = int(saved.get("steps", 0))
            self.prior_steps_with_signal = int(saved.get("steps_with_signal", 0))
        batches = self._pending or ([self._latest] if self._latest is not None else [])
        self._pending = []
        cause = step_cause(batches, skipped, zero_gradient, no_update)
        self.steps += 1
        warning = None
        if cause is None:
            self.steps_with_signal += 1
            self.streak.clear()
        else:
            self.causes[cause] += 1
            self.streak[cause] += 1
            if sum(self.streak.values()) == WARN_AFTER:
                warning = (f"RPGTrainer: the last {WARN_AFTER} optimizer steps carried no learning signal "
                           f"({_counted(self.streak)}), so they did not change the policy by its rewards. "
                           f"{_hints(self.streak)} A run in which no optimizer step carries signal fails at the end.")
        return self.state_dict(), warning

    def state_dict(self) -> dict:
        """The counts of the whole run so far, to store under `STATE_KEY`."""
        return {"steps": self.prior_steps + self.steps,
                "steps_with_signal": self.prior_steps_with_signal + self.steps_with_signal}

    def final_error(self) -> str | None:
        """The error `train()` raises when no optimizer step of the run carried signal (None otherwise, and when no
        step was judged)."""
        if self.steps == 0 or self.prior_steps_with_signal + self.steps_with_signal > 0:
            return None
        resumed = f" (and none of the {self.prior_steps} before the resumed checkpoint)" if self.prior_steps else ""
        return (f"RPGTrainer: none of the {self.steps} optimizer steps{resumed} carried a learning signal "
                f"({_counted(self.causes)}), so the model was trained on nothing. A step carries signal when it is "
                "not skipped, its gradient is not exactly 0, its learning rate is not 0 and its generation batch has "
                "a group whose rewards differ and a trained-on token with a non-zero advantage (the KL penalty and "
                f"the entropy bonus do not count). {_hints(self.causes)}")


# ------------------------------------------------------------------------------------------------------------------
# Reward-model scores
# ------------------------------------------------------------------------------------------------------------------


def check_reward_model_scores(rewards_per_func: torch.Tensor, reward_funcs: Sequence, names: Sequence[str],
                              max_abs_reward: float = MAX_ABS_REWARD) -> None:
    """Raise `ValueError` if a reward model (an `nn.Module` in `reward_funcs`) scored a completion with a value that
    is not finite, or above `max_abs_reward` (`reward_calls.MAX_ABS_REWARD` = 1e15) in magnitude.

    The bound is the one reward functions get (`checked_reward_function`): larger scores can overflow TRL's
    float32 group/batch std to inf and make every advantage 0. A reward model has no "not scored", so NaN is refused
    too. `rewards_per_func` is the gathered `(N, F)` tensor, the same on every process: every process raises the same
    error. Only the reward-model columns are read."""
    for column, (func, name) in enumerate(zip(reward_funcs, names)):
        if not isinstance(func, nn.Module):
            continue
        scores = rewards_per_func[:, column].detach().double().cpu()
        bad = ~torch.isfinite(scores) | (scores.abs() > max_abs_reward)
        if bad.any():
            row = int(bad.nonzero()[0])
            value = float(scores[row])
            what = "NaN" if math.isnan(value) else f"{value:.4g}"
            raise ValueError(
                f"Reward model `{name}` scored completion {row} of the batch (of {scores.numel()}, all processes) "
                f"{what} ({int(bad.sum())} scores out of bounds); reward-model scores must be finite and at most "
                f"{max_abs_reward:g} in magnitude, like the rewards of reward functions: TRL normalises rewards by a "
                "standard deviation computed in float32, which larger scores overflow to inf (making every advantage "
                "0). Rescale the reward model's output.")
