"""Every `GRPOConfig` field and how RPG treats it: `GRPO_FIELDS` (TRL's own fields and those inherited from
`TrainingArguments`), each `accepted` / `changed default` / `refused` / `ignored` with its reason.

The README's drop-in section holds `drop_in_table()` and docs/drop-in.md `full_table()` (tests/test_upgrade_guard.py
checks both are the same text). A field a TRL release adds has no row: `upgrade_guard` then has the self-check
decide, and refuses any value of it but its default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

VERDICTS = ("accepted", "changed default", "refused", "ignored")




@dataclass(frozen=True)
class FieldRule:
    """How RPG treats one `GRPOConfig` field: `verdict` is one of `VERDICTS`; `in_readme`: an accepted field whose
    meaning under RPG a GRPO user should read (the README's table lists it with every other verdict)."""

    name: str
    verdict: str
    reason: str
    in_readme: bool = False


def _rules(verdict: str, reason: str, *names: str) -> list[FieldRule]:
    return [FieldRule(name, verdict, reason) for name in names]


_TRAINING_ARGUMENTS = (
    "output_dir", "per_device_train_batch_size", "num_train_epochs",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args",
    "optim_target_modules", "gradient_accumulation_steps",
    "average_tokens_across_devices", "label_smoothing_factor", "bf16", "fp16", "bf16_full_eval",
    "fp16_full_eval", "tf32", "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "use_liger_kernel", "liger_kernel_config", "use_cache", "neftune_noise_alpha", "torch_empty_cache_steps",
    "auto_find_batch_size", "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node",
    "logging_nan_inf_filter", "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm",
    "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "prediction_loss_only",
    "eval_on_start", "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps",
    "include_for_metrics", "batch_eval_metrics", "save_only_model", "save_strategy", "save_steps",
    "save_on_each_node", "save_total_limit", "enable_jit_checkpoint", "hub_token", "hub_private_repo",
    "hub_model_id", "hub_always_push", "hub_revision", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "ignore_data_skip", "restore_callback_states_from_checkpoint",
    "full_determinism", "seed", "data_seed", "use_cpu", "accelerator_config", "parallelism_config",
    "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order",
    "remove_unused_columns", "label_names", "train_sampling_strategy", "length_column_name",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend",
    "fsdp", "fsdp_config", "deepspeed", "debug", "skip_memory_metrics", "do_train", "do_eval",
    "do_predict", "resume_from_checkpoint", "local_rank",
)

#: Every GRPOConfig field and how RPG treats it (`accepted`: GRPO's meaning and default).
GRPO_FIELDS: dict[str, FieldRule] = {rule.name: rule for rule in [
    # ---- changed defaults (the paper's setup) ----
    FieldRule("beta", "changed default",
              "1e-4, the paper's KL coefficient (GRPO: 0.0); an upgraded GRPOConfig keeps its value"),
    FieldRule("scale_rewards", "changed default",
              "'none': advantage = reward - group mean, the paper's baseline (GRPO: 'group'); an upgraded "
              "GRPOConfig keeps its value"),
    FieldRule("epsilon_high", "changed default",
              "0.28, the paper's clip-higher, when neither `epsilon` nor `epsilon_high` is set (GRPO: `epsilon`); "
              "setting only `epsilon` gives GRPO's symmetric region; must be at least 2^-23 (float32's resolution "
              "at 1, in which the ratio is compared)"),
    FieldRule("steps_per_generation", "changed default",
              "`rpg_generation_reuse` (4) x `gradient_accumulation_steps` when neither it, `generation_batch_size` "
              "nor `num_iterations > 1` is set (GRPO: `gradient_accumulation_steps`): with the sampler as "
              "reference the KL term acts only on reused batches; an upgraded GRPOConfig keeps GRPO's layout"),
    # ---- accepted, with what they mean under RPG (listed in the README) ----
    FieldRule("loss_type", "accepted",
              "selects the aggregation of RPG's per-token loss only ('dapo', the default as in GRPO, 'bnpo', "
              "'grpo', 'dr_grpo'); 'cispo', 'sapo', 'vespo', 'luspo' (other per-token losses) are refused",
              in_readme=True),
    FieldRule("epsilon", "accepted",
              "the lower width of RPG-Style Clip (0.2, as in GRPO); must be at least 2^-23 (float32's resolution at "
              "1: with 0, or 1e-8, on-policy tokens would get no gradient)", in_readme=True),
    FieldRule("importance_sampling_level", "accepted",
              "'token' or 'sequence' (GSPO: changes the reward term's ratio only)", in_readme=True),
    FieldRule("vllm_importance_sampling_correction", "accepted",
              "with rpg_sampler_logps='recompute' the correction weighs every term of RPG's loss, the KL term "
              "included (GRPO leaves its KL uncorrected): the exact gradient needs it when the generator differs "
              "from the trained policy; with 'engine' (what 'auto' picks under vLLM with the sampler as reference, "
              "where exact) mu is the engine's own log-probs, w = pi/mu is already the exact weight, and it and the "
              "other vllm_importance_sampling_* fields have no effect", in_readme=True),
    FieldRule("top_entropy_quantile", "accepted",
              "masks the advantage (the reward term), as in GRPO; the KL term acts on every token", in_readme=True),
    FieldRule("off_policy_mask_threshold", "accepted",
              "masks the advantage (the reward term), as in GRPO; the KL term acts on every token", in_readme=True),
    *[FieldRule(name, "accepted", "must be a finite number >= 0: a non-finite one makes the optimizer write NaN or "
                "inf into every parameter at the first step (GRPO trains on and saves that model)", in_readme=True)
      for name in ("learning_rate", "weight_decay")],
    FieldRule("adam_epsilon", "accepted",
              "with an Adam optimizer, must be finite and >= 1.2e-38 (float32's smallest normal number): with 0, "
              "AdamW writes 0 / 0 = NaN into every parameter whose gradient is 0", in_readme=True),
    *_rules("accepted", "with an Adam optimizer, must be in [0, 1) (torch refuses it later, when the optimizer is "
            "built)", "adam_beta1", "adam_beta2"),
    FieldRule("max_grad_norm", "accepted",
              "None or a number >= 0: NaN or a negative one would silently turn off clipping and RPG's "
              "non-finite-gradient guard, which reads the norm clipping computes", in_readme=True),
    FieldRule("max_steps", "accepted",
              "0 is refused (transformers reads it as a limit of 0 steps yet takes one optimizer step, at learning "
              "rate 0): -1 (epochs) or >= 1", in_readme=True),
    FieldRule("ddp_timeout", "accepted",
              "also bounds one reward-function call in a run of several processes (a call still running after it "
              "ends the run naming the function), and is applied on CPU too (transformers applies it on GPU only); "
              "collectives wait ddp_timeout + 60 s", in_readme=True),
    *[FieldRule(name, "accepted", "every Hub upload's result is read (a failure warned; train() fails if the last "
                "checkpoint never reached the Hub), a checkpoint is kept until its upload is done, the last one "
                "pushed at the end, its manifest last; the final wait is bounded by rpg_hub_upload_timeout",
                in_readme=True)
      for name in ("push_to_hub", "hub_strategy")],
    # ---- refused ----
    FieldRule("sync_ref_model", "refused",
              "TRL's reference-model sync: use rpg_reference='periodic' with rpg_reference_update_steps (works with "
              "PEFT and ZeRO-3 too)"),
    FieldRule("delta", "refused", "GRPO's two-sided clipping: RPG bounds large ratios with rpg_dual_clip_c"),
    # ---- ignored ----
    FieldRule("use_bias_correction_kl", "ignored",
              "GRPO's weighting of its k3 penalty by the importance ratio; RPG's KL term is exact off-policy by "
              "construction"),
    *_rules("ignored", "only read with sync_ref_model, which RPG refuses", "ref_model_mixup_alpha",
            "ref_model_sync_steps"),
    *_rules("ignored", "only read by loss_type 'sapo', which RPG refuses", "sapo_temperature_neg",
            "sapo_temperature_pos"),
    *_rules("ignored", "only read by loss_type 'vespo', which RPG refuses", "vespo_k_pos", "vespo_lambda_pos",
            "vespo_k_neg", "vespo_lambda_neg"),
    # ---- accepted: TRL's generation, rewards, logging and model loading run unchanged ----
    *_rules("accepted", "model loading, as in GRPO", "model_init_kwargs", "trust_remote_code", "disable_dropout",
            "cast_lm_head_to_fp32"),
    FieldRule("router_aux_loss_coef", "accepted", "the MoE auxiliary loss is added to RPG's loss as in GRPO"),
    *_rules("accepted", "generation, as in GRPO", "num_generations", "num_generations_eval", "max_completion_length",
            "ds3_gather_for_generation", "shuffle_dataset", "pad_to_multiple_of", "generation_batch_size",
            "temperature", "top_p", "top_k", "min_p", "generation_kwargs", "chat_template_kwargs",
            "repetition_penalty", "cache_implementation", "max_tool_calling_iterations",
            "use_transformers_continuous_batching", "transformers_continuous_batching_config",
            "use_transformers_paged", "mask_truncated_completions"),
    FieldRule("num_iterations", "accepted", "each generation batch is reused for num_iterations passes, as in GRPO"),
    *_rules("accepted", "vLLM generation, as in GRPO", "use_vllm", "vllm_mode", "vllm_model_impl",
            "vllm_enable_sleep_mode", "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host",
            "vllm_server_port", "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization",
            "vllm_max_model_length", "vllm_tensor_parallel_size"),
    *_rules("accepted", "vLLM's importance-sampling correction, as in GRPO, with rpg_sampler_logps='recompute'; no "
            "effect with 'engine' (see vllm_importance_sampling_correction)", "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap"),
    *_rules("accepted", "rewards and advantages, as in GRPO", "reward_weights", "multi_objective_aggregation"),
    *_rules("accepted", "TRL's entropy bonus and its adaptive controller, added to RPG's loss", "entropy_coef",
            "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
    *_rules("accepted", "logging, as in GRPO", "log_completions", "log_multimodal", "num_completions_to_print",
            "log_unique_prompts", "log_completions_hub_repo"),
    *_rules("accepted", "transformers' TrainingArguments field, read as transformers and TRL read it",
            *_TRAINING_ARGUMENTS),
]}


def unclassified_fields(config_class=None, rules: dict[str, FieldRule] = GRPO_FIELDS) -> list[str]:
    """The fields of `config_class` (default: TRL's `GRPOConfig`) that `rules` does not classify."""
    if config_class is None:
        from trl import GRPOConfig as config_class
    return [f.name for f in dataclasses.fields(config_class) if f.name not in rules]


def _table(rules) -> str:
    rows = ["| GRPOConfig field | under RPG | why |", "|---|---|---|"]
    for verdict in VERDICTS[1:] + VERDICTS[:1]:
        rows += [f"| `{rule.name}` | {verdict} | {rule.reason} |" for rule in rules if rule.verdict == verdict]
    return "\n".join(rows)


def drop_in_table() -> str:
    """The README's table: the GRPOConfig fields RPG changes, refuses or ignores, and the accepted ones whose meaning
    under RPG a GRPO user should read."""
    return _table([rule for rule in GRPO_FIELDS.values() if rule.verdict != "accepted" or rule.in_readme])


def full_table() -> str:
    """Every GRPOConfig field, by verdict (docs/drop-in.md)."""
    return _table(GRPO_FIELDS.values())


__all__ = ["GRPO_FIELDS", "VERDICTS", "FieldRule", "drop_in_table", "full_table", "unclassified_fields"]
