"""Bad data and misbehaving reward functions: a documented meaning, or an error naming the function and the row;
numerical faults never reach the optimizer silently."""

import asyncio
import functools
import math

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset, tiny_model, tiny_tokenizer
from datasets import Dataset, IterableDataset
from tokenizers import normalizers
from trl import GRPOConfig, GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.reward_calls import MAX_ABS_REWARD


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def _rows_without_prompt():
    yield from [{"question": "1+1"}] * 8


def make(model_path, tmp_path, reward=length_reward, dataset=None, **overrides):
    args = RPGConfig(**cpu_args(tmp_path, **{"max_steps": 2, **overrides}))
    return RPGTrainer(model=model_path, reward_funcs=reward, args=args,
                      train_dataset=dataset if dataset is not None else tiny_dataset())


@pytest.mark.parametrize(
    "dataset,match",
    [
        (Dataset.from_dict({"question": ["1+1"] * 8}), "no 'prompt' column"),
        (Dataset.from_dict({"prompt": ["1+1"] * 5 + ["  "] + ["2+2"] * 2}), "row 5: the prompt is empty"),
        (Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 3
                            + [[{"role": "", "content": "1+1"}]]}), "row 3, message 0: the role must be a non-empty"),
        (Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}], []]}), "row 1"),
        (Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 9
                            + [[{"role": "user", "content": None}]]}), r"row 9, message 0: 'content' is None"),
        (Dataset.from_dict({"question": ["1+1"] * 8}).to_iterable_dataset(), "no 'prompt' column"),
        (IterableDataset.from_generator(_rows_without_prompt), r"no 'prompt' column \(columns: \['question'\]\)"),
    ],
    ids=["no prompt column", "empty prompt", "bad role", "no messages", "content None", "streaming, features",
         "streaming, first row"],
)
def test_bad_data_set_is_rejected_before_any_compute(tmp_path, dataset, match):
    with pytest.raises(ValueError, match=match):
        # the model path does not even exist: the data check comes first
        make(str(tmp_path / "no-model-here"), tmp_path, dataset=dataset)


# --- needs `validate_dataset_size(train_dataset, args)` in RPGTrainer.__init__, before the model is loaded ---------


@pytest.mark.parametrize("size,match", [(0, r"is empty \(0 prompts\)"), (7, "has 7 prompts")])
def test_too_small_data_set_is_rejected_before_any_compute(tmp_path, size, match):
    """cpu_args: 8 completions per device x steps_per_generation 4 (rpg_generation_reuse) / 4 generations = 8
    prompts per generation batch; TRL's sampler drops an incomplete one, so 7 prompts would train 0 steps."""
    expected = f"`train_dataset` {match}, but one generation batch needs 8 distinct prompts"
    with pytest.raises(ValueError, match=expected):
        make(str(tmp_path / "no-model-here"), tmp_path, dataset=tiny_dataset(size))


def test_data_set_of_exactly_one_generation_batch_trains(tmp_path, model_path):
    trainer = make(model_path, tmp_path, dataset=tiny_dataset(8), max_steps=5)
    trainer.train()
    assert trainer.state.global_step == 5  # the one batch is reused 4 times, then the next epoch generates again


# --- needs `validate_tokenized_prompts(...)` in RPGTrainer.__init__, right after GRPOTrainer.__init__ --------------


def test_prompt_that_tokenizes_to_nothing_is_named_at_construction(tmp_path):
    """Today: `IndexError: index -1 is out of bounds` inside `generate` (all prompts of a batch empty), a dtype error
    (the first one empty), or generation from a fully masked prompt (another one empty), at train()."""
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Replace("#", "")  # '###' tokenizes to nothing
    path = str(tmp_path / "hash-blind")
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    dataset = Dataset.from_dict({"prompt": ["1+1"] * 11 + ["###"] + ["2+2"] * 4})
    with pytest.raises(ValueError, match=r"`train_dataset` row 11: the prompt '###' tokenizes to no tokens"):
        make(path, tmp_path, dataset=dataset)


# --- reward functions ------------------------------------------------------------------------------------------


