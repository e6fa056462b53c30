"""The upgrade guard: RPG trains on the reviewed TRL, or on a changed TRL that passes the upgrade self-check.

`RPGTrainer._compute_loss` re-implements every feature of GRPO's monolithic `_compute_loss`, and the trainer wraps
other `GRPOTrainer` / `Trainer` methods. A TRL release that changes one of them, or adds a `GRPOConfig` field (a new
loss option, a new mask), could otherwise train *silently* with the change ignored (TRL issue #6807 shows what a
stale copy of `_compute_loss` does). `_compat` catches renamed internals; this module catches changed ones:

- `REVIEWED_METHODS`: every `GRPOTrainer` / `Trainer` method RPG overrides or relies on, each with why and the digest
  of its normalised source (`source_digest`: comments, docstring, blank lines and indentation do not count).
- `GRPO_FIELDS` (`trl_rpg.upgrade.grpo_fields`): every `GRPOConfig` field, classified with its reason.
- `taken_names`: a name RPG's trainer uses for its own helper (all `_rpg_*`) that TRL now defines too.

The digest is the first signal. `check()`, run when an `RPGTrainer` is built (not at import: the objective library,
the rewards, the evaluation and `--help` keep working on any version), does nothing on the reviewed code. On other
code the upgrade self-check decides (`upgrade_check`, run once per installed version in a fresh process and cached
by `upgrade_verdict`): passed, RPG trains, the run that ran the check warning once naming the package whose code
changed, each method by its owner and what was checked, and a new `GRPOConfig` field is accepted at its default only;
failed, `UnreviewedUpgrade` names the property. A reviewed method replaced in this process (a monkeypatch), which a
fresh process cannot see, is refused. `TRL_RPG_ALLOW_UNREVIEWED=1` turns each refusal into a warning, for someone who
reviewed the difference and must train before a trl-rpg release records it. Another trainer registers its own
`Review` (`register_review`) and properties (`upgrade_check.register_properties`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
import re
import warnings
from dataclasses import dataclass

from .grpo_fields import GRPO_FIELDS, VERDICTS, FieldRule, drop_in_table, full_table, unclassified_fields

#: The versions whose code the digests below were taken from.
REVIEWED_VERSIONS = {"trl": "1.16.0", "transformers": "5.24.0"}
#: Set to 1 to train anyway (a warning instead of the error), after reviewing what `check()` names.
ALLOW_ENV = "TRL_RPG_ALLOW_UNREVIEWED"



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


#: Each trainer's review, by name: RPGTrainer's here; another trainer adds its own with `register_review`.
REVIEWS: dict[str, Review] = {"RPGTrainer": Review("trl_rpg.trainers.trainer:RPGTrainer", "GRPOTrainer", "GRPOConfig",
                                                   REVIEWED_METHODS, GRPO_FIELDS, REVIEWED_VERSIONS)}


def register_review(name: str, review: Review, owners: dict[str, str] | None = None) -> None:
    """Add a trainer's review (and the `OWNERS` its methods name, e.g. `{"AsyncGRPOTrainer":
    "trl.experimental.async_grpo:AsyncGRPOTrainer"}`); its trainer calls `check(args, name)` when built."""
    OWNERS.update(owners or {})
    REVIEWS[name] = review


def reviewed_class(review: str) -> type | None:
    """The trainer class that `review` checks (its `Review.trainer`, imported here, at run time); None for a review
    not registered in this process yet (the async one registers itself when its properties are imported, and they
    name their own classes)."""
    spec = REVIEWS.get(review)
    return None if spec is None else _resolve(spec.trainer)


class UnreviewedUpgrade(RuntimeError):
    """The installed TRL/transformers differ from the reviewed code in what RPG relies on."""


def _listed(items) -> str:
    return ", ".join(items)


def defined_in(qualname: str, owners: dict | None = None) -> tuple[str, str]:
    """`(package, "Class.name")` of the code a reviewed method's lookup finds: `GRPOTrainer._prepare_for_training`
    is transformers' `Trainer._prepare_for_training` (GRPOTrainer inherits it). A method that is gone, or a name TRL
    takes, is its owner's (the package `OWNERS` imports it from)."""
    owners = owners or _owners()
    owner_name, _, rest = qualname.partition(".")
    name = rest.split(" ", 1)[0]
    owner = owners.get(owner_name)
    defining = next((c for c in getattr(owner, "__mro__", ()) if name in vars(c)), None)
    if defining is None or rest != name:  # gone, or "name (also the name of ...)"
        return OWNERS.get(owner_name, owner_name).split(".")[0].split(":")[0], f"{owner_name}.{name}"
    return defining.__module__.split(".")[0], f"{defining.__qualname__}.{name}"


def attributed(methods: list[str], owners: dict | None = None) -> tuple[list[str], list[str]]:
    """`(packages, methods)`: the packages whose code changed, in order, and each changed method named by its
    package and the class that defines it (`transformers' Trainer._prepare_for_training (GRPOTrainer inherits
    it)`), with what `changed_methods` / `taken_names` said after its name (`(no longer exists)`, ...)."""
    owners = owners or _owners()
    packages, named = [], []
    for qualname in methods:
        package, where = defined_in(qualname, owners)
        packages += [package] if package not in packages else []
        owner_name, _, rest = qualname.partition(".")
        name, _, note = rest.partition(" ")
        inherits = f" ({owner_name} inherits it)" if where != f"{owner_name}.{name}" else ""
        possessive = f"{package}'" if package.endswith("s") else f"{package}'s"
        named.append(f"{possessive} {where}{inherits}{' ' + note if note else ''}")
    return packages, named


def describe(methods: list[str], fields: list[str], versions: dict[str, str], verdict=None,
             replaced: list[str] | None = None, reviewed_versions: dict[str, str] = REVIEWED_VERSIONS,
             owners: dict | None = None) -> str:
    """The error text: what changed (each method by its package and class, looked up in `owners`), why RPG does not
    train on it, how to proceed."""
    installed = _listed(f"{name} {version}" for name, version in versions.items())
    reviewed = _listed(f"{name} {version}" for name, version in reviewed_versions.items())
    parts = []
    if methods:
        parts.append(f"these methods RPG overrides or relies on differ from the reviewed code: "
                     f"{_listed(attributed(methods, owners)[1])} (why each matters: "
                     "trl_rpg.upgrade.guard.REVIEWED_METHODS)")
    if fields:
        parts.append(f"these GRPOConfig fields are not classified by RPG: {_listed(fields)} (each must be accepted,"
                     " changed, refused or ignored with a reason: trl_rpg.upgrade.guard.GRPO_FIELDS, the table of the"
                     " README's drop-in section)")
    if replaced:
        why = (f"{_listed(replaced)} were replaced in this process after TRL was imported, which the upgrade "
               "self-check (run in a fresh process) cannot see")
    elif verdict is not None and verdict.error:
        why = f"the upgrade self-check gave no verdict: {verdict.error}"
    elif verdict is not None:
        why = "the upgrade self-check failed: " + "; ".join(f"{r['name']}: {r['detail']}" for r in verdict.failed)
    else:
        why = "the upgrade self-check did not run"
    pins = " ".join(f'"{name}=={version}"' for name, version in reviewed_versions.items())
    return (f"RPGTrainer was reviewed against {reviewed}; installed: {installed}. On this version "
            f"{'; '.join(parts)}; {why}. RPG could train with a changed behaviour silently ignored. To proceed: "
            f"install the reviewed versions (pip install {pins}), or review the difference against "
            "trl_rpg/trainers/trainer.py and trl_rpg/trainers/config.py (python scripts/trl_upgrade_diff.py lists it), record it in "
            f"trl_rpg/upgrade/guard.py and run tests/test_upgrade_guard.py, or set {ALLOW_ENV}=1 to train anyway "
            "with a warning.")


def describe_passed(methods: list[str], fields: list[str], versions: dict[str, str], verdict,
                    reviewed_versions: dict[str, str] = REVIEWED_VERSIONS, owners: dict | None = None) -> str:
    """The one warning of the run that checked an unreviewed TRL or transformers and saw the self-check pass: the
    package whose code changed with its version, each changed method by its owner, what was checked."""
    from .self_check import PROPERTIES

    whys = {p.name: p.why for review in PROPERTIES.values() for p in review}
    checked = "; ".join(whys.get(r["name"], r["name"]) for r in verdict.results)
    packages, named = attributed(methods, owners)
    config = _owners().get("GRPOConfig")
    for name in fields:  # a field is its defining class's: TrainingArguments' are transformers'
        package = next((c.__module__.split(".")[0] for c in getattr(config, "__mro__", ())
                        if name in vars(c).get("__annotations__", {})), "trl")
        packages += [package] if package not in packages else []
    changes = [f"changed methods {_listed(named)}"] if methods else []
    changes += [f"new GRPOConfig fields {_listed(fields)} (accepted at their defaults only)"] if fields else []
    where = " and ".join(f"{package} {versions.get(package, '')}".strip() for package in packages)
    return (f"trl-rpg: the code RPG relies on in {where} differs from the reviewed "
            f"versions ({_listed(f'{n} {v}' for n, v in reviewed_versions.items())}): {'; '.join(changes)}. The "
            f"upgrade self-check passed on it ({checked}), so RPG trains on it. Said once per installed version"
            f"{f' (verdict cached in {verdict.cached})' if verdict.cached else ' (the verdict could not be cached)'}"
            "; `trl-rpg env` shows it again.")


def _allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


_SAID: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def new_field_values(args, fields: list[str], config_class) -> list[str]:
    """The unclassified `fields` that `args` sets to another value than their default, as `name=value (default)`."""
    if args is None:
        return []
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(config_class) if f.name in fields
                and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}
    return [f"{name}={getattr(args, name)!r} (default {default!r})" for name, default in defaults.items()
            if getattr(args, name, default) != default]


def check(args=None, review: str = "RPGTrainer") -> list[str]:
    """Nothing to do on the reviewed code. Otherwise the upgrade self-check decides (`upgrade_verdict`, cached):
    passed, one warning and RPG trains (a new GRPOConfig field set to another value than its default is refused);
    failed, `UnreviewedUpgrade` naming the property (a warning with `TRL_RPG_ALLOW_UNREVIEWED=1`). Returns the
    changes found (empty: the reviewed code)."""
    from importlib.metadata import version

    from . import verdict as upgrade_verdict
    spec, owners = REVIEWS[review], _owners()
    methods = changed_methods(owners, spec.methods) + taken_names(review, owners)
    fields = unclassified_fields(owners.get(spec.config), spec.fields)
    if (not methods and not fields) or os.environ.get(upgrade_verdict.IN_CHECK_ENV):
        return methods + fields
    versions = {name: version(name) for name in spec.versions}
    replaced = replaced_here(review, owners)
    gone = [name for name in methods if name.endswith(GONE)]  # an override TRL no longer calls: no check can pass
    verdict = None if replaced or gone else upgrade_verdict.verdict(review, method_digests(review, owners), fields)
    if verdict is not None and verdict.passed:
        if verdict.fresh or not verdict.cached:  # the run that ran the check (or one that could not cache it)
            _warn_once(describe_passed(methods, fields, versions, verdict, spec.versions))
        values = new_field_values(args, fields, owners.get(spec.config))
        if values:
            message = (f"{_listed(values)}: GRPOConfig field(s) of trl {versions.get('trl')} that trl-rpg has not "
                       "reviewed, checked at their defaults only (RPG may ignore another value): leave them at their "
                       f"defaults, or set {ALLOW_ENV}=1 to train anyway.")
            if not _allowed():
                raise UnreviewedUpgrade(message)
            _warn_once(f"{message} ({ALLOW_ENV} is set: training anyway.)")
        return methods + fields
    message = describe(methods, fields, versions, verdict, replaced, spec.versions)
    if _allowed():
        warnings.warn(f"{message} ({ALLOW_ENV} is set: training anyway.)", UserWarning, stacklevel=3)
        return methods + fields
    raise UnreviewedUpgrade(message)


def status(review: str = "RPGTrainer") -> str:
    """One line for a bug report (`trl-rpg env`): the reviewed code, or the self-check's verdict on this TRL."""
    from . import verdict as upgrade_verdict
    spec, owners = REVIEWS[review], _owners()
    methods = changed_methods(owners, spec.methods) + taken_names(review, owners)
    fields = unclassified_fields(owners.get(spec.config), spec.fields)
    if not methods and not fields:
        return "the reviewed code (no self-check needed)"
    verdict = upgrade_verdict.verdict(review, method_digests(review, owners), fields)
    changed = _listed(attributed(methods, owners)[1] + [f"new field {name}" for name in fields])
    if verdict.passed:
        return f"self-check passed ({changed}; {verdict.cached or 'not cached'})"
    failed = verdict.error or "; ".join(f"{r['name']}: {r['detail']}" for r in verdict.failed)
    return f"self-check FAILED, RPGTrainer refuses to train: {failed} ({changed})"


__all__ = ["ALLOW_ENV", "GRPO_FIELDS", "OWNERS", "REVIEWED_METHODS", "REVIEWED_VERSIONS", "REVIEWS", "VERDICTS",
           "FieldRule", "Review", "ReviewedMethod", "UnreviewedUpgrade", "attributed", "changed_methods", "check",
           "defined_in", "describe", "describe_passed", "drop_in_table", "full_table", "method_digests",
           "new_field_values", "normalised_source", "register_review", "replaced_here", "reviewed_class",
           "source_digest", "status", "taken_names", "unclassified_fields"]
