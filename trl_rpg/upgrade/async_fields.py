"""Every `AsyncGRPOConfig` field and what it means under `AsyncRPGTrainer`: the reviewed field table of the
asynchronous trainer (as `grpo_fields` is the synchronous one's). `AsyncRPGConfig`'s help reads it; the upgrade guard
(`async_guard.check_async`) refuses a TRL whose config has a field not listed here.
"""

from __future__ import annotations

from . import grpo_fields

#: Why the asynchronous trainer's reference is the sampler only (the config's help and the error say it).
REFERENCE_REASON = (
    "the asynchronous trainer makes one forward pass per micro-batch, the policy's, and its rollout worker sends "
    "the sampler's own log-probs with every sample, so the sampler of each sample is the one reference that costs "
    "nothing (rho = 1, the paper's setting; w = pi_theta/mu is exact at any staleness). A fixed or periodically "
    "updated reference ('initial', 'periodic', 'adaptive') needs its log-probs on every token: a second forward "
    "pass per micro-batch and a copy of the weights, which TRL's asynchronous trainer does not have; RPGTrainer "
    "offers them"
)


def _same(reason: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, reason)


#: Every `AsyncGRPOConfig` field (TRL 1.16) and what it means under `AsyncRPGTrainer`: the upgrade guard refuses to
#: build the trainer on a TRL whose config has a field not listed here (`async_upgrade_guard.check_async`).
ASYNC_FIELDS: dict[str, str] = {
    **_same("transformers' TrainingArguments field, read as transformers and TRL read it",
            *grpo_fields._TRAINING_ARGUMENTS),
    **_same("transformers' TrainingArguments field, checked as RPGConfig checks it (a setting that writes NaN or inf "
            "into the parameters, or trains no step, is refused)", "learning_rate", "weight_decay", "adam_beta1",
            "adam_beta2", "adam_epsilon", "max_grad_norm", "max_steps", "num_train_epochs",
            "per_device_train_batch_size", "gradient_accumulation_steps"),
    **_same("transformers' TrainingArguments field, read as transformers and TRL read it (RPGTrainer's bounded "
            "reward wait is not in AsyncRPGTrainer: docs/asynchronous.md)", "ddp_timeout"),
    **_same("transformers' TrainingArguments field, read as transformers and TRL read it; each upload's result is "
            "read, a failed one ends train() in HubUploadError (hub_uploads, as in RPGTrainer)", "push_to_hub",
            "hub_strategy"),
    **_same("as in AsyncGRPO", "model_init_kwargs", "dtype", "trust_remote_code", "chat_template_kwargs",
            "vllm_server_base_url", "log_completions"),
    **_same("as in AsyncGRPO; a value that cannot train is refused when the config is built, naming the field and "
            "what is allowed (async_checks)", "router_aux_loss_coef", "num_generations", "max_completion_length",
            "temperature", "repetition_penalty", "max_tool_calling_iterations", "fork_threshold_tokens",
            "vllm_server_timeout", "request_timeout", "weight_sync_timeout", "token_budget", "max_inflight_tasks",
            "max_staleness", "queue_maxsize", "weight_sync_steps", "heartbeat_stale_after_s",
            "num_completions_to_print"),
    **_same("as in AsyncGRPO, its range checked (async_checks); a truncated sampler never proposes the tokens it "
            "cuts, which no importance weight corrects (docs/math.md section 4c)", "top_p", "top_k", "min_p"),
    "epsilon": "the lower width of RPG-Style Clip (0.2, as in AsyncGRPO)",
    "epsilon_high": "0.28, the paper's clip-higher, when neither width is set (AsyncGRPO: `epsilon`); setting only "
                    "`epsilon` gives AsyncGRPO's symmetric region",
}


__all__ = ["ASYNC_FIELDS", "REFERENCE_REASON"]
