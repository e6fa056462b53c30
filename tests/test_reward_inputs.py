"""What a reward function may and may not do (issue 20, section 3): it gets its own copies of its inputs, it cannot
shorten the batch unnoticed, and a call that never returns ends in an error naming it (`rpg_reward_timeout`).
Also: chat roles are the chat template's business (issue 19, section 4), and the unscored-batch warning fires once."""

import asyncio
import threading

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset, tiny_tokenizer
from datasets import Dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.reward_calls import ScoringTally, checked_reward_function, private_copy
from trl_rpg.trainers.validation import validate_tokenized_prompts, validate_train_dataset


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def batch():
    """The keyword arguments TRL passes, for a conversational batch of 4 with two data-set columns."""
    return dict(prompts=[[{"role": "user", "content": f"{i}+1"}] for i in range(4)],
                completions=[[{"role": "assistant", "content": "x" * (i + 1)}] for i in range(4)],
                completion_ids=[[5] * (i + 1) for i in range(4)], answer=["1", "2", "3", "4"],
                reward_model=[{"ground_truth": str(i)} for i in range(4)], trainer_state=object(), log_extra=print)


def vandal(prompts, completions, completion_ids, answer, reward_model, **kwargs):
    """Edits everything it is given, in place, and scores the length of what it sees."""
    completions.reverse()
    completions[0][0]["content"] = "edited"
    completion_ids[0].append(7)
    answer[1] = "edited"
    reward_model[2]["ground_truth"] = "edited"
    prompts[3][0]["content"] = "edited"
    return [float(len(c[0]["content"])) for c in completions]


# --- private copies ------------------------------------------------------------------------------------------------


def test_a_reward_function_that_edits_its_inputs_changes_nothing_for_the_next():
    kwargs, seen = batch(), []
    expected = {key: private_copy(value) for key, value in kwargs.items() if isinstance(value, list)}

    def witness(**given):
        seen.append({key: given[key] for key in expected})
        assert given["trainer_state"] is kwargs["trainer_state"] and given["log_extra"] is print  # passed as they are
        return [0.0] * len(given["completions"])

    assert checked_reward_function(vandal, "vandal")(**kwargs) == [6.0, 3.0, 2.0, 1.0]
    checked_reward_function(witness, "witness")(**kwargs)
    assert seen == [expected]  # the next function scores what was generated
    assert {key: kwargs[key] for key in expected} == expected  # and TRL logs it


def test_async_reward_functions_get_copies_too():
    kwargs = batch()
    expected = private_copy(kwargs["completions"])

    async def async_vandal(**given):
        return vandal(**given)

    asyncio.run(checked_reward_function(async_vandal, "async_vandal")(**kwargs))
    assert kwargs["completions"] == expected


def test_private_copy_shares_only_immutable_values():
    value = [{"a": [1, 2], "b": ("s", [3])}, "text", 4]
    copied = private_copy(value)
    assert copied == value and copied is not value and copied[0] is not value[0]
    assert copied[0]["a"] is not value[0]["a"] and copied[0]["b"][1] is not value[0]["b"][1]
    assert copied[1] is value[1]  # strings are shared: they cannot be edited


def test_trained_ids_and_scored_text_agree_through_the_trainer(tmp_path, model_path):
    """The second function sees the completions TRL trained on (today: reversed for 32 of 32 rows)."""
    tokenizer, pairs = tiny_tokenizer(), []

    def reverser(completions, **kwargs):
        completions.reverse()
        return [0.0] * len(completions)

    def recorder(completions, completion_ids, **kwargs):
        pairs.extend(zip(completions, completion_ids, strict=True))
        return length_reward(completions)

    args = RPGConfig(**cpu_args(tmp_path, max_steps=1))
    RPGTrainer(model=model_path, reward_funcs=[reverser, recorder], args=args, train_dataset=tiny_dataset()).train()
    assert len(pairs) == 32
    assert len({text for text, _ in pairs}) > 1  # the check below is not vacuous
    specials = {tokenizer.pad_token, tokenizer.eos_token}
    assert all(text == "".join(t for t in tokenizer.convert_ids_to_tokens(ids) if t not in specials)
               for text, ids in pairs)  # the tiny tokenizer has one character per token


# --- shortened batches ---------------------------------------------------------------------------------------------


def test_a_reward_function_that_shortens_the_batch_is_named():
    def shortener(prompts, completions, **kwargs):
        prompts.pop()
        completions.pop()
        return [1.0] * len(completions)

    kwargs = batch()
    with pytest.raises(ValueError, match=r"Reward function `shortener` returned 3 rewards for 4 completions; it "
                                         r"shortened its copy of `prompts` \(to 3 items\) and `completions` \(to 3 "
                                         r"items\)"):
        checked_reward_function(shortener, "shortener")(**kwargs)
    assert len(kwargs["prompts"]) == len(kwargs["completions"]) == 4


def test_a_shortened_batch_is_named_through_the_trainer(tmp_path, model_path):
    """Today: a tensor-size error from TRL that names no function."""
    def shortener(prompts, completions, **kwargs):
        del prompts[-1], completions[-1]
        return [1.0] * len(completions)

    args = RPGConfig(**cpu_args(tmp_path, max_steps=1))
    trainer = RPGTrainer(model=model_path, reward_funcs=shortener, args=args, train_dataset=tiny_dataset())
    with pytest.raises(ValueError, match="`shortener` returned 31 rewards for 32 completions; it shortened its copy"):
        trainer.train()


