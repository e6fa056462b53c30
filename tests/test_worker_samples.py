"""What the rollout worker of `AsyncRPGTrainer` sends is checked as it arrives (`trl_rpg.trainers.worker_samples`): a
sample
with a bad value is named (worker, field, value), excluded and counted; a malformed one ends the run naming it; a
worker whose every sample is unusable (excluded or too stale) stops the run instead of hanging; the learning-signal
verdict counts only the tokens that trained. On CPU with the stand-in worker (`trl_rpg.toy.async_rollouts`), a
subclass of which corrupts what it sends."""

import logging
import math

import numpy as np
import pytest
import torch
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoTokenizer

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl.experimental.async_grpo.async_rollout_worker import RolloutSample  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402
from trl_rpg.trainers.worker_samples import (  # noqa: E402
    CheckedRollouts,
    MalformedRolloutSample,
    NoUsableSamples,
    bad_values,
    malformation,
    trained_tokens,
    unusable_limit,
)

GENERATIONS, BATCH, LENGTH = 4, 8, 6
SENT_BOUND = 200


def sample(**changes) -> RolloutSample:
    fields = dict(prompt=[], completion=[], input_ids=np.array([5, 6, 7, 8, 9]),
                  completion_mask=np.array([0, 0, 1, 1, 1]),
                  old_log_probs=np.array([0.0, 0.0, -0.5, -1.0, -2e-5], dtype=np.float32), advantage=0.7,
                  model_version=2, group_id=3, metrics={})
    fields.update(changes)
    return RolloutSample(**fields)


# ---------------------------------------------------------------------------------------------------------------------
# The checks, one sample at a time
# ---------------------------------------------------------------------------------------------------------------------


def test_a_good_sample_passes():
    assert malformation(sample()) is None and bad_values(sample(), current_version=2) == []
    assert bad_values(sample(old_log_probs=np.array([9.0, 9.0, -0.5, 5e-5, 0.0])), 2) == []  # prompt: not read;
    # rounding above 0 allowed


@pytest.mark.parametrize("changes,words", [
    (dict(old_log_probs=np.zeros(4)), "`input_ids` has 5 tokens and `old_log_probs` 4 values"),
    (dict(completion_mask=np.array([0, 1, 1, 1, 1, 1])), "`input_ids` has 5 tokens and `completion_mask` 6"),
    (dict(input_ids=np.zeros((1, 5), dtype=np.int64)), "`input_ids` is not a one-dimensional array"),
    (dict(completion_mask=np.array([0, 0, 2, 1, 1])), "`completion_mask` holds [2]"),
    (dict(completion_mask=np.zeros(5, dtype=np.int64)), "marks no completion token"),
    (dict(input_ids=np.array([5.0, 6, 7, 8, 9])), "not token ids"),
    (dict(old_log_probs=None), "`old_log_probs` is not a one-dimensional array"),
])
def test_malformed_samples_are_described(changes, words):
    assert words in malformation(sample(**changes))


@pytest.mark.parametrize("changes,field,value", [
    (dict(old_log_probs=np.array([0, 0, -0.5, 5.0, -1.0])), "old_log_probs", 5.0),  # a logit, not a log-prob
    (dict(old_log_probs=np.array([0, 0, -0.5, math.nan, -1.0])), "old_log_probs", "nan"),
    (dict(old_log_probs=np.array([0, 0, -math.inf, -0.5, -1.0])), "old_log_probs", -math.inf),
    (dict(advantage=math.nan), "advantage", "nan"),
    (dict(advantage=-math.inf), "advantage", -math.inf),
    (dict(model_version=-5), "model_version", -5),
    (dict(model_version=3), "model_version", 3),  # a version the trainer has not published (current: 2)
    (dict(model_version=1.5), "model_version", 1.5),
])
def test_bad_values_are_named(changes, field, value):
    problems = bad_values(sample(**changes), current_version=2)
    assert [p[0] for p in problems] == [field]
    assert (str(problems[0][1]) == value) if isinstance(value, str) else problems[0][1] == value


def test_only_tokens_that_train_carry_a_signal():
    advantages = torch.tensor([0.0, math.nan, math.inf, 0.5, 0.5])
    logps = torch.tensor([-1.0, -1.0, -1.0, math.nan, -1.0])
    assert trained_tokens(advantages, logps).tolist() == [False, False, False, False, True]


class ListQueue:
    def __init__(self, samples):
        self.samples = list(samples)

    def get(self, timeout=None):
        return self.samples.pop(0)

    def qsize(self):
        return len(self.samples)


