"""The rows of one dynamic-sampling training batch across its generation rounds: a record of every group
generated (`GroupRecord`), the groups chosen to train on (`select_groups`), the plan that assigns their rows to
processes moving as few as possible (`plan_layout`, `RankPlan`), and each process's buffer of the rows it may still
need, assembled into its training rows at the end (`RoundBuffer`). The round loop is
`trl_rpg.dynamic_sampling.sampling`.

Layout conventions (TRL 1.16): a generation batch has `B` rows per process and `W` processes; in the global order
(rank 0's rows, then rank 1's, ...) every prompt occupies `G = num_generations` consecutive rows, so group `g` is
global rows `g*G .. g*G+G-1`. `B` need not be a multiple of `G`, so a group can span two processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..run.batch import (
    COMPLETION_FIELDS,
    PROMPT_FIELDS,
    ROW_FIELDS,
    merge_rows,
    num_rows,
    select_rows,
    to_device,
    unknown_fields,
)

__all__ = ["GroupRecord", "RankPlan", "RoundBuffer", "plan_layout", "select_groups"]


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
