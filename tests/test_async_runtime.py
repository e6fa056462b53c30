"""AsyncRPGTrainer where it cannot run (issue 47): without a CUDA GPU, and without an injected rollout worker inside
the CPU stand-ins, it is refused in one line naming what it needs and `trl-rpg demo --async`, before anything loads
(it was TRL's raw `AssertionError: Torch not compiled with CUDA enabled`, after the model had loaded)."""

import inspect

import pytest
import torch

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client

from trl.experimental.async_grpo import AsyncGRPOTrainer  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg.toy import VarlenAttention, async_trainer_on_cpu  # noqa: E402
from trl_rpg.trainers.async_runtime import AsyncRuntimeMissing, rollout_worker_argument  # noqa: E402
from trl_rpg.upgrade import async_guard as async_upgrade_guard


class Reached(Exception):
    """TRL's constructor was reached: the check let the trainer through."""


@pytest.fixture
def no_cuda(monkeypatch):
    def reached(self, *args, **kwargs):
        raise Reached

    monkeypatch.setattr(AsyncGRPOTrainer, "__init__", reached)
    monkeypatch.setattr(async_upgrade_guard, "check_async", lambda: [])  # it reviews TRL's real __init__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _args(tmp_path):
    return AsyncRPGConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


def test_without_cuda_or_a_worker_the_trainer_is_refused_in_one_line_before_loading(no_cuda, tmp_path):
    with pytest.raises(AsyncRuntimeMissing) as error:
        AsyncRPGTrainer("Qwen/Qwen3-0.6B", args=_args(tmp_path))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("AsyncRPGTrainer needs a CUDA GPU and a vLLM server")
    assert "injected rollout worker" in message and "`trl-rpg demo --async`" in message


def test_an_injected_worker_without_cuda_needs_the_cpu_stand_ins(no_cuda, tmp_path):
    worker = object()
    with pytest.raises(AsyncRuntimeMissing, match=r"inside `with trl_rpg\.toy\.async_trainer_on_cpu\("):
        AsyncRPGTrainer("m", args=_args(tmp_path), rollout_worker=worker, weight_transfer=worker)
    with async_trainer_on_cpu(VarlenAttention), pytest.raises(Reached):
        AsyncRPGTrainer("m", args=_args(tmp_path), rollout_worker=worker, weight_transfer=worker)


def test_with_cuda_the_trainer_goes_on_to_trls(no_cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Reached):
        AsyncRPGTrainer("m", args=_args(tmp_path))


def test_the_rollout_worker_is_found_where_trl_takes_it():
    parameters = list(inspect.signature(AsyncGRPOTrainer.__init__).parameters)
    position = parameters.index("rollout_worker") - 4  # after self, model, reward_funcs, args
    positional = tuple(f"p{i}" for i in range(position)) + ("worker",)
    assert rollout_worker_argument(positional, {}) == "worker"
    assert rollout_worker_argument(positional[:-1], {}) is None
    assert rollout_worker_argument((), {"rollout_worker": "w"}) == "w"
