"""The model card of an RPG run, rendered from RPG's own template (`TEMPLATE`) with `huggingface_hub.ModelCard`.

It carries what TRL's card carries (the base model, the data set, the tags, the tracker links, a quick start, the
framework versions, the citations of the method and of TRL) plus the RPG settings, and is right for any base model
and data set: only a name the Hub can hold (`hub_repo_id`, the rule of `huggingface_hub.utils.validate_repo_id`) is
linked to the Hub, and the quick start loads `hub_model_id` when the run is pushed, else the output folder.

Names are the user's text (a model name, a path, a data-set name) and go into Markdown that the Hub renders: every
name that is not linked as a Hub id is written with `markdown_text` (no HTML, no Markdown syntax, one line), and the
quick start's `model=` argument with `python_string`. The YAML metadata holds the names verbatim (`ModelCardData`
quotes them).
"""

from __future__ import annotations

import os
import textwrap
import unicodedata
from importlib.metadata import PackageNotFoundError, version

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

#: TRL's citation, as TRL's model card gives it.
TRL_CITATION = textwrap.dedent("""\
    @software{vonwerra2020trl,
      title   = {{TRL: Transformers Reinforcement Learning}},
      author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
      license = {Apache-2.0},
      url     = {https://github.com/huggingface/trl},
      year    = {2020}
    }""")  # noqa: E501  (one line, as TRL writes it)

#: RPG's card (Jinja, rendered by `huggingface_hub.ModelCard.from_template`). Every value is passed already escaped;
#: `quick_start_model` is a Python string literal.
TEMPLATE = """\
---
{{ card_data }}
---

# Model Card for {{ title }}

This model is a fine-tuned version of {{ base_model_text }}{{ hub_dataset_text }}.
It {{ trained_on_text }}[TRL](https://github.com/huggingface/trl) and trl-rpg's `{{ trainer }}`.{% if adapter %} \
This repository holds a LoRA adapter (PEFT), not full weights: it loads on top of the base model (`pip install \
peft`).{% endif %}

## Quick start

```python
from transformers import pipeline

question = "If you had a time machine, but could only go to the past or the future once and never return, which \
would you choose and why?"
generator = pipeline("text-generation", model={{ quick_start_model }}, device_map="auto")
output = generator([{"role": "user", "content": question}], max_new_tokens=128, return_full_text=False)[0]
print(output["generated_text"])
```

## Training procedure

{{ tracker_badges }}
This model was trained with RPG, a method introduced in [{{ paper_title }}](https://huggingface.co/papers/{{ paper_id \
}}), with `trl_rpg.{{ trainer }}`, a subclass of TRL's `{{ trl_trainer }}`.

### Framework versions

{{ framework_versions }}
{{ rpg_settings }}
## Citations

Cite RPG as:

```bibtex
{{ rpg_citation }}
```

Cite TRL as:

```bibtex
{{ trl_citation }}
```
"""

#: Tracker badges, as TRL's card shows them (the URL comes from the tracker itself).
_BADGES = {
    "wandb": '[<img src="https://raw.githubusercontent.com/wandb/assets/main/wandb-github-badge-28.svg" '
             'alt="Visualize in Weights & Biases" width="150" height="24"/>]({url})',
    "trackio": '[<img src="https://raw.githubusercontent.com/gradio-app/trackio/refs/heads/main/trackio/assets/'
               'badge.png" alt="Visualize in Trackio" title="Visualize in Trackio" width="150" height="24"/>]({url})',
    "comet": '[<img src="https://raw.githubusercontent.com/comet-ml/comet-examples/master/logo/comet_badge.png" '
             'alt="Visualize in Comet" width="150" height="24"/>]({url})',
}

#: Packages whose versions the card lists, with the names it shows.
_FRAMEWORKS = (("trl", "TRL"), ("trl-rpg", "trl-rpg"), ("transformers", "Transformers"), ("torch", "Pytorch"),
               ("datasets", "Datasets"), ("tokenizers", "Tokenizers"))

