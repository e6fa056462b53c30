"""The upgrade guard of `AsyncRPGTrainer` (`trl.experimental.async_grpo`): the reviewed code of every method of TRL's
asynchronous trainer it overrides or relies on, and the verdict on every `AsyncGRPOConfig` field
(`trl_rpg.upgrade.async_fields.ASYNC_FIELDS`). Built on `trl_rpg.upgrade.guard`'s digests; imported only when an
`AsyncRPGTrainer` is built, so `RPGTrainer` never imports TRL's experimental API. A TRL whose async methods changed
runs the behavioural self-check (`async_upgrade_check`, registered with `upgrade_guard.register_review` and
`upgrade_check.register_properties`, its verdict cached per installed version by `upgrade_verdict`), as `RPGTrainer`
does: passed, it trains with one warning; failed, it is refused naming the property and the async files, unless
`TRL_RPG_ALLOW_UNREVIEWED=1`."""

from __future__ import annotations

import dataclasses
import os
import warnings

from . import self_check as upgrade_check
from .async_fields import ASYNC_FIELDS
from .guard import (
    ALLOW_ENV,
    GONE,
    REVIEWED_VERSIONS,
    Review,
    ReviewedMethod,
    UnreviewedUpgrade,
    _allowed,
    _resolve,
    _warn_once,
    changed_methods,
    describe,
    describe_passed,
    method_digests,
    register_review,
    replaced_here,
)

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
    ReviewedMethod("AsyncGRPOTrainer", "_save_checkpoint", "a37cad49c3f8ff9a",
                   "wrapped (`checkpointing.save_checkpoint`): RPG's state and the manifest written after it"),
    ReviewedMethod("AsyncGRPOTrainer", "_load_optimizer_and_scheduler", "1ae280a7e7120bb9",
                   "wrapped: RPG's state restored after it on resume (the checkpoint verified in `train`)"),
    ReviewedMethod("AsyncGRPOTrainer", "_push_from_checkpoint", "a8e4156fde354a4c",
                   "called once a checkpoint is complete; its uploads run in RPG's worker (`hub_uploads`)"),
    ReviewedMethod("AsyncGRPOTrainer", "_finish_current_push", "4ed2d495c8cfaf53",
                   "replaced: the final wait for Hub uploads, bounded, each result read (`hub_uploads`)"),
    ReviewedMethod("AsyncGRPOTrainer", "get_train_dataloader", "b1a13d2bf2bd1cd1",
                   "reads the samples from `rollout_queue` (main process), which RPG wraps with the checks of what "
                   "the worker sends (`worker_samples.CheckedRollouts`)"),
    ReviewedMethod("RolloutQueueDataset", "__iter__", "486fa4a54d9f5194",
                   "drops samples older than `max_staleness` (`model_version`, after RPG's checks) and yields the "
                   "sampler's log-probs and advantages"),
    ReviewedMethod("DataCollatorForRollout", "torch_call", "6b8c597da2fcba9e", "`global_n_tokens`, the rows"),
    ReviewedMethod("TreeRow", "pack", "cf6cfbae66b7d447",
                   "`token_index`, `old_log_probs`, `advantages`: the flat per-token tensors of RPG's loss"),
    ReviewedMethod("AsyncGRPOConfig", "__post_init__", "53df855b1e7ca8f4", "runs after AsyncRPGConfig's checks"),
    ReviewedMethod("utils", "add_fused_lm_head", "c1b7a9c23e7ad579",
                   "the trainer's log-probs at `temperature`, as vLLM's processed log-probs are"),
    ReviewedMethod("packing", "tree_attention", "df551d45b2bdefe1",
                   "the varlen attention call the CPU stand-in of the tests reproduces (`toy.async_rollouts`)"),
)


#: Where each owner of `ASYNC_REVIEWED_METHODS` is looked up (`upgrade_guard.OWNERS`; "module:" is the module).
ASYNC_OWNERS: dict[str, str] = {
    "AsyncGRPOTrainer": "trl.experimental.async_grpo:AsyncGRPOTrainer",
    "AsyncGRPOConfig": "trl.experimental.async_grpo:AsyncGRPOConfig",
    "RolloutQueueDataset": "trl.experimental.async_grpo.async_grpo_trainer:RolloutQueueDataset",
    "DataCollatorForRollout": "trl.experimental.async_grpo.async_grpo_trainer:DataCollatorForRollout",
    "TreeRow": "trl.experimental.async_grpo.packing:TreeRow",
    "utils": "trl.trainer.utils:", "packing": "trl.experimental.async_grpo.packing:"}
#: The review's name (`upgrade_guard.REVIEWS`, `upgrade_check.PROPERTIES`, the verdict cache).
REVIEW = "AsyncRPGTrainer"
#: The files a maintainer reviews and records a new TRL's async code in (the refusal names them).
ASYNC_FILES = ("trl_rpg/trainers/async_trainer.py and trl_rpg/upgrade/async_fields.py",
               "trl_rpg/upgrade/async_guard.py",
               "tests/test_async_trainer.py and tests/test_async_upgrade_check.py")


