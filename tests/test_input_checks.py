"""Unit tests of `trl_rpg.run.reward_calls` and `trl_rpg.trainers.validation` (no model, no training): reward wrappers
keep the
sync/async nature TRL detects, reward results are checked in float32 against a documented bound, failing reward
functions are not called again, and data sets are checked (streaming first row, `content: None`, size, prompts that
tokenize to nothing)."""

import asyncio
import functools
import logging
import math

import numpy as np
import pytest
import torch
from _tiny import tiny_tokenizer
from accelerate.data_loader import BatchSamplerShard
from datasets import Dataset, IterableDataset
from tokenizers import normalizers, processors
from torch.utils.data import BatchSampler
from trl import GRPOConfig
from trl.trainer.utils import RepeatSampler, get_callable_name, nanstd
from trl.trainer.utils import is_async_callable as trl_is_async_callable

from trl_rpg import RPGConfig
from trl_rpg.run.reward_calls import FLOAT32_MAX, MAX_ABS_REWARD, check_rewards, checked_reward_function
from trl_rpg.trainers.validation import (
    minimum_train_prompts,
    validate_dataset_size,
    validate_tokenized_prompts,
    validate_train_dataset,
)

# ------------------------------------------------------------------------------------------------------------------
# Reward callables of every form TRL accepts
# ------------------------------------------------------------------------------------------------------------------


def sync_fn(completions, **kwargs):
    return [float(len(c)) for c in completions]


async def async_fn(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


class SyncInstance:
    def __init__(self):
        self.scale = 1.0

    def __call__(self, completions, **kwargs):
        return [self.scale * len(c) for c in completions]


class AsyncInstance:
    def __init__(self):
        self.scale = 1.0

    async def __call__(self, completions, **kwargs):
        await asyncio.sleep(0)
        return [self.scale * len(c) for c in completions]


def scaled(completions, factor, **kwargs):
    return [factor * len(c) for c in completions]


async def async_scaled(completions, factor, **kwargs):
    return [factor * len(c) for c in completions]


CALLABLES = {
    "function": lambda: sync_fn,
    "async function": lambda: async_fn,
    "instance": SyncInstance,
    "async instance": AsyncInstance,
    "partial": lambda: functools.partial(scaled, factor=1.0),
    "partial of async function": lambda: functools.partial(async_scaled, factor=1.0),
    "partial of async instance": lambda: functools.partial(AsyncInstance()),
}
KWARGS = {"prompts": ["p0", "p1", "p2"], "completions": ["a", "bb", "ccc"]}


def call(func, **kwargs):
    """Call a reward function the way TRL does: await it when TRL's own test says it is async."""
    if trl_is_async_callable(func):
        return asyncio.run(func(**kwargs))
    return func(**kwargs)


@pytest.mark.parametrize("kind", list(CALLABLES))
def test_wrapper_keeps_the_async_nature_and_name_trl_reads(kind):
    func = CALLABLES[kind]()
    name = get_callable_name(func)  # how GRPOTrainer names it (reward_func_names)
    wrapped = checked_reward_function(func, name)
    assert trl_is_async_callable(wrapped) == trl_is_async_callable(func)
    assert get_callable_name(wrapped) == name
    assert call(wrapped, **KWARGS) == [1.0, 2.0, 3.0]
    assert checked_reward_function(wrapped, name) is wrapped  # never wrapped twice
    if kind == "async instance":  # an awaitable __call__: the wrapper is an `async def` itself
        assert asyncio.iscoroutinefunction(wrapped) and wrapped.scale == 1.0  # attributes copied


@pytest.mark.parametrize("kind", ["async function", "async instance", "partial of async instance"])
def test_results_of_async_reward_functions_are_checked(kind):
    class AsyncDict:
        async def __call__(self, completions, **kwargs):
            return {i: 1.0 for i in range(len(completions))}

    async def async_dict(completions, **kwargs):
        return {i: 1.0 for i in range(len(completions))}

    func = {"async function": async_dict, "async instance": AsyncDict(),
            "partial of async instance": functools.partial(AsyncDict())}[kind]
    with pytest.raises(ValueError, match="`judge` returned a dict"):
        call(checked_reward_function(func, "judge"), **KWARGS)


def test_sync_function_returning_a_coroutine_is_explained():
    def hidden_async(completions, **kwargs):
        return async_fn(completions)

    with pytest.raises(ValueError, match=r"`hidden_async` returned an awaitable \(coroutine\).*`async def`"):
        checked_reward_function(hidden_async, "hidden_async")(**KWARGS)


# ------------------------------------------------------------------------------------------------------------------
# What counts as rewards
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rewards",
    [[1, 0.5, None], (1, 0.5, math.nan), np.array([1.0, 0.5, np.nan]), torch.tensor([1.0, 0.5, float("nan")]),
     [np.float32(1), np.int64(0), None], [True, np.bool_(False), None], [torch.tensor(1.0), np.array(0.5), None],
     torch.tensor([1.0, 0.5, float("nan")], dtype=torch.bfloat16)],
    ids=["list", "tuple", "numpy", "tensor", "numpy scalars", "bools", "0-d tensor and array", "bf16 tensor"],
)
def test_accepted_rewards_become_floats_and_none(rewards):
    out = check_rewards(rewards, "f", completions=["a", "b", "c"])
    assert out[2] is None and [type(x) for x in out[:2]] == [float, float]
    assert out[:2] == [1.0, 0.5] or out[:2] == [1.0, 0.0]


