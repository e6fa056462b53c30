"""What a trainer relies on in TRL, and its digests: the reviewed methods (`REVIEWED_METHODS`, each with the digest
of its normalised source), the owners they are looked up on (`OWNERS`), each trainer's `Review` (`REVIEWS`,
`register_review`) and the comparison with the installed code (`changed_methods`, `method_digests`,
`replaced_here`, `taken_names`). The guard (`guard.check`) and the verdict's own process (`verdict`) read it; it
imports neither.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from dataclasses import dataclass

from .grpo_fields import GRPO_FIELDS, FieldRule

#: The versions whose code the digests below were taken from.
REVIEWED_VERSIONS = {"trl": "1.16.0", "transformers": "5.24.0"}


# ---------------------------------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewedMethod:
    """A method RPG overrides or relies on: `owner` is `"GRPOTrainer"`, `"Trainer"`, `"GRPOConfig"` or
    `"VLLMGeneration"` (where the method is looked up, so an override in between counts), `digest` the
    `source_digest` of the reviewed code."""

    owner: str
    name: str
    digest: str
    why: str

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.name}"


REVIEWED_METHODS: tuple[ReviewedMethod, ...] = (
    ReviewedMethod("GRPOTrainer", "__init__", "b3a4d5ad04475ba0",
                   "RPGTrainer builds on it: it reads `beta` to decide on a reference model (`_compat.trl_sees_beta`) "
                   "and sets every attribute RPG's loss reads (`_compat.INSTANCE_ATTRIBUTES`)"),
    ReviewedMethod("GRPOTrainer", "_compute_loss", "5e1696f089cc35f8",
                   "replaced: RPG's `_compute_loss` re-implements each of its features (masks, importance-sampling "
                   "correction, aggregation, entropy bonus, auxiliary loss); a new one would be silently ignored"),
    ReviewedMethod("GRPOTrainer", "compute_loss", "c8a3316de92970c9", "dispatches to `_compute_loss`"),
    ReviewedMethod("GRPOTrainer", "_generate_and_score_completions", "86098a6c6afecb2a",
                   "wrapped (dynamic sampling, tallies): RPG relies on the batch fields it returns, on its one "
                   "`_calculate_rewards` call per batch, and on its condition for the old-log-prob pass "
                   "(`_compat.trl_skips_old_logps`, rpg_sampler_logps='engine')"),
    ReviewedMethod("GRPOTrainer", "_calculate_rewards", "13c9b1d606fde323",
                   "its return value, the gathered rewards, is captured"),
    ReviewedMethod("GRPOTrainer", "_prepare_inputs", "d8617f874014c408",
                   "buffers and reuses generation batches (`_buffered_inputs`, `_step`), which RPG checkpoints"),
    ReviewedMethod("GRPOTrainer", "_get_per_token_logps_and_entropies", "229ed6106a016c26", "called by RPG's loss"),
    ReviewedMethod("GRPOTrainer", "get_high_entropy_mask", "5910b63f0ea580d0",
                   "called by RPG's loss (`top_entropy_quantile`)"),
    ReviewedMethod("GRPOTrainer", "get_off_policy_mask", "5eea34b4fcdb07c9",
                   "called by RPG's loss (`off_policy_mask_threshold`)"),
    ReviewedMethod("GRPOTrainer", "log", "7c3eb90e1d839e9d",
                   "RPG's override carries the batch metrics forward into `_metrics` before it averages them"),
    ReviewedMethod("GRPOTrainer", "_save_checkpoint", "6f5313d411006bd8",
                   "wrapped: RPG writes its files and the manifest after it, and rotates checkpoints itself"),
    ReviewedMethod("GRPOTrainer", "_load_optimizer_and_scheduler", "108fd4e5bf0dd4c8",
                   "wrapped: RPG restores its state after it on resume"),
    ReviewedMethod("GRPOTrainer", "save_model", "891842af4f28b7de",
                   "wrapped: RPG writes its model card after a final save into output_dir (PEFT's save writes a "
                   "blank one), relying on `_internal_call` marking transformers' own calls"),
    ReviewedMethod("GRPOTrainer", "create_model_card", "0d1f888d680eddcf",
                   "replaced by RPG's card, which keeps what TRL's card carries (tags, tracker links, versions)"),
    ReviewedMethod("GRPOTrainer", "_get_grad_norm", "879dcba334e7231c",
                   "wrapped: the non-finite-gradient guard reads the norm it returns after clipping"),
    ReviewedMethod("GRPOTrainer", "train", "12af1a3d2e4b8ae6",
                   "wrapped: RPG verifies the checkpoint it resumes from and judges the run after it"),
    ReviewedMethod("GRPOTrainer", "_remove_unused_columns", "be453e76dbd69389", "called by dynamic sampling"),
    ReviewedMethod("GRPOTrainer", "_prepare_for_training", "ba121f7f1d0bf192",
                   "wrapped under DeepSpeed: it is where DeepSpeed loads a resumed checkpoint, made weights-only"),
    ReviewedMethod("GRPOTrainer", "_push_from_checkpoint", "a8e4156fde354a4c",
                   "called by RPG once a checkpoint is complete (transformers calls it inside its save, before RPG's "
                   "files and the manifest exist); wrapped: the uploads it queues through `hf_api()` run in RPG's "
                   "worker, a checkpoint's manifest last (`hub_uploads`)"),
    ReviewedMethod("GRPOTrainer", "_finish_current_push", "4ed2d495c8cfaf53",
                   "replaced: the final wait for Hub uploads, bounded, each result read (`hub_uploads`)"),
    ReviewedMethod("Trainer", "_save_checkpoint", "d9833db7afa987cd",
                   "RPG's checkpoint order relies on what it writes and on its rotation (`save_total_limit`)"),
    ReviewedMethod("GRPOConfig", "__post_init__", "aee78ba2191fa4d6",
                   "RPGConfig resolves `steps_per_generation` before it and relies on what it derives after"),
    ReviewedMethod("VLLMGeneration", "generate", "f7c045599c862713",
                   "its output (completions, the engine's log-probs) is checked as it returns (`sampler_logps."
                   "checked_output`), and its log-probs are mu with rpg_sampler_logps='engine'"),
)


def _last_line(code) -> int:
    """The last source line of a code object and the code objects nested in it."""
    last = max((end for _, end, _, _ in code.co_positions() if end), default=code.co_firstlineno)
    return max([last] + [_last_line(const) for const in code.co_consts if hasattr(const, "co_positions")])


def _source_lines(func) -> list[str]:
    """The lines of `func`'s definition, decorators included (what `inspect.getsource` gives, without its
    tokenizer: the block ends at the last line the code object's positions name)."""
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or not hasattr(code, "co_positions"):  # Python 3.10
        return inspect.getsource(func).splitlines()
    lines, _ = inspect.findsource(func)
    return [line.rstrip("\n") for line in lines[code.co_firstlineno - 1:_last_line(code)]]


