"""The upgrade self-check's verdict cannot be forged by accident (issue 46): a cached file is trusted only when it
is strictly a verdict on the properties asked for the installed methods, anything else reruns the check; a FIFO in
place of the cache or its lock does not block; a malformed result line from the check's process is "no verdict"
with the reason; the comparisons the properties make keep their tolerance and their order."""

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from trl_rpg import RPGTrainer
from trl_rpg.upgrade import guard as upgrade_guard
from trl_rpg.upgrade import self_check as upgrade_check
from trl_rpg.upgrade import verdict as upgrade_verdict
from trl_rpg.upgrade.self_check import PROPERTIES, CheckContext

NAMES = [p.name for p in PROPERTIES["RPGTrainer"]]


def results(*failed):
    return [{"name": name, "passed": name not in failed, "detail": "broke" if name in failed else None}
            for name in NAMES]


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """The check's runs (a stand-in returning `answer`, a list holding the verdict to give), the cache in tmp_path."""
    runs, digests = [], upgrade_guard.method_digests()
    answer = [upgrade_verdict.Verdict(True, results())]

    def run_check(review, properties):
        runs.append(review)
        return answer[0], digests

    monkeypatch.setattr(upgrade_verdict, "run_check", run_check)
    monkeypatch.setenv("TRL_RPG_CACHE", str(tmp_path / "cache"))
    return runs, digests, answer


def cache_file(digests) -> Path:
    key = upgrade_verdict.cache_key("RPGTrainer", digests, [], PROPERTIES["RPGTrainer"])
    return upgrade_verdict.cache_dir() / f"{key}.json"


def test_a_cached_failed_verdict_is_read_back_as_failed(checks):
    runs, digests, answer = checks
    answer[0] = upgrade_verdict.Verdict(False, results("grpo_kl_term"))
    first = upgrade_verdict.verdict("RPGTrainer", digests, [])
    again = upgrade_verdict.verdict("RPGTrainer", digests, [])
    assert len(runs) == 1 and again.cached == first.cached  # read from the cache
    assert not again.passed and [r["name"] for r in again.failed] == ["grpo_kl_term"]


@pytest.mark.parametrize("forge", [
    lambda data: {**data, "passed": "false"},  # a string is truthy
    lambda data: {**data, "passed": True},  # beside a failed property
    lambda data: {**data, "passed": True, "results": []},  # all([]) is True
    lambda data: {**data, "results": data["results"][:1]},  # not one result per property
    lambda data: {**data, "results": "all passed"},
    lambda data: {**data, "results": [{**r, "passed": 1} for r in data["results"]]},
    lambda data: {**data, "digests": {**data["digests"], "GRPOTrainer._compute_loss": "0" * 16}},
    lambda data: {k: v for k, v in data.items() if k != "digests"},
    lambda data: "[" * 100_000 + "]" * 100_000,  # RecursionError
    lambda data: '{"passed": tr',
])
def test_a_cached_verdict_is_trusted_only_when_strictly_typed_else_the_check_runs_again(checks, forge):
    runs, digests, answer = checks
    answer[0] = upgrade_verdict.Verdict(False, results("reduction"))
    upgrade_verdict.verdict("RPGTrainer", digests, [])
    path = cache_file(digests)
    forged = forge(json.loads(path.read_text()))
    path.write_text(forged if isinstance(forged, str) else json.dumps(forged))
    result = upgrade_verdict.verdict("RPGTrainer", digests, [])
    assert len(runs) == 2 and not result.passed  # the check ran again: a forged pass never reads as one


def test_the_cache_key_changes_with_the_installed_methods_digests(checks):
    runs, digests, answer = checks
    other = {**digests, "GRPOTrainer._compute_loss": "0" * 16}
    properties = PROPERTIES["RPGTrainer"]
    assert upgrade_verdict.cache_key("RPGTrainer", digests, [], properties) != upgrade_verdict.cache_key(
        "RPGTrainer", other, [], properties)


