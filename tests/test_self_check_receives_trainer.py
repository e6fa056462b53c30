"""The upgrade self-check receives the trainer class it checks (from the `Review`), so `trl_rpg.upgrade.self_check`
imports no trainer module: no import circle trainers/trainer.py -> upgrade/guard.py -> upgrade/verdict.py ->
upgrade/self_check.py -> trainers/trainer.py."""

import ast
from pathlib import Path

from trl_rpg import RPGTrainer
from trl_rpg.upgrade import guard as upgrade_guard
from trl_rpg.upgrade import self_check as upgrade_check


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or "") + ":" + ",".join(a.name for a in node.names))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_upgrade_check_imports_no_trainer():
    imported = _imported_modules(Path(upgrade_check.__file__))  # every module of trl_rpg.upgrade: tests/test_layers.py
    assert not [name for name in imported if "trainer" in name.split(":")[0] and "trl" != name.split(".")[0]], imported


def test_the_review_names_the_class_the_check_receives(tmp_path):
    assert upgrade_guard.reviewed_class("RPGTrainer") is RPGTrainer
    assert upgrade_guard.reviewed_class("not a review") is None
    context = upgrade_check.default_context(str(tmp_path), upgrade_guard.reviewed_class("RPGTrainer"))
    assert context.rpg_class is RPGTrainer
