"""The upgrade self-check of `AsyncRPGTrainer` (`trl_rpg.upgrade.async_self_check`, run by
`async_upgrade_guard.check_async`
through the synchronous trainer's machinery: `upgrade_guard.register_review`, `upgrade_check.register_properties`,
`upgrade_verdict`'s fresh process and cache): each property holds on the reviewed TRL and fails on a TRL changed in
what it checks; a TRL whose async methods changed but behave trains after the self-check (cached per installed
version); a failed self-check is refused naming the property and the async files."""

import dataclasses
import tempfile
import warnings

import pytest

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import (  # noqa: E402
    DataCollatorForRollout,
    RolloutQueueDataset,
)

from trl_rpg.trainers.async_trainer import AsyncRPGTrainer  # noqa: E402
from trl_rpg.upgrade import async_guard as async_upgrade_guard
from trl_rpg.upgrade import async_self_check as async_upgrade_check  # noqa: E402
from trl_rpg.upgrade import guard as upgrade_guard
from trl_rpg.upgrade import verdict as upgrade_verdict
from trl_rpg.upgrade.self_check import PROPERTIES, CheckContext  # noqa: E402


@pytest.fixture(scope="module")
def context():
    with tempfile.TemporaryDirectory() as workdir:
        yield CheckContext(None, None, workdir)


def test_every_property_holds_on_the_reviewed_trl(context):
    assert PROPERTIES[async_upgrade_guard.REVIEW] == async_upgrade_check.ASYNC_PROPERTIES  # registered
    assert [p.name for p in PROPERTIES[async_upgrade_guard.REVIEW]] == [
        "async_batch_fields", "async_staleness_filter", "async_reduction", "async_weight_sync"]
    results = {p.name: p.function()(context) for p in async_upgrade_check.ASYNC_PROPERTIES}
    assert all(detail is None for detail in results.values()), results


class PerRowTokens(DataCollatorForRollout):
    def torch_call(self, examples):
        batch = super().torch_call(examples)
        batch["global_n_tokens"] = batch["global_n_tokens"] / self.num_processes  # each row's share
        return batch


class OneMoreVersion(RolloutQueueDataset):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_staleness += 1


class TwiceTheLoss(AsyncRPGTrainer):
    def compute_loss(self, *args, **kwargs):
        return 2 * super().compute_loss(*args, **kwargs)


def changed(context, **classes) -> CheckContext:
    """A context sharing `context`'s tiny model and AsyncGRPOTrainer run, with TRL classes replaced."""
    memo = {key: value for key, value in context.memo.items() if key in ("async_model", "AsyncGRPOTrainer")}
    return CheckContext(None, None, context.workdir, {**memo, "async_classes": classes})


def test_each_property_fails_on_a_trl_changed_in_what_it_checks(context):
    assert async_upgrade_check.async_reduction(context) is None  # the shared runs (made once)
    assert "global_n_tokens is [4.5, 4.5], not the micro-batch's 9 trained tokens" in \
        async_upgrade_check.async_batch_fields(changed(context, DataCollatorForRollout=PerRowTokens))
    assert "samples of versions [5, 2, 3, 4] gave those of [5, 2, 3]" in \
        async_upgrade_check.async_staleness_filter(changed(context, RolloutQueueDataset=OneMoreVersion))
    assert "from AsyncGRPOTrainer's parameters" in \
        async_upgrade_check.async_reduction(changed(context, AsyncRPGTrainer=TwiceTheLoss))
    unsent = changed(context)
    run = dict(context.memo["AsyncRPGTrainer"])
    run["versions"] = {**run["versions"], 2: {n: t + 1 for n, t in run["versions"][2].items()}}
    unsent.memo["AsyncRPGTrainer"] = run
    assert async_upgrade_check.async_weight_sync(unsent) == ("version 2 as the worker received it is not the "
                                                             "policy's parameters")


def one_digest_changed(monkeypatch):
    methods = list(async_upgrade_guard.ASYNC_REVIEWED_METHODS)
    methods[1] = dataclasses.replace(methods[1], digest="0" * 16)  # compute_loss: "changed" (its code is TRL's)
    monkeypatch.setattr(async_upgrade_guard, "ASYNC_REVIEWED_METHODS", tuple(methods))


