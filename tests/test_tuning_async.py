"""benchmarks/asynchronous_tuned.py's driver on made-up runs (no training): the protocol's tuning rounds, the reported
and regime jobs, saving after every run, resuming an interrupted run, the summary's verdicts and regime."""

import dataclasses
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

pytest.importorskip("requests")  # the k3 arms import TRL's async trainer

from benchmarks import asynchronous_tuned as bench  # noqa: E402


def made_up_run(s, method, staleness, seed, setting, phase):
    """A run whose final accuracy peaks at lr 1.5e-4 (and beta 0.3), falls with staleness for AsyncGRPO, and is
    0.05 higher for AsyncRPG-URKL than for AsyncGRPO on every seed."""
    lr, beta = setting["learning_rate"], setting.get("beta", 0.3)
    acc = 0.7 - 0.05 * math.log(lr / 1.5e-4) ** 2 - 0.02 * math.log(beta / 0.3) ** 2 + 0.001 * (seed % 7)
    if method == "AsyncGRPO":
        acc -= 0.004 * staleness
    if method == "AsyncRPG-URKL":
        acc += 0.05 - 0.004 * staleness
    return {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "setting": dict(setting),
            "accuracy": [[0, 0.4], [8, round(acc, 5)]], "train_s": 1.0, "score": round(acc, 5)}


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.tuned, "build_checkpoint", lambda s, seed: {"seed": seed})
    return dataclasses.replace(bench.FULL, methods=("AsyncGRPO", "AsyncRPG-URKL", "AsyncGRPO+k3 IS"),
                               staleness=(0, 8), find_regime=True, regime_staleness=(16, 32, 64), workers=1,
                               cache_dir=str(tmp_path / "toy"), output_dir=str(tmp_path / "runs"))


def test_tuned_runs_are_reported_on_other_seeds_with_verdicts_and_the_regime(settings, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "tuned_run", lambda *job: calls.append(job) or made_up_run(*job))
    path = str(tmp_path / "r.json")
    result = bench.run(settings, log=lambda *a: None, json_path=path)
    assert result["chosen"] == {"AsyncGRPO": {"learning_rate": 1.5e-4},
                                "AsyncRPG-URKL": {"learning_rate": 1.5e-4, "beta": 0.3},
                                "AsyncGRPO+k3 IS": {"learning_rate": 1.5e-4, "beta": 0.3}}
    tune = [c for c in calls if c[-1] == "tune"]
    assert {c[3] for c in tune} == {100, 101} and {c[2] for c in tune} == {8}  # tuning seeds, tuning staleness
    assert len(tune) == 6 + 18 + 18  # the initial grids: the optimum is inside them
    report = [c for c in calls if c[-1] == "report"]
    assert {c[3] for c in report} == set(range(12)) and len(report) == 3 * 2 * 12
    assert all(c[4] == result["chosen"][c[1]] for c in report)
    regime = [c for c in calls if c[-1] == "regime"]
    assert {(c[1], c[2]) for c in regime} == {("AsyncGRPO", 16), ("AsyncGRPO", 32), ("AsyncGRPO", 64)}
    summary = result["summary"]
    assert summary["paired"]["8|AsyncRPG-URKL - AsyncGRPO"]["verdict"] == "higher"
    assert summary["paired"]["0|AsyncRPG-URKL - AsyncGRPO"]["mean"] == pytest.approx(0.05, abs=1e-9)
    assert summary["paired"]["0|AsyncGRPO+k3 IS - AsyncGRPO"]["verdict"] == bench.tuning.NO_DIFFERENCE
    assert summary["regime"]["found"] == 32  # -0.004 per version: 0.064 at 16, 0.128 at 32
    saved = json.loads(open(path).read())
    assert saved["complete"] and len(saved["runs"]) == len(calls) and saved["machine"]["git_commit"]
    assert saved["settings"]["reported_seeds"] == list(range(12)) and "learning_rate" not in saved["settings"]
    text = bench.markdown(result)
    assert "(no detectable difference)" in text and "found at staleness 32" in text
    assert bench.plot(result, str(tmp_path / "r.png"))
    again = bench.main(["--summarize", path])  # python -m benchmarks.asynchronous_tuned --summarize
    assert again["summary"]["regime"]["found"] == 32 and (tmp_path / "r_sensitivity.png").stat().st_size > 0


