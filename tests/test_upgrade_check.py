"""The upgrade self-check (issue 36 s.1): a TRL whose reviewed code changed trains if it keeps the behaviour RPG
relies on, with one warning naming the version and what was checked, and is refused naming the property when not.

- End to end: a copy of the installed TRL, changed as a newer release could be (code of `_compute_loss` reworded,
  the same behaviour; a new `GRPOConfig` field; version 1.17.0), first on `sys.path` of a fresh process: warned and
  trained, the verdict cached, the new field refused at another value than its default.
- TRL changed as pull requests #5413 and #7188 would change it (tests/_trl_patches.py) is refused by the property
  that each breaks: in this process (a patched `GRPOTrainer` subclass), and on a patched copy of the package.
- The cache (where, the key, an unwritable folder), a method replaced in this process, a name TRL takes.
"""

import json
import os
import subprocess
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

import pytest
from _trl_patches import PR_5413, PR_7188, patched_class, patched_copy
from trl import GRPOTrainer

from trl_rpg.trainers.trainer import RPGTrainer
from trl_rpg.upgrade import guard as upgrade_guard
from trl_rpg.upgrade import verdict as upgrade_verdict
from trl_rpg.upgrade.self_check import PROPERTIES, CheckContext
from trl_rpg.upgrade.verdict import run_properties

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "_unreviewed_trl_script.py"

#: A newer TRL that keeps the behaviour: `_compute_loss` reworded (its digest changes) and a new GRPOConfig field.
SAME_BEHAVIOUR = {"_compute_loss": [("        coef_1 = torch.exp(log_importance_weights)\n",
                                     "        coef_1 = log_importance_weights.exp()  # reworded\n")]}
NEW_FIELD = ("trainer/grpo_config.py", "    def __post_init__(self):\n",
             "    kl_log_ratio_clip: float | None = field(default=None, metadata={\"help\": \"A new option.\"})\n\n"
             "    def __post_init__(self):\n")


def _properties(*names):
    return [p for p in PROPERTIES["RPGTrainer"] if p.name in names]


def _patched_context(patch) -> CheckContext:
    grpo = patched_class(patch)
    return CheckContext(grpo_class=grpo, rpg_class=type("PatchedRPGTrainer", (RPGTrainer, grpo), {}), workdir="")


