"""Everything trl-rpg relies on inside TRL and transformers (and DeepSpeed's checkpoint types), in one place, so an
upgrade touches one file.

Tested against TRL 1.16 and transformers 5 (`pyproject.toml` admits `trl>=1.16,<2`: on another TRL `upgrade_guard`
decides). `tests/test_compat.py` checks every name below on the installed versions and fails with a message naming
what is missing.

`RPGTrainer` overrides these methods (`OVERRIDDEN`):

- `GRPOTrainer._compute_loss(model, inputs)`: RPG's per-token loss replaces GRPO's (the method is monolithic).
- `GRPOTrainer._generate_and_score_completions(inputs)`: dynamic sampling, the all-unscored check, reference tags.
- `GRPOTrainer._save_checkpoint` / `_load_optimizer_and_scheduler`: RPG state in checkpoints.
- `Trainer._get_grad_norm(model, grad_norm)`: the non-finite-gradient guard reads the norm clipping computed.
- `Trainer._push_from_checkpoint(checkpoint_folder)` / `_finish_current_push()`: the Hub uploads it queues run in
  RPG's worker with a checkpoint's manifest last, their results read, the final wait bounded
  (`trl_rpg.run.hub_uploads`;
  transformers' `hf_api()` answered by RPG's recorder during the call: `trainer_hub_api`).
- `Trainer._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)`: under DeepSpeed, where
  transformers has DeepSpeed load a resumed checkpoint, every `torch.load` is made weights-only with the DeepSpeed
  types its checkpoint files hold allowed (`DEEPSPEED_CHECKPOINT_TYPES`; DeepSpeed itself passes
  `weights_only=False`).

and calls or reads these (`CALLED`, `INSTANCE_ATTRIBUTES`): `_calculate_rewards` (its return value, the gathered
rewards, is captured during generation, see `capture_return`), `_get_per_token_logps_and_entropies`,
`get_high_entropy_mask`, `get_off_policy_mask`, `_remove_unused_columns`, the module global `use_adapter` of
`trl.trainer.grpo_trainer` (wrapped during generation, `around_trl_reference_pass`), `Trainer._push_from_checkpoint`
(the Hub upload of a checkpoint, which transformers queues inside its save and RPGTrainer once the checkpoint is
complete, with `args.push_to_hub` off during transformers' save); the instance attributes `_buffered_inputs`
and `_step` (the reused generation batch and the micro-step counter of `GRPOTrainer._prepare_inputs`), `_metrics`,
`beta` (from which TRL decides whether reference log-probs are computed), `ref_model`, `reward_weights`,
`reward_func_names`, `multi_objective_aggregation`, `shuffle_dataset`, `entropy_coef`, `_last_world_entropy`,
`_entropy_window_stats` (TRL's adaptive entropy controller, whose state TRL checkpoints), `_entropy_bonus_enabled`,
`current_gradient_accumulation_steps`, `aux_loss_enabled`, `epsilon_low`, `epsilon_high`, `top_entropy_quantile`,
`off_policy_mask_threshold`, `importance_sampling_level`, `use_vllm`, `vllm_importance_sampling_correction`,
`num_iterations`, `rollout_func`.

It also reuses TRL's `is_async_callable` (the rule by which `GRPOTrainer` decides to await a reward function, which
the reward wrapper keeps) rather than a copy of it, and TRL's `get_trackio_space_url` / `get_comet_experiment_url`
(the tracker links of the model card, `trl_rpg.trainers.model_card`). One more TRL helper is imported where it is
used, not
here: `trl.cli.commands.training._subtract_subsequence` (`trl <command>`'s split of the arguments its parser did not
consume), by `trl_rpg/cli/launcher.py`, which must not load this module's TRL trainer and model utilities. The
launcher also uses accelerate's launch internals, imported there for the same reason: `accelerate.commands.launch.
_validate_launch_command` (its completion of the launch arguments, read to decide whether one plain process can
train in the launcher's own process), `accelerate.utils.launch.prepare_simple_launcher_cmd_env` (the environment of
that process) and `launch_command`; `tests/test_compat.py` checks them too.

From torch it uses `torch.distributed.distributed_c10d._set_pg_timeout` (`set_collective_timeout`: `ddp_timeout`
honoured on CPU too).

With `rpg_sampler_logps="engine"` (`trl_rpg.trainers.sampler_logps`) RPG relies on TRL 1.16's condition for the
no-grad pass
that computes `old_per_token_logps` in `_generate_and_score_completions` (`args.gradient_accumulation_steps %
generate_every != 0 or (use_vllm and vllm_importance_sampling_correction)`, see `trl_skips_old_logps`), and checks
the engine's output as `VLLMGeneration.generate` (`trl.generation.vllm_generation`) returns it (`returning_through`).

Generation batches are dicts whose fields `trl_rpg.run.batch` knows (`GENERATION_BATCH_FIELDS` below lists the
text-only
ones TRL 1.16 produces); dynamic sampling refuses others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_comet_experiment_url, get_trackio_space_url, is_async_callable, use_adapter

#: Keys of a TRL generation batch that are forwarded to the model as multimodal inputs.
MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)

#: GRPOTrainer / Trainer methods RPGTrainer overrides.
OVERRIDDEN = ("_compute_loss", "_generate_and_score_completions", "_save_checkpoint", "_load_optimizer_and_scheduler",
              "_get_grad_norm", "_prepare_for_training", "_push_from_checkpoint", "_finish_current_push")
#: GRPOTrainer methods RPGTrainer calls.
CALLED = ("_calculate_rewards", "_get_per_token_logps_and_entropies", "get_high_entropy_mask", "get_off_policy_mask",
          "_remove_unused_columns", "_prepare_inputs", "_push_from_checkpoint")
#: Attributes a built GRPOTrainer must have.
INSTANCE_ATTRIBUTES = (
    "_buffered_inputs", "_step", "_metrics", "beta", "ref_model", "reward_weights", "reward_func_names",
    "multi_objective_aggregation", "shuffle_dataset", "entropy_coef", "_last_world_entropy", "_entropy_window_stats",
    "_entropy_bonus_enabled", "current_gradient_accumulation_steps", "aux_loss_enabled", "epsilon_low",
    "epsilon_high", "top_entropy_quantile", "off_policy_mask_threshold", "importance_sampling_level", "use_vllm",
    "vllm_importance_sampling_correction", "processing_class", "environment_factories", "tools", "chat_template",
    "chat_template_kwargs", "num_iterations", "rollout_func",
)
#: Fields of a text-only training generation batch of TRL 1.16 (with steps_per_generation > accumulation steps).
GENERATION_BATCH_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                           "num_items_in_batch", "old_per_token_logps")


#: The classes (besides tensors and plain data) in DeepSpeed 0.19's ZeRO-1/2/3 checkpoint files, found by loading the
#: files of real ZeRO-2 and ZeRO-3 checkpoints (fp32 and bf16, full fine-tuning and LoRA) with `weights_only=True`:
#: the optimizer state's parameter slice map, its loss scaler (dynamic with fp16) and the ZeRO stage. Each holds
#: numbers only; allowing them lets `torch.load(weights_only=True)` rebuild them and nothing else.
DEEPSPEED_CHECKPOINT_TYPES = (
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
)


def deepspeed_checkpoint_types() -> list[type]:
    """The classes of `DEEPSPEED_CHECKPOINT_TYPES` (DeepSpeed is imported: call it only where DeepSpeed runs)."""
    import importlib

    return [getattr(importlib.import_module(module), name)
            for module, name in (path.rsplit(".", 1) for path in DEEPSPEED_CHECKPOINT_TYPES)]


@contextmanager
def trl_sees_beta(args, beta: float) -> Iterator[None]:
    """Within the block, `args.beta` reads `beta`; restored after.

    TRL decides from `args.beta` (copied to `self.beta` in `GRPOTrainer.__init__`) whether to build a reference
    model and whether to compute reference log-probs at generation time. With `rpg_reference="sampling"` RPG needs
    neither, whatever its own beta, so the trainer is built with TRL seeing 0.
    """
    saved = args.beta
    args.beta = beta
    try:
        yield
    finally:
        args.beta = saved


@contextmanager
def around_trl_reference_pass(context: Callable[[Any], AbstractContextManager]) -> Iterator[None]:
    """Within the block, TRL's PEFT reference pass in `GRPOTrainer._generate_and_score_completions` (the forward
    inside its `use_adapter(model, ...)`, that method's only use of it) also runs inside `context(model)`.

    RPG's reference must be a deterministic policy (`reference.without_dropout`); TRL computes those log-probs with
    the model in training mode, where the adapter's `lora_dropout` and the model's dropout are on.
    """
    import trl.trainer.grpo_trainer as grpo

    original = grpo.use_adapter

    @contextmanager
    def wrapped(model, adapter_name):
        with original(model, adapter_name=adapter_name), context(model):
            yield

    grpo.use_adapter = wrapped
    try:
        yield
    finally:
        grpo.use_adapter = original


@contextmanager
def capture_return(obj: Any, method: str) -> Iterator[list]:
    """Within the block, every call of `obj.<method>` also appends its return value to the yielded list.

    Used to read, as a value, the gathered rewards TRL computes inside `_generate_and_score_completions` (TRL does
    not return them).
    """
    original = getattr(obj, method)
    returned: list = []

    def recording(*args, **kwargs):
        value = original(*args, **kwargs)
        returned.append(value)
        return value

    setattr(obj, method, recording)
    try:
        yield returned
    finally:
        delattr(obj, method)  # the class's method is visible again


def recording(fn) -> tuple[Any, list]:
    """`(call, returned)`: `call(...)` calls `fn(...)` and also appends its return value to `returned`.

    `AsyncGRPOTrainer.compute_loss(model, inputs)` returns only its loss; `AsyncRPGTrainer` hands it `call` for
    `model` to read the model output its loss came from (the log-probs and entropies of the packed tokens).
    """
    returned: list = []

    def call(*args, **kwargs):
        value = fn(*args, **kwargs)
        returned.append(value)
        return value

    return call, returned


@contextmanager
def async_trainer_on_cpu(varlen_attention) -> Iterator[None]:
    """Within the block, TRL's asynchronous trainer runs on CPU: its packed attention calls `varlen_attention`'s
    `flash_attn_varlen_func` instead of the FA3 kernel that `trl.experimental.async_grpo.packing._flash_attn` loads
    from the Hub (GPU only), and its MFU metric is off (`async_grpo_trainer.get_peak_flops_per_device` asks CUDA for
    the device's name). For tests and CPU benchmarks (`trl_rpg.toy.async_rollouts.VarlenAttention`)."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    saved = packing._flash_attn, async_grpo_trainer.get_peak_flops_per_device
    packing._flash_attn = lambda: varlen_attention
    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None
    try:
        yield
    finally:
        packing._flash_attn, async_grpo_trainer.get_peak_flops_per_device = saved


def async_cpu_stand_ins_installed() -> bool:
    """Whether TRL's asynchronous trainer runs with the CPU stand-ins now (inside `async_trainer_on_cpu`): its MFU
    metric no longer asks CUDA for the device's name (`get_peak_flops_per_device`, TRL's own outside the block)."""
    from trl.experimental.async_grpo import async_grpo_trainer
    from trl.trainer import utils

    return async_grpo_trainer.get_peak_flops_per_device is not utils.get_peak_flops_per_device


@contextmanager
def trainer_hub_api(wrap) -> Iterator[None]:
    """Within the block, transformers' Trainer gets `wrap(api)` from `hf_api()` (the shared `HfApi` it uploads with,
    a name of `transformers.trainer`), `api` being what `hf_api()` returns."""
    import transformers.trainer as trainer_module

    original = trainer_module.hf_api
    trainer_module.hf_api = lambda: wrap(original())
    try:
        yield
    finally:
        trainer_module.hf_api = original


#: Seconds the process group's collectives wait beyond `ddp_timeout` (`set_collective_timeout`): a reward call stuck
#: for `ddp_timeout` on one process is reported by that process (`reward_exits.StuckRewardWatchdog`) before the others
#: give up waiting without saying why.
COLLECTIVE_TIMEOUT_MARGIN = 60.0


def set_collective_timeout(seconds: float) -> None:
    """Make the default process group's collectives wait `seconds` (torch's `distributed_c10d._set_pg_timeout`, on
    gloo and NCCL alike): transformers passes `ddp_timeout` to the process group on GPU and under DeepSpeed only, and
    gloo's own default is 30 minutes. Nothing without an initialised process group."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    if dist.is_available() and dist.is_initialized():
        _set_pg_timeout(timedelta(seconds=seconds))


@contextmanager
def returning_through(obj: Any, method: str, check) -> Iterator[None]:
    """Within the block, every call of `obj.<method>` returns `check(value)` instead of its value (which `check` may
    refuse by raising); afterwards `obj.<method>` is what it was (an instance's own wrapper is kept). Used to check
    the vLLM engine's output before TRL reads it."""
    own = method in vars(obj)
    original = getattr(obj, method)

    def checked(*args, **kwargs):
        return check(original(*args, **kwargs))

    setattr(obj, method, checked)
    try:
        yield
    finally:
        if own:
            setattr(obj, method, original)
        else:
            delattr(obj, method)  # the class's method is visible again


@contextmanager
def trl_skips_old_logps(trainer) -> Iterator[None]:
    """Within the block, TRL 1.16's `_generate_and_score_completions` runs no forward pass for `old_per_token_logps`
    and computes no vLLM importance-sampling ratio: its condition for the pass, `args.gradient_accumulation_steps %
    (steps_per_generation * num_iterations) != 0 or (use_vllm and vllm_importance_sampling_correction)`, reads an
    accumulation that is a multiple of the generation period and the correction off (nothing else in generation and
    scoring reads either); both are restored after."""
    args = trainer.args
    saved = args.gradient_accumulation_steps, trainer.vllm_importance_sampling_correction
    args.gradient_accumulation_steps = args.steps_per_generation * trainer.num_iterations
    trainer.vllm_importance_sampling_correction = False
    try:
        yield
    finally:
        args.gradient_accumulation_steps, trainer.vllm_importance_sampling_correction = saved


# ---------------------------------------------------------------------------------------------------------------------
# transformers versions older than the reviewed one (pyproject.toml admits transformers >= 5.10.4, what vllm 0.31
# accepts; CI's smoke subset runs on it: constraints-oldest.txt)
# ---------------------------------------------------------------------------------------------------------------------


def _transformers_at_least(release: str) -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).release >= Version(release).release


def trainer_end(trainer) -> None:
    """What `Trainer.end()` does (transformers >= 5.18, which TRL's `grpo.py` calls on those versions only): finish
    the trackers and destroy the process group. `RPGTrainer.end` on an older transformers."""
    trainer.accelerator.end_training()


#: transformers >= 5.18 has `Trainer.end()`; before, `RPGTrainer` defines it (`trainer_end`).
TRAINER_HAS_END = _transformers_at_least("5.18")


def _checkpointing_field() -> str:
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


#: The name transformers reads for activation (gradient) checkpointing: `activation_checkpointing` from 5.24 on, where
#: `gradient_checkpointing` is its deprecated alias (a `FutureWarning` whenever it is set), `gradient_checkpointing`
#: before. trl-rpg's own configs set this one (`no_activation_checkpointing`).
ACTIVATION_CHECKPOINTING = _checkpointing_field()


def no_activation_checkpointing() -> dict[str, bool]:
    """The config keyword that turns activation checkpointing off on the installed transformers, without a
    deprecation warning (`{"activation_checkpointing": False}` from 5.24, `{"gradient_checkpointing": False}`
    before)."""
    return {ACTIVATION_CHECKPOINTING: False}


def checkpointing_at_trl_default(args) -> None:
    """GRPOConfig's own default `gradient_checkpointing=True` (TRL's, not the user's) moved to the current name before
    `TrainingArguments.__post_init__` reads it, so that transformers >= 5.24 does not warn on every config that the
    deprecated alias was set; a value the user set keeps transformers' warning."""
    import dataclasses

    from trl import GRPOConfig

    if ACTIVATION_CHECKPOINTING == "gradient_checkpointing" or args.activation_checkpointing is not None:
        return
    [default] = [f.default for f in dataclasses.fields(GRPOConfig) if f.name == "gradient_checkpointing"]
    if args.gradient_checkpointing is default:
        args.activation_checkpointing, args.gradient_checkpointing = default, None


#: transformers >= 5.24's deprecation of the model methods TRL 1.16 itself calls (its gradient-checkpointing setup and
#: `trl.models.utils.disable_gradient_checkpointing`): a `FutureWarning` per call, nothing a user can change
#: (`trl_rpg/cli/entry.py` filters the same, without importing this module).
TRL_INTERNAL_DEPRECATIONS = (r"`(is_gradient_checkpointing|gradient_checkpointing_enable|"
                             r"gradient_checkpointing_disable)`")


def quiet_trl_internal_deprecations() -> None:
    """Hide `TRL_INTERNAL_DEPRECATIONS` (the warnings filter, as `trl-rpg train` does): called when a trainer is
    built."""
    import warnings

    warnings.filterwarnings("ignore", message=TRL_INTERNAL_DEPRECATIONS, category=FutureWarning)


def _adapter_folders(checkpoint: str) -> tuple[bool, list[str]]:
    """Whether `checkpoint` holds an adapter at its root, and its subfolders that hold one (as transformers reads
    them on resume)."""
    import os

    names = ("adapter_model.safetensors", "adapter_model.bin")

    def holds(folder: str) -> bool:
        return any(os.path.isfile(os.path.join(folder, name)) for name in names)

    subfolders = [name for name in sorted(os.listdir(checkpoint))
                  if os.path.isdir(os.path.join(checkpoint, name)) and holds(os.path.join(checkpoint, name))]
    return holds(checkpoint), subfolders


def resume_policy_adapter(model, checkpoint: str) -> bool:
    """Load the policy's adapter ("default") from `checkpoint` where transformers < 5.23 skipped it: its
    `Trainer._load_from_checkpoint` loads only the adapter subfolders (RPG's reference adapter) when there are some,
    and the resumed run would train on from the *initial* adapter without a word. transformers 5.23 loads it as
    here (`model.load_adapter(checkpoint, "default", ...)`, then the active adapter set again); PEFT copies the
    weights into the existing parameters, so the optimizer's references stay valid. True when it loaded."""
    if _transformers_at_least("5.23") or not (hasattr(model, "load_adapter") and hasattr(model, "active_adapters")):
        return False
    at_root, subfolders = _adapter_folders(checkpoint)
    if not (at_root and subfolders):
        return False
    active = model.active_adapters[0]
    model.load_adapter(checkpoint, "default", is_trainable=(active == "default"))
    model.set_adapter(active)
    return True


def missing_internals(trainer_class, trainer=None) -> list[str]:
    """Names listed above that the installed TRL/transformers lack (instance attributes only if `trainer` given)."""
    missing = [f"{trainer_class.__name__}.{name}" for name in (*OVERRIDDEN, *CALLED) if not hasattr(trainer_class,
                                                                                                      name)]
    if trainer is not None:
        missing += [f"{type(trainer).__name__} instance attribute {name}" for name in INSTANCE_ATTRIBUTES
                    if not hasattr(trainer, name)]
    return missing


__all__ = [
    "ACTIVATION_CHECKPOINTING", "CALLED", "COLLECTIVE_TIMEOUT_MARGIN", "DEEPSPEED_CHECKPOINT_TYPES",
    "GENERATION_BATCH_FIELDS",
    "INSTANCE_ATTRIBUTES", "MULTIMODAL_KEYS", "OVERRIDDEN", "TRL_INTERNAL_DEPRECATIONS",
    "deepspeed_checkpoint_types",
    "PREFIX_CHECKPOINT_DIR", "TRAINER_HAS_END", "around_trl_reference_pass", "async_trainer_on_cpu", "capture_return",
    "checkpointing_at_trl_default", "recording", "disable_gradient_checkpointing", "is_async_callable",
    "get_comet_experiment_url", "get_trackio_space_url", "missing_internals", "no_activation_checkpointing",
    "quiet_trl_internal_deprecations", "resume_policy_adapter",
    "returning_through", "set_collective_timeout", "trainer_end", "trainer_hub_api", "trl_sees_beta",
    "trl_skips_old_logps", "use_adapter",
]
