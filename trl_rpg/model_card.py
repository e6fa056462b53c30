"""The model card of an RPG run: TRL's card, made right for any base model and data set, plus RPG's settings.

TRL's template links the base model and the data set to the Hub and loads `hub_model_id` in its quick start. For a
model trained from a local folder or built in code, a local data file, or a run not pushed to the Hub, that gives
"fine-tuned version of [None](https://huggingface.co/None)", links to local paths and `model="None"`.
`hub_repo_id` decides what may be linked; `repair` rewrites those sentences after TRL renders the card.

Names are the user's text (a model name, a path, a data-set name) and go into Markdown that the Hub renders: every
name that is not linked as a Hub id is written with `markdown_text` (no HTML, no Markdown syntax, one line), and the
quick start's `model=` argument with `python_string`.
"""

from __future__ import annotations

import os
import re
import textwrap
import unicodedata

from huggingface_hub import metadata_load

#: The paper, as TRL's model card cites it (`GRPOTrainer._paper`).
RPG_PAPER = {
    "title": "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning",
    "id": "2505.17508",
    "citation": textwrap.dedent("""\
        @inproceedings{zhang2026rpg,
            title        = {{On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning}},
            author       = {Yifan Zhang and Yifeng Liu and Huizhuo Yuan and Quanquan Gu and Andrew Chi-Chih Yao},
            booktitle    = {The Fourteenth International Conference on Learning Representations},
            year         = 2026,
            eprint       = {arXiv:2505.17508},
        }"""),
}

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?", re.ASCII)

# Characters with a meaning in (GitHub-flavoured) Markdown inside a line; each is written backslash-escaped.
_MARKDOWN_PUNCTUATION = frozenset("\\`*_[](){}#!|~$")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _invisible(ch: str) -> bool:
    """Line breaks, control and format characters (newlines, bidi overrides, U+2028 ...): shown as escapes."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def _escape_code(ch: str) -> str:
    code = ord(ch)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def markdown_text(name: str) -> str:
    """`name` as literal Markdown text on one line: line breaks and control characters written as escapes
    (`\\n`), HTML special characters as entities, Markdown punctuation backslash-escaped. Rendered, it reads as
    the name (with `\\n` for a newline) and can open no tag, heading, link, table cell or emphasis."""
    out = []
    for ch in str(name):
        if _invisible(ch):
            ch = _escape_code(ch)  # a backslash sequence, escaped below like any other text
            out.append(ch.replace("\\", "\\\\"))
        elif ch in _HTML:
            out.append(_HTML[ch])
        elif ch in _MARKDOWN_PUNCTUATION:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def python_string(value: str) -> str:
    """`value` as a double-quoted Python string literal on one line, with no backtick (it cannot close the code
    block it sits in)."""
    out = []
    for ch in str(value):
        if ch in "\\\"":
            out.append("\\" + ch)
        elif ch == "`" or _invisible(ch):
            out.append(_escape_code(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def hub_repo_id(name: str | None) -> str | None:
    """`name` if it can be a Hub repository id (`name` or `owner/name`, ASCII, no spaces) and is not a local
    path."""
    if not name or os.path.exists(name) or not _REPO_ID.fullmatch(name) or name.endswith((".parquet", ".json",
                                                                                           ".jsonl", ".csv")):
        return None
    return name


def repair(card: str, base_model: str | None, dataset_name: str | None, load_as: str,
           model_name: str | None = None) -> str:
    """Fix TRL's rendered card: no link to a base model or data set that is not on the Hub, every other name
    escaped (`markdown_text`), and a quick start that loads `load_as` (the Hub id it is pushed to, else the output
    folder). `model_name` is the name TRL wrote into the title, if any."""
    if model_name:
        card = card.replace(f"# Model Card for {model_name}", f"# Model Card for {markdown_text(model_name)}", 1)
    if hub_repo_id(base_model) is None:
        described = f"the local model {markdown_text(base_model)}" if base_model else "a model built in code"
        for rendered in {base_model or "None", "None"}:  # TRL links `_name_or_path` unless it is a folder
            card = card.replace(f"This model is a fine-tuned version of [{rendered}](https://huggingface.co/"
                                f"{rendered})", f"This model is a fine-tuned version of {described}", 1)
    if dataset_name and hub_repo_id(dataset_name) is None:
        card = card.replace(f"[{dataset_name}](https://huggingface.co/datasets/{dataset_name})",
                            markdown_text(dataset_name))
    quoted = python_string(load_as)
    return re.sub(r'pipeline\("text-generation", model="[^"\n]*"',
                  lambda _: f'pipeline("text-generation", model={quoted}', card)


def complete(path: str, args, base_model: str | None, dataset_name: str | None, load_as: str) -> None:
    """Repair the card TRL wrote at `path` and append the RPG settings."""
    model_name = metadata_load(path) or {}
    model_name = model_name.get("model_name")  # TRL's title; its YAML metadata holds the name verbatim
    with open(path, encoding="utf-8") as f:
        text = repair(f.read(), base_model, dataset_name, load_as, model_name=model_name)
    if dataset_name and hub_repo_id(dataset_name) is None:
        text = text.replace("It has been trained using", f"It was trained on {markdown_text(dataset_name)} using",
                            1)
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


__all__ = ["complete", "hub_repo_id", "markdown_text", "python_string", "repair", "rpg_settings"]