def test_reward_function_that_raises_is_called_once_and_named(tmp_path, model_path):
    calls = []

    def picky_reward(completions, prompts, **kwargs):
        calls.append(len(prompts))
        return [1 / (int(p[0]) % 2) for p in prompts]  # fails on prompts starting with an even digit

    trainer = make(model_path, tmp_path, reward=picky_reward)
    with pytest.raises(RuntimeError, match=r"Reward function `picky_reward` raised ZeroDivisionError: division by "
                                           r"zero on a batch of 32 completions\. The failing row was not identified"):
        trainer.train()
    assert calls == [32]  # once, with the whole generation batch: never again per row


def test_reward_function_returning_a_dict_is_rejected(tmp_path, model_path):
    def dict_reward(completions, **kwargs):  # today read through its keys: reward = row index
        return {i: 1.0 for i in range(len(completions))}

    with pytest.raises(ValueError, match="Reward function `dict_reward` returned a dict; a reward function must "
                                         "return a list"):
        make(model_path, tmp_path, reward=dict_reward).train()


class AsyncJudge:
    """A reward written as a class whose `__call__` is `async def` (e.g. an LLM judge client)."""

    def __init__(self):
        self.returned = []

    async def __call__(self, completions, **kwargs):
        await asyncio.sleep(0)
        rewards = length_reward(completions)
        self.returned.append(rewards)
        return rewards


class SyncJudge(AsyncJudge):
    def __call__(self, completions, **kwargs):
        rewards = length_reward(completions)
        self.returned.append(rewards)
        return rewards


def _reward_forms():
    async_judge, sync_judge, recorded = AsyncJudge(), SyncJudge(), []

    async def async_length(completions, **kwargs):
        rewards = length_reward(completions)
        recorded.append(rewards)
        return rewards

    def scaled_length(completions, scale, **kwargs):
        rewards = [scale * r for r in length_reward(completions)]
        recorded.append(rewards)
        return rewards

    return {
        "async function": (async_length, "async_length", recorded),
        "async instance": (async_judge, "AsyncJudge", async_judge.returned),
        "sync instance": (sync_judge, "SyncJudge", sync_judge.returned),
        "partial": (functools.partial(scaled_length, scale=1.0), "scaled_length", recorded),
    }


@pytest.mark.parametrize("form", ["async function", "async instance", "sync instance", "partial"])
def test_every_reward_form_trl_accepts_trains(tmp_path, model_path, form):
    """Today an `async def __call__` instance fails ("must return a list ..., got coroutine")."""
    reward, name, returned = _reward_forms()[form]
    trainer = make(model_path, tmp_path, reward=reward, max_steps=1)
    trainer.train()
    assert len(returned) == 1 and len(returned[0]) == 32  # called (and awaited) once for the generation batch
    logged = trainer.state.log_history[0][f"rewards/{name}/mean"]
    assert logged == pytest.approx(sum(returned[0]) / 32, abs=1e-6)  # TRL trained on what the function returned


def test_async_instance_gives_the_same_rewards_as_under_grpo(tmp_path, model_path):
    """Same seed, model and batch layout: the first generation batch (the same completions) is scored the same."""
    grpo_judge, rpg_judge = AsyncJudge(), AsyncJudge()
    overrides = {**cpu_args(tmp_path / "grpo", max_steps=1), "steps_per_generation": 4}
    grpo = GRPOTrainer(model=model_path, reward_funcs=grpo_judge, args=GRPOConfig(**overrides),
                       train_dataset=tiny_dataset())
    grpo.train()
    rpg = make(model_path, tmp_path, reward=rpg_judge, max_steps=1, steps_per_generation=4)
    rpg.train()
    assert len(rpg_judge.returned[0]) == len(grpo_judge.returned[0]) == 32
    assert rpg_judge.returned == grpo_judge.returned
    assert (rpg.state.log_history[0]["rewards/AsyncJudge/mean"]
            == grpo.state.log_history[0]["rewards/AsyncJudge/mean"])


