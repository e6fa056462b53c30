"""The upgrade guard of `AsyncRPGTrainer` (`trl.experimental.async_grpo`): the reviewed code of every method of TRL's
asynchronous trainer it overrides or relies on, and the verdict on every `AsyncGRPOConfig` field
(`trl_rpg.async_config.ASYNC_FIELDS`). Built on `trl_rpg.upgrade_guard`'s digests; imported only when an
`AsyncRPGTrainer` is built, so `RPGTrainer` never imports TRL's experimental API. TRL's experimental API changes
without notice, so a change here is refused (no behavioural self-check as `RPGTrainer`'s), unless
`TRL_RPG_ALLOW_UNREVIEWED=1`."""

from __future__ import annotations

import dataclasses
import os
import warnings

from .upgrade_guard import ALLOW_ENV, REVIEWED_VERSIONS, ReviewedMethod, UnreviewedUpgrade, changed_methods, describe

#: What `AsyncRPGTrainer` overrides or relies on; owners: the async trainer's classes, `"utils"` (trl.trainer.utils),
#: `"packing"` (the async trainer's packing module).
ASYNC_REVIEWED_METHODS: tuple[ReviewedMethod, ...] = (
    ReviewedMethod("AsyncGRPOTrainer", "__init__", "52ec1058cd8c76e8",
                   "builds the model with the fused head at `temperature`, the clip widths RPG reads "
                   "(`epsilon_low`, `epsilon_high`), the worker and the weight transfer"),
    ReviewedMethod("AsyncGRPOTrainer", "compute_loss", "5a2970b65c8144aa",
                   "runs with the model call recorded: RPG's loss replaces its PPO clip on the tokens it selects, "
                   "with its token normalisation (`loss.packed_token_mean`) and aux-loss scaling"),
    ReviewedMethod("AsyncGRPOTrainer", "_sync_weight", "01adbb4607ba652b", "publishes the policy, bumps the version"),
    ReviewedMethod("AsyncGRPOTrainer", "_sync_weight_merged", "1567bbcf8e23c326", "sends the policy (adapter merged)"),
    ReviewedMethod("AsyncGRPOTrainer", "_streaming_iter", "134787fe7dee9c81", "the weights sent"),
    ReviewedMethod("AsyncGRPOTrainer", "log", "4df357198379c6dc", "reduces RPG's `rpg/*` values with TRL's"),
    ReviewedMethod("AsyncGRPOTrainer", "create_model_card", "0d1f888d680eddcf", "replaced by RPG's card"),
    ReviewedMethod("AsyncGRPOTrainer", "_get_grad_norm", "879dcba334e7231c", "wrapped: the non-finite guard"),
    ReviewedMethod("AsyncGRPOTrainer", "train", "12af1a3d2e4b8ae6", "wrapped: the start-up line"),
    ReviewedMethod("RolloutQueueDataset", "__iter__", "486fa4a54d9f5194",
                   "drops samples older than `max_staleness` and yields the sampler's log-probs and advantages"),
    ReviewedMethod("DataCollatorForRollout", "torch_call", "6b8c597da2fcba9e", "`global_n_tokens`, the rows"),
    ReviewedMethod("TreeRow", "pack", "cf6cfbae66b7d447",
                   "`token_index`, `old_log_probs`, `advantages`: the flat per-token tensors of RPG's loss"),
    ReviewedMethod("AsyncGRPOConfig", "__post_init__", "53df855b1e7ca8f4", "runs after AsyncRPGConfig's checks"),
    ReviewedMethod("utils", "add_fused_lm_head", "c1b7a9c23e7ad579",
                   "the trainer's log-probs at `temperature`, as vLLM's processed log-probs are"),
    ReviewedMethod("packing", "tree_attention", "df551d45b2bdefe1",
                   "the varlen attention call the CPU stand-in of the tests reproduces (`toy.async_rollouts`)"),
)


def _async_owners() -> dict:
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer, packing
    from trl.trainer import utils

    return {"AsyncGRPOTrainer": AsyncGRPOTrainer, "AsyncGRPOConfig": AsyncGRPOConfig, "utils": utils,
            "RolloutQueueDataset": async_grpo_trainer.RolloutQueueDataset, "packing": packing,
            "DataCollatorForRollout": async_grpo_trainer.DataCollatorForRollout, "TreeRow": packing.TreeRow}


def check_async(owners: dict | None = None, config_class=None) -> list[str]:
    """`check()` for `AsyncRPGTrainer`: `ASYNC_REVIEWED_METHODS` and the `AsyncGRPOConfig` fields
    (`trl_rpg.async_config.ASYNC_FIELDS` classifies them), the same error or, with `TRL_RPG_ALLOW_UNREVIEWED=1`,
    warning."""
    from importlib.metadata import version

    from .async_config import ASYNC_FIELDS

    if config_class is None:
        from trl.experimental.async_grpo import AsyncGRPOConfig as config_class
    owners = owners or _async_owners()
    methods = changed_methods(owners, ASYNC_REVIEWED_METHODS)
    fields = [f.name for f in dataclasses.fields(config_class) if f.name not in ASYNC_FIELDS]
    if not (methods or fields):
        return []
    message = describe(methods, fields, {name: version(name) for name in REVIEWED_VERSIONS}, owners=owners).replace(
        "RPGTrainer was reviewed", "AsyncRPGTrainer was reviewed").replace(
        "GRPOConfig fields are not classified", "AsyncGRPOConfig fields are not classified (trl_rpg.async_config."
        "ASYNC_FIELDS)").replace("REVIEWED_METHODS", "ASYNC_REVIEWED_METHODS")
    if os.environ.get(ALLOW_ENV, "").strip().lower() not in ("1", "true", "yes"):
        raise UnreviewedUpgrade(message)
    warnings.warn(f"{message} ({ALLOW_ENV} is set: training anyway.)", UserWarning, stacklevel=3)
    return methods + fields


__all__ = ["ASYNC_REVIEWED_METHODS", "check_async"]