def _environment(site: Path, tmp_path: Path) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "TRL_RPG_CACHE"}  # the cache under tmp_path
    return {**environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def newer_trl(tmp_path_factory) -> Path:
    """A folder holding TRL "1.17.0": the installed TRL with `_compute_loss` reworded and a new GRPOConfig field."""
    return patched_copy(tmp_path_factory.mktemp("site"), SAME_BEHAVIOUR, "1.17.0", extra_edits=[NEW_FIELD])


def test_a_newer_trl_that_keeps_the_behaviour_trains_with_one_warning_and_its_new_field_at_its_default(tmp_path,
                                                                                                       newer_trl):
    site = newer_trl
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                          env=_environment(site, tmp_path), timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["trl_file"].startswith(str(site))  # the changed copy, not the installed TRL
    assert report["global_step"] == 1  # trained
    [warning] = report["warnings"]  # one warning for two trainers
    transformers = version("transformers")  # named too where it is not the reviewed one (CI's smoke subsets)
    reviewed = transformers == upgrade_guard.REVIEWED_VERSIONS["transformers"]
    also = "" if reviewed else f" and transformers {transformers}"
    assert (f"the code RPG relies on in trl 1.17.0{also} differs from the reviewed versions (trl 1.16.0, transformers "
            "5.24.0)") in warning
    assert "changed methods trl's GRPOTrainer._compute_loss" in warning
    assert "new GRPOConfig fields kl_log_ratio_clip (accepted at their defaults only)" in warning
    for prop in PROPERTIES["RPGTrainer"]:
        assert prop.why in warning
    assert report["self_check_runs"] == 1  # the second trainer read the cached verdict
    cached = list((tmp_path / "cache" / "trl-rpg" / "upgrade-check").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["passed"] is True
    assert str(cached[0]) in warning
    assert report["refused"].startswith("kl_log_ratio_clip=5.0 (default None): GRPOConfig field(s) of trl 1.17.0 "
                                        "that trl-rpg has not reviewed, checked at their defaults only")


@pytest.mark.slow
def test_a_copy_of_trl_changed_as_prs_5413_and_7188_is_refused_naming_each_property(tmp_path):
    """The self-check's own process (as `upgrade_verdict` starts it) on a copy of TRL changed as both PRs would: the
    two properties they break (the others train; the test of the reviewed-behaviour copy above runs them all)."""
    site = patched_copy(tmp_path / "site", {**PR_7188, "_generate_and_score_completions":
                                            PR_5413["_generate_and_score_completions"],
                                            "_compute_loss": PR_5413["_compute_loss"] + PR_7188["_compute_loss"]},
                        "1.18.0.dev0")
    request = json.dumps({"properties": [[p.name, p.why, p.target] for p in _properties("generation_batch",
                                                                                         "grpo_kl_term")]})
    done = subprocess.run([sys.executable, "-m", "trl_rpg.upgrade.verdict"], input=request, capture_output=True,
                          text=True, env=_environment(site, tmp_path), timeout=900)
    line = [x for x in done.stdout.splitlines() if x.startswith(upgrade_verdict.RESULT_PREFIX)][-1]
    results = {r["name"]: r for r in json.loads(line[len(upgrade_verdict.RESULT_PREFIX):])["results"]}
    assert not results["generation_batch"]["passed"] and not results["grpo_kl_term"]["passed"]
    assert "lacks old_per_token_logps, importance_sampling_ratio" in results["generation_batch"]["detail"]
    assert "importance_sampling_level='sequence'" in results["grpo_kl_term"]["detail"]


@pytest.mark.slow
def test_the_maintainer_script_lists_the_changed_method_with_its_diff_and_the_new_field(newer_trl, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_upgrade_diff", ROOT / "scripts" / "trl_upgrade_diff.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(newer_trl)]) == 0
    report = capsys.readouterr().out
    transformers = version("transformers")
    if transformers == upgrade_guard.REVIEWED_VERSIONS["transformers"]:
        assert report.startswith("reviewed: trl 1.16.0, transformers 5.24.0; new: trl 1.17.0, transformers 5.24.0")
    else:  # another admitted transformers: the header says the installed side is not the reviewed one
        assert report.startswith(f"installed (NOT the reviewed trl 1.16.0, transformers 5.24.0: the diffs are "
                                 f"against it; install with -c constraints.txt for the reviewed side): trl 1.16.0, "
                                 f"transformers {transformers}; new: trl 1.17.0, transformers {transformers}")
    changed = 1 + len(upgrade_guard.changed_methods())  # _compute_loss, and what another transformers changed
    assert f"## RPGTrainer: {changed} of {len(upgrade_guard.REVIEWED_METHODS)} reviewed methods changed" in report
    digest = upgrade_guard.REVIEWED_METHODS[1].digest  # GRPOTrainer._compute_loss
    assert f"### GRPOTrainer._compute_loss: digest {digest} -> " in report
    assert "-    coef_1 = torch.exp(log_importance_weights)\n+    coef_1 = log_importance_weights.exp()  # reworded" \
        in report
    assert ("### config fields to classify (1): trl_rpg/upgrade/grpo_fields.py\n"
            "- kl_log_ratio_clip = None: A new option.") in report


# ---------------------------------------------------------------------------------------------------------------------
# Each PR refused by the property it breaks (in this process)
# ---------------------------------------------------------------------------------------------------------------------


def test_trl_changed_as_pr_5413_fails_the_generation_batch_property():
    """On-policy under vLLM's correction the batch no longer carries the ratio RPG's loss weighs every term by."""
    [result] = run_properties(_properties("generation_batch"), _patched_context(PR_5413))
    assert not result["passed"]
    assert result["detail"].startswith("under vLLM's importance-sampling correction (token_truncate, sequence_mask; "
                                       "on-policy) the batch lacks old_per_token_logps, importance_sampling_ratio")


def test_trl_changed_as_pr_7188_fails_the_kl_term_property():
    """The KL's bias correction by the per-token ratio under importance_sampling_level='sequence'."""
    [result] = run_properties(_properties("grpo_kl_term"), _patched_context(PR_7188))
    assert not result["passed"]
    assert result["detail"].startswith("at importance_sampling_level='sequence' GRPO's KL term is not beta x k3 "
                                       "weighted by its sequence-level importance ratio")
    assert "token'" not in result["detail"]  # token level: unchanged by the PR


#: GRPO's 'dapo' normaliser without the accumulation factor: an aggregation RPG's own loss would not follow.
DAPO_NORMALISER = {"_compute_loss": [(
    "normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation",
    "normalizer = normalizer / self.args.steps_per_generation")]}


def test_the_reviewed_trl_keeps_the_generation_batch_and_the_kl_term():
    results = run_properties(_properties("generation_batch", "grpo_kl_term"))
    assert [r["passed"] for r in results] == [True, True], results


def test_a_trl_that_trains_otherwise_or_drops_the_restored_buffer_fails_reduction_and_resume():
    """GRPO's aggregation changed: RPG (which replaces the loss) no longer trains to GRPO's parameters. Every `train()`
    starting from a fresh generation batch: a run resumed mid-batch regenerates instead of reusing RPG's buffer."""

    class DropsTheBuffer(patched_class(DAPO_NORMALISER)):
        def train(self, *args, **kwargs):
            self.fresh_start = True
            return super().train(*args, **kwargs)

        def _prepare_inputs(self, generation_batch):
            if getattr(self, "fresh_start", False):
                self._buffered_inputs, self.fresh_start = None, False
            return super()._prepare_inputs(generation_batch)

    context = CheckContext(DropsTheBuffer, type("PatchedRPGTrainer", (RPGTrainer, DropsTheBuffer), {}), "")
    reduction, resume = run_properties(_properties("reduction", "checkpoint_resume"), context)
    assert reduction["detail"].startswith("RPG and GRPO parameters differ by ")
    assert resume["detail"] == ("the resumed run generated a new batch instead of reusing the generation buffer RPG "
                                "restored")


def test_a_failed_verdict_refuses_naming_the_property(monkeypatch):
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    monkeypatch.setattr(upgrade_guard, "changed_methods", lambda owners, methods: ["GRPOTrainer._compute_loss"])
    failed = upgrade_verdict.Verdict(False, [{"name": "grpo_kl_term", "passed": False, "detail": "the KL changed"},
                                             {"name": "reduction", "passed": True, "detail": None}])
    monkeypatch.setattr(upgrade_verdict, "verdict", lambda review, digests, fields: failed)
    with pytest.raises(upgrade_guard.UnreviewedUpgrade, match=r"GRPOTrainer._compute_loss .*the upgrade self-check "
                                                              r"failed: grpo_kl_term: the KL changed\. RPG could"):
        upgrade_guard.check()
    assert upgrade_guard.status() == ("self-check FAILED, RPGTrainer refuses to train: grpo_kl_term: the KL changed "
                                      "(trl's GRPOTrainer._compute_loss)")


def test_a_passed_check_names_the_package_and_the_class_whose_code_changed_once_per_installed_version(monkeypatch):
    """transformers 5.25 changed `Trainer._prepare_for_training`, which GRPOTrainer inherits: the warning names
    transformers and its `Trainer`, not TRL, and only the run that ran the check warns (later runs read the cache)."""
    monkeypatch.setattr(upgrade_guard, "_SAID", set())
    monkeypatch.setattr(upgrade_guard, "changed_methods",
                        lambda owners, methods: ["GRPOTrainer._prepare_for_training", "GRPOTrainer._compute_loss"])
    monkeypatch.setattr(upgrade_guard, "unclassified_fields", lambda config, fields: [])
    passed = upgrade_verdict.Verdict(True, [{"name": "reduction", "passed": True, "detail": None}],
                                     cached="/cache/key.json", fresh=True)
    monkeypatch.setattr(upgrade_verdict, "verdict", lambda review, digests, fields: passed)
    with pytest.warns(UserWarning) as caught:
        upgrade_guard.check()
    [warning] = [str(w.message) for w in caught]
    assert warning.startswith(f"trl-rpg: the code RPG relies on in transformers {version('transformers')} and trl "
                              "1.16.0 differs from "
                              "the reviewed versions (trl 1.16.0, transformers 5.24.0): changed methods "
                              "transformers' Trainer._prepare_for_training (GRPOTrainer inherits it), trl's "
                              "GRPOTrainer._compute_loss. The upgrade self-check passed on it (")
    assert warning.endswith("Said once per installed version (verdict cached in /cache/key.json); `trl-rpg env` "
                            "shows it again.")
    assert upgrade_guard.status() == ("self-check passed (transformers' Trainer._prepare_for_training (GRPOTrainer "
                                      "inherits it), trl's GRPOTrainer._compute_loss; /cache/key.json)")
    monkeypatch.setattr(upgrade_guard, "_SAID", set())  # another process: the verdict read from the cache
    passed.fresh = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert upgrade_guard.check() == ["GRPOTrainer._prepare_for_training", "GRPOTrainer._compute_loss"]


def test_a_method_gone_or_a_name_trl_takes_is_its_owners_package():
    assert upgrade_guard.attributed([f"GRPOTrainer._compute_loss{upgrade_guard.GONE}",
                                     "GRPOTrainer._rpg_x (also the name of RPGTrainer's own _rpg_x)",
                                     "GRPOConfig.__post_init__", "Trainer._save_checkpoint"]) == (
        ["trl", "transformers"],
        ["trl's GRPOTrainer._compute_loss (no longer exists)",
         "trl's GRPOTrainer._rpg_x (also the name of RPGTrainer's own _rpg_x)", "trl's GRPOConfig.__post_init__",
         "transformers' Trainer._save_checkpoint"])


# ---------------------------------------------------------------------------------------------------------------------
# The cache, what is replaced in this process, the names RPG keeps for itself
# ---------------------------------------------------------------------------------------------------------------------


def test_the_verdict_is_cached_per_installed_version_and_an_unwritable_cache_only_costs_a_rerun(monkeypatch,
                                                                                                 tmp_path):
    runs = []

    def run_check(review, properties):
        runs.append(review)
        return upgrade_verdict.Verdict(True, [{"name": p.name, "passed": True, "detail": None}
                                              for p in properties]), digests

    digests = upgrade_guard.method_digests()
    monkeypatch.setattr(upgrade_verdict, "run_check", run_check)
    monkeypatch.delenv("TRL_RPG_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert upgrade_verdict.cache_dir() == tmp_path / "xdg" / "trl-rpg" / "upgrade-check"
    first = upgrade_verdict.verdict("RPGTrainer", digests, ["new_field"])
    assert first.passed and first.cached and Path(first.cached).parent == upgrade_verdict.cache_dir()
    assert upgrade_verdict.verdict("RPGTrainer", digests, ["new_field"]).cached == first.cached and len(runs) == 1
    versions = upgrade_verdict.installed_versions()
    monkeypatch.setattr(upgrade_verdict, "installed_versions", lambda: {**versions, "trl": "1.17.1"})
    upgrade_verdict.verdict("RPGTrainer", digests, ["new_field"])
    assert len(runs) == 2  # another installed version: checked again
    monkeypatch.setenv("TRL_RPG_CACHE", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("not a folder")
    unwritable = upgrade_verdict.verdict("RPGTrainer", digests, ["new_field"])
    assert unwritable.passed and unwritable.cached is None and len(runs) == 3


def test_the_check_runs_outside_the_launch_that_asked_on_cpu_offline_and_on_the_same_path(monkeypatch):
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500", "ACCELERATE_MIXED_PRECISION": "bf16",
                       "CUDA_VISIBLE_DEVICES": "0,1", "SOME_SETTING": "kept"}.items():
        monkeypatch.setenv(key, value)
    env = upgrade_verdict._child_environment()
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT", "ACCELERATE_MIXED_PRECISION"} & set(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HF_HUB_OFFLINE"] == "1" and env["SOME_SETTING"] == "kept"
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "1" and env[upgrade_verdict.IN_CHECK_ENV] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[:1] == [p for p in sys.path if p and os.path.isdir(p)][:1]


def test_a_verdict_from_a_process_that_saw_other_code_is_no_verdict(monkeypatch, tmp_path):
    """A method patched at run time in a way its name does not show: the fresh process saw other digests."""
    digests = upgrade_guard.method_digests()
    seen = {**digests, "GRPOTrainer._compute_loss": "0" * 16}
    monkeypatch.setattr(upgrade_verdict, "run_check", lambda review, properties: (
        upgrade_verdict.Verdict(True, [{"name": "reduction", "passed": True, "detail": None}]), seen))
    monkeypatch.setenv("TRL_RPG_CACHE", str(tmp_path))
    result = upgrade_verdict.verdict("RPGTrainer", digests, [])
    assert not result.passed and "GRPOTrainer._compute_loss differ between this process and a fresh import" in \
        result.error and result.cached is None


def test_a_method_replaced_in_this_process_is_named_without_running_the_check(monkeypatch):
    assert upgrade_guard.replaced_here() == []
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, model, inputs: None)
    assert upgrade_guard.replaced_here() == ["GRPOTrainer._compute_loss (now test_upgrade_check."
                                             "test_a_method_replaced_in_this_process_is_named_without_running_the_"
                                             "check.<locals>.<lambda>)"]


