"""trl-rpg: Regularized Policy Gradient (RPG) for TRL.

`RPGTrainer` / `RPGConfig` are drop-in replacements for TRL's `GRPOTrainer` / `GRPOConfig` that train with the RPG
objectives of Zhang et al., "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning"
(ICLR 2026, arXiv:2505.17508); `AsyncRPGTrainer` / `AsyncRPGConfig` do the same for TRL's asynchronous trainer
(`trl.experimental.async_grpo`). The objective library `trl_rpg.objectives` is torch-only.
"""

from .objectives import rpg_per_token_loss

__version__ = "0.1.0"

__all__ = ["AsyncRPGConfig", "AsyncRPGTrainer", "RPGConfig", "RPGTrainer", "rpg_per_token_loss", "__version__"]


def __getattr__(name):
    # The trainer pulls in TRL/transformers; import it lazily so `trl_rpg.objectives` stays light.
    if name == "RPGConfig":
        from .trainers.config import RPGConfig

        return RPGConfig
    if name == "RPGTrainer":
        from .trainers.trainer import RPGTrainer

        return RPGTrainer
    # The asynchronous trainer imports `trl.experimental` (and its warning): only when asked for
    if name == "AsyncRPGConfig":
        from .trainers.async_config import AsyncRPGConfig

        return AsyncRPGConfig
    if name == "AsyncRPGTrainer":
        from .trainers.async_trainer import AsyncRPGTrainer

        return AsyncRPGTrainer
    raise AttributeError(f"module 'trl_rpg' has no attribute {name!r}")
