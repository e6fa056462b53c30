"""Silent damage refused (issue 35, sections 1 and 2): optimizer settings that write NaN or inf into the parameters,
a run whose parameters the optimizer made non-finite, `max_steps=0`, a reward function's `SystemExit` or its own
`KeyboardInterrupt`, and batch layouts whose description never finished computing."""

import asyncio
import math
import os
import signal
import sys
import textwrap
import time
from contextlib import contextmanager

import pandas as pd
import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from transformers import TrainerControl
from trl import GRPOConfig

from trl_rpg import RPGConfig, RPGTrainer, cli
from trl_rpg.run import checkpoint
from trl_rpg.run.parameter_guard import (
    CHECK_EVERY,
    NonFiniteParameters,
    ParameterGuard,
    check_due,
    first_non_finite,
    maybe_non_finite,
)
from trl_rpg.run.reward_calls import checked_reward_function
from trl_rpg.trainers.describe import batch_layout, describe_objective, off_policy_micro_batches


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@contextmanager
def hang_guard(seconds=120):
    """Fail, instead of hanging, if the block runs past `seconds` (a generous bound: what it guards is instant)."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------------------------------------------
# Optimizer settings and max_steps
# ----------------------------------------------------------------------------------------------------------------

OPTIMIZER_CASES = [
    (dict(learning_rate=math.inf), "learning_rate", "finite number >= 0"),
    (dict(learning_rate=math.nan), "learning_rate", "finite number >= 0"),
    (dict(learning_rate=-1e-3), "learning_rate", "finite number >= 0"),
    (dict(weight_decay=math.nan), "weight_decay", "finite number >= 0"),
    (dict(adam_epsilon=0.0), "adam_epsilon", "0 / 0 = NaN"),
    (dict(adam_epsilon=1e-300), "adam_epsilon", "smallest normal"),
    (dict(adam_epsilon=math.inf), "adam_epsilon", "finite number"),
    (dict(adam_beta2=1.0), "adam_beta2", "[0, 1)"),
    (dict(max_grad_norm=math.nan), "max_grad_norm", "turns clipping and the non-finite-gradient guard off"),
    (dict(max_steps=0), "max_steps", "-1 (train num_train_epochs epochs)"),
]


@pytest.mark.parametrize("overrides,field,allowed", OPTIMIZER_CASES, ids=[c[1] + ":" + repr(c[0]) for c in
                                                                        OPTIMIZER_CASES])
def test_settings_that_damage_the_model_are_refused_naming_the_field(tmp_path, overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        RPGConfig(**cpu_args(tmp_path, **overrides))
    assert f"RPGConfig: `{field}`=" in str(error.value) and allowed in str(error.value)


def test_settings_are_checked_again_when_the_trainer_is_built(tmp_path):
    """An upgraded GRPOConfig, and a field changed after the config was built, are refused before any model loads
    (the model path does not exist)."""
    with pytest.raises(ValueError, match="`learning_rate`=inf"):
        RPGTrainer(model="never-loaded", reward_funcs=digit_reward, train_dataset=tiny_dataset(),
                    args=GRPOConfig(**cpu_args(tmp_path, learning_rate=math.inf)))
    args = RPGConfig(**cpu_args(tmp_path))
    args.adam_epsilon = 0.0
    with pytest.raises(ValueError, match="`adam_epsilon`=0.0"):
        RPGTrainer(model="never-loaded", reward_funcs=digit_reward, train_dataset=tiny_dataset(), args=args)
    # what stays allowed: no Adam, no adam_epsilon to check; no clipping; a learning rate of 0; max_steps -1
    RPGConfig(**cpu_args(tmp_path, optim="sgd", adam_epsilon=0.0, max_grad_norm=0.0, learning_rate=0.0))
    RPGConfig(**cpu_args(tmp_path, max_steps=-1, max_grad_norm=math.inf))


def test_trl_rpg_train_refuses_them_with_one_error_line(capsys, monkeypatch):
    from accelerate.commands import launch

    from trl_rpg.cli import launcher

    launched = []
    monkeypatch.setattr(launch, "launch_command", launched.append)
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: launched.append(argv) or 0)
    for flag, value in (("--learning_rate", "inf"), ("--max_steps", "0"), ("--adam_epsilon", "0")):
        status = cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16",
                           "False", flag, value])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert status == 2 and not launched
        assert lines[-1].startswith("trl-rpg train: error: ") and f"`{flag[2:]}`=" in lines[-1], lines[-3:]


# ----------------------------------------------------------------------------------------------------------------
# Non-finite parameters after an optimizer step
# ----------------------------------------------------------------------------------------------------------------


class EpsilonZeroAtStep2(torch.optim.AdamW):
    """AdamW whose second step has eps=0 (what `adam_epsilon=0` does from the first): 0 / 0 = NaN in every parameter
    entry whose gradient has been 0 (the embeddings of tokens not seen), from a finite gradient."""

    def __init__(self, params):
        super().__init__(params, lr=1e-2)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        for group in self.param_groups:
            group["eps"] = 0.0 if self.steps == 2 else 1e-8
        return super().step(closure)


def test_a_run_whose_optimizer_writes_non_finite_parameters_stops_before_saving_them(model_path, tmp_path):
    """The step-2 parameters hold NaN: the run raises at step 2, naming a parameter; checkpoint-1 is complete,
    nothing of step 2 is written, no final model, and rotation (save_total_limit=1) kept checkpoint-1."""
    out = tmp_path / "run"
    args = RPGConfig(**cpu_args(out, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1,
                                steps_per_generation=2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.optimizer = EpsilonZeroAtStep2(trainer.model.parameters())
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 2 `model\.[\w.]+` is not finite"):
        trainer.train()
    assert sorted(p for p in os.listdir(out) if not p.startswith(".")) == ["README.md", "checkpoint-1"]  # the card
    assert checkpoint.is_complete(str(out / "checkpoint-1"))
    assert not (out / "model.safetensors").exists()


def test_first_non_finite_names_the_parameter():
    named = [("a", torch.ones(3)), ("empty", torch.ones(0)), ("b", torch.tensor([1.0, math.nan])),
             ("c", torch.tensor([math.inf]))]
    assert first_non_finite(named) == "b"
    assert first_non_finite(named[:2]) is None
    assert first_non_finite([("big", torch.tensor([3e38, -3e38]))]) is None  # large but finite


def test_the_fused_check_flags_nan_and_inf_and_nothing_finite():
    """`maybe_non_finite`: 1 when some element is NaN, inf or -inf (also in bfloat16), 0 for finite tensors."""
    assert maybe_non_finite([torch.ones(3), torch.ones(0)]).item() == 0
    assert maybe_non_finite([torch.ones(0)]).item() == 0
    for bad in (math.nan, math.inf, -math.inf):
        assert maybe_non_finite([torch.ones(3), torch.tensor([1.0, bad])]).item() == 1, bad
        assert maybe_non_finite([torch.tensor([bad], dtype=torch.bfloat16)]).item() == 1, bad


def guard_call(guard, model, step=3, max_steps=3, save=False):
    """The guard after optimizer step `step` of `max_steps` (the last one by default: always checked)."""
    state = type("State", (), {"global_step": step, "max_steps": max_steps})()
    return guard.on_step_end(guard_args(), state, TrainerControl(should_save=save), model=model)


def guard_args():
    args = RPGConfig.__new__(RPGConfig)
    args.learning_rate, args.weight_decay, args.adam_epsilon, args.optim = 1e-3, 0.0, 1e-8, "adamw_torch"
    return args


def test_the_parameters_are_checked_before_every_save_at_the_end_after_a_skipped_step_and_every_k_steps():
    """`check_due`: a step that saves, the last step, a stop, a step after the gradient guard skipped one, every
    `every`-th step; no other."""
    quiet = TrainerControl()
    assert [s for s in range(1, 30) if check_due(s, quiet, 100, False, every=10)] == [10, 20]
    assert check_due(3, TrainerControl(should_save=True), 100, False)
    assert check_due(3, TrainerControl(should_training_stop=True), 100, False)
    assert check_due(100, quiet, 100, False) and check_due(3, quiet, 100, True)
    assert CHECK_EVERY == 10


def test_a_nan_the_loss_does_not_reach_is_found_at_the_next_due_check_and_a_skipped_step_checks_at_once():
    """A NaN written after step 4 of 100 (no save, no skipped step): steps 5-9 go on, step 10 stops naming it and the
    last good check. A gradient-guard skip makes the very next step's check due; the end of training checks a step
    `on_step_end` did not."""
    model, flags, skipped = torch.nn.Linear(2, 2), [], [0]
    guard = ParameterGuard(reduce=lambda flag: flags.append(flag.item()) or flag, skipped_steps=lambda: skipped[0])
    for step in range(1, 5):
        guard_call(guard, model, step=step, max_steps=100)
    assert flags == []  # nothing due yet: no collective either
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    for step in range(5, 10):
        guard_call(guard, model, step=step, max_steps=100)
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 10 `weight` is not finite \(NaN or inf; no "
                                                  r"earlier check\)"):
        guard_call(guard, model, step=10, max_steps=100)
    model, skipped = torch.nn.Linear(2, 2), [0]
    guard = ParameterGuard(reduce=lambda flag: flag, skipped_steps=lambda: skipped[0])
    guard_call(guard, model, step=10, max_steps=100)  # checked: finite
    with torch.no_grad():
        model.bias[1] = math.inf
    guard_call(guard, model, step=11, max_steps=100)  # not due
    skipped[0] = 1
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 12 `bias` is not finite \(NaN or inf; the "
                                                  r"last check found every parameter finite after step 10\)"):
        guard_call(guard, model, step=12, max_steps=100)
    guard = ParameterGuard(reduce=lambda flag: flag)
    state = type("State", (), {"global_step": 13, "max_steps": 100})()
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 13 `bias`"):
        guard.on_train_end(guard_args(), state, TrainerControl(), model=model)


def test_the_parameter_guard_costs_one_collective_and_an_overflowing_norm_does_not_stop_the_run():
    """A finite step: one collective (the fused check's flag). Parameters of 3e38 overflow the fused norm: the exact
    check (a second collective) finds every element finite and the run goes on; an inf then stops it, naming it."""
    model, flags = torch.nn.Linear(2, 2), []
    guard = ParameterGuard(reduce=lambda flag: flags.append(flag.item()) or flag)
    guard_call(guard, model)
    assert flags == [0.0]
    with torch.no_grad():
        model.weight.fill_(3e38)
    guard_call(guard, model)
    assert flags == [0.0, 1.0, 0.0]
    with torch.no_grad():
        model.weight[1, 0] = math.inf
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 3 `weight` is not finite"):
        guard_call(guard, model)


# ----------------------------------------------------------------------------------------------------------------
# A reward function's SystemExit and KeyboardInterrupt
# ----------------------------------------------------------------------------------------------------------------


def _call(raised, timeout=None):
    def reward(completions, **kwargs):
        raise raised

    return checked_reward_function(reward, "exits", timeout=timeout)(prompts=["p"], completions=["c"])


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["in the caller's thread", "in a worker thread"])
@pytest.mark.parametrize("raised,says", [
    (SystemExit(0), "raised SystemExit(0) on a batch of 1 completions (sys.exit(0))"),
    (SystemExit(3), "exit status 3 and nothing saved"),
    (SystemExit("no GPU"), "SystemExit('no GPU')"),
    (KeyboardInterrupt(), "raised KeyboardInterrupt itself on a batch of 1 completions; no interrupt signal"),
])
def test_a_reward_functions_exit_is_an_error_naming_it(raised, says, timeout):
    with pytest.raises(RuntimeError, match="Reward function `exits` raised") as error:
        _call(raised, timeout)
    assert says in str(error.value)


@pytest.mark.parametrize("raised", [SystemExit(0), KeyboardInterrupt()])
def test_an_async_reward_functions_exit_is_an_error_naming_it(raised):
    async def reward(completions, **kwargs):
        raise raised

    wrapped = checked_reward_function(reward, "exits")
    with pytest.raises(RuntimeError, match=f"Reward function `exits` raised {type(raised).__name__}"):
        asyncio.run(wrapped(prompts=["p"], completions=["c"]))


def test_a_ctrl_c_during_a_reward_call_stays_a_ctrl_c():
    def reward(completions, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # a real interrupt signal, as Ctrl-C sends
        time.sleep(30)  # interrupted by it
        return [1.0]

    # Python's own Ctrl-C handler, as in a program started from a terminal (a pytest-xdist worker ignores SIGINT)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            checked_reward_function(reward, "slow")(prompts=["p"], completions=["c"])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored
    finally:
        signal.signal(signal.SIGINT, outer)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A module `exit_rewards` on sys.path: `exits_at_import` calls sys.exit(0) when imported; `reward` raises
    SystemExit(3) when called."""
    (tmp_path / "exit_rewards_at_import.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "exit_rewards.py").write_text(textwrap.dedent("""
        def reward(completions, **kwargs):
            raise SystemExit(3)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("exit_rewards", "exit_rewards_at_import"):
        sys.modules.pop(name, None)


def test_trl_rpg_train_a_reward_module_exiting_at_import_is_refused_naming_it(reward_module, capsys):
    status = cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16",
                       "False", "--reward_funcs", "exit_rewards_at_import.reward"])
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert status == 2
    assert last.startswith("trl-rpg train: error: --reward_funcs 'exit_rewards_at_import.reward': module "
                           "'exit_rewards_at_import' exited while it was imported (SystemExit(0))"), last


