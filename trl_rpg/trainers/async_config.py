"""`AsyncRPGConfig`: TRL's `AsyncGRPOConfig` (`trl.experimental.async_grpo`) plus the RPG objective's fields.

Importing this module imports `trl.experimental` (TRL warns that its API is experimental); `import trl_rpg` does not.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..objectives.config_fields import (
    beta_field,
    check_objective,
    config_field,
    divergence_field,
    dual_clip_field,
    epsilon_field,
    epsilon_high_field,
    estimator_field,
    refuse,
    resolve_clip_widths,
)
from ..run import hub_uploads
from ..run.parameter_guard import check_optimizer_settings
from ..upgrade.async_fields import ASYNC_FIELDS, REFERENCE_REASON
from .async_checks import check_async_fields
from .describe import beta_too_small_warning


@dataclass
class AsyncRPGConfig(AsyncGRPOConfig):
    r"""
    Configuration for [`AsyncRPGTrainer`]: every [`~trl.experimental.async_grpo.AsyncGRPOConfig`] field, plus the RPG
    objective's fields (the same definitions and checks as [`RPGConfig`]'s).

    The loss is RPG's per-token loss on the samples of TRL's asynchronous rollout worker, with TRL's token
    normalisation: `E[A] - beta * D` with `D` regularising the policy towards the policy version that sampled each
    sample. Defaults follow the paper: `rpg_divergence="urkl"`, `rpg_estimator="reinforce"`, `beta=1e-4`, RPG-Style
    Clip with `(epsilon, epsilon_high) = (0.2, 0.28)` and `rpg_dual_clip_c=10.0`. With `beta=0` and
    `rpg_dual_clip_c=None`, RPG's clip has the gradient of TRL's PPO clip: the run trains as `AsyncGRPOTrainer`.

    The advantages are the rollout worker's (TRL's: `(reward - group mean) / group std`); there is no `loss_type` (the
    loss is TRL's token mean over each micro-batch's trained tokens) and no batch reuse (each sample is trained on
    once; it is off-policy by its staleness).

    Parameters:
        rpg_divergence (`str`, *optional*, defaults to `"urkl"`):
            `"fkl"` KL(ref || pi), `"rkl"` KL(pi || ref), `"ufkl"` and `"urkl"` their unnormalised forms, or a name
            added with `trl_rpg.objectives.per_token.register_divergence`.
        rpg_estimator (`str`, *optional*, defaults to `"reinforce"`):
            `"reinforce"` (stop-gradient surrogate, RPG-REINFORCE) or `"differentiable"`.
        rpg_dual_clip_c (`float` or `None`, *optional*, defaults to `10.0`):
            Dual-clip bound `c > 1`; `None` disables it.
        rpg_reference (`str`, *optional*, defaults to `"sampling"`):
            The only value: the policy version that sampled each sample. Why no other reference: see
            `REFERENCE_REASON` (docs/asynchronous.md).
        rpg_hub_upload_timeout (`float` or `None`, *optional*, defaults to `3600`):
            Seconds the end of training (and `push_to_hub()`, before its own upload) waits for the Hub uploads still
            running (`push_to_hub=True`); then `train()` raises `trl_rpg.run.hub_uploads.HubUploadError` naming them.
            `None`: no bound, as in transformers (`trl_rpg.run.hub_uploads`), as in `RPGConfig`.
    """

    beta: float = beta_field()
    epsilon: float | None = epsilon_field()
    epsilon_high: float | None = epsilon_high_field()
    rpg_divergence: str = divergence_field()
    rpg_estimator: str = estimator_field()
    rpg_dual_clip_c: float | None = dual_clip_field()
    rpg_reference: str = config_field(
        "sampling",
        "Reference policy: 'sampling' only, the policy version that sampled each sample (its log-probs come with the "
        "sample: no reference model, no extra forward pass). Other references need a second forward pass, which the "
        "asynchronous trainer does not make: use RPGTrainer for 'initial', 'periodic' or 'adaptive'.",
        choices=["sampling"],
    )
    rpg_hub_upload_timeout: float | None = config_field(3600.0, hub_uploads.TIMEOUT_HELP)

    def __post_init__(self):
        self.epsilon, self.epsilon_high = resolve_clip_widths(self.epsilon, self.epsilon_high)
        check_objective(self, "AsyncRPGConfig")
        check_optimizer_settings(self)  # settings that write NaN or inf into the parameters (parameter_guard)
        check_async_fields(self, "AsyncRPGConfig")  # TRL's own async fields: a value that cannot train (async_checks)
        if self.rpg_reference != "sampling":
            refuse("AsyncRPGConfig", "rpg_reference", self.rpg_reference, f"only 'sampling' is offered here: "
                                                                          f"{REFERENCE_REASON}")
        super().__post_init__()
        if too_small := beta_too_small_warning(self, "AsyncRPGConfig"):
            warnings.warn(too_small, UserWarning, stacklevel=3)

    @classmethod
    def from_async_grpo_config(cls, args: AsyncGRPOConfig) -> AsyncRPGConfig:
        """Upgrade an `AsyncGRPOConfig`: its fields keep their values (`epsilon_high=None` keeps TRL's meaning, the
        symmetric region), the RPG fields get RPG's defaults."""
        if isinstance(args, cls):
            return args
        # an AsyncGRPOConfig's epsilon is always set, so `resolve_clip_widths` keeps epsilon_high=None symmetric
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init})


def as_async_rpg_config(args, model) -> AsyncRPGConfig:
    """The `AsyncRPGConfig` an `AsyncRPGTrainer` runs with: `args` itself, an `AsyncGRPOConfig` upgraded, or, for
    `args=None`, defaults with an output directory named after the model (a path)."""
    if args is None:
        return AsyncRPGConfig(f"{str(model).rstrip('/').split('/')[-1]}-AsyncRPG")
    if isinstance(args, AsyncRPGConfig):  # again: a field may have been changed since the config was built
        check_optimizer_settings(args)
        check_async_fields(args, "AsyncRPGConfig")
        return args
    if isinstance(args, AsyncGRPOConfig):
        return AsyncRPGConfig.from_async_grpo_config(args)
    raise ValueError(f"`args` must be an AsyncRPGConfig or an AsyncGRPOConfig, got {type(args).__name__} (a "
                     "GRPOConfig or RPGConfig configures the synchronous RPGTrainer).")


__all__ = ["ASYNC_FIELDS", "REFERENCE_REASON", "AsyncRPGConfig", "as_async_rpg_config"]