def test_the_queue_skips_excluded_samples_and_stops_on_a_run_of_unusable_ones(caplog):
    metrics = {"rpg/excluded_samples_total": []}
    bad = [sample(advantage=math.nan, group_id=i) for i in range(3)]
    checked = CheckedRollouts(ListQueue([*bad, sample(group_id=9)]), "the rollout worker W", lambda: 2, 1, metrics,
                              limit=4)
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        assert checked.get().group_id == 9
    assert checked.excluded == 3 and metrics["rpg/excluded_samples_total"] == [1.0] * 3
    assert checked.unusable_run == 0  # a usable sample resets the run
    assert "sample 1 (group_id=0, model_version=2) from the rollout worker W excluded from training: " \
           "`advantage`=nan (allowed: a finite number)" in caplog.records[0].getMessage()
    stale = [sample(model_version=0) for _ in range(2)]  # staleness 2 > max_staleness 1: returned, TRL drops them
    checked = CheckedRollouts(ListQueue([*stale, sample(model_version=-5), sample(advantage=math.nan)]),
                              "the rollout worker W", lambda: 2, 1, metrics, limit=4)
    assert [checked.get(), checked.get()] == stale
    with pytest.raises(NoUsableSamples, match=r"the last 4 samples from the rollout worker W could not be trained on "
                                              r"\(2 older than max_staleness=1, 1 `model_version` not allowed, 1 "
                                              r"`advantage` not allowed; the last: `advantage` not allowed \(nan\)\)"):
        checked.get()


def test_a_long_run_of_unusable_samples_is_warned_before_the_limit(caplog):
    """Unusable samples for `warn_after_s` seconds (a clock the test moves): one warning per run, the next run warned
    again; a usable sample in between ends the run."""
    now = [0.0]
    stale = [sample(model_version=0) for _ in range(4)]
    checked = CheckedRollouts(ListQueue([*stale, sample(), *stale]), "the rollout worker W", lambda: 2, 1,
                              {"rpg/excluded_samples_total": []}, limit=100, warn_after_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        for seconds in (0, 20, 31, 45):  # the run starts at 0: warned at 31 only
            now[0] = seconds
            checked.get()
        now[0] = 100
        checked.get()  # usable: the run ends
        for seconds in (101, 120, 140, 141):
            now[0] = seconds
            checked.get()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert warned[0].startswith("AsyncRPGTrainer: no sample from the rollout worker W could be trained on for 31 s "
                                "(3 in a row; the last: older than max_staleness=1 (staleness 2)); the run stops "
                                "after 100.")
    assert "for 39 s (3 in a row" in warned[1]


def test_the_limit_exceeds_what_the_worker_holds():
    class Args:
        queue_maxsize, max_inflight_tasks, num_generations = 1024, 32, 8
        max_staleness, per_device_train_batch_size, gradient_accumulation_steps = 4, 8, 2

    assert unusable_limit(Args) > 2 * (1024 + 32 * 8)
    Args.max_inflight_tasks = -1  # TRL's automatic value: max_staleness * batch * accumulation groups
    assert unusable_limit(Args) > 2 * (1024 + 64 * 8)


# ---------------------------------------------------------------------------------------------------------------------
# In the trainer, with a worker that corrupts what it sends
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("samples") / "model"))


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def prompts(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]})


class CorruptingWorker(StaleRolloutWorker):
    """The stand-in worker, `corrupt(sample)` applied to every sample it sends (it returns the sample, changed or
    not, and whether it changed it); `sent` records whether each one was changed, in the order sent. It sends at most
    `SENT_BOUND` samples (then fails), so a check that lets the trainer wait for ever fails the test instead."""

    def __init__(self, *args, corrupt, **kwargs):
        super().__init__(*args, **kwargs)
        self.corrupt, self.sent = corrupt, []

    def _scored(self, *args):
        if len(self.sent) >= SENT_BOUND:
            raise RuntimeError(f"CorruptingWorker: the test's bound of {SENT_BOUND} samples was reached")
        samples = []
        for good in super()._scored(*args):
            sent, changed = self.corrupt(good)
            samples.append(sent)
            self.sent.append(changed)
        return samples