def test_trl_rpg_train_a_reward_raising_system_exit_fails_naming_it(reward_module, model_path, capsys):
    """Trained in this process, as `trl-rpg train` trains one process: status 1, not 3 (or 0 for SystemExit(0)),
    the last line names the function and the exit."""
    data = reward_module / "train.parquet"
    pd.DataFrame({"prompt": [f"{i}+1" for i in range(16)]}).to_parquet(data)
    status = cli.main(["train", "--model_name_or_path", model_path, "--dataset_name", str(data), "--output_dir",
                       str(reward_module / "out"), "--max_steps", "1", "--per_device_train_batch_size", "8",
                       "--num_generations", "4", "--rpg_generation_reuse", "1", "--max_completion_length", "4",
                       "--report_to", "none", "--save_strategy", "no", "--use_cpu", "True", "--bf16", "False",
                       "--reward_funcs", "exit_rewards.reward"])
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert status == 1
    assert "error: RuntimeError: Reward function `reward` raised SystemExit(3)" in last, last
    assert "exit_rewards.py:3, in reward" in last


# ----------------------------------------------------------------------------------------------------------------
# Batch layouts: answered at once, whatever the sizes
# ----------------------------------------------------------------------------------------------------------------


def test_the_off_policy_count_in_closed_form_is_the_counted_one():
    for generate_every in range(1, 25):
        for accumulation in range(1, 25):
            period = math.lcm(generate_every, accumulation)
            counted = sum(i // accumulation != (i - i % generate_every) // accumulation for i in range(period))
            assert off_policy_micro_batches(generate_every, accumulation) == counted, (generate_every, accumulation)


def test_huge_layouts_are_described_at_once(tmp_path):
    """`rpg_generation_reuse=10**9` took 203 s; co-prime 100003 / 99991 never finished; a generation batch of 10**9
    completions that does not hold whole groups of 3 looped over 10**9 candidate divisors."""
    with hang_guard():
        args = RPGConfig(**cpu_args(tmp_path, rpg_generation_reuse=10**9))
        assert batch_layout(args).off_policy == 10**9 - 1
        args = RPGConfig(**cpu_args(tmp_path, steps_per_generation=100003, gradient_accumulation_steps=99991,
                                    per_device_train_batch_size=4))
        assert "5000249937 of every 9999399973 micro-batches off-policy" in describe_objective(args)
        with pytest.raises(ValueError, match=r"num_generations to a divisor of 1000000000 \(2, 4, 5, 8, 10, 16\)"):
            RPGConfig(**cpu_args(tmp_path, rpg_generation_reuse=10**9, per_device_train_batch_size=1,
                                 num_generations=3))
