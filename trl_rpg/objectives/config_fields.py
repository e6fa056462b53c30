"""The RPG objective's settings, shared by `RPGConfig` and `AsyncRPGConfig`: the fields (their defaults and help
texts, defined once here), the resolution of the clip widths and the checks of each value.

Both configs declare the same fields with these definitions (`beta = beta_field()`, ...), so the two trainers
read one text in `--help` and refuse a bad value with the same message; `check_objective` is the one check.
Nothing here imports TRL.
"""

from __future__ import annotations

import math
from dataclasses import field

from .per_token import DIVERGENCES, ESTIMATORS

#: The smallest clip width (`epsilon`, `epsilon_high`): float32's machine epsilon 2^-23, the spacing of float32 numbers
#: above 1. The ratio and its bounds are compared in float32 (`objectives.rpg_per_token_loss` computes in at least
#: float32), where 1 + 1e-8 == 1: a smaller width is no trust region at all, or is rounded up to this one.
MIN_CLIP_WIDTH = 2.0**-23
#: The paper's trust region (eps_low, eps_high): the default when neither width is set.
PAPER_CLIP_WIDTHS = (0.2, 0.28)


def config_field(default, help_text: str, choices: list | None = None):
    """A config field with its `--help` text (and the allowed values, when there is a fixed set)."""
    metadata = {"help": help_text} if choices is None else {"help": help_text, "choices": choices}
    return field(default=default, metadata=metadata)


def beta_field():
    return config_field(1e-4, "KL coefficient beta of the RPG objective E[A] - beta * D. The paper uses 1e-4.")


def epsilon_field():
    return config_field(
        None,
        "Lower clip width eps_low (> 0) of RPG-Style Clip: the trust region is [1 - epsilon, 1 + epsilon_high]. "
        "Default 0.2 (the paper's).",
    )


def epsilon_high_field():
    return config_field(
        None,
        "Upper clip width eps_high (> 0). Default: 0.28 (the paper's clip-higher) when `epsilon` is not set either; "
        "equal to `epsilon` when only `epsilon` is set, as in GRPOConfig.",
    )


def divergence_field():
    return config_field("urkl", "Divergence: 'fkl' KL(ref||pi), 'rkl' KL(pi||ref), 'ufkl', 'urkl' (unnormalised), "
                                "or a name added with trl_rpg.objectives.per_token.register_divergence.")


def estimator_field():
    return config_field("reinforce", "Gradient estimator: 'reinforce' (stop-gradient, RPG-REINFORCE) or "
                                     "'differentiable'.", choices=list(ESTIMATORS))


def dual_clip_field():
    return config_field(10.0, "Dual-clip bound c > 1 for negative effective advantages; None disables it.")


def resolve_clip_widths(epsilon: float | None, epsilon_high: float | None) -> tuple[float, float]:
    """The trust region `(eps_low, eps_high)` from the two config fields (None = not set).

    Neither set: the paper's (0.2, 0.28). Only `epsilon` set: symmetric, `(epsilon, epsilon)`, as a GRPO user who
    sets only `epsilon` expects. Only `epsilon_high` set: `(0.2, epsilon_high)`. Both set: as given.
    """
    if epsilon is None and epsilon_high is None:
        return PAPER_CLIP_WIDTHS
    if epsilon is None:
        return PAPER_CLIP_WIDTHS[0], epsilon_high
    return epsilon, epsilon if epsilon_high is None else epsilon_high


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def refuse(config_name: str, name: str, value, allowed: str):
    """Raise the error of a bad setting: the config, the field, the value and what is allowed."""
    raise ValueError(f"{config_name}: `{name}`={value!r} is not allowed; {allowed}.")


def check_objective(config, config_name: str) -> None:
    """Refuse a bad value of the objective's fields (`rpg_divergence`, `rpg_estimator`, `beta`, `epsilon`,
    `epsilon_high` after `resolve_clip_widths`, `rpg_dual_clip_c`), naming the field and what is allowed."""
    def bad(name, value, allowed):
        refuse(config_name, name, value, allowed)

    if config.rpg_divergence not in DIVERGENCES:
        bad("rpg_divergence", config.rpg_divergence, f"choose one of {list(DIVERGENCES)}")
    if config.rpg_estimator not in ESTIMATORS:
        bad("rpg_estimator", config.rpg_estimator, f"choose one of {list(ESTIMATORS)}")
    if not finite(config.beta) or config.beta < 0:
        bad("beta", config.beta, "it must be a finite number >= 0")
    # A zero width puts w = 1 on the clip boundary: on-policy tokens would get no gradient (docs/math.md sec. 3)
    if not finite(config.epsilon) or config.epsilon <= 0:
        bad("epsilon", config.epsilon, "it must be a finite number > 0 (the lower clip width eps_low; with 0, every "
                                       "on-policy token would sit on the clip boundary and get no gradient)")
    if not finite(config.epsilon_high) or config.epsilon_high <= 0:
        bad("epsilon_high", config.epsilon_high, "it must be a finite number > 0 (the upper clip width eps_high; "
                                                 "with 0, on-policy tokens would get no gradient)")
    for name in ("epsilon", "epsilon_high"):  # a width float32 rounds away is not the width set
        if getattr(config, name) < MIN_CLIP_WIDTH:
            bad(name, getattr(config, name),
                f"it must be at least {MIN_CLIP_WIDTH:.3g} (2^-23, float32's resolution at 1): RPG compares the "
                "ratio w with 1 - epsilon and 1 + epsilon_high in float32 (bfloat16 log-probs are upcast), where "
                "a smaller width is rounded (1 + 1e-8 is 1: every on-policy token, w = 1, would sit on the clip "
                "boundary and get no gradient)")
    if config.rpg_dual_clip_c is not None and (not finite(config.rpg_dual_clip_c) or config.rpg_dual_clip_c <= 1):
        bad("rpg_dual_clip_c", config.rpg_dual_clip_c, "it must be a number > 1, or None to disable dual-clip")


__all__ = ["MIN_CLIP_WIDTH", "PAPER_CLIP_WIDTHS", "beta_field", "check_objective", "config_field",
           "divergence_field", "dual_clip_field", "epsilon_field", "epsilon_high_field", "estimator_field", "finite",
           "refuse", "resolve_clip_widths"]
