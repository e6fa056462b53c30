"""The upgrade guard: refuse to train on a TRL/transformers whose code RPG relies on is not the code that was reviewed.

`RPGTrainer._compute_loss` re-implements every feature of GRPO's monolithic `_compute_loss`, and the trainer wraps
other `GRPOTrainer` / `Trainer` methods. A TRL release that changes one of them, or adds a `GRPOConfig` field (a new
loss option, a new mask), would otherwise train *silently* with the change ignored (TRL issue #6807 shows what a
stale copy of `_compute_loss` does). `_compat` catches renamed internals; this module catches changed ones:

- `REVIEWED_METHODS`: every `GRPOTrainer` / `Trainer` method RPG overrides or relies on, each with why and the digest
  of its normalised source (`source_digest`: comments, docstring, blank lines and indentation do not count).
- `GRPO_FIELDS`: every `GRPOConfig` field (TRL's own and those inherited from `TrainingArguments`), classified
  `accepted` / `changed default` / `refused` / `ignored`, each with its reason. The README's drop-in section holds
  `drop_in_table()` (tests/test_upgrade_guard.py checks it is the same text); docs/drop-in.md holds every row.

`check()` runs when an `RPGTrainer` is built (not at import: the objective library, the rewards, the evaluation and
`--help` do not depend on TRL's internals and keep working; every training run still passes through it before a
model is loaded). It raises `UnreviewedUpgrade` naming each changed method and each unclassified field. Setting
the environment variable `TRL_RPG_ALLOW_UNREVIEWED=1` turns the error into a warning: for someone who reviewed the
difference (a patched or backported TRL) and must train before a trl-rpg release records it; the warning stays in
the log of every run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
import re
import warnings
from dataclasses import dataclass

#: The versions whose code the digests below were taken from.
REVIEWED_VERSIONS = {"trl": "1.16.0", "transformers": "5.24.0"}
#: Set to 1 to train anyway (a warning instead of the error), after reviewing what `check()` names.
ALLOW_ENV = "TRL_RPG_ALLOW_UNREVIEWED"

VERDICTS = ("accepted", "changed default", "refused", "ignored")


# ---------------------------------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewedMethod:
    """A method RPG overrides or relies on: `owner` is `"GRPOTrainer"`, `"Trainer"` or `"GRPOConfig"` (where the
    method is looked up, so an override in between counts), `digest` the `source_digest` of the reviewed code."""

    owner: str
    name: str
    digest: str
    why: str

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.name}"


REVIEWED_METHODS: tuple[ReviewedMethod, ...] = (
    ReviewedMethod("GRPOTrainer", "__init__", "b3a4d5ad04475ba0",
                   "RPGTrainer builds on it: it reads `beta` to decide on a reference model (`_compat.trl_sees_beta`) "
                   "and sets every attribute RPG's loss reads (`_compat.INSTANCE_ATTRIBUTES`)"),
    ReviewedMethod("GRPOTrainer", "_compute_loss", "5e1696f089cc35f8",
                   "replaced: RPG's `_compute_loss` re-implements each of its features (masks, importance-sampling "
                   "correction, aggregation, entropy bonus, auxiliary loss); a new one would be silently ignored"),
    ReviewedMethod("GRPOTrainer", "compute_loss", "c8a3316de92970c9", "dispatches to `_compute_loss`"),
    ReviewedMethod("GRPOTrainer", "_generate_and_score_completions", "86098a6c6afecb2a",
                   "wrapped (dynamic sampling, tallies): RPG relies on the batch fields it returns and on its one "
                   "`_calculate_rewards` call per batch"),
    ReviewedMethod("GRPOTrainer", "_calculate_rewards", "13c9b1d606fde323",
                   "its return value, the gathered rewards, is captured"),
    ReviewedMethod("GRPOTrainer", "_prepare_inputs", "d8617f874014c408",
                   "buffers and reuses generation batches (`_buffered_inputs`, `_step`), which RPG checkpoints"),
    ReviewedMethod("GRPOTrainer", "_get_per_token_logps_and_entropies", "229ed6106a016c26", "called by RPG's loss"),
    ReviewedMethod("GRPOTrainer", "get_high_entropy_mask", "5910b63f0ea580d0",
                   "called by RPG's loss (`top_entropy_quantile`)"),
    ReviewedMethod("GRPOTrainer", "get_off_policy_mask", "5eea34b4fcdb07c9",
                   "called by RPG's loss (`off_policy_mask_threshold`)"),
    ReviewedMethod("GRPOTrainer", "log", "7c3eb90e1d839e9d",
                   "RPG's override carries the batch metrics forward into `_metrics` before it averages them"),
    ReviewedMethod("GRPOTrainer", "_save_checkpoint", "6f5313d411006bd8",
                   "wrapped: RPG writes its files and the manifest after it, and rotates checkpoints itself"),
    ReviewedMethod("GRPOTrainer", "_load_optimizer_and_scheduler", "108fd4e5bf0dd4c8",
                   "wrapped: RPG restores its state after it on resume"),
    ReviewedMethod("GRPOTrainer", "save_model", "891842af4f28b7de",
                   "wrapped: RPG writes its model card after a final save into output_dir (PEFT's save writes a "
                   "blank one), relying on `_internal_call` marking transformers' own calls"),
    ReviewedMethod("GRPOTrainer", "create_model_card", "0d1f888d680eddcf",
                   "replaced by RPG's card, which keeps what TRL's card carries (tags, tracker links, versions)"),
    ReviewedMethod("GRPOTrainer", "_get_grad_norm", "879dcba334e7231c",
                   "wrapped: the non-finite-gradient guard reads the norm it returns after clipping"),
    ReviewedMethod("GRPOTrainer", "train", "12af1a3d2e4b8ae6",
                   "wrapped: RPG verifies the checkpoint it resumes from and judges the run after it"),
    ReviewedMethod("GRPOTrainer", "_remove_unused_columns", "be453e76dbd69389", "called by dynamic sampling"),
    ReviewedMethod("GRPOTrainer", "_prepare_for_training", "ba121f7f1d0bf192",
                   "wrapped under DeepSpeed: it is where DeepSpeed loads a resumed checkpoint, made weights-only"),
    ReviewedMethod("GRPOTrainer", "_push_from_checkpoint", "a8e4156fde354a4c",
                   "called by RPG once a checkpoint is complete (transformers calls it inside its save, before RPG's "
                   "files and the manifest exist)"),
    ReviewedMethod("Trainer", "_save_checkpoint", "d9833db7afa987cd",
                   "RPG's checkpoint order relies on what it writes and on its rotation (`save_total_limit`)"),
    ReviewedMethod("GRPOConfig", "__post_init__", "aee78ba2191fa4d6",
                   "RPGConfig resolves `steps_per_generation` before it and relies on what it derives after"),
)


def _last_line(code) -> int:
    """The last source line of a code object and the code objects nested in it."""
    last = max((end for _, end, _, _ in code.co_positions() if end), default=code.co_firstlineno)
    return max([last] + [_last_line(const) for const in code.co_consts if hasattr(const, "co_positions")])


def _source_lines(func) -> list[str]:
    """The lines of `func`'s definition, decorators included (what `inspect.getsource` gives, without its
    tokenizer: the block ends at the last line the code object's positions name)."""
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or not hasattr(code, "co_positions"):  # Python 3.10
        return inspect.getsource(func).splitlines()
    lines, _ = inspect.findsource(func)
    return [line.rstrip("\n") for line in lines[code.co_firstlineno - 1:_last_line(code)]]