# Characters with a meaning in (GitHub-flavoured) Markdown inside a line; each is written backslash-escaped.
_MARKDOWN_PUNCTUATION = frozenset("\\`*_[](){}#!|~$")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_DATA_FILE_SUFFIXES = (".parquet", ".json", ".jsonl", ".csv")


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
    """`name` if the Hub can hold it as a repository id and it is not a local path or a data file's name, else None.

    The rule is `huggingface_hub.utils.validate_repo_id`'s (`name` or `owner/name`, letters, digits, `-`, `_`, `.`,
    at most 96 characters each, no `--` or `..`), with ASCII letters only (the Hub's; `validate_repo_id` reads `\\w`
    as Unicode)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(name, str) or not name or not name.isascii() or os.path.exists(name) or \
            name.lower().endswith(_DATA_FILE_SUFFIXES):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def card_tags(tags, trainer_tags, model_config, trackio_url: str | None) -> list[str]:
    """The card's tags, as TRL's `create_model_card` makes them: the user's (a string or a list), `unsloth` for an
    Unsloth model, `hf_jobs` inside a Hugging Face job, the trainer's own, and `trackio:<url>` for a Trackio run;
    sorted, after TRL's `generated_from_trainer`."""
    found = {tags} if isinstance(tags, str) else set(tags or ())
    if hasattr(model_config, "unsloth_version"):
        found.add("unsloth")
    if "JOB_ID" in os.environ:
        found.add("hf_jobs")
    found.update(trainer_tags)
    if trackio_url is not None:
        found = {tag for tag in found if not tag.startswith("trackio:")} | {f"trackio:{trackio_url}"}
    return ["generated_from_trainer", *sorted(found - {"generated_from_trainer"})]


def tracker_urls() -> dict[str, str]:
    """The URLs of the running Weights & Biases run, Trackio space and Comet experiment (those that exist)."""
    from transformers import is_wandb_available

    from .._compat import get_comet_experiment_url, get_trackio_space_url

    urls = {}
    if is_wandb_available():
        import wandb

        if wandb.run is not None:
            urls["wandb"] = wandb.run.url
    urls["trackio"], urls["comet"] = get_trackio_space_url(), get_comet_experiment_url()
    return {name: url for name, url in urls.items() if url}


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


_SCALE_TEXT = {"none": ": reward - group mean, not divided by the std", "group": ": divided by the group's std",
               "batch": ": divided by the batch's std"}


def rpg_settings(args, beta: float, adapter: bool = False) -> str:
    """The card's "RPG settings" section: the objective, the two settings that most change behaviour against GRPO
    (batch reuse and `scale_rewards`), and what the saved output is."""
    from .describe import batch_layout

    steps = batch_layout(args).optimizer_steps_per_generation
    reuse = (f"`{steps}` (steps_per_generation={args.steps_per_generation}, gradient_accumulation_steps="
             f"{args.gradient_accumulation_steps}, num_iterations={args.num_iterations})")
    output = ("LoRA adapter (PEFT): load it on top of the base model" if adapter else
              "full model weights")
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
        | batch reuse (optimizer steps per generation batch) | {reuse} |
        | advantage (`scale_rewards`) | `{args.scale_rewards}`{_SCALE_TEXT.get(args.scale_rewards, "")} |
        | saved output | {output} |
        """)


def async_rpg_settings(args, beta: float, adapter: bool = False) -> str:
    """`AsyncRPGTrainer`'s "RPG settings" section: the objective, the staleness allowed and what is saved."""
    output = "LoRA adapter (PEFT): load it on top of the base model" if adapter else "full model weights"
    clip = (args.epsilon, args.epsilon_high, args.rpg_dual_clip_c)
    return textwrap.dedent(f"""
        ## RPG settings

        Trained with RPG ([arXiv:2505.17508](https://huggingface.co/papers/2505.17508)) via `trl_rpg.AsyncRPGTrainer`
        (asynchronous rollouts from a vLLM server):

        | setting | value |
        |---|---|
        | divergence | `{args.rpg_divergence}` |
        | estimator | `{args.rpg_estimator}` |
        | reference policy | `sampling` (the policy version that sampled each sample) |
        | beta | `{beta}` |
        | clip (eps_low, eps_high, c) | `{clip}` |
        | staleness allowed (`max_staleness`) | `{args.max_staleness}` |
        | advantage | the rollout worker's: (reward - group mean) / group std |
        | saved output | {output} |
        """)


