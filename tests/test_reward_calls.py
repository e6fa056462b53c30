"""Reward calls beyond one assistant turn and no environment: a completion of several assistant messages (TRL's
multi-turn tool calling) is graded on the last one; `environments` (TRL 1.16 passes the batch's environment
instances to every reward function as `environments=`, and its own `get_reward` reward reads them) reach the
function as the trainer's own objects, never copied; and a reward call that timed out leaves a worker thread that
does not keep the process alive."""

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trl_rpg.rewards import completion_to_text, math_reward
from trl_rpg.run.reward_calls import checked_reward_function

ROOT = Path(__file__).resolve().parents[1]


# --- several assistant messages ------------------------------------------------------------------------------------


def tool_calling_completion(first_answer: str, final_answer: str) -> list[dict]:
    """A completion as TRL returns one after a tool call: assistant (calling the tool), tool, assistant."""
    return [
        {"role": "assistant", "content": f"Guess: Answer: {first_answer}. Let me check.",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expr": "2+3"}}}]},
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "assistant", "content": f"The calculator says 5.\nAnswer: {final_answer}"},
    ]


def test_a_completion_of_several_assistant_messages_is_graded_on_the_last():
    completions = [tool_calling_completion("4", "5"), tool_calling_completion("5", "4")]
    assert completion_to_text(completions[0]).endswith("Answer: 5")
    assert math_reward(completions, ground_truth=["5", "5"]) == [1.0, 0.0]  # the final answer counts, not the guess


# --- environments --------------------------------------------------------------------------------------------------


class Environment:
    """A stateful environment holding what cannot be copied (a lock, as a connection or a sandbox would)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rewarded = 0

    def get_reward(self):
        self.rewarded += 1
        return float(self.rewarded)


def trl_call(environments) -> dict:
    """The keyword arguments TRL 1.16's `_calculate_rewards` passes when the trainer has environments."""
    return dict(prompts=["2+3="] * 2, completions=["5", "6"], completion_ids=[[7], [8]], trainer_state=object(),
                log_extra=print, log_metric=print, environments=environments)


def get_reward(environments, **kwargs):
    """TRL's reward for an environment that defines `get_reward` (one value per rollout, from its environment)."""
    return [e.get_reward() for e in environments]


async def async_get_reward(environments, **kwargs):
    return get_reward(environments)


@pytest.mark.parametrize("func,timeout", [(get_reward, None), (get_reward, 30.0), (async_get_reward, None)],
                         ids=["sync", "sync_with_timeout", "async"])
def test_reward_functions_get_the_trainers_environments_themselves(func, timeout):
    environments = [Environment(), Environment()]
    wrapped = checked_reward_function(func, "environment_reward", timeout=timeout)
    for call in (1, 2):
        kwargs = trl_call(environments)
        rewards = asyncio.run(wrapped(**kwargs)) if func is async_get_reward else wrapped(**kwargs)
        assert rewards == [float(call)] * 2  # each call sees the state the previous call left
        assert kwargs["environments"] is environments
    assert [e.rewarded for e in environments] == [2, 2]  # the trainer's environments were rewarded, not copies


# --- a timed-out call's worker thread ------------------------------------------------------------------------------

TIMED_OUT_CALL = r"""
import threading
from trl_rpg.run.reward_calls import checked_reward_function

def never_returns(completions, **kwargs):
    threading.Event().wait()

try:
    checked_reward_function(never_returns, "never_returns", timeout=0.2)(completions=["a"], prompts=["p"])
except TimeoutError as error:
    print("raised:", error, flush=True)
"""


def test_a_timed_out_reward_call_does_not_keep_the_process_alive():
    """The worker thread of a call that never returns is still running when the script ends: the process must exit
    (a non-daemon thread would keep it waiting forever)."""
    try:
        proc = subprocess.run([sys.executable, "-c", TIMED_OUT_CALL], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the process did not exit after the TimeoutError: {hung.stdout!r}")
    assert proc.returncode == 0, proc.stderr
    assert "raised: Reward function `never_returns` did not return within 0.2 s" in proc.stdout
