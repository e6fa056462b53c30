"""The values of TRL's own asynchronous fields (`AsyncGRPOConfig`, TRL 1.16) that cannot train, refused when an
`AsyncRPGConfig` is built, before any model is loaded: each check raises a `ValueError` naming the config, the field,
the value and what is allowed (`objective_config.refuse`), and returns nothing when the values are good.

TRL checks none of them. What each would do, read from TRL's asynchronous trainer and rollout worker:

* `max_steps=0` trains `num_train_epochs` epochs (TRL derives the length from the epochs for any `max_steps <= 0`);
* `temperature` 0, negative or not finite: TRL's fused LM head divides the logits by it (inf/NaN log-probs);
* `num_generations` 1: the group std of one reward is NaN, so is every advantage; 0 or negative: no group completes;
* `max_completion_length` 0: vLLM refuses `max_tokens=0`, so every request fails;
* `top_p`, `top_k`, `min_p`, `repetition_penalty` out of vLLM's ranges: every request fails;
* `max_staleness` negative: every sample is dropped as stale, for ever (a hang with no output); not an integer: the
  adapter count a LoRA server must hold (`max_staleness + 2`) is not a count;
* `weight_sync_steps` 0: `global_step % 0` at the first step; `max_inflight_tasks` 0: no request is ever sent;
* a timeout or `heartbeat_stale_after_s` NaN, negative or 0: NaN never compares greater (a hung worker is never
  seen); 0 or negative gives up at once (the server wait, the heartbeat) or never (aiohttp reads a request timeout
  <= 0 as none); inf waits for ever.
"""

from __future__ import annotations

import math

from ..objectives.config_fields import refuse

#: The timeouts of `AsyncGRPOConfig`, in seconds: each must be a finite number > 0.
TIMEOUT_FIELDS = ("vllm_server_timeout", "request_timeout", "weight_sync_timeout", "heartbeat_stale_after_s")


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value) -> bool:
    return _number(value) and math.isfinite(value)


def check_training_length(args, config_name: str) -> None:
    """`max_steps` an integer >= 1 or negative (-1: the epochs decide), `num_train_epochs` > 0 when the epochs decide,
    and `per_device_train_batch_size` / `gradient_accumulation_steps` integers >= 1."""
    if not _integer(args.max_steps) or args.max_steps == 0:
        refuse(config_name, "max_steps", args.max_steps,
               "it must be an integer >= 1, or -1 (train num_train_epochs epochs): with 0, AsyncGRPOTrainer derives "
               "the length from num_train_epochs as for -1, so the run trains although 0 steps were asked")
    if args.max_steps < 0 and not (_finite(args.num_train_epochs) and args.num_train_epochs > 0):
        refuse(config_name, "num_train_epochs", args.num_train_epochs,
               f"with max_steps={args.max_steps} the epochs decide the length, so it must be a finite number > 0 "
               "(or set max_steps >= 1)")
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if not _integer(getattr(args, name)) or getattr(args, name) < 1:
            refuse(config_name, name, getattr(args, name), "it must be an integer >= 1")


def check_sampling(args, config_name: str) -> None:
    """What the rollout worker asks vLLM for: `num_generations` an integer >= 2, `max_completion_length` >= 1,
    `temperature` finite > 0, `top_p` in (0, 1], `top_k` -1 or 0 (off) or >= 1, `min_p` None or in [0, 1],
    `repetition_penalty` finite > 0 (vLLM's ranges; temperature 0, greedy in vLLM, has no log-probs to train on)."""
    if not _integer(args.num_generations) or args.num_generations < 2:
        refuse(config_name, "num_generations", args.num_generations,
               "it must be an integer >= 2: the advantage is (reward - group mean) / group std, and the std of a "
               "group of one is NaN")
    if not _integer(args.max_completion_length) or args.max_completion_length < 1:
        refuse(config_name, "max_completion_length", args.max_completion_length,
               "it must be an integer >= 1 (the most tokens vLLM generates per completion)")
    if not _finite(args.temperature) or args.temperature <= 0:
        refuse(config_name, "temperature", args.temperature,
               "it must be a finite number > 0: the trainer's log-probs are log_softmax(logits / temperature), "
               "undefined at 0 (use a small temperature, e.g. 0.1, for nearly greedy sampling)")
    if not _finite(args.top_p) or not 0 < args.top_p <= 1:
        refuse(config_name, "top_p", args.top_p, "it must be a number in (0, 1] (1.0: off, every token considered)")
    if not _integer(args.top_k) or args.top_k < -1:
        refuse(config_name, "top_k", args.top_k, "it must be an integer >= 1, or 0 or -1 for off (vLLM's meaning)")
    if args.min_p is not None and (not _finite(args.min_p) or not 0 <= args.min_p <= 1):
        refuse(config_name, "min_p", args.min_p, "it must be a number in [0, 1] (0: off), or None")
    if not _finite(args.repetition_penalty) or args.repetition_penalty <= 0:
        refuse(config_name, "repetition_penalty", args.repetition_penalty,
               "it must be a finite number > 0 (1.0: off)")


