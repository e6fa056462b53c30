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
import os
import warnings

from .grpo_fields import GRPO_FIELDS, VERDICTS, FieldRule, drop_in_table, full_table, unclassified_fields
from .reviews import (  # noqa: F401 - re-exported: the guard's public names
    GONE,
    OWNERS,
    REVIEWED_METHODS,
    REVIEWED_VERSIONS,
    REVIEWS,
    Review,
    ReviewedMethod,
    _owners,
    _resolve,
    changed_methods,
    method_digests,
    normalised_source,
    register_review,
    replaced_here,
    reviewed_class,
    source_digest,
    taken_names,
)

#: Set to 1 to train anyway (a warning instead of the error), after reviewing what `check()` names.
ALLOW_ENV = "TRL_RPG_ALLOW_UNREVIEWED"



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
            "trl_rpg/trainers/trainer.py and trl_rpg/trainers/config.py (python scripts/trl_upgrade_diff.py lists "
            "it), record it in "
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