def test_rpg_keeps_its_own_names_out_of_trls_way(monkeypatch):
    """Every name RPGTrainer defines is a reviewed override, one of TRL's card attributes, or RPG's own (`_rpg_*`,
    or public and RPG's); a TRL that starts using one of RPG's names is flagged."""
    reviewed = {m.name for m in upgrade_guard.REVIEWED_METHODS if m.owner == "GRPOTrainer"}
    own = [name for name in vars(RPGTrainer) if not (name.startswith("__") and name.endswith("__"))
           and name not in reviewed | {"_tag_names", "_name", "_paper"}]
    assert own and all(name.startswith("_rpg_") or not name.startswith("_") for name in own), own
    assert upgrade_guard.taken_names() == []
    monkeypatch.setattr(GRPOTrainer, "_rpg_log_loss_metrics", lambda self: None, raising=False)
    assert upgrade_guard.taken_names() == ["GRPOTrainer._rpg_log_loss_metrics (also the name of RPGTrainer's own "
                                           "_rpg_log_loss_metrics)"]


def test_new_field_values_names_what_differs_from_the_default():
    from trl_rpg import RPGConfig

    args = RPGConfig(output_dir="o", use_cpu=True, bf16=False, report_to="none", top_k=3)
    assert upgrade_guard.new_field_values(args, ["top_k", "top_p"], RPGConfig) == ["top_k=3 (default 0)"]
    assert upgrade_guard.new_field_values(None, ["top_k"], RPGConfig) == []
