"""The upgrade guard: a TRL/transformers whose code RPG overrides or relies on differs from the reviewed code, or whose
GRPOConfig has a field RPG has not classified, is refused when a trainer is built, naming what to review; the
README's drop-in table is the classification table."""

import dataclasses
import re
from pathlib import Path

import pytest
import trl
from trl import GRPOConfig, GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer, _compat
from trl_rpg.upgrade import guard as upgrade_guard
from trl_rpg.upgrade.guard import GRPO_FIELDS, REVIEWED_METHODS, VERDICTS, UnreviewedUpgrade

ROOT = Path(__file__).resolve().parents[1]


def _changed_compute_loss(self, model, inputs):
    return super(GRPOTrainer, self).compute_loss(model, inputs)  # stands for a TRL release's new code


@dataclasses.dataclass
class _GRPOConfigWithANewField(GRPOConfig):
    new_loss_knob: float = dataclasses.field(default=0.0, metadata={"help": "a field a new TRL could add"})


def test_the_installed_code_differs_from_the_reviewed_only_in_a_package_whose_version_differs():
    """On the reviewed versions (CI's full suite: constraints.txt) nothing differs and `check()` has nothing to do; on
    another admitted version (CI's smoke subsets), only the code of a package whose version moved differs."""
    from importlib.metadata import version

    moved = {name for name, reviewed in upgrade_guard.REVIEWED_VERSIONS.items() if version(name) != reviewed}
    packages, _ = upgrade_guard.attributed(upgrade_guard.changed_methods())
    assert set(packages) <= moved, packages
    if not moved:
        assert upgrade_guard.changed_methods() == [] and upgrade_guard.unclassified_fields() == []
        assert upgrade_guard.check() == []


def test_a_changed_compute_loss_refuses_to_build_a_trainer_naming_it_and_how_to_proceed(monkeypatch, tmp_path):
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _changed_compute_loss)
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    assert "GRPOTrainer._compute_loss" in upgrade_guard.changed_methods()
    args = RPGConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(UnreviewedUpgrade) as error:  # before the (missing) model is looked at
        RPGTrainer(model=str(tmp_path / "no-such-model"), reward_funcs=len, args=args)
    message = str(error.value)
    assert "GRPOTrainer._compute_loss" in message and "REVIEWED_METHODS" in message
    assert f"trl {trl.__version__}" in message and "pip install \"trl==1.16.0\" \"transformers==5.24.0\"" in message
    assert "TRL_RPG_ALLOW_UNREVIEWED=1" in message and "tests/test_upgrade_guard.py" in message


def test_a_grpo_config_field_rpg_has_not_classified_is_refused(monkeypatch):
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    assert upgrade_guard.unclassified_fields(_GRPOConfigWithANewField) == ["new_loss_knob"]
    monkeypatch.setattr(trl, "GRPOConfig", _GRPOConfigWithANewField)  # what `check()` reads
    with pytest.raises(UnreviewedUpgrade, match=r"GRPOConfig fields are not classified by RPG: new_loss_knob .*"
                                                r"GRPO_FIELDS, the table of the README's drop-in section"):
        upgrade_guard.check()


def test_the_environment_variable_turns_the_error_into_a_warning(monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _changed_compute_loss)
    monkeypatch.setenv(upgrade_guard.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"GRPOTrainer._compute_loss.*TRL_RPG_ALLOW_UNREVIEWED is set"):
        assert "GRPOTrainer._compute_loss" in upgrade_guard.check()
    monkeypatch.setenv(upgrade_guard.ALLOW_ENV, "0")
    with pytest.raises(UnreviewedUpgrade):
        upgrade_guard.check()


def _documented(x):
    """Docstring."""
    # a comment
    y = x + 1  # why

    return y


def _documented_again(x):
    """Another docstring,
    on two lines."""
    y = x + 1  # another reason
    return y


def _changed(x):
    """Docstring."""
    y = x + 2  # why
    return y


def _with_a_hash_in_a_string(x):
    return f"{x}  # not a comment"


def _with_another_hash_in_a_string(x):
    return f"{x}  # not a comment either"


def test_a_digest_ignores_comments_docstrings_and_layout_but_not_code():
    digest = upgrade_guard.source_digest
    assert upgrade_guard.normalised_source(_documented) == "def _documented(x):\ny = x + 1\nreturn y"
    assert digest(_documented_again) != digest(_documented)  # the name differs...
    assert upgrade_guard.normalised_source(_documented_again).split("\n")[1:] == \
        upgrade_guard.normalised_source(_documented).split("\n")[1:]  # ...the body does not
    assert upgrade_guard.normalised_source(_changed).split("\n")[1:] == ["y = x + 2", "return y"]
    assert digest(_with_a_hash_in_a_string) != digest(_with_another_hash_in_a_string)
    assert digest(len) == "no source"


def test_every_method_rpg_overrides_or_calls_is_reviewed():
    reviewed = {m.name for m in REVIEWED_METHODS if m.owner == "GRPOTrainer"}
    overridden = {name for name, value in vars(RPGTrainer).items()
                  if callable(value) and hasattr(GRPOTrainer, name) and name not in ("__init_subclass__",)}
    assert overridden - reviewed == set(), "RPGTrainer overrides methods the guard does not check"
    assert set(_compat.OVERRIDDEN) | set(_compat.CALLED) <= reviewed
    assert len({m.qualname for m in REVIEWED_METHODS}) == len(REVIEWED_METHODS)
    assert all(re.fullmatch(r"[0-9a-f]{16}", m.digest) and m.why for m in REVIEWED_METHODS)


def test_every_grpo_config_field_is_classified_once_with_a_reason():
    assert set(GRPO_FIELDS) == {f.name for f in dataclasses.fields(GRPOConfig)}  # no stale row either
    assert all(rule.verdict in VERDICTS and len(rule.reason) > 10 for rule in GRPO_FIELDS.values())


def _rules(verdict):
    return [rule.name for rule in GRPO_FIELDS.values() if rule.verdict == verdict]


def test_the_table_says_what_rpg_does():
    """"changed default": RPGConfig's default differs from GRPOConfig's; "refused": a non-default value is refused
    naming the field; every field of RPGConfig that is GRPOConfig's keeps GRPO's default unless its row says so."""
    rpg = RPGConfig(output_dir="o", use_cpu=True, bf16=False, report_to="none")
    grpo = GRPOConfig(output_dir="o", use_cpu=True, bf16=False, report_to="none")
    differ = {f.name for f in dataclasses.fields(GRPOConfig) if getattr(rpg, f.name) != getattr(grpo, f.name)}
    assert differ - {"generation_batch_size"} == set(_rules("changed default"))  # derived from steps_per_generation
    refused_values = {"sync_ref_model": True, "delta": 2.0}
    assert set(refused_values) == set(_rules("refused"))
    for name, value in refused_values.items():
        with pytest.raises(ValueError, match=f"`{name}`"):
            RPGConfig(output_dir="o", use_cpu=True, bf16=False, report_to="none", **{name: value})


def test_the_readme_drop_in_section_holds_the_table_and_docs_every_row():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert upgrade_guard.drop_in_table() in readme, ("regenerate it: python -c 'from trl_rpg.upgrade import guard; "
                                                     "print(guard.drop_in_table())'")
    docs = (ROOT / "docs" / "drop-in.md").read_text(encoding="utf-8")
    assert upgrade_guard.full_table() in docs
    for name in _rules("changed default") + _rules("refused") + _rules("ignored"):
        assert f"| `{name}` |" in readme
    assert f"`GRPOConfig`'s {len(GRPO_FIELDS)} fields" in " ".join(readme.split())