def render(args, *, base_model: str | None, model_name: str | None, dataset_name: str | None, load_as: str,
           tags: list[str], adapter: bool = False, trackers: dict[str, str] | None = None,
           trainer: str = "RPGTrainer", trl_trainer: str = "GRPOTrainer", settings=rpg_settings):
    """The card (a `huggingface_hub.ModelCard`) of a run with config `args`, trained from `base_model` (the model's
    `_name_or_path`: a Hub id, a local folder, or empty for a model built in code) on `dataset_name`, to be loaded as
    `load_as`; `trainer` (subclass of TRL's `trl_trainer`) trained it, `settings(args, beta, adapter)` is its RPG
    settings section."""
    from huggingface_hub import ModelCard, ModelCardData

    base_id, dataset_id = hub_repo_id(base_model), hub_repo_id(dataset_name)
    if base_id:
        base_model_text = f"[{base_id}](https://huggingface.co/{base_id})"
    else:
        base_model_text = f"the local model {markdown_text(base_model)}" if base_model else "a model built in code"
    if dataset_name and not dataset_id:
        trained_on_text = f"was trained on {markdown_text(dataset_name)} using "
    else:
        trained_on_text = "has been trained using "
    card_data = ModelCardData(
        base_model=base_model if base_model and not os.path.isdir(base_model) else None,  # TRL's rule
        datasets=dataset_id, library_name="transformers" if not adapter else "peft", model_name=model_name,
        tags=tags)
    return ModelCard.from_template(
        card_data, template_str=TEMPLATE,
        title=markdown_text(model_name or os.path.basename(os.path.abspath(args.output_dir))),
        base_model_text=base_model_text,
        hub_dataset_text=f" on the [{dataset_id}](https://huggingface.co/datasets/{dataset_id}) dataset"
        if dataset_id else "",
        trained_on_text=trained_on_text, adapter=adapter, quick_start_model=python_string(load_as), trainer=trainer,
        trl_trainer=trl_trainer,
        tracker_badges="\n".join(_BADGES[name].format(url=url) for name, url in (trackers or {}).items()),
        paper_title=RPG_PAPER["title"], paper_id=RPG_PAPER["id"],
        framework_versions="\n".join(f"- {label}: {_version(package)}" for package, label in _FRAMEWORKS)
        + (f"\n- PEFT: {_version('peft')}" if adapter else ""),
        rpg_settings=settings(args, args.beta, adapter), rpg_citation=RPG_PAPER["citation"],
        trl_citation=TRL_CITATION)


def write(path: str, args, model, *, load_as: str, model_name: str | None, dataset_name: str | None, tags,
          trainer_tags, **trainer) -> None:
    """Render the card of `model` (unwrapped: a PEFT model makes an adapter's card) and save it at `path`;
    `trainer`: `render`'s `trainer`, `trl_trainer` and `settings`."""
    from accelerate.utils import is_peft_model

    trackers = tracker_urls()
    card = render(args, base_model=getattr(model.config, "_name_or_path", None) or None, model_name=model_name,
                  dataset_name=dataset_name, load_as=load_as,
                  tags=card_tags(tags, trainer_tags, model.config, trackers.get("trackio")),
                  adapter=is_peft_model(model), trackers=trackers, **trainer)
    card.save(path)


__all__ = ["RPG_PAPER", "TEMPLATE", "TRL_CITATION", "async_rpg_settings", "card_tags", "hub_repo_id",
           "markdown_text", "python_string", "render", "rpg_settings", "tracker_urls", "write"]