@pytest.mark.parametrize(
    "rewards,match",
    [({0: 1.0, 1: 0.5, 2: 0.0}, "returned a dict"), ("110", "returned a str"), ({1.0, 0.5, 0.0}, "returned a set"),
     ((x for x in [1.0, 0.5, 0.0]), "returned a generator"),
     (np.ones((3, 1)), r"returned a ndarray of shape \(3, 1\)"),
     (torch.tensor(1.0), r"returned a Tensor of shape \(\)"), (3.0, "returned a float"), (None, "returned a NoneType"),
     (np.array([1j, 1, 1]), "returned a complex ndarray"), ([1.0, "0.5", 0.0], "returned '0.5' for row 1"),
     ([1.0, [0.5], 0.0], r"returned \[0.5\] for row 1"), ([1.0, 0.5, 1j], "returned 1j for row 2")],
    ids=["dict", "str", "set", "generator", "2-d array", "0-d tensor", "scalar", "None", "complex", "str item",
         "list item", "complex item"],
)
def test_anything_else_raises_naming_function_and_type(rewards, match):
    with pytest.raises(ValueError, match=f"Reward function `f` {match}"):
        check_rewards(rewards, "f", completions=["a", "b", "c"])


def test_wrong_length_is_named():
    with pytest.raises(ValueError, match="`f` returned 2 rewards for 3 completions"):
        check_rewards([1.0, 2.0], "f", completions=["a", "b", "c"])


# ------------------------------------------------------------------------------------------------------------------
# Finite in float32, and within the bound that keeps TRL's float32 std finite
# ------------------------------------------------------------------------------------------------------------------

EDGE = math.nextafter(MAX_ABS_REWARD, math.inf)


@pytest.mark.parametrize(
    "value,match",
    [(1e300, r"returned 1e\+300 for row 1 \(prompt: 'p1'\); rewards must be finite in float32"),
     (-3.5e38, r"returned -3.5e\+38 for row 1 .*finite in float32"),  # finite in float64, inf in float32
     (math.inf, "returned inf for row 1 .*finite in float32"),
     (10 ** 400, "returned an integer of 1329 bits for row 1 .*finite in float32"),
     (1e30, r"returned 1e\+30 for row 1 .*at most 1e\+15 in magnitude"),
     (EDGE, r"returned 1000000000000000.1 for row 1 .*at most 1e\+15"),
     (-EDGE, r"returned -1000000000000000.1 for row 1 .*at most 1e\+15"),
     (np.float64(2e15), r"returned 2000000000000000.0 for row 1"),
     (torch.tensor(3e16), r"returned 3.0000000\d+e\+16 for row 1")],  # a float32 0-d tensor: its float32 value
)
def test_rewards_too_large_for_float32_arithmetic_are_rejected_with_their_row(value, match):
    with pytest.raises(ValueError, match=f"Reward function `big` {match}"):
        check_rewards([0.0, value, 0.0], "big", KWARGS["completions"], KWARGS["prompts"])


def test_rewards_at_the_bound_are_accepted_exactly():
    assert check_rewards([MAX_ABS_REWARD, -MAX_ABS_REWARD, 1e-300], "f") == [1e15, -1e15, 1e-300]


def test_the_bound_keeps_trl_std_finite_and_larger_rewards_break_it():
    """The derivation of MAX_ABS_REWARD on TRL's own float32 `nanstd`: a million rewards at +-bound (the worst case
    for the squared deviations) give a finite std; at 1e19 (above sqrt(float32 max) / 2) the std of a group of 4 is
    inf and every advantage (r - mean) / (std + 1e-4) is exactly 0, the silent failure the bound prevents."""
    n = 2 ** 20
    batch = torch.full((n,), MAX_ABS_REWARD, dtype=torch.float32)
    batch[::2] = -MAX_ABS_REWARD
    std = nanstd(batch)
    assert torch.isfinite(std) and abs(std.item() / MAX_ABS_REWARD - 1) < 1e-3
    assert n * MAX_ABS_REWARD ** 2 < FLOAT32_MAX / 100  # the documented margin: 3.4e8 rewards

    group = torch.tensor([1e19, -1e19, 1e19, -1e19], dtype=torch.float32)
    assert torch.isinf(nanstd(group))
    advantages = (group - group.mean()) / (nanstd(group) + 1e-4)
    assert torch.equal(advantages, torch.zeros(4))


