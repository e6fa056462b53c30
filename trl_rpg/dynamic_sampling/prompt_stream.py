"""The extra prompts of dynamic sampling's generation rounds (`PromptStream`): a seeded stream over the training set,
laid out like TRL's generation batches, whose position is saved with the run (`trl_rpg.dynamic_sampling.sampling`).
"""

from __future__ import annotations

from typing import Any

import torch


class PromptStream:
    """Prompts for the extra generation rounds, laid out like TRL's generation batches.

    A stream of prompt indices over the training set, reshuffled every pass with a generator seeded from
    `(seed, pass)` (a different permutation from TRL's own sampler), is cut into global batches of
    `local_batch_size * world_size / num_generations` prompts; each prompt fills `num_generations` consecutive rows
    and process `rank` takes rows `[rank * B, (rank + 1) * B)`. The stream is a pure function of the number of prompts
    drawn so far (`cursor`), so every process draws the same prompts without communicating and a run resumes exactly
    from the saved cursor.
    """

    SEED_OFFSET = 0x5EED_D5  # keeps the stream off TRL's own permutation

    def __init__(self, dataset, seed: int, shuffle: bool, num_generations: int, local_batch_size: int,
                 world_size: int, rank: int):
        self.dataset = dataset
        self.seed = int(seed)
        self.shuffle = shuffle
        self.group_size = num_generations
        self.local_rows = local_batch_size
        self.world_size = world_size
        self.rank = rank
        if (self.local_rows * self.world_size) % self.group_size:
            raise ValueError(f"{world_size} x {local_batch_size} rows do not split into groups of {num_generations}.")
        self.prompts_per_round = self.local_rows * self.world_size // self.group_size
        self.map_style = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        self._perm: tuple[int, torch.Tensor] | None = None
        self._iter: tuple[int, int, Any] | None = None  # (epoch, position, iterator) for iterable datasets

    def _generator(self, epoch: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 1_000_003 + self.SEED_OFFSET + epoch) % (2 ** 63))

    def indices(self, cursor: int, count: int) -> list[int]:
        """Dataset indices of prompts `cursor .. cursor + count - 1` of the stream (map-style datasets)."""
        n = len(self.dataset)
        if n == 0:
            raise ValueError("The training set is empty.")
        out = []
        for j in range(cursor, cursor + count):
            epoch, pos = divmod(j, n)
            if not self.shuffle:
                out.append(pos)
                continue
            if self._perm is None or self._perm[0] != epoch:
                self._perm = (epoch, torch.randperm(n, generator=self._generator(epoch)))
            out.append(int(self._perm[1][pos]))
        return out

    def _rank_slice(self) -> list[int]:
        """Stream positions (relative to the cursor) of this process's rows."""
        first = self.rank * self.local_rows
        return [row // self.group_size for row in range(first, first + self.local_rows)]

    def draw(self, cursor: int) -> tuple[list[dict], int]:
        """This process's rows of the next round, and the new cursor."""
        positions = self._rank_slice()
        if self.map_style:
            wanted = sorted(set(positions))
            idx = self.indices(cursor + wanted[0], wanted[-1] - wanted[0] + 1)
            unique = {p: idx[p - wanted[0]] for p in wanted}
            fetch = [unique[p] for p in wanted]
            if hasattr(self.dataset, "__getitems__"):
                examples = self.dataset.__getitems__(fetch)
            else:
                examples = [self.dataset[i] for i in fetch]
            by_pos = dict(zip(wanted, examples))
        else:
            examples = self._read_iterable(cursor, self.prompts_per_round)
            by_pos = {p: examples[p] for p in set(positions)}
        rows = [dict(by_pos[p]) for p in positions]  # fresh dicts: TRL writes extra fields into its inputs
        return rows, cursor + self.prompts_per_round

    def _read_iterable(self, cursor: int, count: int) -> list[dict]:
        out = []
        while len(out) < count:
            epoch_state = self._iter
            if epoch_state is None or (epoch_state[0], epoch_state[1]) != self._locate(cursor + len(out)):
                self._iter = self._open(cursor + len(out))
            epoch, pos, it = self._iter
            try:
                example = next(it)
            except StopIteration:
                if pos == 0:
                    raise ValueError("The training set is empty.") from None
                self._epoch_length = pos
                self._iter = self._open_epoch(epoch + 1)
                continue
            out.append(example)
            self._iter = (epoch, pos + 1, it)
        return out

    # iterable datasets: the length is learnt at the end of the first pass
    _epoch_length: int | None = None

    def _locate(self, j: int) -> tuple[int, int]:
        if self._epoch_length is None:
            return 0, j
        return divmod(j, self._epoch_length)

    def _open_epoch(self, epoch: int):
        dataset = self.dataset
        if self.shuffle and hasattr(dataset, "shuffle"):
            dataset = dataset.shuffle(seed=(self.seed * 1_000_003 + self.SEED_OFFSET) % (2 ** 32))
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
        return epoch, 0, iter(dataset)

    def _open(self, j: int):
        if self._epoch_length is None:  # first pass not finished: read from the start, skipping j examples
            epoch, pos = 0, j
        else:
            epoch, pos = divmod(j, self._epoch_length)
        epoch_, _, it = self._open_epoch(epoch)
        for skipped in range(pos):
            try:
                next(it)
            except StopIteration:  # the dataset is shorter than the cursor says: learn its length and retry
                self._epoch_length = skipped
                return self._open(j)
        return epoch_, pos, it


__all__ = ["PromptStream"]
