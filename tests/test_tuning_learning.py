"""benchmarks/learning_tuned.py on made-up runs (no training): the arms and what they tune, the runs at each batch
reuse (same steps, same samples), the tuned settings reaching the trainers' configs, the regime search against the
fresh run (reuse 1), and resuming."""

import dataclasses
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import learning_tuned as bench  # noqa: E402


def made_up_run(s, method, reuse, seed, setting, phase):
    """Final accuracy peaked at lr 3e-4 and beta 0.04; GRPO loses 0.004 per reuse step; RPG-URKL 0.03 above it."""
    lr, beta = setting["learning_rate"], setting.get("beta", 0.04)
    acc = 0.7 - 0.05 * math.log(lr / 3e-4) ** 2 - 0.02 * math.log(beta / 0.04) ** 2 + 0.002 * (seed % 5)
    acc -= 0.004 * reuse if method in ("GRPO", "RPG-REINFORCE-URKL") else 0.0
    acc += 0.03 if method == "RPG-REINFORCE-URKL" else 0.0
    return {"phase": phase, "method": method, "reuse": reuse, "seed": seed, "setting": dict(setting),
            "accuracy": [[0, 0.4], [96, round(acc, 5)]], "train_s": 1.0, "score": round(acc, 5)}


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.tuned, "build_checkpoint", lambda s, seed: {"seed": seed})
    return dataclasses.replace(bench.FULL, find_regime=True, workers=1, cache_dir=str(tmp_path / "toy"),
                               output_dir=str(tmp_path / "runs"))


def test_the_arms_and_what_each_tunes():
    assert {m: bench.regularised(m) for m in bench.ARMS} == {
        "GRPO": True, "GRPO k3 unweighted": True, "DAPO": False, "RPG-REINFORCE-URKL": True,
        "RPG-REINFORCE-UFKL": True}
    assert bench.regularised("RPG-REINFORCE-URKL beta=0") is False


def test_every_reuse_runs_the_same_steps_and_samples():
    for reuse in (1, 4, 16, 32, 48):
        s = bench.at_reuse(bench.FULL, reuse)
        assert s.reuse == reuse and s.max_steps == bench.FULL.steps == 96
    with pytest.raises(ValueError, match=r"reuse levels must be positive integers dividing steps \(96\); got \[5\]"):
        bench.check_settings(dataclasses.replace(bench.FULL, reuse_levels=(4, 5)))


def test_the_tuned_setting_reaches_the_trainers_config(tmp_path):
    s = bench.at_reuse(dataclasses.replace(bench.FULL, output_dir=str(tmp_path)), 16)
    kind, config = bench.bench._config(s, "GRPO k3 unweighted", 0, str(tmp_path), {"learning_rate": 6e-4,
                                                                                   "beta": 0.16})
    assert (kind, config.learning_rate, config.beta, config.use_bias_correction_kl) == ("grpo", 6e-4, 0.16, False)
    assert config.steps_per_generation == 16 and config.max_steps == 96
    kind, config = bench.bench._config(s, "RPG-REINFORCE-UFKL", 0, str(tmp_path), {"learning_rate": 1.5e-4,
                                                                                   "beta": 0.01})
    assert (kind, config.learning_rate, config.beta, config.rpg_divergence) == ("rpg", 1.5e-4, 0.01, "ufkl")
    assert bench.bench._config(s, "DAPO", 0, str(tmp_path), {"learning_rate": 3e-4})[1].beta == 0.0


def test_tuned_at_reuse_16_reported_at_4_and_16_and_the_regime_against_reuse_1(settings, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "tuned_run", lambda *job: calls.append(job) or made_up_run(*job))
    path = str(tmp_path / "r.json")
    result = bench.run(settings, log=lambda *a: None, json_path=path)
    assert result["chosen"]["DAPO"] == {"learning_rate": 3e-4}
    assert result["chosen"]["RPG-REINFORCE-URKL"] == {"learning_rate": 3e-4, "beta": 0.04}
    assert {c[2] for c in calls if c[-1] == "tune"} == {16}
    assert {c[2] for c in calls if c[-1] == "report"} == {4, 16}
    assert {(c[1], c[2]) for c in calls if c[-1] == "regime"} == {("GRPO", 1), ("GRPO", 32), ("GRPO", 48)}
    summary = result["summary"]
    assert summary["regime"]["found"] == 32  # -0.004 per reuse step: 0.06 at 16, 0.124 at 32
    assert summary["paired"]["16|RPG-REINFORCE-URKL - GRPO"]["verdict"] == "higher"
    assert summary["paired"]["4|GRPO k3 unweighted - GRPO"]["mean"] == pytest.approx(0.016, abs=1e-9)
    assert json.loads(open(path).read())["complete"]
    assert "found at reuse 32" in bench.markdown(result) and bench.plot(result, str(tmp_path / "r.png"))
    again = bench.main(["--summarize", path])  # python -m benchmarks.learning_tuned --summarize
    assert again["summary"]["regime"]["found"] == 32 and (tmp_path / "r_sensitivity.png").stat().st_size > 0
