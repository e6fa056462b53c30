"""What the rollout worker of `AsyncRPGTrainer` sends, checked as it arrives (as `sampler_logps.checked_output` checks
the vLLM engine of `RPGTrainer`).

Each `RolloutSample` the worker puts on its queue is read through `CheckedRollouts` before TRL's staleness filter
(`RolloutQueueDataset.__iter__`) sees it:

- a *malformed* sample (`input_ids`, `completion_mask` and `old_log_probs` not one value per token, a mask not 0/1,
  no completion token) ends the run in `MalformedRolloutSample`, naming the sample and the worker: TRL's collator would
  otherwise fail with a raw `IndexError` / `RuntimeError`, or pair tokens with the wrong log-probs;
- a sample with a *bad value* (a completion token's sampler log-prob NaN, infinite or above 0 beyond rounding, as a
  server returning logits or raw log-probs sends; an advantage that is not finite; a `model_version` outside
  [0, the trainer's current version]) is excluded: a warning names it (worker, field, value), and it is counted
  (`rpg/excluded_samples_total` per logging window, `rpg/excluded_samples` in `train()`'s metrics);
- when `unusable_limit` samples in a row were excluded or are older than `max_staleness` (TRL drops those without a
  word, and would wait for ever if every sample is), the run stops in `NoUsableSamples`, saying why; a warning comes
  first when such a run has lasted `UNUSABLE_WARNING_S` seconds (a slow worker takes long to send the limit).

Pure checks (`malformation`, `bad_values`) and the queue wrapper; the trainer installs it (`AsyncRPGTrainer.__init__`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: A sampler log-prob above this is not a log-probability (log p <= 0; the margin allows rounding in the server).
LOGPROB_TOLERANCE = 1e-4
#: Seconds of unusable samples only after which a warning says so (the error comes at `unusable_limit` samples).
UNUSABLE_WARNING_S = 60.0
#: Excluded samples warned about one by one; the rest are counted only.
WARNED_SAMPLES = 10
EXCLUDED_METRIC = "rpg/excluded_samples_total"  # per logging window ("total": TRL sums it over the window)
EXCLUDED_RUN_METRIC = "rpg/excluded_samples"  # over the train() call, in its metrics


class MalformedRolloutSample(RuntimeError):
    """The rollout worker sent a sample whose per-token fields do not line up."""


class NoUsableSamples(RuntimeError):
    """Every one of the last `unusable_limit` samples the worker sent was excluded or too stale to train on."""


def worker_name(worker, server_url: str | None = None) -> str:
    """The rollout worker in words, for warnings and errors."""
    name = f"the rollout worker {type(worker).__name__}"
    if type(worker).__name__ == "AsyncRolloutWorker" and server_url:
        name += f" (vLLM server {server_url})"
    return name


def sample_name(sample, index: int) -> str:
    """A sample in words: its place in the stream, its group, the version it says sampled it."""
    return (f"sample {index} (group_id={getattr(sample, 'group_id', '?')}, "
            f"model_version={getattr(sample, 'model_version', '?')!r})")


def _vector(value) -> np.ndarray | None:
    try:
        array = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)
    except Exception:  # noqa: BLE001 - anything that is not array-like is malformed
        return None
    return array


def malformation(sample) -> str | None:
    """Why `sample`'s per-token fields cannot be packed (None: they can): `input_ids`, `completion_mask` and
    `old_log_probs` one-dimensional with one value per token, the mask 0/1 with at least one completion token."""
    fields = {}
    for field in ("input_ids", "completion_mask", "old_log_probs"):
        array = _vector(getattr(sample, field, None))
        if array is None or array.ndim != 1 or array.dtype == object:
            return f"`{field}` is not a one-dimensional array of numbers (got {type(getattr(sample, field, None))})"
        fields[field] = array
    n = len(fields["input_ids"])
    for field in ("completion_mask", "old_log_probs"):
        if len(fields[field]) != n:
            return f"`input_ids` has {n} tokens and `{field}` {len(fields[field])} values (one per token needed)"
    if not np.issubdtype(fields["input_ids"].dtype, np.integer):
        return f"`input_ids` holds {fields['input_ids'].dtype} values, not token ids"
    mask = fields["completion_mask"]
    if not np.isin(mask, (0, 1)).all():
        return f"`completion_mask` holds {sorted(set(np.unique(mask).tolist()) - {0, 1})[:3]}, not only 0 and 1"
    if mask.sum() == 0:
        return "`completion_mask` marks no completion token (nothing to train on)"
    return None


def bad_values(sample, current_version: int) -> list[tuple[str, object, str]]:
    """The values of a well-formed sample that cannot train, as (field, value, what is allowed); empty: none."""
    problems = []
    logps = np.asarray(sample.old_log_probs, dtype=np.float64)[np.asarray(sample.completion_mask) == 1]
    if not np.isfinite(logps).all():
        problems.append(("old_log_probs", float(logps[~np.isfinite(logps)][0]),
                         "finite sampler log-probs on every completion token"))
    elif (logps > LOGPROB_TOLERANCE).any():
        problems.append(("old_log_probs", float(logps.max()),
                         "log-probabilities <= 0 (a positive value is a logit or an unnormalised score: is the "
                         "server's logprobs mode `processed_logprobs`?)"))
    try:
        advantage = float(sample.advantage)
    except (TypeError, ValueError):
        advantage = sample.advantage
    if not isinstance(advantage, float) or not math.isfinite(advantage):
        problems.append(("advantage", advantage, "a finite number"))
    version = sample.model_version
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 <= version <= current_version:
        problems.append(("model_version", version, f"an integer in [0, {current_version}] (the trainer's current "
                                                   "policy version)"))
    return problems


def unusable_limit(args) -> int:
    """How many samples in a row may be unusable (excluded, or older than `max_staleness`) before the run stops: more
    than the worker can hold (its queue, the groups in flight and being scored) twice over, so a backlog that aged
    while the trainer stepped is drained, never mistaken for a worker that sends nothing usable."""
    inflight = int(getattr(args, "max_inflight_tasks", -1) or -1)
    if inflight < 0:  # TRL's automatic value (per process; the limit's margin covers several)
        inflight = max(int(args.max_staleness), 0) * args.per_device_train_batch_size * \
            args.gradient_accumulation_steps
    held = max(int(getattr(args, "queue_maxsize", 0) or 0), 0) + (inflight + 16) * max(int(args.num_generations), 1)
    return 2 * held + 256


class CheckedRollouts:
    """The worker's `rollout_buffer` as TRL's `RolloutQueueDataset` reads it (`get`, `qsize`), every sample checked
    first (see the module docstring). `version` returns the trainer's current policy version; `metrics` is TRL's
    metric sink."""

    def __init__(self, queue, worker: str, version: Callable[[], int], max_staleness: int, metrics, limit: int,
                 trainer: str = "AsyncRPGTrainer", warn_after_s: float = UNUSABLE_WARNING_S,
                 clock: Callable[[], float] = time.monotonic):
        self.queue, self.worker, self.version, self.metrics = queue, worker, version, metrics
        self.max_staleness, self.limit, self.trainer = max_staleness, limit, trainer
        self.warn_after_s, self.clock = warn_after_s, clock
        self._unusable_since: float | None = None  # when the current run of unusable samples began
        self._warned_run = False
        self.received = 0  #: samples read from the worker
        self.excluded = 0  #: samples excluded (bad values)
        self.unusable_run = 0  #: consecutive samples excluded or too stale
        self._reasons: dict[str, int] = {}

    def qsize(self) -> int:
        return self.queue.qsize()

    def __getattr__(self, name):  # anything else TRL or a worker reads of the queue (not called for own attributes)
        if name == "queue":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.queue, name)

    def get(self, timeout=None):
        while True:
            sample = self.queue.get(timeout=timeout)
            self.received += 1
            if self.usable(sample):
                return sample

    def usable(self, sample) -> bool:
        """Check one sample; False: it is excluded (warned and counted). A sample too stale for TRL is returned as
        usable (TRL drops and counts it) but counts towards `limit`."""
        name = sample_name(sample, self.received)
        problem = malformation(sample)
        if problem:
            raise MalformedRolloutSample(
                f"{self.trainer}: {name} from {self.worker} is malformed: {problem}. A rollout sample needs "
                "`input_ids`, `completion_mask` (1 on completion tokens) and `old_log_probs` with one value per "
                "token; check the worker (a custom rollout_worker, or TRL's against its vLLM server's version).")
        current = int(self.version())
        problems = bad_values(sample, current)
        if problems:
            self.excluded += 1
            self.metrics[EXCLUDED_METRIC].append(1.0)
            if self.excluded <= WARNED_SAMPLES:
                details = "; ".join(f"`{field}`={value!r} (allowed: {allowed})" for field, value, allowed in problems)
                logger.warning("%s: %s from %s excluded from training: %s.%s", self.trainer, name, self.worker,
                               details, " Further excluded samples are counted in rpg/excluded_samples_total "
                               "without a warning." if self.excluded == WARNED_SAMPLES else "")
            self._unusable(f"`{problems[0][0]}` not allowed ({problems[0][1]!r})")
            return False
        if current - int(sample.model_version) > self.max_staleness:
            self._unusable(f"older than max_staleness={self.max_staleness} (staleness "
                           f"{current - int(sample.model_version)})")
        else:
            self.unusable_run, self._reasons, self._unusable_since, self._warned_run = 0, {}, None, False
        return True

    def _unusable(self, reason: str) -> None:
        self.unusable_run += 1
        kind = reason.split(" (")[0]
        self._reasons[kind] = self._reasons.get(kind, 0) + 1
        now = self.clock()
        self._unusable_since = now if self._unusable_since is None else self._unusable_since
        if not self._warned_run and now - self._unusable_since >= self.warn_after_s:
            self._warned_run = True  # once per run of unusable samples: a slow worker is told before the limit
            logger.warning("%s: no sample from %s could be trained on for %.0f s (%d in a row; the last: %s); the "
                           "run stops after %d.", self.trainer, self.worker, now - self._unusable_since,
                           self.unusable_run, reason, self.limit)
        if self.unusable_run >= self.limit:
            counts = ", ".join(f"{n} {kind}" for kind, n in self._reasons.items())
            raise NoUsableSamples(
                f"{self.trainer}: the last {self.unusable_run} samples from {self.worker} could not be trained on "
                f"({counts}; the last: {reason}), so the run would wait for ever. Check the worker's sampler "
                "log-probs, advantages and model_version stamps, and max_staleness against how far behind the "
                "worker generates.")


def trained_tokens(advantages: torch.Tensor, sampler_logps: torch.Tensor) -> torch.Tensor:
    """The tokens of a micro-batch that carry a learning signal: a finite sampler log-prob and a finite, non-zero
    advantage (the objective excludes the others from the loss, `objectives.rpg_per_token_loss`)."""
    return torch.isfinite(advantages) & torch.isfinite(sampler_logps) & (advantages != 0)


__all__ = ["EXCLUDED_METRIC", "EXCLUDED_RUN_METRIC", "LOGPROB_TOLERANCE", "CheckedRollouts", "MalformedRolloutSample",
           "NoUsableSamples", "bad_values", "malformation", "sample_name", "trained_tokens", "unusable_limit",
           "worker_name"]
