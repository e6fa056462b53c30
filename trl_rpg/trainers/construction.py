"""The checks that building a trainer runs, in order: one function before the model loads, one after.

`RPGTrainer`:
1. `before_load` (nothing loaded yet, so a refusal costs nothing):
   a. the upgrade guard (`trl_rpg.upgrade.guard.check`): TRL code RPG relies on changed must not train silently;
   b. the config (`config.as_rpg_config`): a `GRPOConfig` converted, every field's range (the objective's fields,
      the optimizer's, `ddp_timeout`), the settings that make a term inert or biased warned;
   c. the inputs (`validation.validate_inputs`), unless an `environment_factory` makes the prompts: the output folder
      is not another run's, the training set's prompts and size, the reward functions' columns, the evaluation sets.
2. `after_load` (the model, tokenizer and accelerator exist):
   a. the precision the run trains in against the one asked for (`precision.clash_warning`);
   b. the prompts as the tokenizer sees them (`validation.validate_tokenized_prompts`);
   c. the dropout of the training forward, which the config could not see (`describe.dropout_warning`).

`AsyncRPGTrainer`: `async_before_load` (the async upgrade guard, `as_async_rpg_config`, the runtime: a CUDA GPU or
the CPU stand-ins); what it checks after loading (the sampler's logprobs mode, the worker's samples) needs the
rollout worker and runs in the trainer.
"""

from __future__ import annotations

import logging
import os
import warnings

from .. import _compat
from ..upgrade import guard as upgrade_guard
from . import precision
from .config import RPGConfig, as_rpg_config
from .describe import dropout_warning
from .validation import validate_inputs, validate_tokenized_prompts

logger = logging.getLogger(__name__)


def before_load(model, reward_funcs, args, train_dataset, eval_dataset, environment_factory) -> RPGConfig:
    """Steps 1a-1c for `RPGTrainer`; returns the `RPGConfig` the trainer trains with."""
    upgrade_guard.check(args)
    _compat.quiet_trl_internal_deprecations()
    args = as_rpg_config(args, model)
    if environment_factory is None:
        validate_inputs(train_dataset, eval_dataset, reward_funcs, args)
    return args


def after_load(trainer) -> None:
    """Steps 2a-2c for a built `RPGTrainer` (its `sampler_logps` set)."""
    args = trainer.args
    clash = precision.clash_warning(args.bf16, args.fp16, trainer.accelerator.mixed_precision,
                                    os.environ.get(precision.MIXED_PRECISION_ENV))
    if clash and trainer.is_world_process_zero():  # `trl-rpg train` refuses it; a script is told
        logger.warning(clash)
    if trainer.environment_factories is None:
        validate_tokenized_prompts(trainer.train_dataset, trainer.processing_class, tools=trainer.tools,
                                   chat_template=trainer.chat_template,
                                   chat_template_kwargs=trainer.chat_template_kwargs)
    if (dropout := dropout_warning(args, trainer.sampler_logps, trainer.model)) and trainer.is_world_process_zero():
        warnings.warn(dropout, UserWarning, stacklevel=3)  # what the config could not know: the model's dropout


def async_before_load(model, args, positional, kwargs):
    """`AsyncRPGTrainer`'s checks before anything loads; returns the `AsyncRPGConfig` it trains with."""
    from ..upgrade import async_guard
    from .async_config import as_async_rpg_config
    from .async_runtime import check_async_runtime

    async_guard.check_async()
    args = as_async_rpg_config(args, model)  # a value that cannot train: refused naming the field
    check_async_runtime(positional, kwargs)  # no CUDA GPU, no stand-ins: one line, before anything loads
    return args


__all__ = ["after_load", "async_before_load", "before_load"]
