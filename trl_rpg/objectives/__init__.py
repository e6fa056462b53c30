"""The objective core: RPG's per-token objectives, their loss aggregation and metrics, and the objective's config
fields. It imports torch only (`tests/test_layers.py` walks its imports), so it can be used without TRL.

- `per_token`: the divergences (a registry: `register_divergence`, `get_divergence`), the two estimators
  (fully differentiable, REINFORCE-style) and RPG-Style Clip: `rpg_per_token_loss`.
- `loss`: aggregation of per-token losses into the step's loss (TRL's loss types) and the logged metrics.
- `config_fields`: the `rpg_*` dataclass fields that pick an objective, with their checks.

May import: torch and the standard library; nothing else of trl_rpg.
"""

from .per_token import (
    DIVERGENCES,
    ESTIMATORS,
    Divergence,
    ObjectiveInputs,
    divergence_value,
    get_divergence,
    register_divergence,
    rpg_per_token_loss,
)

__all__ = ["DIVERGENCES", "ESTIMATORS", "Divergence", "ObjectiveInputs", "divergence_value", "get_divergence",
           "register_divergence", "rpg_per_token_loss"]
