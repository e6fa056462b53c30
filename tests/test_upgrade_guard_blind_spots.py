"""The upgrade guard's blind spots (issue 33 section 1): a change inside a string that holds `  #` is a change of
code, and a reviewed method that a TRL release removed is reported, not skipped."""


import pytest
from trl import GRPOTrainer

from trl_rpg.upgrade import guard as upgrade_guard


def _with_a_hash_in_a_string(x):
    return f"{x}  # not a comment"


def _with_another_hash_in_a_string(x):
    return f"{x}  # not a comment either"


def _with_a_comment(x):
    return x  # a comment


def test_a_change_inside_a_string_after_a_hash_changes_the_digest():
    """`  #` inside a string (quotes unbalanced before it) starts no comment: the text after it is code. Compared
    without the `def` line, which differs anyway."""
    def body(func):
        return upgrade_guard.normalised_source(func).split("\n")[1:]

    assert body(_with_a_hash_in_a_string) == ['return f"{x}  # not a comment"']
    assert body(_with_a_hash_in_a_string) != body(_with_another_hash_in_a_string)
    assert body(_with_a_comment) == ["return x"]  # a real inline comment still does not count


def test_a_reviewed_method_that_trl_removed_is_reported(monkeypatch):
    """A TRL release without `GRPOTrainer._compute_loss` (RPG's loss replaces it: its features would be lost
    unseen): named as gone, and building a trainer is refused."""
    body = {k: v for k, v in vars(GRPOTrainer).items() if k not in ("_compute_loss", "__dict__", "__weakref__")}
    release = type("GRPOTrainer", GRPOTrainer.__bases__, body)  # TRL's class without it
    owners = {**upgrade_guard._owners(), "GRPOTrainer": release}
    assert upgrade_guard.changed_methods(owners) == ["GRPOTrainer._compute_loss (no longer exists)"]
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    monkeypatch.setattr(upgrade_guard, "_owners", lambda: owners)
    monkeypatch.setattr("trl_rpg.upgrade.verdict.verdict", lambda *a, **k: pytest.fail("no self-check for it"))
    with pytest.raises(upgrade_guard.UnreviewedUpgrade, match=r"GRPOTrainer\._compute_loss \(no longer exists\)"):
        upgrade_guard.check()