def build(model_path, tokenizer, tmp_path, corrupt, **overrides):
    worker = CorruptingWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                              max_completion_length=LENGTH, seed=0, groups_per_call=BATCH // GENERATIONS,
                              corrupt=corrupt)
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, num_generations=GENERATIONS,
                    max_completion_length=LENGTH, max_steps=2, learning_rate=1e-2, max_staleness=2, token_budget=0,
                    use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                    disable_tqdm=True, beta=0.1)
    settings.update(overrides)
    trainer = AsyncRPGTrainer(model_path, reward_funcs=length_reward, args=AsyncRPGConfig(**settings),
                              train_dataset=prompts(), processing_class=tokenizer, rollout_worker=worker,
                              weight_transfer=worker)
    return trainer, worker


def every(n: int, **changes):
    """Corrupt every n-th sample sent (the 2nd, the (n+2)th, ...) with `changes`."""
    count = [0]

    def corrupt(s):
        count[0] += 1
        if count[0] % n != 2 % n:
            return s, False
        for key, value in changes.items():
            setattr(s, key, value(s) if callable(value) else value)
        return s, True
    return corrupt


@pytest.mark.parametrize("changes,field,value", [
    (dict(old_log_probs=lambda s: np.where(s.completion_mask == 1, 5.0, 0.0).astype(np.float32)), "old_log_probs",
     "5.0"),
    (dict(advantage=math.nan), "advantage", "nan"),
    (dict(model_version=100), "model_version", "100"),
])
def test_bad_samples_are_named_excluded_and_counted(model_path, tokenizer, tmp_path, caplog, changes, field, value):
    with async_trainer_on_cpu(VarlenAttention), caplog.at_level(logging.WARNING, logger="trl_rpg"):
        trainer, worker = build(model_path, tokenizer, tmp_path, every(5, **changes))
        metrics = trainer.train().metrics
    received = trainer.rollout_queue.received
    corrupted = sum(worker.sent[:received])
    assert corrupted >= 3 and metrics["rpg/excluded_samples"] == corrupted
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert sum(h.get("rpg/excluded_samples_total", 0) for h in logs) == corrupted
    assert all(h["sample/staleness_mean"] >= 0 and math.isfinite(h["loss"]) for h in logs)  # none trained on
    warned = [r.getMessage() for r in caplog.records if "excluded from training" in r.getMessage()]
    assert len(warned) == corrupted
    assert f"from the rollout worker CorruptingWorker excluded from training: `{field}`={value}" in warned[0]


@pytest.mark.parametrize("changes,max_staleness,words", [
    (dict(model_version=-5), 2, "`model_version` not allowed (-5)"),  # TRL would drop every one for ever
    (dict(model_version=0), 0, "older than max_staleness=0 (staleness 1)"),  # every sample too stale
])
def test_a_worker_whose_every_sample_is_unusable_stops_the_run(model_path, tokenizer, tmp_path, changes,
                                                               max_staleness, words):
    with async_trainer_on_cpu(VarlenAttention):
        trainer, _ = build(model_path, tokenizer, tmp_path, every(1, **changes), max_staleness=max_staleness)
        trainer.rollout_queue.limit = 12  # the default is thousands: the bound, made quick
        with pytest.raises(NoUsableSamples) as error:
            trainer.train()
    assert str(error.value).startswith("AsyncRPGTrainer: the last 12 samples from the rollout worker "
                                       "CorruptingWorker could not be trained on")
    assert words in str(error.value) and trainer.state.global_step == 0


def test_a_malformed_sample_ends_the_run_naming_it(model_path, tokenizer, tmp_path):
    with async_trainer_on_cpu(VarlenAttention):
        trainer, _ = build(model_path, tokenizer, tmp_path, every(7, old_log_probs=lambda s: s.old_log_probs[:-1]))
        with pytest.raises(MalformedRolloutSample) as error:
            trainer.train()
    assert str(error.value).startswith("AsyncRPGTrainer: sample 2 (group_id=0, model_version=1) from the rollout "
                                       "worker CorruptingWorker is malformed: `input_ids` has ")
    assert "tokens and `old_log_probs`" in str(error.value)


def test_the_verdict_counts_only_tokens_that_trained(model_path, tokenizer, tmp_path):
    """Past the checks (the queue read directly, as before them): every advantage NaN excludes every token from the
    loss, and the run says it trained on nothing."""
    with async_trainer_on_cpu(VarlenAttention):
        trainer, _ = build(model_path, tokenizer, tmp_path, every(1, advantage=math.nan), max_steps=1)
        trainer.rollout_queue = trainer.rollout_queue.queue
        metrics = trainer.train().metrics
    assert metrics["rpg/trained_on_nothing"] == 1.0