# ------------------------------------------------------------------------------------------------------------------
# A reward function that raises is called once
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True])
def test_failing_reward_function_is_called_exactly_once(is_async):
    calls = []

    def body(prompts, **kwargs):
        calls.append(len(prompts))
        return [1 / (int(p[1]) % 2) for p in prompts]  # ZeroDivisionError on 'p0' and 'p2'

    async def async_body(prompts, **kwargs):
        return body(prompts, **kwargs)

    wrapped = checked_reward_function(async_body if is_async else body, "sandbox")
    with pytest.raises(RuntimeError, match=r"Reward function `sandbox` raised ZeroDivisionError: division by zero on "
                                           r"a batch of 3 completions\. The failing row was not identified") as info:
        call(wrapped, **KWARGS)
    assert calls == [3]  # one call with the whole batch; no per-row retries
    assert isinstance(info.value.__cause__, ZeroDivisionError)  # the user's traceback is kept


# ------------------------------------------------------------------------------------------------------------------
# Data sets
# ------------------------------------------------------------------------------------------------------------------


def streaming(rows):
    def gen():
        yield from rows
    return IterableDataset.from_generator(gen)


@pytest.mark.parametrize(
    "dataset,match",
    [(streaming([{"question": "1+1"}] * 3), r"no 'prompt' column \(columns: \['question'\]\)"),
     (Dataset.from_dict({"question": ["1+1"] * 3}).to_iterable_dataset(), "no 'prompt' column"),
     (streaming([]), "`train_dataset` is empty: the streaming data set yielded no rows"),
     (streaming([{"prompt": "  "}, {"prompt": "1+1"}]), "row 0: the prompt is empty"),
     (streaming([{"prompt": [{"role": "user", "content": None}]}]), "row 0, message 0: 'content' is None")],
    ids=["generator without prompt", "features without prompt", "empty", "empty first prompt", "content None"],
)
def test_streaming_data_set_first_row_is_checked(dataset, match):
    with pytest.raises(ValueError, match=match):
        validate_train_dataset(dataset)


def test_streaming_check_does_not_consume_the_data_set():
    dataset = streaming([{"prompt": f"{i}+1"} for i in range(5)])
    iterator_before = iter(dataset)
    assert next(iterator_before)["prompt"] == "0+1"
    validate_train_dataset(dataset)
    assert [row["prompt"] for row in dataset] == [f"{i}+1" for i in range(5)]  # every row still there, in order
    assert next(iterator_before)["prompt"] == "1+1"  # a user's running iterator is not advanced


def test_content_none_is_rejected_with_its_row():
    good = [{"role": "user", "content": "1+1"}]
    bad = [{"role": "system", "content": "be brief"}, {"role": "user", "content": None}]
    with pytest.raises(ValueError, match=r"`train_dataset` row 2, message 1: 'content' is None"):
        validate_train_dataset(Dataset.from_dict({"prompt": [good, good, bad, good]}))


def test_content_none_is_allowed_on_a_tool_calling_turn():
    call_turn = {"role": "assistant", "content": None,
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    validate_train_dataset(Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1"}, call_turn]}]))


# --- size -------------------------------------------------------------------------------------------------------


def rpg_args(tmp_path, **kwargs):
    return RPGConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True,
                     report_to="none", **kwargs)


def prompts(n):
    return Dataset.from_dict({"prompt": [f"{i}+1" for i in range(n)]})


def test_minimum_is_one_generation_batch_of_distinct_prompts(tmp_path):
    rpg = rpg_args(tmp_path)  # steps_per_generation = rpg_generation_reuse 4 x accumulation 1
    grpo = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True,
                      report_to="none")
    assert (minimum_train_prompts(rpg), minimum_train_prompts(grpo)) == (8, 2)  # 8 x 4 / 4 and 8 x 1 / 4
    assert minimum_train_prompts(rpg_args(tmp_path, gradient_accumulation_steps=2)) == 16
    assert minimum_train_prompts(rpg_args(tmp_path, rpg_generation_reuse=1)) == 2


