"""benchmarks/smollm2_tuned.py and the task it trains (two-digit sums), without the model: the task's split and
data, the tuned settings reaching the trainers' configs, the preparation (each seed's start measured once, kept on
resume), the score read from the sampled accuracy, and the driver's phases on made-up runs."""

import dataclasses
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import smollm2_tuned as bench  # noqa: E402
from trl_rpg.smollm2 import task  # noqa: E402


def test_two_digit_sums_are_split_once_into_disjoint_train_and_held_out_problems():
    split = task.split_problems("two-digit")
    assert len(split["test"]) == 64 and len(split["train"]) == 90 * 90 - 64
    assert not set(split["test"]) & set(split["train"])
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, b in split["test"] + split["train"])
    assert split == task.split_problems("two-digit")  # independent of any seed
    carries = sum((a % 10) + (b % 10) >= 10 for a, b in split["test"])
    assert 16 <= carries <= 48  # about half the held-out sums carry (45% of all two-digit pairs)
    data = task.make_dataset(split="test", operands="two-digit")
    assert len(data) == 64
    for prompt, answer in zip(data["prompt"], data["answer"]):
        a, b = (int(x) for x in prompt[0]["content"].removeprefix("What is ").split("?")[0].split(" + "))
        assert answer == str(a + b) and (a, b) in split["test"]
    train = task.make_dataset(200, seed=3, operands="two-digit")
    assert train["prompt"] == task.make_dataset(200, seed=3, operands="two-digit")["prompt"]
    assert train["prompt"] != task.make_dataset(200, seed=4, operands="two-digit")["prompt"]
    with pytest.raises(ValueError, match=r"operands must be one of 'single-digit', 'two-digit'; got 'three-digit'"):
        task.make_dataset(operands="three-digit")


def test_the_single_digit_split_the_demo_and_section_7_used_is_unchanged():
    split = task.split_problems()
    assert split == task.split_problems("single-digit")
    assert len(split["test"]) == 30 and len(split["train"]) == 70
    pool = [(a, b) for a in range(10) for b in range(10)]  # the split as it was written before operands existed
    __import__("random").Random(39).shuffle(pool)
    assert split["test"] == sorted(pool[:30])
    assert task.make_dataset(50, seed=3)["prompt"] == task.make_dataset(50, seed=3, operands="single-digit")["prompt"]


def test_the_tuned_setting_and_the_task_reach_the_trainers_config(tmp_path):
    s = bench.at_reuse(dataclasses.replace(bench.FULL, output_dir=str(tmp_path)), 16)
    assert s.max_steps == bench.FULL.steps == 32 and s.generation_batches == 2
    kind, config = bench.smollm2.run_config(s, "GRPO k3 unweighted", 0, str(tmp_path),
                                            {"learning_rate": 1e-3, "beta": 0.1})
    assert (kind, config.learning_rate, config.beta, config.use_bias_correction_kl) == ("grpo", 1e-3, 0.1, False)
    assert (config.steps_per_generation, config.max_steps, config.max_completion_length) == (16, 32, 32)
    kind, config = bench.smollm2.run_config(s, "RPG-REINFORCE-UFKL", 0, str(tmp_path),
                                            {"learning_rate": 2.5e-4, "beta": 0.01})
    assert (kind, config.learning_rate, config.beta, config.rpg_divergence) == ("rpg", 2.5e-4, 0.01, "ufkl")
    assert bench.smollm2.run_config(s, "DAPO", 0, str(tmp_path), {"learning_rate": 5e-4})[1].beta == 0.0
    old = bench.smollm2.run_config(bench.smollm2.FULL, "GRPO", 0, str(tmp_path))[1]  # section 7's runs: unchanged
    assert (old.learning_rate, old.max_completion_length, old.temperature) == (5e-4, 16, 1.0)


def test_settings_the_protocol_refuses():
    with pytest.raises(ValueError, match=r"reuse levels must be positive integers dividing steps \(32\); got \[5\]"):
        bench.check_settings(dataclasses.replace(bench.FULL, reuse_levels=(1, 5)))
    with pytest.raises(ValueError, match="operands must be one of single-digit, two-digit; got 'hex'"):
        bench.check_settings(dataclasses.replace(bench.FULL, operands="hex"))
    with pytest.raises(ValueError, match="reported_seeds must hold at least 6 seeds"):
        bench.check_settings(dataclasses.replace(bench.FULL, reported_seeds=(0, 1, 2)))
    with pytest.raises(ValueError, match="must be disjoint from tuning_seeds"):
        bench.check_settings(dataclasses.replace(bench.FULL, reported_seeds=(0, 1, 2, 3, 4, 100)))


