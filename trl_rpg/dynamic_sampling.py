"""Dynamic sampling (DAPO): drop prompt groups whose rewards do not vary and generate more until the batch is full.

Under a group baseline, a group whose completions all get the same reward (all right, all wrong, or any constant
non-binary score) has advantage 0 everywhere and carries no policy-gradient signal. `RPGTrainer` (with
`RPGConfig.dynamic_sampling=True`) removes such groups after scoring, generates more prompts until the generation
batch again holds the configured number of groups, and trains on that batch as usual.

This module holds the group filter, the bookkeeping across generation rounds, the plan that assigns kept rows to
processes, and the round loop itself (`DynamicSampler.collect`), which the trainer calls
with its generation-and-scoring function and its collectives (`trl_rpg.batch` regroups the rows; the extra prompts
come from `trl_rpg.prompt_stream`).

Layout conventions (TRL 1.16): a generation batch has `B` rows per process and `W` processes; in the global order
(rank 0's rows, then rank 1's, ...) every prompt occupies `G = num_generations` consecutive rows, so group `g` is
global rows `g*G .. g*G+G-1`. `B` need not be a multiple of `G`, so a group can span two processes. Rewards are
gathered over all processes, which is what the filter reads: every process decides the same thing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .batch import (
    COMPLETION_FIELDS,
    PROMPT_FIELDS,
    ROW_FIELDS,
    merge_rows,
    num_rows,
    select_rows,
    to_device,
    unknown_fields,
)
from .prompt_stream import PromptStream

logger = logging.getLogger(__name__)

#: Key of the dynamic-sampling state in `TrainerState.stateful_callbacks` (saved in `trainer_state.json`).
STATE_KEY = "RPGDynamicSampling"

#: Relative tolerance of "zero variance": a group is constant when max - min <= RTOL * max(1, max |reward|).
RTOL = 1e-6

#: Rounds in a row without a kept group after which `DynamicSampler.collect` warns (again after 2x, 4x, ... as many).
IDLE_ROUNDS_WARNING = 8

# ------------------------------------------------------------------------------------------------------------------
# The group filter
# ------------------------------------------------------------------------------------------------------------------


def _constant(values: torch.Tensor, valid: torch.Tensor, rtol: float = RTOL) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of `values` (groups x G), whether its valid entries are constant (or fewer than 2), and their
    population std (0 for constant rows)."""
    count = valid.sum(-1)
    hi = torch.where(valid, values, torch.full_like(values, -math.inf)).amax(-1)
    lo = torch.where(valid, values, torch.full_like(values, math.inf)).amin(-1)
    scale = torch.where(valid, values.abs(), torch.zeros_like(values)).amax(-1).clamp(min=1.0)
    constant = (count < 2) | ((hi - lo) <= rtol * scale)
    zeros = torch.zeros_like(values)
    mean = torch.where(valid, values, zeros).sum(-1, keepdim=True) / count.clamp(min=1).unsqueeze(-1)
    var = torch.where(valid, (values - mean) ** 2, zeros).sum(-1) / count.clamp(min=1)
    std = torch.where(constant, torch.zeros_like(var), var.sqrt())
    return constant, std


