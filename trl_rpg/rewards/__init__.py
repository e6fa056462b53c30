"""Rewards for RPG training: grading an answer, the reward functions, and the reward functions selectable by name.

* :mod:`trl_rpg.rewards.grading` -- the one scoring rule of training and evaluation, built from
  :mod:`~trl_rpg.rewards.extraction` (a completion's final answer), :mod:`~trl_rpg.rewards.normalization` (its
  canonical form) and :mod:`~trl_rpg.rewards.verification` (the same answer? ``math-verify`` with a timeout).
* :mod:`trl_rpg.rewards.functions` -- :func:`math_reward` (1 correct / 0 wrong), :func:`paper_math_reward` (the
  paper's +1 / -1), :func:`make_math_reward` (any values) and :func:`make_overlong_punishment`.
* :mod:`trl_rpg.rewards.registry` -- :data:`REWARD_FUNCS` by name and :func:`check_reward_columns`.

Every public name of these modules is importable from here (``from trl_rpg.rewards import math_reward``).
No module of the package imports torch.

May import: nothing else of trl_rpg (the bottom layer, beside `objectives`; docs/architecture.md).
"""

from .functions import make_math_reward, make_overlong_punishment, math_reward, paper_math_reward
from .grading import (
                      ANSWER_COLUMNS,
                      MATH_VERIFY_TIMEOUT_S,
                      MAX_SYMBOLIC_ANSWER_CHARS,
                      completion_to_text,
                      extract_answer,
                      is_equivalent,
                      normalize_answer,
                      reference_answer,
                      score_answer,
                      score_completion,
)
from .registry import (
                      REWARD_FUNCS,
                      RewardEntry,
                      check_reward_columns,
                      get_reward_func,
                      register_reward,
                      reward_columns,
                      reward_func_name,
)

__all__ = ["ANSWER_COLUMNS", "MATH_VERIFY_TIMEOUT_S", "MAX_SYMBOLIC_ANSWER_CHARS", "REWARD_FUNCS", "RewardEntry",
           "check_reward_columns", "completion_to_text", "extract_answer", "get_reward_func", "is_equivalent",
           "make_math_reward", "make_overlong_punishment", "math_reward", "normalize_answer", "paper_math_reward",
           "reference_answer", "register_reward", "reward_columns", "reward_func_name", "score_answer",
           "score_completion"]