def test_a_fifo_in_place_of_the_cache_file_or_its_lock_does_not_block(checks):
    runs, digests, answer = checks
    path = cache_file(digests)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    os.mkfifo(path.with_suffix(".lock"))
    found = []
    thread = threading.Thread(target=lambda: found.append(upgrade_verdict.verdict("RPGTrainer", digests, [])),
                              daemon=True)
    thread.start()
    thread.join(60)  # a blocked open never returns: the test fails instead of hanging
    assert found and found[0].passed and len(runs) == 1


@pytest.mark.parametrize("line, reason", [
    ('{"results": [', "the self-check's result line is not JSON (JSONDecodeError)"),
    ("[" * 100_000 + "]" * 100_000, "the self-check's result line is not JSON (RecursionError)"),
    ("[]", "the self-check's result line is not a JSON object"),
    ('{"results": {"reduction": true}, "digests": {}}', "the self-check's result is malformed: the results are a "
                                                        "dict, not a list"),
    ('{"results": [], "digests": {}}', "the self-check's result is malformed: 0 results for the 4 properties"),
    (json.dumps({"results": [{**r, "passed": "true"} for r in results()], "digests": {}}),
     "the self-check's result is malformed: reduction's 'passed' is not true or false"),
    (json.dumps({"results": results()[::-1], "digests": {}}), "the self-check's result is malformed: a result is "
                                                              "not the property reduction's"),
    (json.dumps({"results": results(), "digests": None}), "the self-check's result is malformed: the methods' "
                                                          "digests are not a mapping"),
])
def test_every_malformed_result_line_of_the_check_is_no_verdict_with_the_reason(monkeypatch, line, reason):
    done = subprocess.CompletedProcess([], 0, stdout=f"noise\n{upgrade_verdict.RESULT_PREFIX}{line}\n", stderr="")
    monkeypatch.setattr(upgrade_verdict.subprocess, "run", lambda *args, **kwargs: done)
    verdict, seen = upgrade_verdict.run_check("RPGTrainer", PROPERTIES["RPGTrainer"])
    assert not verdict.passed and verdict.error.startswith(reason) and seen == {}


def test_one_failed_property_fails_the_checks_verdict():
    line = json.dumps({"results": results("grpo_kl_term"), "digests": {"GRPOTrainer._compute_loss": "ab"}})
    verdict, seen = upgrade_verdict.parse_result(line, PROPERTIES["RPGTrainer"])
    assert verdict.error is None and not verdict.passed and seen == {"GRPOTrainer._compute_loss": "ab"}
    assert upgrade_verdict.parse_result(json.dumps({"results": results(), "digests": {}}),
                                        PROPERTIES["RPGTrainer"])[0].passed


def test_a_value_ten_percent_off_fails_the_self_checks_comparison():
    want = torch.tensor([1.0, -2.0, 0.5])
    assert upgrade_check._close(want * (1 + 1e-6), want)
    assert not upgrade_check._close(want * 1.1, want)


def test_a_checkpoint_loaded_after_the_first_micro_batch_fails_checkpoint_resume(tmp_path):
    """The recorded hooks of the two runs stand in for training (the properties read them from the context)."""
    checkpoint = str(tmp_path / "rpg" / "checkpoint-1")
    same = {"w": torch.zeros(2)}
    memo = {"rpg": {"events": [("micro-batch", 0), ("save", 1), ("save", 2)], "after": same,
                    "output_dir": str(tmp_path / "rpg")},
            "resumed": {"events": [("micro-batch", 1), ("load", checkpoint), ("micro-batch", 2)], "after": same}}
    # the trainer under review only lends its config class (the memo holds its runs)
    context = CheckContext(grpo_class=object, rpg_class=RPGTrainer, workdir=str(tmp_path), memo=memo)
    detail = upgrade_check.checkpoint_resume(context)
    assert detail is not None and detail.startswith(
        f"_load_optimizer_and_scheduler was not called once with {checkpoint} before the first micro-batch")
    memo["resumed"]["events"] = [("load", checkpoint), ("micro-batch", 1), ("micro-batch", 2)]
    assert upgrade_check.checkpoint_resume(context) is None


def test_a_check_of_no_properties_is_no_verdict():
    """`all([])` is True: a review with nothing checked must not pass."""
    verdict, _ = upgrade_verdict.parse_result('{"results": [], "digests": {}}', ())
    assert not verdict.passed and verdict.error.endswith("0 results for the 0 properties asked (none)")