def test_a_trl_whose_async_methods_changed_but_behave_trains_after_the_self_check(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_RPG_CACHE", str(tmp_path))
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    one_digest_changed(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert async_upgrade_guard.check_async() == ["AsyncGRPOTrainer.compute_loss"]
    said = [str(w.message) for w in caught if "self-check passed" in str(w.message)]
    assert len(said) == 1 and "so AsyncRPGTrainer trains on it" in said[0] and "async_reduction" not in said[0]
    assert "RPG reduced to TRL's loss trains to AsyncGRPOTrainer's parameters" in said[0]
    assert any(tmp_path.rglob("*.json"))  # the verdict is cached ...

    def not_again(*args):
        raise AssertionError("the self-check ran again")

    monkeypatch.setattr(upgrade_verdict, "run_check", not_again)
    assert async_upgrade_guard.check_async() == ["AsyncGRPOTrainer.compute_loss"]  # ... and read back


def test_a_failed_self_check_is_refused_naming_the_async_files(monkeypatch):
    monkeypatch.delenv(upgrade_guard.ALLOW_ENV, raising=False)
    one_digest_changed(monkeypatch)
    failed = upgrade_verdict.Verdict(False, [{"name": "async_reduction", "passed": False, "detail": "off by 2"}])
    monkeypatch.setattr(upgrade_verdict, "verdict", lambda *args: failed)
    with pytest.raises(upgrade_guard.UnreviewedUpgrade) as error:
        async_upgrade_guard.check_async()
    message = str(error.value)
    assert message.startswith("AsyncRPGTrainer was reviewed against trl 1.16.0")
    for named in ("AsyncGRPOTrainer.compute_loss", "trl_rpg.upgrade.async_guard.ASYNC_REVIEWED_METHODS",
                  "the upgrade self-check failed: async_reduction: off by 2", "trl_rpg/trainers/async_trainer.py",
                  "trl_rpg/upgrade/async_guard.py", "tests/test_async_upgrade_check.py"):
        assert named in message, named
    for synchronous in ("trl_rpg/trainers/trainer.py", "trl_rpg.upgrade.guard.REVIEWED_METHODS",
                        "tests/test_upgrade_guard.py", "GRPO_FIELDS"):
        assert synchronous not in message, synchronous


def test_a_new_config_field_is_refused_naming_the_async_table():
    @dataclasses.dataclass
    class NewerConfig(AsyncGRPOConfig):
        new_loss_option: bool = False

    with pytest.raises(upgrade_guard.UnreviewedUpgrade) as error:
        async_upgrade_guard.check_async(config_class=NewerConfig)
    assert "these AsyncGRPOConfig fields are not classified by AsyncRPGTrainer: new_loss_option " \
           "(each must be accepted, changed, refused or ignored with a reason: " \
           "trl_rpg.upgrade.async_fields.ASYNC_FIELDS)" \
           in str(error.value)


def test_the_module_owners_resolve():
    owners = async_upgrade_guard._async_owners()
    assert all(owner is not None for owner in owners.values()), owners
    assert upgrade_guard.replaced_here(async_upgrade_guard.REVIEW, owners) == []


def test_the_maintainer_script_covers_the_async_review():
    """`scripts/trl_upgrade_diff.py` dumps both reviews; a new TRL whose async compute_loss changed and whose
    AsyncGRPOConfig has a new field is reported under AsyncRPGTrainer, with the async files to record them in."""
    import copy
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "trl_upgrade_diff.py"
    spec = importlib.util.spec_from_file_location("trl_upgrade_diff", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    reviewed = script.dump()
    assert set(reviewed["reviews"]) >= {"RPGTrainer", "AsyncRPGTrainer"}
    new = copy.deepcopy(reviewed)
    method = new["reviews"]["AsyncRPGTrainer"]["methods"]["AsyncGRPOTrainer.compute_loss"]
    method["source"] = method["source"].replace("coef_1 = torch.exp(log_ratio)", "coef_1 = log_ratio.exp()")
    method["digest"] = "1234567890abcdef"
    new["reviews"]["AsyncRPGTrainer"]["fields"]["new_async_option"] = {"default": "None", "help": "A new option."}
    report = script.compare(reviewed, new)
    async_part = report[report.index("## AsyncRPGTrainer"):]
    assert async_part.startswith(f"## AsyncRPGTrainer: 1 of {len(async_upgrade_guard.ASYNC_REVIEWED_METHODS)} "
                                 "reviewed methods changed (record the new digests in trl_rpg/upgrade/async_guard.py)")
    assert "-    coef_1 = torch.exp(log_ratio)\n+    coef_1 = log_ratio.exp()" in async_part
    assert ("### config fields to classify (1): trl_rpg/upgrade/async_fields.py (ASYNC_FIELDS)\n"
            "- new_async_option = None: A new option.") in async_part
    assert "## RPGTrainer: 0 of" in report
    assert "config fields to classify (0): trl_rpg/upgrade/grpo_fields.py" in report


def test_every_trl_method_the_async_trainer_overrides_is_reviewed():
    """A method `AsyncRPGTrainer` defines that `AsyncGRPOTrainer` also defines must be in `ASYNC_REVIEWED_METHODS`
    (else a TRL that changes it, or starts calling it differently, goes unseen): add a row with its digest."""
    async_upgrade_guard.register()
    assert upgrade_guard.taken_names(async_upgrade_guard.REVIEW) == []