_DOCSTRING_OPEN = re.compile(r"""^[rRuUbB]{0,2}(\"\"\"|\'\'\')""")


def _without_docstring(lines: list[str], has_docstring: bool) -> list[str]:
    """`lines` without the function's docstring: the first string opened by triple quotes after the `def` line."""
    if not has_docstring:
        return lines
    def_at = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), None)
    for i in range(0 if def_at is None else def_at + 1, len(lines)):
        opened = _DOCSTRING_OPEN.match(lines[i].strip())
        if opened:
            quote, rest = opened.group(1), lines[i].strip()[opened.end():]
            end = i if quote in rest else next((j for j in range(i + 1, len(lines)) if quote in lines[j]), i)
            return lines[:i] + lines[end + 1:]
    return lines


def _without_comment(line: str) -> str:
    """`line` (stripped) without a whole-line comment, or an inline one (`code  # comment`, as ruff and black write
    it) when the code before it has balanced quotes."""
    if line.startswith("#"):
        return ""
    at = line.find("  #")
    if at >= 0 and line[:at].count('"') % 2 == 0 and line[:at].count("'") % 2 == 0:
        return line[:at].rstrip()
    return line


def normalised_source(func) -> str:
    """The source of `func` without its docstring, comments, blank lines and indentation: what a refactor that only
    reformats or re-documents leaves unchanged. Text (not an AST dump, not bytecode), so the digest is the same on
    every Python version; textual (neither `tokenize` nor `ast`, 30x slower: this runs in every process that builds
    a trainer), so a quote-unbalanced line keeps its comment: a false alarm at worst, never a missed change of code
    (a changed line of a multi-line string that starts with `#` is the one blind spot)."""
    lines = _without_docstring(_source_lines(func), inspect.unwrap(func).__doc__ is not None)
    kept = (_without_comment(line.strip()) for line in lines)
    return "\n".join(line for line in kept if line)