@pytest.mark.parametrize("num_processes", [1, 2, 3])
@pytest.mark.parametrize("reuse", [1, 4])
def test_minimum_matches_trl_sampler_on_each_process(num_processes, reuse):
    """TRL's `RepeatSampler` with TRL's arguments, batched and sharded across processes as accelerate does: every
    process gets batches iff the data set has at least `minimum_train_prompts` prompts."""
    P, G = 4, 4
    S = reuse
    args = type("Args", (), {"generation_batch_size": P * num_processes * S, "num_generations": G,
                             "world_size": num_processes})()
    needed = minimum_train_prompts(args)

    def batches_per_process(size):
        sampler = RepeatSampler(list(range(size)), mini_repeat_count=G, batch_size=args.generation_batch_size // G,
                                repeat_count=S, shuffle=True, seed=0)
        batch_sampler = BatchSampler(sampler, batch_size=P * S, drop_last=False)
        return [len(list(BatchSamplerShard(batch_sampler, num_processes, rank))) for rank in range(num_processes)]

    assert batches_per_process(needed - 1) == [0] * num_processes
    assert all(n > 0 for n in batches_per_process(needed))


def test_too_small_data_set_names_size_minimum_and_settings(tmp_path):
    args = rpg_args(tmp_path)
    validate_dataset_size(prompts(8), args)  # exactly one generation batch: fine
    with pytest.raises(ValueError) as info:
        validate_dataset_size(prompts(7), args)
    message = str(info.value)
    assert message.startswith("`train_dataset` has 7 prompts, but one generation batch needs 8 distinct prompts, so "
                              "training would run 0 steps.")
    for text in ["per_device_train_batch_size (8) x processes (1) x steps_per_generation (4) = 32 completions",
                 "rpg_generation_reuse 4 x gradient_accumulation_steps 1", "4x the prompts of GRPOTrainer"]:
        assert text in message


def test_empty_data_set_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is empty \\(0 prompts\\), but one generation batch needs 8"):
        validate_dataset_size(Dataset.from_dict({"prompt": []}), rpg_args(tmp_path))


def test_explicit_steps_per_generation_is_named(tmp_path):
    args = rpg_args(tmp_path, steps_per_generation=2)
    with pytest.raises(ValueError, match="needs 4 distinct prompts.*or steps_per_generation") as info:
        validate_dataset_size(prompts(3), args)
    assert "rpg_generation_reuse" not in str(info.value)


def test_streaming_data_set_size_is_not_checked(tmp_path):
    validate_dataset_size(streaming([{"prompt": "1+1"}]), rpg_args(tmp_path))
    validate_dataset_size(None, rpg_args(tmp_path))


# --- prompts that tokenize to nothing ----------------------------------------------------------------------------


@pytest.fixture
def hash_blind_tokenizer():
    """The tiny tokenizer, with '#' removed by its normaliser: '###' tokenizes to nothing."""
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Replace("#", "")
    assert tokenizer("###")["input_ids"] == []
    return tokenizer


def test_prompt_that_tokenizes_to_nothing_is_named(hash_blind_tokenizer):
    dataset = Dataset.from_dict({"prompt": ["1+1", "2+2", "###", "3+3"]})
    with pytest.raises(ValueError, match=r"`train_dataset` row 2: the prompt '###' tokenizes to no tokens"):
        validate_tokenized_prompts(dataset, hash_blind_tokenizer, batch_size=2)  # the row opens the second batch
    validate_tokenized_prompts(dataset.select([0, 1, 3]), hash_blind_tokenizer)


def test_conversational_prompts_use_the_trainer_chat_template(hash_blind_tokenizer):
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}], [{"role": "user", "content": "#"}]]})
    validate_tokenized_prompts(dataset, hash_blind_tokenizer)  # the tokenizer's template adds '=' after the prompt
    bare = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="`eval_dataset` row 1: the prompt .* tokenizes to no tokens"):
        validate_tokenized_prompts(dataset, hash_blind_tokenizer, chat_template=bare, name="eval_dataset")


def test_tokenized_check_is_bounded_and_says_so(hash_blind_tokenizer, caplog):
    dataset = Dataset.from_dict({"prompt": ["1+1"] * 5 + ["###"]})
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.validation"):
        validate_tokenized_prompts(dataset, hash_blind_tokenizer, max_rows=5)
    assert "checked the first 5 of the 6 prompts of `train_dataset`" in caplog.text
    with pytest.raises(ValueError, match="row 5"):
        validate_tokenized_prompts(dataset, hash_blind_tokenizer, max_rows=None)


def test_tokenized_check_skips_streaming_and_empty_data_sets(hash_blind_tokenizer):
    validate_tokenized_prompts(streaming([{"prompt": "###"}]), hash_blind_tokenizer)
    validate_tokenized_prompts(Dataset.from_dict({"prompt": []}), hash_blind_tokenizer)


def test_text_gets_a_bos_token_so_no_text_prompt_is_empty(hash_blind_tokenizer):
    hash_blind_tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<eos> $A", special_tokens=[("<eos>", hash_blind_tokenizer.eos_token_id)])
    assert hash_blind_tokenizer(text=["###"])["input_ids"] == [[hash_blind_tokenizer.eos_token_id]]  # as TRL sees it
    validate_tokenized_prompts(Dataset.from_dict({"prompt": ["1+1", "###"]}), hash_blind_tokenizer)