def test_a_run_is_scored_by_its_sampled_accuracy_and_keeps_the_greedy_one(monkeypatch, tmp_path):
    import trl_rpg.smollm2

    seen = {}

    def train_one(s, path, method, seed, setting):
        seen.update(reuse=s.reuse, batches=s.generation_batches, setting=setting, path=path)
        return {"accuracy": [(16, {"sampled": 0.2, "greedy": 0.5}), (32, {"sampled": 0.3, "greedy": 0.25})],
                "rewards": [0.1, 0.2], "total_s": 9.0, "log_means": {}}

    monkeypatch.setattr(trl_rpg.smollm2, "prepare_smollm2", lambda cache, log=None: "/model")
    monkeypatch.setattr(bench.smollm2, "train_one", train_one)
    r = bench.tuned_run(bench.FULL, "GRPO", 16, 100, {"learning_rate": 5e-4, "beta": 0.1}, "tune")
    assert seen == {"reuse": 16, "batches": 2, "setting": {"learning_rate": 5e-4, "beta": 0.1}, "path": "/model"}
    assert r["score"] == 0.3 and r["accuracy"] == [(16, 0.2), (32, 0.3)] and r["greedy"] == [(16, 0.5), (32, 0.25)]
    assert bench.tuned.final(r) == 0.3

    def diverges(*args):
        raise FloatingPointError("non-finite loss at step 3")

    monkeypatch.setattr(bench.smollm2, "train_one", diverges)
    r = bench.tuned_run(bench.FULL, "DAPO", 1, 0, {"learning_rate": 1e-3}, "report")
    assert r["score"] is None and r["accuracy"] is None and "step 3" in r["diverged"]


def made_up_run(s, method, reuse, seed, setting, phase):
    """Sampled accuracy peaked at lr 5e-4 and beta 0.1 (an edge of the initial grid); reuse 16 costs GRPO 0.05."""
    lr, beta = setting["learning_rate"], setting.get("beta", 0.1)
    acc = 0.5 - 0.05 * math.log(lr / 5e-4) ** 2 - 0.02 * math.log(beta / 0.1) ** 2 + 0.002 * (seed % 5)
    acc -= 0.05 if (method == "GRPO" and reuse == 16) else 0.0
    return {"phase": phase, "method": method, "reuse": reuse, "seed": seed, "setting": dict(setting),
            "accuracy": [[16, 0.2], [32, round(acc, 5)]], "train_s": 1.0, "score": round(acc, 5)}


def test_tuned_at_reuse_16_reported_fresh_and_at_16_and_resumed_without_measuring_a_start_twice(
        tmp_path, monkeypatch):
    import trl_rpg.smollm2

    starts, calls = [], []
    monkeypatch.setattr(trl_rpg.smollm2, "prepare_smollm2", lambda cache, log=None: "/model")
    monkeypatch.setattr(bench.smollm2, "evaluate_start", lambda s, path, seed: starts.append(seed) or {
        "seed": seed, "accuracy": {"greedy": 0.25, "sampled": 0.05}})
    monkeypatch.setattr(bench, "tuned_run", lambda *job: calls.append(job) or made_up_run(*job))
    pools = []

    class RecordedPool(bench.tuned.WorkerPool):
        def __init__(self, workers, tasks_per_worker=None):
            pools.append(tasks_per_worker)
            super().__init__(workers, tasks_per_worker)

    monkeypatch.setattr(bench.tuned, "WorkerPool", RecordedPool)
    s = dataclasses.replace(bench.FULL, workers=1, output_dir=str(tmp_path / "runs"))
    path = str(tmp_path / "r.json")
    result = bench.run(s, log=lambda *a: None, json_path=path)
    assert pools == [1]  # a fresh worker process per run (a SmolLM2 worker kept a run's memory through the next)
    assert async_bench.DESIGN.tasks_per_worker == 1
    assert sorted(starts) == [0, 1, 2, 3, 4, 5, 100, 101] and result["model_path"] == "/model"
    assert result["chosen"]["DAPO"] == {"learning_rate": 5e-4}
    assert result["chosen"]["RPG-REINFORCE-URKL"] == {"learning_rate": 5e-4, "beta": 0.1}
    tune = [c for c in calls if c[-1] == "tune"]
    assert {c[2] for c in tune} == {16} and {c[3] for c in tune} == {100, 101}
    assert len([c for c in tune if c[1] == "DAPO"]) <= s.budget >= len([c for c in tune if c[1] == "GRPO"])
    assert {0.4} == {c[4]["beta"] for c in tune if c[1] == "GRPO" and c[4]["beta"] > 0.1}  # the edge extended x4
    report = [c for c in calls if c[-1] == "report"]
    assert {c[2] for c in report} == {1, 16} and {c[3] for c in report} == set(range(6)) and len(report) == 60
    assert result["summary"]["paired"]["16|RPG-REINFORCE-URKL - GRPO"]["verdict"] == "higher"
    assert result["summary"]["paired"]["1|RPG-REINFORCE-URKL - GRPO"]["verdict"] == bench.tuned.tuning.NO_DIFFERENCE
    assert json.loads(open(path).read())["complete"]
    assert "two-digit sums" in bench.markdown(result) and bench.plot(result, str(tmp_path / "r.png"))
    starts.clear(), calls.clear()
    again = bench.run(s, log=lambda *a: None, json_path=path, previous=json.loads(open(path).read()))
    assert starts == [] and calls == [] and again["chosen"] == result["chosen"]