def test_an_interrupted_run_resumes_with_only_what_is_missing(settings, tmp_path, monkeypatch):
    path, calls = str(tmp_path / "r.json"), []

    def interrupted(*job):
        if len(calls) == 60:  # 42 tuning runs, then 18 reported ones
            raise KeyboardInterrupt
        calls.append(job)
        return made_up_run(*job)

    monkeypatch.setattr(bench, "tuned_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.run(settings, log=lambda *a: None, json_path=path)
    partial = json.loads(open(path).read())
    assert len(partial["runs"]) == 60 and not partial["complete"]  # saved after every run
    more = []
    monkeypatch.setattr(bench, "tuned_run", lambda *job: more.append(job) or made_up_run(*job))
    s = bench.settings_from_dict(partial["settings"])
    s.cache_dir, s.output_dir = settings.cache_dir, settings.output_dir
    result = bench.run(s, log=lambda *a: None, json_path=path, previous=partial)
    assert not {(c[1], c[2], c[3], str(c[4]), c[5]) for c in calls} & {(c[1], c[2], c[3], str(c[4]), c[5])
                                                                         for c in more}
    assert len(calls) + len(more) == 42 + 72 + 36 and result["complete"]


def test_the_protocols_promises_are_checked_before_anything_runs(settings, capsys):
    with pytest.raises(ValueError, match="reported_seeds must be disjoint"):
        bench.check_settings(dataclasses.replace(settings, reported_seeds=tuple(range(100, 112))))
    with pytest.raises(ValueError, match="include AsyncGRPO"):
        bench.check_settings(dataclasses.replace(settings, methods=("AsyncRPG-URKL",)))
    with pytest.raises(ValueError, match="reported runs on tuning seeds"):
        bench.report_jobs(dataclasses.replace(settings, reported_seeds=(100,)), {})
    assert bench.regime_staleness(settings) == [16, 32, 64]
    assert bench.regime_staleness(dataclasses.replace(settings, staleness=(8,))) == [0, 16, 32, 64]
    assert [bench.regularised(m) for m in bench.ARMS] == [False, True, True, True, True, False]


def test_a_diverged_run_is_recorded_and_scores_below_every_setting(settings, monkeypatch):
    def diverging(*args, **kwargs):
        raise FloatingPointError("AsyncGRPOWithK3Trainer: the loss is nan")

    monkeypatch.setattr(bench.bench, "train_one", diverging)
    r = bench.tuned_run(settings, "AsyncGRPO+k3", 8, 100, {"learning_rate": 3e-4, "beta": 1.0}, "tune")
    assert r["score"] is None and "loss is nan" in r["diverged"] and bench.final(r) == 0.0


def test_asynchronous_builds_the_k3_arms_at_the_tuned_setting(tmp_path):
    s = dataclasses.replace(bench.bench.FULL, output_dir=str(tmp_path))
    for method, weighted in (("AsyncGRPO+k3", False), ("AsyncGRPO+k3 IS", True)):
        kind, config = bench.bench.run_config(s, method, 8, 0, 0.3, 1.5e-4)
        assert kind == "k3" and type(config).__name__ == "AsyncGRPOWithK3Config"
        assert (config.beta, config.use_bias_correction_kl, config.learning_rate) == (0.3, weighted, 1.5e-4)
    kind, config = bench.bench.run_config(s, "AsyncGRPO", 8, 0, None, 7.5e-5)
    assert kind == "grpo" and config.learning_rate == 7.5e-5 and not hasattr(config, "beta")
    assert bench.bench.run_config(s, "AsyncGRPO", 8, 0, None)[1].learning_rate == s.learning_rate


@pytest.mark.parametrize("quick", [True, False])
def test_quick_writes_outside_the_committed_results(quick, monkeypatch):
    from benchmarks import _common

    class Written(Exception):
        pass

    def written(path, obj):
        raise Written(os.path.abspath(path))

    monkeypatch.setattr(bench.tuned, "write_json", written)
    monkeypatch.setattr(bench, "run", lambda *a, **k: {"machine": {}, "summary": {"tuning": {}}})
    monkeypatch.setattr(bench, "plot", lambda *a: None)
    monkeypatch.setattr(bench.tuning, "plot_sensitivity", lambda *a: None)
    with pytest.raises(Written) as where:
        bench.main(["--quick"] if quick else [])
    folder = os.path.dirname(str(where.value))
    assert folder == (_common.QUICK_RESULTS_DIR if quick else os.path.abspath(_common.RESULTS_DIR))


def test_reported_runs_go_level_by_level_in_the_order_given(settings):
    """Every arm on every seed at one level before the next (an interruption leaves whole levels behind), in the
    order of `staleness`, not sorted."""
    chosen = {m: {"learning_rate": 7.5e-5} for m in settings.methods}
    jobs = bench.report_jobs(dataclasses.replace(settings, staleness=(16, 0)), chosen)
    levels = [job[1] for job in jobs]
    per_level = len(settings.methods) * len(settings.reported_seeds)
    assert levels == [16] * per_level + [0] * per_level