_DOCSTRING_OPEN = re.compile(r"""^[rRuUbB]{0,2}(\"\"\"|\'\'\')""")


def _without_docstring(lines: list[str], has_docstring: bool) -> list[str]:
    """`lines` without the function's docstring: the first string opened by triple quotes after the `def` line."""
    if not has_docstring:
        return lines
    def_at = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), None)
    for i in range(0 if def_at is None else def_at + 1, len(lines)):
        opened = _DOCSTRING_OPEN.match(lines[i].strip())
        if opened:
            quote, rest = opened.group(1), lines[i].strip()[opened.end():]
            end = i if quote in rest else next((j for j in range(i + 1, len(lines)) if quote in lines[j]), i)
            return lines[:i] + lines[end + 1:]
    return lines


def _without_comment(line: str) -> str:
    """`line` (stripped) without a whole-line comment, or an inline one (`code  # comment`, as ruff and black write
    it) when the code before it has balanced quotes."""
    if line.startswith("#"):
        return ""
    at = line.find("  #")
    if at >= 0 and line[:at].count('"') % 2 == 0 and line[:at].count("'") % 2 == 0:
        return line[:at].rstrip()
    return line


def normalised_source(func) -> str:
    """The source of `func` without its docstring, comments, blank lines and indentation: what a refactor that only
    reformats or re-documents leaves unchanged. Text (not an AST dump, not bytecode), so the digest is the same on
    every Python version; textual (neither `tokenize` nor `ast`, 30x slower: this runs in every process that builds
    a trainer), so a quote-unbalanced line keeps its comment: a false alarm at worst, never a missed change of code
    (a changed line of a multi-line string that starts with `#` is the one blind spot)."""
    lines = _without_docstring(_source_lines(func), inspect.unwrap(func).__doc__ is not None)
    kept = (_without_comment(line.strip()) for line in lines)
    return "\n".join(line for line in kept if line)


@functools.lru_cache(maxsize=None)  # by function object: a trainer built again costs nothing, a patched method counts
def source_digest(func) -> str:
    """The first 16 hex digits of the SHA-256 of `normalised_source(func)`; `"no source"` when there is none (a
    builtin, a C extension, a function made by `exec`)."""
    try:
        text = normalised_source(func)
    except (OSError, TypeError):
        return "no source"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Where each owner of a reviewed method is looked up ("module:attribute"); `register_review` adds others.
OWNERS: dict[str, str] = {"GRPOTrainer": "trl:GRPOTrainer", "Trainer": "transformers:Trainer",
                          "GRPOConfig": "trl:GRPOConfig",
                          "VLLMGeneration": "trl.generation.vllm_generation:VLLMGeneration"}


def _resolve(path: str):
    import importlib

    module, attribute = path.split(":")  # "module:" is the module itself (an owner of module-level functions)
    try:
        return getattr(importlib.import_module(module), attribute, None) if attribute else importlib.import_module(
            module)
    except ImportError:
        return None


def _owners() -> dict:
    return {name: _resolve(path) for name, path in OWNERS.items()}


#: How `changed_methods` marks a reviewed method the installed TRL no longer has (refused without a self-check: RPG's
#: override of it would never be called, or the code it relies on is gone).
GONE = " (no longer exists)"