@functools.lru_cache(maxsize=None)  # by function object: a trainer built again costs nothing, a patched method counts
def source_digest(func) -> str:
    """The first 16 hex digits of the SHA-256 of `normalised_source(func)`; `"no source"` when there is none (a
    builtin, a C extension, a function made by `exec`)."""
    try:
        text = normalised_source(func)
    except (OSError, TypeError):
        return "no source"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _owners():
    from transformers import Trainer
    from trl import GRPOConfig, GRPOTrainer

    return {"GRPOTrainer": GRPOTrainer, "Trainer": Trainer, "GRPOConfig": GRPOConfig}


def changed_methods(owners: dict | None = None) -> list[str]:
    """The reviewed methods whose code differs from the reviewed code (or that are gone), as `"GRPOTrainer.name"`."""
    owners = owners or _owners()
    changed = []
    for method in REVIEWED_METHODS:
        func = getattr(owners[method.owner], method.name, None)
        if func is None:
            changed.append(f"{method.qualname} (no longer exists)")
        elif source_digest(func) != method.digest:
            changed.append(method.qualname)
    return changed


# ---------------------------------------------------------------------------------------------------------------------
# GRPOConfig fields
# ---------------------------------------------------------------------------------------------------------------------


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
    "output_dir", "per_device_train_batch_size", "num_train_epochs", "max_steps", "learning_rate",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args", "weight_decay", "adam_beta1",
    "adam_beta2", "adam_epsilon", "optim_target_modules", "gradient_accumulation_steps",
    "average_tokens_across_devices", "max_grad_norm", "label_smoothing_factor", "bf16", "fp16", "bf16_full_eval",
    "fp16_full_eval", "tf32", "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "use_liger_kernel", "liger_kernel_config", "use_cache", "neftune_noise_alpha", "torch_empty_cache_steps",
    "auto_find_batch_size", "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node",
    "logging_nan_inf_filter", "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm",
    "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "prediction_loss_only",
    "eval_on_start", "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps",
    "include_for_metrics", "batch_eval_metrics", "save_only_model", "save_strategy", "save_steps",
    "save_on_each_node", "save_total_limit", "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo",
    "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "ignore_data_skip", "restore_callback_states_from_checkpoint",
    "full_determinism", "seed", "data_seed", "use_cpu", "accelerator_config", "parallelism_config",
    "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order",
    "remove_unused_columns", "label_names", "train_sampling_strategy", "length_column_name",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend",
    "ddp_timeout", "fsdp", "fsdp_config", "deepspeed", "debug", "skip_memory_metrics", "do_train", "do_eval",
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
              "the correction weighs every term of RPG's loss, the KL term included (GRPO leaves its KL uncorrected):"
              " the exact gradient needs it when the generator differs from the trained policy", in_readme=True),
    FieldRule("top_entropy_quantile", "accepted",
              "masks the advantage (the reward term), as in GRPO; the KL term acts on every token", in_readme=True),
    FieldRule("off_policy_mask_threshold", "accepted",
              "masks the advantage (the reward term), as in GRPO; the KL term acts on every token", in_readme=True),
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
            "vllm_max_model_length", "vllm_tensor_parallel_size", "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap"),
    *_rules("accepted", "rewards and advantages, as in GRPO", "reward_weights", "multi_objective_aggregation"),
    *_rules("accepted", "TRL's entropy bonus and its adaptive controller, added to RPG's loss", "entropy_coef",
            "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
    *_rules("accepted", "logging, as in GRPO", "log_completions", "log_multimodal", "num_completions_to_print",
            "log_unique_prompts", "log_completions_hub_repo"),
    *_rules("accepted", "transformers' TrainingArguments field, read as transformers and TRL read it",
            *_TRAINING_ARGUMENTS),
]}


