"""`AsyncRPGConfig` refuses every value of TRL's own asynchronous fields and of the optimizer settings that cannot
train, when it is built (before any model loads), naming the field and what is allowed
(`trl_rpg.trainers.async_checks`);
good values, TRL's defaults and the edges of each range are accepted."""

import math

import pytest
from trl.experimental.async_grpo import AsyncGRPOConfig

from trl_rpg.trainers.async_config import AsyncRPGConfig, as_async_rpg_config

BASE = dict(output_dir="/tmp/trl-rpg-async-checks-test", use_cpu=True, report_to="none")
NAN, INF = math.nan, math.inf

BAD = [  # (field, bad value, words the message must hold besides the field)
    ("max_steps", 0, "integer >= 1, or -1"),
    ("max_steps", 2.5, "integer >= 1, or -1"),
    ("num_train_epochs", 0, "finite number > 0"),
    ("num_train_epochs", NAN, "finite number > 0"),
    ("per_device_train_batch_size", 0, "integer >= 1"),
    ("gradient_accumulation_steps", 0, "integer >= 1"),
    ("temperature", 0.0, "finite number > 0"),
    ("temperature", NAN, "finite number > 0"),
    ("temperature", -1.0, "finite number > 0"),
    ("temperature", INF, "finite number > 0"),
    ("num_generations", 0, "integer >= 2"),
    ("num_generations", 1, "group of one is NaN"),
    ("num_generations", -2, "integer >= 2"),
    ("max_completion_length", 0, "integer >= 1"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("top_p", NAN, "(0, 1]"),
    ("top_k", -5, "0 or -1 for off"),
    ("top_k", 2.5, "integer >= 1"),
    ("min_p", -0.1, "[0, 1]"),
    ("min_p", 1.5, "[0, 1]"),
    ("min_p", NAN, "[0, 1]"),
    ("repetition_penalty", 0.0, "finite number > 0"),
    ("repetition_penalty", NAN, "finite number > 0"),
    ("router_aux_loss_coef", -1.0, "finite number >= 0"),
    ("router_aux_loss_coef", NAN, "finite number >= 0"),
    ("weight_sync_steps", 0, "integer >= 1"),
    ("max_staleness", -1, "waits for ever"),
    ("max_staleness", NAN, "integer >= 0"),
    ("max_staleness", 1.5, "integer >= 0"),
    ("max_inflight_tasks", 0, "no request is ever sent"),
    ("max_inflight_tasks", -2, "-1 (auto"),
    ("queue_maxsize", -1, "integer >= 0"),
    ("token_budget", 1.5, "integer"),
    ("fork_threshold_tokens", -1, "integer >= 0"),
    ("max_tool_calling_iterations", -1, "integer >= 0"),
    ("num_completions_to_print", -1, "integer >= 0"),
    ("vllm_server_timeout", -1.0, "finite number of seconds > 0"),
    ("vllm_server_timeout", NAN, "finite number of seconds > 0"),
    ("request_timeout", 0, "finite number of seconds > 0"),
    ("request_timeout", -5, "finite number of seconds > 0"),
    ("weight_sync_timeout", NAN, "finite number of seconds > 0"),
    ("weight_sync_timeout", INF, "waits for ever"),
    ("heartbeat_stale_after_s", NAN, "never seen"),
    ("heartbeat_stale_after_s", -1.0, "finite number of seconds > 0"),
    ("rpg_hub_upload_timeout", NAN, "finite number of seconds > 0, or None"),
    ("learning_rate", NAN, "finite number >= 0"),  # the optimizer settings, as RPGConfig refuses them
    ("weight_decay", -0.1, "finite number >= 0"),
    ("adam_epsilon", 0.0, "0 / 0 = NaN"),
    ("adam_beta2", 1.0, "[0, 1)"),
    ("max_grad_norm", NAN, "number >= 0"),
]


def overrides(field, value) -> dict:
    extra = {"max_steps": -1} if field == "num_train_epochs" else {}  # the epochs decide only without max_steps
    return {**BASE, **extra, field: value}


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_a_value_that_cannot_train_is_refused_naming_the_field(field, value, words):
    with pytest.raises(ValueError) as error:
        AsyncRPGConfig(**overrides(field, value))
    message = str(error.value)
    assert message.startswith(f"AsyncRPGConfig: `{field}`={value!r} is not allowed; "), message
    assert words in message, message


UPGRADED = [(f, v) for f, v, _ in BAD if (f, str(v)) in {("max_steps", "0"), ("temperature", "0.0"), (
    "temperature", "nan"), ("max_staleness", "-1"), ("heartbeat_stale_after_s", "nan"), ("top_k", "-5")}]


@pytest.mark.parametrize("field,value", UPGRADED, ids=[f"{f}={v!r}" for f, v in UPGRADED])
def test_an_async_grpo_config_with_such_a_value_is_refused_when_upgraded(field, value):
    """TRL's own config accepts it; the upgrade (what `AsyncRPGTrainer(args=AsyncGRPOConfig(...))` does first)
    refuses it, and so does an `AsyncRPGConfig` changed after it was built."""
    assert len(UPGRADED) == 6
    trl_args = AsyncGRPOConfig(**overrides(field, value))
    with pytest.raises(ValueError, match=f"AsyncRPGConfig: `{field}`="):
        as_async_rpg_config(trl_args, "model")
    args = AsyncRPGConfig(**BASE)
    setattr(args, field, value)
    with pytest.raises(ValueError, match=f"AsyncRPGConfig: `{field}`="):
        as_async_rpg_config(args, "model")


GOOD = [  # TRL's defaults are in every config built here; these are the edges and the "off" values
    dict(max_steps=1), dict(max_steps=-1, num_train_epochs=0.5), dict(temperature=1e-3), dict(num_generations=2),
    dict(max_completion_length=1), dict(top_p=1.0), dict(top_p=1e-6), dict(top_k=0), dict(top_k=-1), dict(top_k=1),
    dict(min_p=0.0), dict(min_p=1.0), dict(min_p=None), dict(repetition_penalty=1.3), dict(router_aux_loss_coef=0.0),
    dict(router_aux_loss_coef=None), dict(weight_sync_steps=3), dict(max_staleness=0), dict(max_inflight_tasks=-1),
    dict(max_inflight_tasks=1), dict(queue_maxsize=0), dict(token_budget=None), dict(token_budget=-1),
    dict(token_budget=4096), dict(fork_threshold_tokens=0), dict(max_tool_calling_iterations=0),
    dict(num_completions_to_print=0), dict(vllm_server_timeout=0.5), dict(request_timeout=1),
    dict(heartbeat_stale_after_s=1e-3), dict(weight_sync_timeout=10**6),
    dict(rpg_hub_upload_timeout=None), dict(rpg_hub_upload_timeout=1.5),
]


@pytest.mark.parametrize("values", GOOD, ids=[",".join(f"{k}={v!r}" for k, v in g.items()) for g in GOOD])
def test_good_values_are_accepted(values):
    args = AsyncRPGConfig(**BASE, **values)
    assert all(getattr(args, k) == v for k, v in values.items())


def test_trls_defaults_are_accepted():
    defaults = AsyncGRPOConfig(**BASE)
    assert as_async_rpg_config(defaults, "model").max_staleness == defaults.max_staleness


@pytest.mark.parametrize("field,value", [("max_staleness", -1), ("heartbeat_stale_after_s", NAN)])
def test_the_trainer_refuses_before_any_model_loads(field, value):
    """A model path that does not exist: the refusal comes first, naming the field (not a failed model load)."""
    pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client
    from trl_rpg import AsyncRPGTrainer

    for args in (AsyncGRPOConfig(**BASE, **{field: value}), AsyncRPGConfig(**BASE)):
        setattr(args, field, value)
        with pytest.raises(ValueError, match=f"AsyncRPGConfig: `{field}`="):
            AsyncRPGTrainer("no-such-model-folder", args=args)