# --- timeout -------------------------------------------------------------------------------------------------------


def test_a_reward_function_that_never_returns_times_out_naming_it():
    release = threading.Event()

    def stuck(completions, **kwargs):
        release.wait()  # until the test ends: the worker thread cannot be stopped
        return [0.0] * len(completions)

    try:
        with pytest.raises(TimeoutError, match=r"Reward function `stuck` did not return within 0.2 s on a batch of 4 "
                                               r"completions \(rpg_reward_timeout=0.2\)"):
            checked_reward_function(stuck, "stuck", timeout=0.2)(**batch())
    finally:
        release.set()


def never_returning(cancelled: list):
    """An async reward function that waits forever and records in `cancelled` that it was cancelled."""

    async def reward(completions, **kwargs):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    return reward


def test_an_async_reward_function_that_never_returns_is_cancelled():
    cancelled = []
    stuck = never_returning(cancelled)

    async def call():
        with pytest.raises(TimeoutError, match="Reward function `stuck` did not return within 0.2 s"):
            await checked_reward_function(stuck, "stuck", timeout=0.2)(**batch())
        await asyncio.sleep(0)  # let the cancellation run
        assert cancelled == [True]  # cancelled by the wrapper, not left pending for asyncio.run to clean up

    asyncio.run(call())


def test_cancelling_the_call_cancels_the_async_reward_function():
    cancelled = []
    slow = never_returning(cancelled)

    async def call():
        outer = asyncio.ensure_future(checked_reward_function(slow, "slow")(**batch()))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        await asyncio.sleep(0)
        assert cancelled == [True]  # as when TRL awaits the function itself

    asyncio.run(call())


def test_with_a_timeout_a_reward_function_runs_as_without_one():
    modes = []

    def tracker(completions, **kwargs):
        modes.append(torch.is_grad_enabled())
        return [float(len(c)) for c in completions]

    def failing(completions, **kwargs):
        raise KeyError("missing")

    wrapped = checked_reward_function(tracker, "tracker", timeout=30)
    with torch.no_grad():
        assert wrapped(**batch()) == [1.0] * 4
    assert wrapped(**batch()) == [1.0] * 4
    assert modes == [False, True]  # the caller's grad mode
    with pytest.raises(RuntimeError, match="Reward function `failing` raised KeyError: 'missing' on a batch of 4"):
        checked_reward_function(failing, "failing", timeout=30)(**batch())


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), "10"])
def test_a_timeout_must_be_a_positive_number_of_seconds(timeout):
    with pytest.raises(ValueError, match=r"`rpg_reward_timeout`=.* must be a number of seconds > 0, or None"):
        checked_reward_function(length_reward, "length_reward", timeout=timeout)


def test_the_timeout_is_off_by_default_and_a_config_field():
    assert RPGConfig.__dataclass_fields__["rpg_reward_timeout"].default is None
    assert "TimeoutError" in RPGConfig.__dataclass_fields__["rpg_reward_timeout"].metadata["help"]


# --- chat roles ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["ipython", "function", "observation", "critic"])
def test_any_role_name_passes_the_data_set_check(role):
    """Llama 3.1's tool results have the role 'ipython' (today: "role 'ipython' is not one of [...]"); which roles
    exist is the chat template's business."""
    validate_train_dataset(Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1"},
                                                          {"role": role, "content": "2"}]}]))


def test_roles_the_chat_template_accepts_train(tmp_path, model_path):
    prompts = [[{"role": "user", "content": f"{i}+1"}, {"role": "ipython", "content": "2"}] for i in range(16)]
    dataset = Dataset.from_dict({"prompt": prompts})
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1))
    RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=dataset).train()


def test_a_role_the_chat_template_refuses_is_named_with_its_row():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                               "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}{{ m['content'] }}"
                               "{% endfor %}")
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 2
                                 + [[{"role": "ipython", "content": "2"}]]})
    with pytest.raises(ValueError, match=r"`train_dataset` row 2: the chat template refuses the prompt .*Unknown "
                                         r"role: ipython"):
        validate_tokenized_prompts(dataset, tokenizer)


@pytest.mark.parametrize("role", [None, 3, ""])
def test_a_role_that_is_not_a_name_is_refused(role):
    with pytest.raises(ValueError, match="row 0, message 0: the role must be a non-empty string"):
        validate_train_dataset(Dataset.from_list([{"prompt": [{"role": role, "content": "1+1"}]}]))


# --- the unscored-batch warning ------------------------------------------------------------------------------------


def test_the_first_unscored_batch_is_reported_once_whenever_it_comes():
    nan, scored = torch.full((4,), float("nan")), torch.ones(4)
    tally = ScoringTally()
    reports = [tally.add([scored]), tally.add([nan]), tally.add([nan, nan]), tally.add([nan, scored])]
    assert reports == [False, True, False, False]  # batch 1 scored, batch 2 the first unscored: one report
    assert (tally.batches, tally.scored) == (4, 2)