def check_pipeline(args, config_name: str) -> None:
    """The rollout pipeline: `max_staleness` an integer >= 0, `weight_sync_steps` >= 1, `max_inflight_tasks` >= 1 or
    -1 (auto), `queue_maxsize` >= 0 (0: no bound), `token_budget` None or an integer (<= 0: off),
    `fork_threshold_tokens` >= 0, `max_tool_calling_iterations` and `num_completions_to_print` None or >= 0."""
    if not _integer(args.max_staleness) or args.max_staleness < 0:
        refuse(config_name, "max_staleness", args.max_staleness,
               "it must be an integer >= 0 (the most policy versions a sample may lag; 0: only samples of the "
               "current version): with a negative one every sample is dropped as stale and the run waits for ever")
    if not _integer(args.weight_sync_steps) or args.weight_sync_steps < 1:
        refuse(config_name, "weight_sync_steps", args.weight_sync_steps,
               "it must be an integer >= 1 (optimizer steps between weight syncs to the vLLM server)")
    if not _integer(args.max_inflight_tasks) or not (args.max_inflight_tasks >= 1 or args.max_inflight_tasks == -1):
        refuse(config_name, "max_inflight_tasks", args.max_inflight_tasks,
               "it must be an integer >= 1, or -1 (auto: max_staleness x samples per step); with 0 no request is "
               "ever sent")
    if not _integer(args.queue_maxsize) or args.queue_maxsize < 0:
        refuse(config_name, "queue_maxsize", args.queue_maxsize, "it must be an integer >= 0 (0: no bound)")
    if args.token_budget is not None and not _integer(args.token_budget):
        refuse(config_name, "token_budget", args.token_budget,
               "it must be an integer (<= 0: no token budgeting), or None (the vLLM server's max_model_len)")
    if not _integer(args.fork_threshold_tokens) or args.fork_threshold_tokens < 0:
        refuse(config_name, "fork_threshold_tokens", args.fork_threshold_tokens, "it must be an integer >= 0")
    for name in ("max_tool_calling_iterations", "num_completions_to_print"):
        value = getattr(args, name)
        if value is not None and (not _integer(value) or value < 0):
            refuse(config_name, name, value, "it must be an integer >= 0, or None (no limit)")


def check_timeouts(args, config_name: str) -> None:
    """Every timeout of `TIMEOUT_FIELDS` a finite number of seconds > 0; `rpg_hub_upload_timeout` too, or None."""
    hub = getattr(args, "rpg_hub_upload_timeout", None)
    if hub is not None and (not _finite(hub) or hub <= 0):
        refuse(config_name, "rpg_hub_upload_timeout", hub, "it must be a finite number of seconds > 0, or None (no "
                                                           "bound)")
    for name in TIMEOUT_FIELDS:
        value = getattr(args, name)
        if not _finite(value) or value <= 0:
            refuse(config_name, name, value,
                   "it must be a finite number of seconds > 0: NaN never times out (a hung server or worker is "
                   "never seen), 0 or a negative one gives up at once (or, for an HTTP request, never), inf waits "
                   "for ever")


def check_model_settings(args, config_name: str) -> None:
    """`router_aux_loss_coef` None (the model's own) or a finite number >= 0."""
    coef = args.router_aux_loss_coef
    if coef is not None and (not _finite(coef) or coef < 0):
        refuse(config_name, "router_aux_loss_coef", coef,
               "it must be a finite number >= 0 (0: off), or None (the model config's own coefficient)")


def check_async_fields(args, config_name: str = "AsyncRPGConfig") -> None:
    """Every check of this module, in the order of `AsyncGRPOConfig`'s fields."""
    check_training_length(args, config_name)
    check_model_settings(args, config_name)
    check_sampling(args, config_name)
    check_timeouts(args, config_name)
    check_pipeline(args, config_name)


__all__ = ["TIMEOUT_FIELDS", "check_async_fields", "check_model_settings", "check_pipeline", "check_sampling",
           "check_timeouts", "check_training_length"]