def changed_methods(owners: dict | None = None, methods: tuple[ReviewedMethod, ...] = REVIEWED_METHODS) -> list[str]:
    """The reviewed methods whose code differs from the reviewed code (or that are gone), as `"GRPOTrainer.name"`."""
    owners = owners or _owners()
    changed = []
    for method in methods:
        func = getattr(owners.get(method.owner), method.name, None)
        if func is None:
            changed.append(f"{method.qualname}{GONE}")
        elif source_digest(func) != method.digest:
            changed.append(method.qualname)
    return changed


def method_digests(review: str = "RPGTrainer", owners: dict | None = None) -> dict[str, str]:
    """`{"GRPOTrainer.name": digest}` of the review's methods as installed ("missing" for a method that is gone)."""
    owners = owners or _owners()
    return {m.qualname: source_digest(f) if (f := getattr(owners.get(m.owner), m.name, None)) else "missing"
            for m in REVIEWS[review].methods}


def replaced_here(review: str = "RPGTrainer", owners: dict | None = None) -> list[str]:
    """Reviewed methods (and owner classes) replaced in this process after TRL was imported (a monkeypatch, a patched
    subclass put in TRL's place): a check in a fresh process would not see them."""
    owners, spec, found = owners or _owners(), REVIEWS[review], []
    for name, path in OWNERS.items():
        owner = owners.get(name)
        where = getattr(owner, "__module__", None) or getattr(owner, "__name__", "")  # a class, or a module
        if owner is not None and where.split(".")[0] != path.split(".")[0].split(":")[0]:
            found.append(f"{name} (now {where}.{getattr(owner, '__qualname__', '')})")
    for method in spec.methods:
        owner = owners.get(method.owner)
        defining = next((c for c in getattr(owner, "__mro__", ()) if method.name in vars(c)), None)
        func = inspect.unwrap(getattr(owner, method.name, None) or (lambda: None))
        where = getattr(func, "__qualname__", "")
        if defining is not None and (where != f"{defining.__qualname__}.{method.name}"
                                     or getattr(func, "__module__", None) != defining.__module__):
            found.append(f"{method.qualname} (now {getattr(func, '__module__', '?')}.{where})")
    return found


def taken_names(review: str = "RPGTrainer", owners: dict | None = None) -> list[str]:
    """Names the RPG trainer defines for itself that its TRL base class now defines too (a TRL method RPG's helper
    would silently replace); the reviewed overrides and TRL's card attributes are RPG's on purpose."""
    owners, spec = owners or _owners(), REVIEWS[review]
    base, rpg = owners.get(spec.base), _resolve(spec.trainer)
    if base is None or rpg is None:
        return []
    reviewed = {m.name for m in spec.methods if m.owner == spec.base} | {"_tag_names", "_name", "_paper"}
    return [f"{spec.base}.{name} (also the name of {rpg.__name__}'s own {name})" for name in vars(rpg)
            if not (name.startswith("__") and name.endswith("__")) and name not in reviewed and hasattr(base, name)]


# ---------------------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Review:
    """What one RPG trainer relies on in TRL: `trainer` ("module:attribute" of the RPG class), `base` and `config`
    (the `OWNERS` names of the TRL trainer it subclasses and of the config whose fields `fields` classifies),
    `methods` (its reviewed methods) and `versions` (those they were taken from). Its self-check properties are
    `upgrade_check.PROPERTIES[name]`."""

    trainer: str
    base: str
    config: str
    methods: tuple[ReviewedMethod, ...]
    fields: dict[str, FieldRule]
    versions: dict[str, str]
    #: The module that registers this review (imported by the verdict's own process); None: this one.
    registered_by: str | None = None


#: Each trainer's review, by name: RPGTrainer's here; another trainer adds its own with `register_review`.
REVIEWS: dict[str, Review] = {"RPGTrainer": Review("trl_rpg.trainers.trainer:RPGTrainer", "GRPOTrainer", "GRPOConfig",
                                                   REVIEWED_METHODS, GRPO_FIELDS, REVIEWED_VERSIONS)}


def register_review(name: str, review: Review, owners: dict[str, str] | None = None) -> None:
    """Add a trainer's review (and the `OWNERS` its methods name, e.g. `{"AsyncGRPOTrainer":
    "trl.experimental.async_grpo:AsyncGRPOTrainer"}`); its trainer calls `check(args, name)` when built."""
    OWNERS.update(owners or {})
    REVIEWS[name] = review


def reviewed_class(review: str) -> type | None:
    """The trainer class that `review` checks (its `Review.trainer`, imported here, at run time, by name: nothing in
    `trl_rpg.upgrade` imports a trainer); None for a review not registered in this process."""
    spec = REVIEWS.get(review)
    return None if spec is None else _resolve(spec.trainer)


__all__ = ["GONE", "OWNERS", "REVIEWED_METHODS", "REVIEWED_VERSIONS", "REVIEWS", "Review", "ReviewedMethod",
           "changed_methods", "method_digests", "normalised_source", "register_review", "replaced_here",
           "reviewed_class", "source_digest", "taken_names"]
