"""Dynamic sampling (DAPO): drop prompt groups whose rewards do not vary and generate more until the batch is full.

Under a group baseline, a group whose completions all get the same reward (all right, all wrong, or any constant
non-binary score) has advantage 0 everywhere and carries no policy-gradient signal. `RPGTrainer` (with
`RPGConfig.dynamic_sampling=True`) removes such groups after scoring, generates more prompts until the generation
batch again holds the configured number of groups, and trains on that batch as usual.

This module holds the round loop (`DynamicSampler.collect`), which the trainer calls with its generation-and-scoring
function and its collectives, and the metrics of a batch (`summary`). The parts have a module each, whose public names
it hands on (`trl_rpg.dynamic_sampling.sampling.X`): the group filter (`trl_rpg.run.group_signal`), the bookkeeping
across
generation rounds and the plan that assigns kept rows to processes (`trl_rpg.dynamic_sampling.round_buffer`;
`trl_rpg.run.batch`
regroups the rows), the extra prompts (`trl_rpg.dynamic_sampling.prompt_stream`).

Layout conventions (TRL 1.16): a generation batch has `B` rows per process and `W` processes; in the global order
(rank 0's rows, then rank 1's, ...) every prompt occupies `G = num_generations` consecutive rows, so group `g` is
global rows `g*G .. g*G+G-1`. `B` need not be a multiple of `G`, so a group can span two processes. Rewards are
gathered over all processes, which is what the filter reads: every process decides the same thing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..run.group_signal import RTOL, group_reward_signal
from .prompt_stream import PromptStream
from .round_buffer import GroupRecord, RankPlan, RoundBuffer, plan_layout, select_groups

logger = logging.getLogger(__name__)

#: Key of the dynamic-sampling state in `TrainerState.stateful_callbacks` (saved in `trainer_state.json`).
STATE_KEY = "RPGDynamicSampling"

#: Rounds in a row without a kept group after which `DynamicSampler.collect` warns (again after 2x, 4x, ... as many).
IDLE_ROUNDS_WARNING = 8


@dataclasses.dataclass
class Collectives:
    """What the round loop needs from the distributed setup (every process calls each of these together)."""

    world_size: int
    rank: int
    device: Any
    gather_object: Callable[[Any], list]  # all-gather of one Python object per process
    sum_over_processes: Callable[[torch.Tensor], torch.Tensor]


class DynamicSampler:
    """Assembles training batches whose groups all carry a learning signal (RPGConfig `dynamic_sampling`).

    `collect` generates and scores rounds of prompts (the batch TRL handed over, then prompts from a seeded stream),
    keeps the groups whose rewards vary (judged on `metric`: one reward function's column, or the weighted total),
    until `generation_batch_size / num_generations` groups are kept or `max_rounds` rounds are spent, then gives each
    process `len(inputs)` rows of them. Every decision is taken from rewards gathered over all processes, so all
    processes run the same rounds and the same collectives.
    """

    def __init__(self, *, num_generations: int, max_rounds: int, on_exhausted: str, metric: str | None,
                 reward_func_names: Sequence[str], reward_weights: torch.Tensor, aggregation: str, pad_token_id: int,
                 dataset, seed: int, shuffle: bool, collectives: Collectives):
        if metric is not None and metric not in reward_func_names:
            raise ValueError(f"RPGConfig: `dynamic_sampling_metric`={metric!r} is not allowed; choose the name of "
                             f"one reward function, one of {list(reward_func_names)}, or None for the weighted total.")
        self.group_size = num_generations
        self.max_rounds = max_rounds
        self.fill = on_exhausted == "train"
        self.metric = metric
        self.column = None if metric is None else list(reward_func_names).index(metric)
        self.weights = reward_weights
        self.aggregation = aggregation
        self.pad_token_id = pad_token_id
        self.dataset, self.seed, self.shuffle = dataset, seed, shuffle
        self.comm = collectives
        self._streams: dict[int, PromptStream] = {}

    @classmethod
    def for_trainer(cls, trainer) -> DynamicSampler:
        """The sampler of an `RPGTrainer`: its config, reward functions, training set (without the columns TRL
        removes) and the accelerator's collectives."""
        from accelerate.utils import gather_object
        from datasets import Dataset

        args, acc, dataset = trainer.args, trainer.accelerator, trainer.train_dataset
        if args.remove_unused_columns and isinstance(dataset, Dataset):
            dataset = trainer._remove_unused_columns(dataset, description="training")
        return cls(
            num_generations=trainer.num_generations, max_rounds=args.dynamic_sampling_max_rounds,
            on_exhausted=args.dynamic_sampling_on_exhausted, metric=args.dynamic_sampling_metric,
            reward_func_names=trainer.reward_func_names, reward_weights=trainer.reward_weights,
            aggregation=trainer.multi_objective_aggregation, pad_token_id=trainer._rpg_pad_token_id, dataset=dataset,
            seed=args.data_seed if args.data_seed is not None else args.seed, shuffle=trainer.shuffle_dataset,
            collectives=Collectives(acc.num_processes, acc.process_index, acc.device, gather_object,
                                    lambda t: acc.gather(t).sum()),
        )

    def collect_batch(self, inputs: dict, generate: Callable, saved: dict, log: Callable[[dict], None]):
        """`collect` for the trainer: the prompt stream's state read from and written back to `saved` (the
        trainer state's `stateful_callbacks`, so checkpoints carry it), the statistics handed to `log` under
        `dynamic_sampling/`, and a warning when the rounds ran out. Returns `(batch, rewards of every round)`."""
        try:
            output, state, stats, rewards = self.collect(inputs, generate, saved.get(STATE_KEY) or {})
        except DynamicSamplingExhausted as error:
            saved[STATE_KEY] = error.state
            log({f"dynamic_sampling/{k}": v for k, v in error.stats.items()})
            raise
        saved[STATE_KEY] = state
        log({f"dynamic_sampling/{k}": v for k, v in stats.items() if k not in PROCESS_LOCAL_STATS})
        if stats["exhausted"]:
            logger.warning("Dynamic sampling: %d of %d groups kept after %d rounds (dynamic_sampling_max_rounds); "
                           "training on them plus %d groups without reward variance.", int(stats["groups_kept"]),
                           len(inputs) * self.comm.world_size // self.group_size, int(stats["rounds"]),
                           int(stats["groups_trained_without_signal"]))
        return output, rewards

    def signal(self, rewards_per_func: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`group_reward_signal` on the metric's rewards."""
        if self.column is None:
            return group_reward_signal(rewards_per_func, self.weights, self.group_size, self.aggregation)
        rewards = rewards_per_func[:, self.column:self.column + 1]
        return group_reward_signal(rewards, torch.ones(1), self.group_size, "sum_then_normalize")

    def _warn_if_idle(self, idle: int, buffer: RoundBuffer, rounds: int) -> None:
        """Warn (main process) after `IDLE_ROUNDS_WARNING` rounds in a row without a kept group, then at each
        doubling: with a large `dynamic_sampling_max_rounds`, a reward that never varies would spin silently."""
        if idle < IDLE_ROUNDS_WARNING or idle & (idle - 1) or self.comm.rank != 0:  # 8, 16, 32, ...
            return
        decides = ("the weighted total of the reward functions" if self.column is None
                   else f"the reward function {self.metric!r} (dynamic_sampling_metric)")
        logger.warning(
            "Dynamic sampling: the last %d generation rounds kept no group (%d of the %d groups this batch needs kept "
            "after %d rounds; dynamic_sampling_max_rounds=%d): the rewards of %s are equal within every group. Check "
            "the reward functions (a constant reward, a reward the model never earns, e.g. an answer it never "
            "writes) and the sampling settings (temperature near 0 or top_k=1 make a prompt's completions alike), "
            "or lower dynamic_sampling_max_rounds.", idle, buffer.groups_informative, buffer.target, rounds,
            self.max_rounds, decides)

    def stream(self, local_batch_size: int) -> PromptStream:
        if local_batch_size not in self._streams:
            self._streams[local_batch_size] = PromptStream(
                self.dataset, self.seed, self.shuffle, self.group_size, local_batch_size, self.comm.world_size,
                self.comm.rank)
        return self._streams[local_batch_size]

    def collect(self, inputs: list[dict], generate_and_score: Callable, state: dict
                ) -> tuple[dict[str, Any], dict, dict[str, float], list[torch.Tensor]]:
        """One training batch.

        Args:
            inputs: this process's rows of the batch TRL handed over (the first round).
            generate_and_score: `rows -> (generation batch, gathered rewards (N, F))`, TRL's generation and scoring.
            state: the saved state (`prompts_drawn`, `exhausted_batches`).

        Returns:
            `(batch, new_state, stats, rewards)`: this process's training rows, the state to save, the
            `dynamic_sampling/*` metrics (plus `rows_received` / `rows_sent`, this process's share of the exchange)
            and the gathered rewards of every round. With `on_exhausted="raise"` an exhausted batch raises
            `RuntimeError` (after `stats` are final: the caller is not called back).
        """
        local_rows, world_size = len(inputs), self.comm.world_size
        target = local_rows * world_size // self.group_size
        cursor = int(state.get("prompts_drawn", 0))
        exhausted_total = int(state.get("exhausted_batches", 0))
        buffer = RoundBuffer(target, self.group_size, local_rows, world_size, self.comm.rank, fill=self.fill)
        all_rewards = []
        batch = inputs
        idle = 0  # rounds in a row that kept no group
        for round_index in range(self.max_rounds):
            if round_index > 0:
                batch, cursor = self.stream(local_rows).draw(cursor)
            output, rewards = generate_and_score(batch)
            if rewards.size(0) != local_rows * world_size:
                raise RuntimeError(f"dynamic_sampling expected the rewards of {local_rows * world_size} completions, "
                                   f"got {rewards.size(0)}.")
            all_rewards.append(rewards)
            informative, spread = self.signal(rewards)
            buffer.add_round(output, informative, spread)
            if buffer.full:
                break
            idle = 0 if bool(informative.any()) else idle + 1
            if round_index + 1 < self.max_rounds:  # (the last round's outcome is reported by the caller)
                self._warn_if_idle(idle, buffer, round_index + 1)
        exhausted = not buffer.full
        exhausted_total += int(exhausted)
        new_state = {"prompts_drawn": cursor, "exhausted_batches": exhausted_total}
        if exhausted and not self.fill:
            stats = summary(buffer, [], exhausted)
            raise DynamicSamplingExhausted(
                f"Dynamic sampling: after {buffer.rounds_used} generation rounds (dynamic_sampling_max_rounds="
                f"{self.max_rounds}) only {buffer.groups_informative} of the {target} groups a training batch needs "
                f"have non-zero reward variance ({buffer.groups_generated} groups generated, "
                f"{stats['frac_filtered']:.1%} filtered). Raise dynamic_sampling_max_rounds, check the reward "
                f"functions, or set dynamic_sampling_on_exhausted='train' to train on the groups kept.",
                stats=stats, state=new_state)

        merged, selected, plan = buffer.assemble(
            self.pad_token_id, lambda outgoing: self.comm.gather_object([outgoing]), device=self.comm.device)
        loss_mask = merged["completion_mask"] if "tool_mask" not in merged else (
            merged["completion_mask"] * merged["tool_mask"])
        merged["num_items_in_batch"] = self.comm.sum_over_processes(loss_mask.sum())
        stats = {**summary(buffer, selected, exhausted), "exhausted_total": float(exhausted_total),
                 "rows_received": float(len(plan.receive)),
                 "rows_sent": float(sum(len(v) for v in plan.send.values()))}
        return merged, new_state, stats, all_rewards


#: Statistics of `DynamicSampler.collect` that differ between processes (not logged as run metrics).
PROCESS_LOCAL_STATS = ("rows_received", "rows_sent")


class DynamicSamplingExhausted(RuntimeError):
    """The rounds ran out with `dynamic_sampling_on_exhausted="raise"`; carries the batch's stats and state."""

    def __init__(self, message: str, stats: dict[str, float], state: dict):
        super().__init__(message)
        self.stats = stats
        self.state = state


def summary(buffer: RoundBuffer, selected: Sequence[GroupRecord], exhausted: bool) -> dict[str, float]:
    """The `dynamic_sampling/*` metrics of one training batch."""
    generated = buffer.groups_generated
    informative = buffer.groups_informative
    return {
        "rounds": float(buffer.rounds_used),
        "groups_generated": float(generated),
        "groups_kept": float(informative),
        "frac_filtered": 1.0 - informative / generated if generated else 0.0,
        "groups_trained_without_signal": float(sum(not r.informative for r in selected)),
        "exhausted": float(exhausted),
    }


__all__ = [
    "IDLE_ROUNDS_WARNING",
    "STATE_KEY",
    "Collectives",
    "DynamicSampler",
    "DynamicSamplingExhausted",
    "GroupRecord",
    "PromptStream",
    "RTOL",
    "RankPlan",
    "RoundBuffer",
    "group_reward_signal",
    "plan_layout",
    "select_groups",
    "summary",
]
