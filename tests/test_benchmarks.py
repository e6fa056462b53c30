"""Smoke tests of the benchmark entry points' core functions (tiny sizes; the real runs are in docs/benchmarks.md)."""

import dataclasses
import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import cost, learning  # noqa: E402
from benchmarks._common import write_json  # noqa: E402


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_learning_smoke(tmp_path, keep_threads):
    s = dataclasses.replace(
        learning.FULL, seeds=(0,), methods=("RPG-REINFORCE-URKL", "GRPO"), generation_batches=1, reuse=2,
        per_device_train_batch_size=8, num_generations=4, eval_problems=8, eval_every=1, sft_steps=3,
        num_train_problems=32, workers=1, cache_dir=str(tmp_path / "toy"), output_dir=str(tmp_path / "runs"),
    )
    result = learning.run(s, log=lambda *a: None)
    assert [r["method"] for r in result["runs"]] == ["RPG-REINFORCE-URKL", "GRPO"]
    for r in result["runs"]:
        assert [step for step, _ in r["accuracy"]] == [0, 1, 2]
        assert all(0.0 <= a <= 1.0 for _, a in r["accuracy"])
        assert len(r["rewards"]) == 1 and 0.0 <= r["rewards"][0] <= 1.0
        assert r["accuracy"][0][1] == result["runs"][0]["accuracy"][0][1]  # same SFT start for every method
    for m in s.methods:
        row = result["summary"]["methods"][m]
        assert 0.0 <= row["last_mean"] <= 1.0 and 0.0 <= row["best_mean"] <= 1.0
        assert row["reached"].endswith("/1")
    paired = result["summary"]["paired"]["RPG-REINFORCE-URKL - GRPO"]
    assert paired["n"] == 1 and paired["wins"] + paired["ties"] + paired["losses"] == 1
    table = learning.markdown(result)
    assert "RPG-REINFORCE-URKL" in table and "GRPO" in table
    assert learning.plot(result, str(tmp_path / "learning.png"))
    write_json(str(tmp_path / "learning.json"), result)
    json.loads((tmp_path / "learning.json").read_text())  # strict JSON (NaN written as null)


def test_cost_smoke(tmp_path, keep_threads):
    s = dataclasses.replace(
        cost.QUICK, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, lengths=(8,),
        repetitions=1, warmup_cycles=1, measured_cycles=1, cache_dir=str(tmp_path / "cost"),
    )
    result = cost.run(s, log=lambda *a: None, spawn=False)
    assert sorted(r["method"] for r in result["runs"]) == sorted(cost.METHODS)
    refs = {r["method"]: r["reference_model"] for r in result["runs"]}
    assert refs == {"RPG": False, "GRPO(beta>0)": True, "GRPO(beta=0)": False}
    passes = {r["method"]: r["passes_per_batch"] for r in result["runs"]}
    # reference = sampling policy: RPG makes no reference forward pass; GRPO(beta>0) makes one per batch
    assert passes["RPG"] == passes["GRPO(beta=0)"] == {"policy_no_grad": 1.0, "reference": 0.0, "policy_grad": 1.0}
    assert passes["GRPO(beta>0)"] == {"policy_no_grad": 1.0, "reference": 1.0, "policy_grad": 1.0}
    for r in result["runs"]:
        assert math.isfinite(r["step_s"]) and r["step_s"] > 0 and math.isfinite(r["step_cpu_s"])
        assert r["peak_rss_mib"] > 0
        assert r["mean_completion_length"] == 8  # generation forced to the full length
    ratios = result["summary"]["by_length"]["8"]
    for key in ("RPG/GRPO(beta>0)", "RPG/GRPO(beta=0)"):
        assert math.isfinite(ratios[key]["step_time"]) and math.isfinite(ratios[key]["memory"])
    assert "RPG/GRPO" in cost.markdown(result)