def test_reward_function_with_wrong_length_is_named(tmp_path, model_path):
    def short_reward(completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(ValueError, match="`short_reward` returned 31 rewards for 32 completions"):
        make(model_path, tmp_path, reward=short_reward).train()


def test_infinite_reward_is_rejected_with_its_row(tmp_path, model_path):
    def wild_reward(completions, **kwargs):
        return [math.inf if i == 3 else 0.5 for i in range(len(completions))]

    with pytest.raises(ValueError, match="`wild_reward` returned inf for row 3"):
        make(model_path, tmp_path, reward=wild_reward).train()


@pytest.mark.parametrize("value,match", [(1e300, r"1e\+300 for row 5 .*finite in float32"),
                                         (1e30, r"1e\+30 for row 5 .*at most 1e\+15 in magnitude")])
def test_overflowing_reward_is_rejected_with_its_row(tmp_path, model_path, value, match):
    """Today 1e300 becomes inf in TRL's float32 reward tensor, and 1e30 makes the group std inf, so every advantage
    is exactly 0 and nothing is learnt, without a word."""

    def huge_reward(completions, **kwargs):
        return [value if i == 5 else r for i, r in enumerate(length_reward(completions))]

    with pytest.raises(ValueError, match=f"Reward function `huge_reward` returned {match}"):
        make(model_path, tmp_path, reward=huge_reward, scale_rewards="group").train()


@pytest.mark.parametrize("scale_rewards", ["group", "batch"])
def test_rewards_at_the_bound_train_with_finite_std(tmp_path, model_path, scale_rewards):
    def bound_reward(completions, **kwargs):  # rewards in [0, MAX_ABS_REWARD], the largest accepted
        return [MAX_ABS_REWARD * r for r in length_reward(completions)]

    trainer = make(model_path, tmp_path, reward=bound_reward, scale_rewards=scale_rewards, max_steps=1)
    trainer.train()
    first = trainer.state.log_history[0]
    assert math.isfinite(first["reward_std"]) and first["reward_std"] > 0
    assert first["frac_reward_zero_std"] < 1  # some group varies: its advantages are not all 0
    assert math.isfinite(first["loss"])
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_none_and_nan_rewards_mean_not_scored(tmp_path, model_path):
    """TRL's convention: None (and NaN, treated the same) means not scored; such completions get zero advantage and
    training goes on with finite parameters."""

    def partial_reward(completions, **kwargs):
        out = length_reward(completions)
        return [None if i % 4 == 0 else (math.nan if i % 4 == 1 else r) for i, r in enumerate(out)]

    trainer = make(model_path, tmp_path, reward=partial_reward)
    trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    advantages = torch.cat([b["advantages"] for b in trainer._buffered_inputs])
    assert torch.isfinite(advantages).all()


def test_nan_sampling_logprobs_are_excluded_and_counted(tmp_path, model_path):
    """Tokens a generator could not score (NaN log-prob) are dropped from the loss and counted in the logs."""
    trainer = make(model_path, tmp_path, max_steps=3, steps_per_generation=4)
    original = trainer._generate_and_score_completions

    def corrupt(inputs):
        out = original(inputs)
        out["old_per_token_logps"][0, 0] = float("nan")
        out["old_per_token_logps"][1, 0] = float("inf")
        return out

    trainer._generate_and_score_completions = corrupt
    trainer.train()
    excluded = [h["rpg/excluded_tokens"] for h in trainer.state.log_history if "rpg/excluded_tokens" in h]
    assert sum(excluded) >= 1  # the corrupted rows land in some micro-batch of the reused generation batch
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_nan_advantages_are_excluded(tmp_path, model_path):
    trainer = make(model_path, tmp_path, max_steps=2, steps_per_generation=2)
    original = trainer._generate_and_score_completions

    def corrupt(inputs):
        out = original(inputs)
        out["advantages"][:3] = float("nan")
        return out

    trainer._generate_and_score_completions = corrupt
    trainer.train()
    excluded = sum(h.get("rpg/excluded_tokens", 0) for h in trainer.state.log_history)
    assert excluded > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