# ---------------------------------------------------------------------------------------------------------------------
# The asynchronous variant: benchmarks/smollm2_async_tuned.py
# ---------------------------------------------------------------------------------------------------------------------

from benchmarks import smollm2_async_tuned as async_bench  # noqa: E402


def test_async_the_tuned_setting_the_staleness_and_the_task_reach_the_trainers_config(tmp_path):
    s = dataclasses.replace(async_bench.FULL, output_dir=str(tmp_path))
    kind, config = async_bench.run_config(s, "AsyncGRPO+k3 IS", 8, 0, {"learning_rate": 1e-3, "beta": 0.3})
    assert (kind, config.learning_rate, config.beta, config.use_bias_correction_kl) == ("k3", 1e-3, 0.3, True)
    assert (config.max_staleness, config.max_steps, config.max_completion_length, config.temperature) == (8, 32, 32,
                                                                                                          0.7)
    assert config.per_device_train_batch_size == 16 and config.num_generations == 8
    kind, config = async_bench.run_config(s, "AsyncRPG-UFKL", 0, 0, {"learning_rate": 2.5e-4, "beta": 0.03})
    assert (kind, config.learning_rate, config.beta, config.rpg_divergence, config.max_staleness) == (
        "rpg", 2.5e-4, 0.03, "ufkl", 0)
    kind, config = async_bench.run_config(s, "AsyncRPG beta=0", 8, 0, {"learning_rate": 5e-4})
    assert (kind, config.beta) == ("rpg", 0.0)
    assert async_bench.run_config(s, "AsyncGRPO", 8, 0, {"learning_rate": 5e-4})[0] == "grpo"
    assert {m for m in async_bench.ARMS if async_bench.DESIGN.regularised[m]} == {
        "AsyncGRPO+k3", "AsyncGRPO+k3 IS", "AsyncRPG-URKL", "AsyncRPG-UFKL"}


def test_async_settings_the_protocol_refuses():
    with pytest.raises(ValueError, match="reported_seeds must hold at least 6 seeds"):
        async_bench.check_settings(dataclasses.replace(async_bench.FULL, reported_seeds=(0, 1)))
    with pytest.raises(ValueError, match=r"per_device_train_batch_size \(12\) must be a multiple of num_generations"):
        async_bench.check_settings(dataclasses.replace(async_bench.FULL, per_device_train_batch_size=12))
    with pytest.raises(ValueError, match="operands must be one of"):
        async_bench.check_settings(dataclasses.replace(async_bench.FULL, operands="x"))


def test_async_a_run_is_scored_by_its_sampled_accuracy(monkeypatch):
    monkeypatch.setattr(async_bench, "train_one", lambda s, method, staleness, seed, setting: {
        "accuracy": (32, {"sampled": 0.3, "greedy": 0.4}), "steps": 32, "rewards": [0.1], "log_means": {},
        "train_s": 5.0, "total_s": 9.0})
    r = async_bench.tuned_run(async_bench.FULL, "AsyncRPG-URKL", 8, 100, {"learning_rate": 5e-4, "beta": 0.3}, "tune")
    assert (r["score"], r["accuracy"], r["greedy"], r["staleness"], r["train_s"]) == (0.3, [(32, 0.3)], [(32, 0.4)],
                                                                                      8, 5.0)
    assert async_bench.tuned.final(r) == 0.3


def test_async_tuned_at_staleness_8_and_reported_at_0_and_8(tmp_path, monkeypatch):
    import trl_rpg.smollm2

    calls = []
    monkeypatch.setattr(trl_rpg.smollm2, "prepare_smollm2", lambda cache, log=None: "/model")
    monkeypatch.setattr(bench.smollm2, "evaluate_start", lambda s, path, seed: {
        "seed": seed, "accuracy": {"greedy": 0.25, "sampled": 0.05}})

    def made_up(s, method, staleness, seed, setting, phase):
        calls.append((method, staleness, seed, setting, phase))
        acc = 0.4 - 0.05 * math.log(setting["learning_rate"] / 5e-4) ** 2 + 0.002 * seed
        acc += 0.03 if (method == "AsyncRPG-URKL" and staleness == 8) else 0.0
        return {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "setting": dict(setting),
                "accuracy": [[32, acc]], "train_s": 1.0, "score": acc}

    monkeypatch.setattr(async_bench, "tuned_run", made_up)
    s = dataclasses.replace(async_bench.FULL, workers=1, output_dir=str(tmp_path / "runs"))
    result = async_bench.run(s, log=lambda *a: None, json_path=str(tmp_path / "r.json"))
    assert {c[1] for c in calls if c[-1] == "tune"} == {8} and {c[1] for c in calls if c[-1] == "report"} == {0, 8}
    assert len([c for c in calls if c[-1] == "report"]) == 6 * 2 * 6  # arms x levels x reported seeds
    assert result["chosen"]["AsyncGRPO"] == {"learning_rate": 5e-4}
    assert result["summary"]["paired"]["8|AsyncRPG-URKL - AsyncGRPO"]["verdict"] == "higher"
    assert "asynchronous, two-digit sums" in async_bench.markdown(result)
