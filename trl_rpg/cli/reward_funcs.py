"""`--reward_funcs`: names of registered reward functions (`trl_rpg.rewards.REWARD_FUNCS`, and the toy task's
`toy_reward`, a name of the command line only) and dotted import paths, checked and resolved to reward callables."""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from ..rewards import REWARD_FUNCS, get_reward_func, register_reward

#: The reward function used when `--reward_funcs` is not given.
DEFAULT_REWARD_FUNCS = ("math_reward",)


@register_reward("toy_reward", columns=("answer",), help="the bundled toy arithmetic task (reads `answer`)")
def _build_toy_reward(**settings):
    """The toy task's reward, a name of the command line only: the training API does not depend on the toy."""
    from ..toy import toy_reward  # lazy: the toy imports the trainer

    return toy_reward


def _is_import_path(name: str) -> bool:
    return "." in name


def check_reward_names(names) -> None:
    """Refuse reward-function names that are neither registered (`trl_rpg.rewards.REWARD_FUNCS`) nor dotted import
    paths to a reward function (`check_reward_callable`), before anything is launched. A dotted path is imported
    here (the training process imports it again)."""
    for name in names or DEFAULT_REWARD_FUNCS:
        if _is_import_path(name):
            _import_reward_func(name)
        elif name not in REWARD_FUNCS:
            get_reward_func(name)  # raises the ValueError naming the registered functions and the closest one


#: Keyword arguments TRL passes to every reward function (besides the data set's columns).
REWARD_KEYWORDS = ("prompts", "completions", "completion_ids")


def check_reward_callable(path: str, func) -> None:
    """Refuse what `--reward_funcs path` resolved to unless it is a function TRL can call as a reward function:
    `func(prompts=..., completions=..., completion_ids=..., **columns)`, so it must take keyword arguments and accept
    any (`**kwargs`), as TRL's reward functions do. `os.system`, `builtins.eval` or a class are refused."""
    def refuse(why: str):
        raise ValueError(f"--reward_funcs {path!r}: {why}. A reward function takes keyword arguments "
                         "`prompts`, `completions`, `completion_ids` and the data set's columns, and returns one "
                         "float (or None) per completion: `def my_reward(completions, **kwargs)`.")

    if inspect.isclass(func) or not callable(func):
        refuse(f"is {'a class' if inspect.isclass(func) else f'not callable (a {type(func).__name__})'}")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        refuse("is a callable whose arguments cannot be inspected (a built-in), not a reward function")
    parameters = list(signature.parameters.values())
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        refuse(f"takes positional-only arguments ({', '.join(positional_only)}), not a reward function's keywords")
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        refuse(f"does not accept **kwargs (its arguments: {signature})")


def _import_reward_func(path: str):
    """Import `module.function`; the working directory is searched after the installed packages (appended to
    `sys.path`, never first: a file such as `peft.py` there must not replace a dependency)."""
    module_path, func_name = path.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        func = getattr(importlib.import_module(module_path), func_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--reward_funcs {path!r}: cannot import {func_name!r} from {module_path!r} ({error}).") \
            from error
    except SystemExit as error:  # the run would end with its status (0: "success"), nothing trained
        raise ValueError(f"--reward_funcs {path!r}: importing {module_path!r} raised SystemExit({error.code!r}) "
                         "(sys.exit at import): a reward module must not end the process when it is imported; "
                         "put that code under `if __name__ == \"__main__\":`.") from error
    check_reward_callable(path, func)
    return func


def resolve_reward_funcs(names, max_completion_length: int, soft_punish_cache: int) -> list:
    """Turn `--reward_funcs` names (`trl_rpg.rewards.REWARD_FUNCS`) and dotted import paths into reward callables."""
    return [_import_reward_func(name) if _is_import_path(name) else
            get_reward_func(name, max_completion_length=max_completion_length, soft_punish_cache=soft_punish_cache)
            for name in names or DEFAULT_REWARD_FUNCS]