def unclassified_fields(config_class=None) -> list[str]:
    """The fields of `config_class` (default: TRL's `GRPOConfig`) that `GRPO_FIELDS` does not classify."""
    if config_class is None:
        from trl import GRPOConfig as config_class
    return [f.name for f in dataclasses.fields(config_class) if f.name not in GRPO_FIELDS]


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


# ---------------------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------------------


class UnreviewedUpgrade(RuntimeError):
    """The installed TRL/transformers differ from the reviewed code in what RPG relies on."""


def describe(methods: list[str], fields: list[str], versions: dict[str, str]) -> str:
    """The error text: what changed, what to review, how to proceed."""
    installed = ", ".join(f"{name} {version}" for name, version in versions.items())
    reviewed = ", ".join(f"{name} {version}" for name, version in REVIEWED_VERSIONS.items())
    parts = []
    if methods:
        parts.append(f"these methods RPG overrides or relies on differ from the reviewed code: {', '.join(methods)} "
                     "(why each matters: trl_rpg.upgrade_guard.REVIEWED_METHODS)")
    if fields:
        parts.append(f"these GRPOConfig fields are not classified by RPG: {', '.join(fields)} (each must be accepted,"
                     " changed, refused or ignored with a reason: trl_rpg.upgrade_guard.GRPO_FIELDS, the table of the"
                     " README's drop-in section)")
    return (f"RPGTrainer was reviewed against {reviewed}; installed: {installed}. On this version "
            f"{'; '.join(parts)}. RPG could train with a changed behaviour silently ignored. To proceed: install the "
            f"reviewed versions (pip install \"trl=={REVIEWED_VERSIONS['trl']}\" "
            f"\"transformers=={REVIEWED_VERSIONS['transformers']}\"), or review the difference against "
            f"trl_rpg/trainer.py and trl_rpg/config.py, record it in trl_rpg/upgrade_guard.py and run "
            f"tests/test_upgrade_guard.py, or set {ALLOW_ENV}=1 to train anyway with a warning.")


def check(owners: dict | None = None, config_class=None) -> list[str]:
    """Raise `UnreviewedUpgrade` (a warning with `TRL_RPG_ALLOW_UNREVIEWED=1`) when a reviewed method changed or a
    GRPOConfig field is unclassified; returns the problems found (empty: the reviewed code)."""
    from importlib.metadata import version

    methods = changed_methods(owners)
    fields = unclassified_fields(config_class)
    if not methods and not fields:
        return []
    message = describe(methods, fields, {name: version(name) for name in REVIEWED_VERSIONS})
    if os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes"):
        warnings.warn(f"{message} ({ALLOW_ENV} is set: training anyway.)", UserWarning, stacklevel=3)
        return methods + fields
    raise UnreviewedUpgrade(message)


__all__ = ["ALLOW_ENV", "GRPO_FIELDS", "REVIEWED_METHODS", "REVIEWED_VERSIONS", "VERDICTS", "FieldRule",
           "ReviewedMethod", "UnreviewedUpgrade", "changed_methods", "check", "describe", "drop_in_table",
           "full_table", "normalised_source", "source_digest", "unclassified_fields"]
