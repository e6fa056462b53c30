"""Input checks that fail early with an error naming the culprit (data set rows, reward functions)."""

from __future__ import annotations

import functools
import inspect
import math

VALID_ROLES = ("system", "user", "assistant", "tool", "developer")


def validate_train_dataset(dataset, name: str = "train_dataset", max_rows: int | None = None) -> None:
    """Check that `dataset` has a usable `prompt` column: non-empty text or a well-formed conversation.

    Raises `ValueError` naming the data set, the row and what is wrong. Iterable (streaming) data sets are checked
    on their column names only.
    """
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(f"`{name}` has no 'prompt' column (columns: {list(columns)}). RPGTrainer, like "
                         "GRPOTrainer, needs a 'prompt' column of strings or of chat messages.")
    if not hasattr(dataset, "__len__") or columns is None:
        return
    prompts = dataset["prompt"] if max_rows is None else dataset.select(range(min(max_rows, len(dataset))))["prompt"]
    for row, prompt in enumerate(prompts):
        _check_prompt(prompt, name, row)


def _check_prompt(prompt, name, row):
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"`{name}` row {row}: the prompt is empty.")
        return
    if isinstance(prompt, (list, tuple)):
        if len(prompt) == 0:
            raise ValueError(f"`{name}` row {row}: the conversational prompt has no messages.")
        for i, message in enumerate(prompt):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ValueError(f"`{name}` row {row}, message {i}: each message must be a dict with 'role' and "
                                 f"'content', got {message!r:.200}.")
            if message["role"] not in VALID_ROLES:
                raise ValueError(f"`{name}` row {row}, message {i}: role {message['role']!r} is not one of "
                                 f"{list(VALID_ROLES)}.")
        if all(not _content_text(m["content"]).strip() for m in prompt):
            raise ValueError(f"`{name}` row {row}: every message of the conversational prompt is empty.")
        return
    raise ValueError(f"`{name}` row {row}: the prompt must be a string or a list of chat messages, got "
                     f"{type(prompt).__name__}.")


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content blocks
        return " ".join(str(block.get("text", "<non-text>")) if isinstance(block, dict) else str(block)
                        for block in content)
    return str(content)


def checked_reward_function(func, name: str):
    """Wrap a synchronous reward function so that its failures name the function and the row.

    - An exception is re-raised as `RuntimeError` naming the function and the first row that fails alone.
    - A result that is not a list of numbers/None of the right length raises `ValueError`.
    - ``None`` and NaN mean "not scored" for that function (TRL's convention; the row is excluded from its group's
      baseline when no function scores it); +-inf raises `ValueError` naming the row.
    """
    if inspect.iscoroutinefunction(func) or getattr(func, "_rpg_checked", False):
        return func

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        completions = kwargs.get("completions")
        n = len(completions) if completions is not None else None
        try:
            rewards = func(*args, **kwargs)
        except Exception as error:
            row = _first_failing_row(func, args, kwargs, n)
            where = f" on row {row} (prompt: {kwargs['prompts'][row]!r:.200})" if row is not None else ""
            raise RuntimeError(f"Reward function `{name}` raised {type(error).__name__}: {error}{where}.") from error
        if rewards is None or not hasattr(rewards, "__len__"):
            raise ValueError(f"Reward function `{name}` must return a list with one reward per completion, got "
                             f"{type(rewards).__name__}.")
        rewards = list(rewards)
        if n is not None and len(rewards) != n:
            raise ValueError(f"Reward function `{name}` returned {len(rewards)} rewards for {n} completions.")
        cleaned = []
        for row, reward in enumerate(rewards):
            if reward is None:
                cleaned.append(None)
                continue
            try:
                value = float(reward)
            except (TypeError, ValueError):
                raise ValueError(f"Reward function `{name}` returned {reward!r:.100} for row {row}; rewards must be "
                                 "numbers or None.") from None
            if math.isnan(value):
                cleaned.append(None)  # NaN: not scored, like None
            elif math.isinf(value):
                raise ValueError(f"Reward function `{name}` returned {value} for row {row}; rewards must be finite "
                                 "(use None for 'not scored').")
            else:
                cleaned.append(value)
        return cleaned

    wrapper._rpg_checked = True
    return wrapper


def _first_failing_row(func, args, kwargs, n):
    if not n:
        return None
    for row in range(n):
        single = {k: (v[row:row + 1] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
        try:
            func(*args, **single)
        except Exception:
            return row
    return None
