"""The model card of an RPG run: TRL's card, made right for any base model and data set, plus RPG's settings.

TRL's template links the base model and the data set to the Hub and loads `hub_model_id` in its quick start. For a
model trained from a local folder or built in code, a local data file, or a run not pushed to the Hub, that gives
"fine-tuned version of [None](https://huggingface.co/None)", links to local paths and `model="None"`.
`hub_repo_id` decides what may be linked; `repair` rewrites those sentences after TRL renders the card.
"""

from __future__ import annotations

import os
import re
import textwrap

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")


def hub_repo_id(name: str | None) -> str | None:
    """`name` if it can be a Hub repository id (`name` or `owner/name`, no spaces) and is not a local path."""
    if not name or os.path.exists(name) or not _REPO_ID.match(name) or name.endswith((".parquet", ".json",
                                                                                       ".jsonl", ".csv")):
        return None
    return name


def repair(card: str, base_model: str | None, dataset_name: str | None, load_as: str) -> str:
    """Fix TRL's rendered card: no link to a base model or data set that is not on the Hub, and a quick start that
    loads `load_as` (the Hub id it is pushed to, else the output folder)."""
    if hub_repo_id(base_model) is None:
        described = f"the local model `{base_model}`" if base_model else "a model built in code"
        card = card.replace("This model is a fine-tuned version of [None](https://huggingface.co/None)",
                            f"This model is a fine-tuned version of {described}")
    if dataset_name and hub_repo_id(dataset_name) is None:
        card = card.replace(f"[{dataset_name}](https://huggingface.co/datasets/{dataset_name})", f"`{dataset_name}`")
    return re.sub(r'pipeline\("text-generation", model="[^"]*"', f'pipeline("text-generation", model="{load_as}"',
                  card)


def complete(path: str, args, base_model: str | None, dataset_name: str | None, load_as: str) -> None:
    """Repair the card TRL wrote at `path` and append the RPG settings."""
    with open(path, encoding="utf-8") as f:
        text = repair(f.read(), base_model, dataset_name, load_as)
    if dataset_name and hub_repo_id(dataset_name) is None:
        text = text.replace("It has been trained using", f"It was trained on `{dataset_name}` using", 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + rpg_settings(args, args.beta))


def rpg_settings(args, beta: float) -> str:
    """The card's "RPG settings" section."""
    return textwrap.dedent(f"""
        ## RPG settings

        Trained with RPG ([arXiv:2505.17508](https://huggingface.co/papers/2505.17508)) via `trl_rpg.RPGTrainer`:

        | setting | value |
        |---|---|
        | divergence | `{args.rpg_divergence}` |
        | estimator | `{args.rpg_estimator}` |
        | reference policy | `{args.rpg_reference}` |
        | beta | `{beta}` |
        | clip (eps_low, eps_high, c) | `({args.epsilon}, {args.epsilon_high}, {args.rpg_dual_clip_c})` |
        | aggregation (`loss_type`) | `{args.loss_type}` |
        """)


__all__ = ["complete", "hub_repo_id", "repair", "rpg_settings"]