def group_reward_signal(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int,
    aggregation: str = "sum_then_normalize", rtol: float = RTOL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which groups carry a learning signal, from the rewards of the whole (gathered) batch.

    Args:
        rewards_per_func: `(N, F)` rewards of N completions (N a multiple of `num_generations`, groups contiguous)
            under F reward functions; NaN where a function gave no reward (TRL's `None`).
        reward_weights: `(F,)` weights of the reward functions.
        aggregation: TRL's `multi_objective_aggregation`. `"sum_then_normalize"`: the group's reward is the weighted
            sum of the functions (NaN when every function gave None) and the group is kept iff that reward varies.
            `"normalize_then_sum"`: each function is normalised within the group first, so the group is kept iff the
            weighted sum of the normalised rewards varies (a function constant in the group contributes 0).

    Returns:
        `(informative, spread)`: bool `(N // G,)`, True for groups whose reward variance is non-zero (up to float
        rounding: max - min <= `rtol` * max(1, max |reward|) counts as constant; fewer than two scored completions
        count as constant); and float `(N // G,)`, the std of the group's reward (0 when not informative).
    """
    if rewards_per_func.dim() != 2 or rewards_per_func.size(0) % num_generations:
        raise ValueError(f"rewards_per_func must be (N, F) with N a multiple of num_generations={num_generations}, "
                         f"got {tuple(rewards_per_func.shape)}.")
    rpf = rewards_per_func.detach().double().cpu()
    weights = reward_weights.detach().double().cpu()
    grouped = rpf.view(-1, num_generations, rpf.size(1))  # (groups, G, F)
    scored = ~torch.isnan(grouped).all(-1)  # (groups, G): at least one function gave a reward
    if aggregation == "sum_then_normalize":
        rewards = (torch.nan_to_num(grouped, nan=0.0) * weights).sum(-1)
    elif aggregation == "normalize_then_sum":
        per_func = grouped.transpose(1, 2)  # (groups, F, G)
        valid = ~torch.isnan(per_func)
        constant, _ = _constant(per_func, valid, rtol)
        count = valid.sum(-1, keepdim=True).clamp(min=1)
        mean = torch.where(valid, per_func, torch.zeros_like(per_func)).sum(-1, keepdim=True) / count
        var = torch.where(valid, (per_func - mean) ** 2, torch.zeros_like(per_func)).sum(-1, keepdim=True) / count
        normalised = torch.where(valid & ~constant.unsqueeze(-1), (per_func - mean) / (var.sqrt() + 1e-4),
                                 torch.zeros_like(per_func))
        rewards = (normalised * weights.view(1, -1, 1)).sum(1)  # (groups, G)
    else:
        raise ValueError(f"Unknown multi_objective_aggregation {aggregation!r}.")
    constant, spread = _constant(rewards, scored, rtol)
    return ~constant, spread.float()


def _check_fields(batch: dict[str, Any], rows: int) -> None:
    unknown = unknown_fields(batch)
    if unknown:
        raise NotImplementedError(
            f"dynamic_sampling cannot regroup the generation-batch field {unknown[0]!r} (multimodal inputs and fields "
            "added by other trainer extensions are not supported yet); disable dynamic_sampling for this setup.")
    for key in (*PROMPT_FIELDS, *COMPLETION_FIELDS, *ROW_FIELDS):
        value = batch.get(key)
        if value is not None and value.size(0) != rows:
            raise ValueError(f"Generation-batch field {key!r} has {value.size(0)} rows, expected {rows}.")


# ------------------------------------------------------------------------------------------------------------------
# Bookkeeping across rounds
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroupRecord:
    round: int
    group: int  # index of the group in its round's global batch
    informative: bool
    spread: float  # std of the group's reward (0 for every non-informative group)


def select_groups(records: Sequence[GroupRecord], target: int, fill: bool) -> list[GroupRecord]:
    """The groups to train on, `records` being in generation order: the first `target` informative groups; if there
    are fewer and `fill`, topped up with the earliest non-informative ones (all of spread 0: no order by spread
    could tell them apart)."""
    chosen = [r for r in records if r.informative][:target]
    if fill and len(chosen) < target:
        rest = [r for r in records if not r.informative]
        chosen += rest[:target - len(chosen)]
    return chosen


@dataclasses.dataclass
class RankPlan:
    """Where the rows one process trains on come from (rows are `(round, local_index)` on their owner)."""

    keep: list[tuple[int, int]]  # own rows kept
    receive: list[tuple[int, int, int]]  # (source rank, round, local index), in arrival order
    send: dict[int, list[tuple[int, int]]]  # destination rank -> own rows to send, in the order it expects them


def plan_layout(selected: Sequence[GroupRecord], num_generations: int, local_batch_size: int,
                world_size: int) -> list[RankPlan]:
    """Assign the rows of the selected groups to processes, `local_batch_size` each, moving as few as possible.

    Every process computes the same plan from the same (gathered) information. Each process keeps the selected rows
    it already holds, up to `local_batch_size`; the surplus of over-full processes goes, in rank order, to the
    processes that are short. Every row of every selected group is trained on exactly once, so groups stay whole
    across the global batch (the loss needs no group structure once advantages are computed, and TRL shuffles rows
    anyway).
    """
    if len(selected) * num_generations != local_batch_size * world_size:
        raise ValueError(f"{len(selected)} groups of {num_generations} cannot fill {world_size} x "
                         f"{local_batch_size} rows.")
    held: list[list[tuple[int, int]]] = [[] for _ in range(world_size)]
    for rec in selected:
        for j in range(num_generations):
            row = rec.group * num_generations + j
            held[row // local_batch_size].append((rec.round, row % local_batch_size))
    plans = [RankPlan(keep=h[:local_batch_size], receive=[], send={}) for h in held]
    surplus = [(src, row) for src, h in enumerate(held) for row in h[local_batch_size:]]
    cursor = 0
    for dst, plan in enumerate(plans):
        need = local_batch_size - len(plan.keep)
        for src, (rnd, idx) in surplus[cursor:cursor + need]:
            plan.receive.append((src, rnd, idx))
            plans[src].send.setdefault(dst, []).append((rnd, idx))
        cursor += need
    return plans


class RoundBuffer:
    """The rows one process may still need, over the generation rounds of one training batch.

    After each round only the rows of the groups the current selection would train on are kept (a row dropped once is
    never selected later: informative groups are taken in generation order and the filler set only shrinks), so
    memory stays at about one batch plus one round.
    """

    def __init__(self, target_groups: int, num_generations: int, local_batch_size: int, world_size: int, rank: int,
                 fill: bool):
        self.target = target_groups
        self.group_size = num_generations
        self.local_rows = local_batch_size
        self.world_size = world_size
        self.rank = rank
        self.fill = fill
        self.records: list[GroupRecord] = []
        self.rounds: list[tuple[dict[str, Any], list[int]]] = []  # (rows kept, their local indices)

    @property
    def rounds_used(self) -> int:
        return len(self.rounds)

    @property
    def groups_generated(self) -> int:
        return len(self.records)

    @property
    def groups_informative(self) -> int:
        return sum(r.informative for r in self.records)

    @property
    def full(self) -> bool:
        return self.groups_informative >= self.target

    def add_round(self, batch: dict[str, Any], informative: torch.Tensor, spread: torch.Tensor) -> None:
        _check_fields(batch, self.local_rows)
        if informative.numel() * self.group_size != self.local_rows * self.world_size:
            raise ValueError(f"{informative.numel()} groups of {self.group_size} do not match {self.world_size} "
                             f"processes x {self.local_rows} rows.")
        round_index = len(self.rounds)
        self.records += [GroupRecord(round_index, g, bool(i), float(s))
                         for g, (i, s) in enumerate(zip(informative.tolist(), spread.tolist()))]
        self.rounds.append((batch, list(range(self.local_rows))))
        self._prune()

    def _prune(self) -> None:
        wanted: dict[int, set[int]] = {}
        lo, hi = self.rank * self.local_rows, (self.rank + 1) * self.local_rows
        for rec in select_groups(self.records, self.target, self.fill):
            for row in range(rec.group * self.group_size, (rec.group + 1) * self.group_size):
                if lo <= row < hi:
                    wanted.setdefault(rec.round, set()).add(row - lo)
        for k, (batch, index) in enumerate(self.rounds):
            keep = [pos for pos, idx in enumerate(index) if idx in wanted.get(k, ())]
            if len(keep) != len(index):
                self.rounds[k] = (select_rows(batch, keep), [index[pos] for pos in keep])

    def rows(self, wanted: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """This process's rows `(round, local_index)`, as one dict per run of rows from the same round (in order)."""
        positions = [{idx: pos for pos, idx in enumerate(index)} for _, index in self.rounds]
        parts: list[dict[str, Any]] = []
        run_round, run = None, []
        for rnd, idx in [*wanted, (None, None)]:
            if rnd != run_round and run:
                parts.append(select_rows(self.rounds[run_round][0], run))
                run = []
            if rnd is None:
                break
            run_round = rnd
            run.append(positions[rnd][idx])
        return parts

    def assemble(self, pad_token_id: int, exchange: Callable[[dict[int, dict]], list[dict[int, dict]]] | None,
                 device=None) -> tuple[dict[str, Any], list[GroupRecord], RankPlan]:
        """This process's training rows: its kept rows plus the rows other processes send it.

        `exchange(outgoing)` is an all-gather: it takes `{destination rank: batch dict}` and returns every process's
        outgoing dict, in rank order. It is called on every process or on none (the plan is the same everywhere).
        """
        selected = select_groups(self.records, self.target, self.fill)
        plans = plan_layout(selected, self.group_size, self.local_rows, self.world_size)
        mine = plans[self.rank]
        parts = self.rows(mine.keep)
        if any(p.send for p in plans):
            if exchange is None:
                raise RuntimeError("Rows must move between processes but no exchange function was given.")
            outgoing = {dst: to_device(merge_rows(self.rows(rows), pad_token_id), "cpu")
                        for dst, rows in mine.send.items()}
            incoming = exchange(outgoing)
            for src in sorted({src for src, _, _ in mine.receive}):
                parts.append(to_device(incoming[src][self.rank], device) if device is not None
                             else incoming[src][self.rank])
        merged = merge_rows(parts, pad_token_id)
        if num_rows(merged) != self.local_rows:
            raise RuntimeError(f"Assembled {num_rows(merged)} rows, expected {self.local_rows}.")
        return merged, selected, mine


# ------------------------------------------------------------------------------------------------------------------
# The round loop
# ------------------------------------------------------------------------------------------------------------------


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
    "RankPlan",
    "RoundBuffer",
    "group_reward_signal",
    "plan_layout",
    "select_groups",
    "summary",
]