def _async_owners() -> dict:
    return {name: _resolve(path) for name, path in ASYNC_OWNERS.items()}


def register() -> None:
    """Register the review (the current `ASYNC_REVIEWED_METHODS`) and its self-check properties
    (`async_upgrade_check.ASYNC_PROPERTIES`) with the synchronous trainer's machinery."""
    from .async_self_check import ASYNC_PROPERTIES

    register_review(REVIEW, Review("trl_rpg.trainers.async_trainer:AsyncRPGTrainer", "AsyncGRPOTrainer",
                                   "AsyncGRPOConfig",
                                   ASYNC_REVIEWED_METHODS, ASYNC_FIELDS, REVIEWED_VERSIONS, registered_by=__name__),
                    ASYNC_OWNERS)
    if REVIEW not in upgrade_check.PROPERTIES:
        upgrade_check.register_properties(REVIEW, *ASYNC_PROPERTIES)


def async_text(message: str) -> str:
    """A message of `upgrade_guard` (`describe`, `describe_passed`), naming the asynchronous trainer's review and
    files instead of the synchronous one's."""
    replacements = (
        ("RPGTrainer was reviewed", "AsyncRPGTrainer was reviewed"),
        ("trl_rpg.upgrade.guard.REVIEWED_METHODS", "trl_rpg.upgrade.async_guard.ASYNC_REVIEWED_METHODS"),
        ("these GRPOConfig fields are not classified by RPG", "these AsyncGRPOConfig fields are not classified by "
                                                             "AsyncRPGTrainer"),
        ("trl_rpg.upgrade.guard.GRPO_FIELDS, the table of the README's drop-in section",
         "trl_rpg.upgrade.async_fields.ASYNC_FIELDS"),
        ("new GRPOConfig fields", "new AsyncGRPOConfig fields"),
        ("trl_rpg/trainers/trainer.py and trl_rpg/trainers/config.py", ASYNC_FILES[0]),
        ("trl_rpg/upgrade/guard.py and run tests/test_upgrade_guard.py", f"{ASYNC_FILES[1]} and run {ASYNC_FILES[2]}"),
        ("so RPG trains on it", "so AsyncRPGTrainer trains on it"))
    for old, new in replacements:
        message = message.replace(old, new)
    return message


def check_async(owners: dict | None = None, config_class=None) -> list[str]:
    """`upgrade_guard.check()` for `AsyncRPGTrainer`: nothing to do on the reviewed code. A changed method
    (`ASYNC_REVIEWED_METHODS`) runs the behavioural self-check (`async_upgrade_check`, in a fresh process, cached per
    installed version by `upgrade_verdict`): passed, one warning and the trainer trains; failed (or a method gone, or
    replaced in this process), `UnreviewedUpgrade` naming what failed and the async files to review. An
    `AsyncGRPOConfig` field not classified in `trl_rpg.upgrade.async_fields.ASYNC_FIELDS` is refused without a
    self-check.
    With `TRL_RPG_ALLOW_UNREVIEWED=1` a refusal is a warning. Returns the changes found."""
    from importlib.metadata import version

    from . import verdict as upgrade_verdict

    if config_class is None:
        from trl.experimental.async_grpo import AsyncGRPOConfig as config_class
    owners = owners or _async_owners()
    methods = changed_methods(owners, ASYNC_REVIEWED_METHODS)
    fields = [f.name for f in dataclasses.fields(config_class) if f.name not in ASYNC_FIELDS]
    if not (methods or fields) or os.environ.get(upgrade_verdict.IN_CHECK_ENV):
        return methods + fields
    register()
    versions = {name: version(name) for name in REVIEWED_VERSIONS}
    replaced = replaced_here(REVIEW, owners)
    gone = [name for name in methods if name.endswith(GONE)]
    verdict = None
    if not (replaced or gone or fields):
        verdict = upgrade_verdict.verdict(REVIEW, method_digests(REVIEW, owners), fields)
        if verdict.passed:
            if verdict.fresh or not verdict.cached:  # the run that ran the check (or one that could not cache it)
                _warn_once(async_text(describe_passed(methods, fields, versions, verdict, REVIEWED_VERSIONS,
                                                      owners=owners)))
            return methods
    message = async_text(describe(methods, fields, versions, verdict, replaced, REVIEWED_VERSIONS,
                                    owners=owners))
    if not _allowed():  # "1", "true" or "yes" only: "0" is not permission
        raise UnreviewedUpgrade(message)
    warnings.warn(f"{message} ({ALLOW_ENV} is set: training anyway.)", UserWarning, stacklevel=3)
    return methods + fields


__all__ = ["ASYNC_FILES", "ASYNC_OWNERS", "ASYNC_REVIEWED_METHODS", "REVIEW", "async_text", "check_async",
           "register"]

register()
