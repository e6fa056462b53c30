"""Smoke tests of the benchmark entry points' core functions (tiny sizes; the real runs are in docs/benchmarks.md)."""

import dataclasses
import json
import math
import os
import statistics
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import _common, cost, learning, offpolicy  # noqa: E402
from benchmarks._common import write_json  # noqa: E402


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_learning_saves_after_every_run_and_resumes_only_what_is_missing(tmp_path, monkeypatch):
    """benchmarks/learning.py with the checkpoints and the training stubbed out: the partial results file after each
    run, and `--resume` on it running only the missing (method, seed) runs of the file's settings."""
    trained = []

    def train_one(s, method, seed):
        trained.append((method, seed))
        if len(trained) == 3 and interrupt:
            raise KeyboardInterrupt
        return {"method": method, "seed": seed, "accuracy": [[0, 0.4], [8, 0.5 + 0.01 * seed]], "rewards": [0.5],
                "train_s": 1.0, "log_means": {}}

    monkeypatch.setattr(learning, "build_checkpoint", lambda s, seed: {"seed": seed, "sft_accuracy": 0.4})
    monkeypatch.setattr(learning, "train_one", train_one)
    s = dataclasses.replace(learning.FULL, seeds=(0, 1), methods=("RPG-REINFORCE-URKL", "GRPO"), workers=1,
                            cache_dir=str(tmp_path / "toy"), output_dir=str(tmp_path / "runs"))
    path = str(tmp_path / "learning.json")
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        learning.run(s, log=lambda *a: None, json_path=path)
    partial = json.loads(open(path).read())
    assert not partial["complete"] and [(r["method"], r["seed"]) for r in partial["runs"]] == [
        ("RPG-REINFORCE-URKL", 0), ("GRPO", 0)]
    interrupt, trained[:] = False, []
    result = learning.main(["--resume", path])  # python -m benchmarks.learning --resume FILE
    assert trained == [("RPG-REINFORCE-URKL", 1), ("GRPO", 1)]
    assert result["complete"] and json.loads(open(path).read())["complete"]
    assert [(r["method"], r["seed"]) for r in result["runs"]] == [("RPG-REINFORCE-URKL", 0), ("GRPO", 0),
                                                                   ("RPG-REINFORCE-URKL", 1), ("GRPO", 1)]
    assert result["summary"]["methods"]["GRPO"]["last_mean"] == pytest.approx(0.505)


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
        repetitions=1, warmup_cycles=1, measured_cycles=1, train_rounds=3, cache_dir=str(tmp_path / "cost"),
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
    # What holds on any machine: step times and peak RSS are positive, so those ratios exist; "RSS above start" may
    # measure 0 (runs in one process reuse memory it already holds): its ratio is then undefined, never an error.
    row = result["summary"]["by_length"]["8"]
    for other in ("GRPO(beta>0)", "GRPO(beta=0)"):
        r = row[f"RPG/{other}"]
        assert r["step_time"] == pytest.approx(row["RPG"]["step_s_median"] / row[other]["step_s_median"])
        assert r["memory"] == pytest.approx(row["RPG"]["mem_mib_median"] / row[other]["mem_mib_median"])
        above = row[other]["mem_above_start_mib"]
        if above:
            assert r["memory_above_start"] == pytest.approx(row["RPG"]["mem_above_start_mib"] / above)
        else:
            assert r["memory_above_start"] is None
    table = cost.markdown(result)
    assert "RPG/GRPO" in table and "Training side on its own" in table
    # the training side: one fixed batch, the trainers' cycles interleaved with a rotating order, paired ratios
    (side,) = result["training_side"]
    assert side["turns"] == ["GRPO(beta>0)", "GRPO(beta=0)", "RPG", "GRPO(beta=0)", "RPG", "GRPO(beta>0)",
                             "RPG", "GRPO(beta>0)", "GRPO(beta=0)"]  # as run, after one warm-up round (A B C)
    for m in cost.METHODS:
        assert len(side["step_cpu_s"][m]) == 3 and all(t > 0 for t in side["step_cpu_s"][m])
        # every trainer scored the same fixed completions (full length, same rewards batch after batch)
        assert side["batches"][m] == side["batches"]["RPG"] and len(side["batches"][m]) == 4
        assert all(length == 8 for _, length in side["batches"][m])
    summ = row["training_side"]
    logs = [math.log(a / b) for a, b in zip(side["step_cpu_s"]["RPG"], side["step_cpu_s"]["GRPO(beta=0)"])]
    assert summ["RPG/GRPO(beta=0)"]["ratio"] == pytest.approx(math.exp(sum(logs) / 3))
    assert summ["RPG/GRPO(beta=0)"]["low"] < summ["RPG/GRPO(beta=0)"]["ratio"] < summ["RPG/GRPO(beta=0)"]["high"]
    # the parts that differ between the trainers were timed in every round: the loss without the model pass (less
    # than the whole step) and the gradient-norm hook
    for m in cost.METHODS:
        assert len(side["parts_s"][m]) == 3
        for cycle in side["parts_s"][m]:
            assert set(cycle) == set(cost.PARTS) and all(v > 0 for v in cycle.values())
        parts = summ[m]["parts_ms_median"]
        assert 0 < parts["loss_without_model"] < 1e3 * summ[m]["step_s_median"]
    assert "loss without the model pass" in table


def test_the_training_side_clock_stops_after_every_other_callback():
    """`run_last`: the timing callback's `on_step_end` runs after the trainer's own (RPG's parameter guard)."""
    from transformers.trainer_callback import CallbackHandler, TrainerCallback

    order = []

    class Named(TrainerCallback):
        def __init__(self, name):
            self.name = name

        def on_step_end(self, args, state, control, **kwargs):
            order.append(self.name)

    timing = Named("timing")
    handler = CallbackHandler([timing, Named("guard")], None, None, None, None)
    trainer = types.SimpleNamespace(remove_callback=handler.remove_callback, add_callback=handler.add_callback)
    cost.run_last(trainer, timing)
    handler.on_step_end(types.SimpleNamespace(), types.SimpleNamespace(), types.SimpleNamespace())
    assert order == ["guard", "timing"]


def test_ratio_ci_pairs_rounds_and_refuses_zero_times():
    r = cost.ratio_ci([1.0, 1.1, 0.9], [1.0, 1.0, 1.0])
    logs = [0.0, math.log(1.1), math.log(0.9)]
    mean = sum(logs) / 3
    half = 4.30 * statistics.stdev(logs) / math.sqrt(3)
    assert r["ratio"] == pytest.approx(math.exp(mean)) and r["n"] == 3
    assert r["low"] == pytest.approx(math.exp(mean - half)) and r["high"] == pytest.approx(math.exp(mean + half))
    assert cost.ratio_ci([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]) is None  # a time that measured 0: undefined, no error
    assert cost.ratio_ci([1.0], [1.0]) is None  # one round: no interval
    assert cost.target_verdict({"ratio": 1.0, "low": 0.99, "high": 1.015}) == "met"
    assert cost.target_verdict({"ratio": 1.05, "low": 1.03, "high": 1.07}) == "missed"
    assert cost.target_verdict({"ratio": 1.02, "low": 1.0, "high": 1.04}).startswith("not resolved")
    assert cost.target_verdict(None) == "not measured"


def _cost_run(method, step_s, rss, rss_start):
    return {"method": method, "length": 8, "step_s": step_s, "step_cpu_s": step_s, "peak_rss_mib": rss,
            "rss_start_mib": rss_start, "reference_model": method == "GRPO(beta>0)", "mean_completion_length": 8.0,
            "passes_per_batch": None}


def test_cost_ratios_with_a_zero_denominator_are_undefined_not_an_error():
    """The CI failure: a trainer's "RSS above start" measured 0 and the ratio divided by it."""
    s = dataclasses.replace(cost.QUICK, lengths=(8,))
    runs = [_cost_run("RPG", 0.2, 500.0, 400.0), _cost_run("GRPO(beta>0)", 0.25, 600.0, 600.0),
            _cost_run("GRPO(beta=0)", 0.0, 500.0, 450.0)]
    summary = cost.summarize(s, runs)
    row = summary["by_length"]["8"]
    assert row["RPG/GRPO(beta>0)"]["memory_above_start"] is None  # 100 / 0
    assert row["RPG/GRPO(beta>0)"]["step_time"] == pytest.approx(0.8)
    assert row["RPG/GRPO(beta=0)"]["step_time"] is None  # 0.2 / 0
    assert row["RPG/GRPO(beta=0)"]["memory_above_start"] == pytest.approx(2.0)
    table = cost.markdown({"settings": cost._to_jsonable(s), "summary": summary, "n_params": 1000})
    assert "undefined" in table and "the denominator measured 0" in table
    assert _common.ratio(1.0, 0.0) is None and _common.ratio(None, 1.0) is None
    assert _common.ratio(float("nan"), 1.0) is None and _common.ratio(3.0, 2.0) == 1.5
    assert _common.fmt_ratio(None) == "undefined" and _common.fmt_ratio(1.5) == "1.500"


# ---------------------------------------------------------------------------------------------------------------------
# The off-policy sweep (benchmarks/offpolicy.py)
# ---------------------------------------------------------------------------------------------------------------------


def test_offpolicy_sweep_smoke(tmp_path, keep_threads):
    """A tiny sweep end to end: every (method, regime, seed) runs once, from the seed's one SFT start, with the same
    prompts, steps and samples; the summary, tables, plot and strict JSON come out."""
    s = dataclasses.replace(
        offpolicy.FULL, seeds=(0, 1), methods=("RPG-REINFORCE-URKL", "DAPO"), reuse_levels=(1, 2), max_steps=2,
        stress_learning_rate=None, per_device_train_batch_size=8, num_generations=4, eval_problems=8, eval_every=1,
        sft_steps=3, num_train_problems=32, workers=1, cache_dir=str(tmp_path / "toy"),
        output_dir=str(tmp_path / "runs"),
    )
    partial = tmp_path / "offpolicy.json"
    result = offpolicy.run(s, log=lambda *a: None, json_path=str(partial))
    runs = result["runs"]
    assert sorted((r["method"], r["regime"], r["seed"]) for r in runs) == sorted(offpolicy.jobs(s))
    assert len(runs) == 2 * 2 * 2
    assert json.loads(partial.read_text())["complete"] is False  # written while running: runs so far, no summary
    for seed in s.seeds:
        mine = [r for r in runs if r["seed"] == seed]
        assert len({r["start"] for r in mine}) == 1 and len({r["accuracy"][0][1] for r in mine}) == 1
        assert len({r["prompt_digest"] for r in mine}) == 1  # same prompts, same order, every method and reuse
    for r in runs:
        assert r["steps"] == 2 and r["samples"] == 2 * 8  # equal optimizer steps and generated samples
        assert [step for step, _ in r["accuracy"]] == [0, 1, 2]
        assert r["reuse"] == (1 if r["regime"] == "reuse 1" else 2)
        assert r["drift"]["tokens"] > 0
        if r["reuse"] == 1:  # on-policy: no stored sampler log-probs, w = 1 exactly
            assert r["drift"]["w_max"] == 1.0 and r["drift"]["kl_sampler"] == 0.0
    summ = result["summary"]
    inv = summ["invariants"]
    assert inv["same_start_per_seed"] and inv["same_prompts_per_seed"]
    assert inv["equal_steps_per_regime"] and inv["equal_samples_per_regime"]
    assert set(summ["regimes"]) == {"reuse 1", "reuse 2"}
    assert summ["paired"]["reuse 2: RPG-REINFORCE-URKL - DAPO"]["last"]["n"] == 2
    table = offpolicy.markdown(result)
    assert "RPG-REINFORCE-URKL" in table and "KL(μ‖π)" in table and "same SFT start per seed yes" in table
    assert offpolicy.plot(result, str(tmp_path / "offpolicy.png"))
    write_json(str(tmp_path / "final.json"), result)
    json.loads((tmp_path / "final.json").read_text())
    # a resumed run does nothing more when every run is there
    again = offpolicy.run(s, log=lambda *a: None, previous=json.loads((tmp_path / "final.json").read_text()))
    assert len(again["runs"]) == len(runs)


def _acc_run(method, regime, seed, accs, start="ckpt", digest="p", steps=4, samples=32):
    return {"method": method, "regime": regime, "seed": seed, "accuracy": [[2 * i, a] for i, a in enumerate(accs)],
            "start": f"{start}{seed}", "prompt_digest": f"{digest}{seed}", "steps": steps, "samples": samples,
            "train_s": 3.0, "eval_s": 1.0, "drift": {}, "log_means": {}}


def test_offpolicy_summary_is_computed_from_the_runs():
    s = dataclasses.replace(offpolicy.FULL, seeds=(0, 1, 2), methods=("A", "DAPO"), reuse_levels=(1, 4),
                            max_steps=4, stress_learning_rate=None)
    runs = []
    for seed, (a1, d1, a4, d4) in enumerate([(0.5, 0.4, 0.6, 0.5), (0.5, 0.5, 0.7, 0.5), (0.6, 0.5, 0.3, 0.6)]):
        runs += [_acc_run("A", "reuse 1", seed, [0.4, a1]), _acc_run("DAPO", "reuse 1", seed, [0.4, d1]),
                 _acc_run("A", "reuse 4", seed, [0.4, a4]), _acc_run("DAPO", "reuse 4", seed, [0.4, d4])]
    runs[-2]["accuracy"] = [[0, 0.4], [2, 0.8], [4, 0.65], [6, 0.3]]  # seed 2, A, reuse 4: collapses after 0.8
    summ = offpolicy.summarize(s, [{"sft_accuracy": 0.4}], runs)
    p = summ["paired"]["reuse 4: A - DAPO"]
    diffs = [0.6 - 0.5, 0.7 - 0.5, 0.3 - 0.6]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert p["last"]["mean"] == pytest.approx(mean) and p["last"]["n"] == 3
    assert p["last"]["half_width"] == pytest.approx(4.30 * sd / math.sqrt(3))  # t(0.975, df=2) = 4.30
    assert p["best"]["mean"] == pytest.approx((0.1 + 0.2 + 0.2) / 3)  # best: 0.6 / 0.7 / 0.8 against 0.5 / 0.5 / 0.6
    assert (p["wins"], p["ties"], p["losses"]) == (2, 0, 1)
    assert summ["paired"]["reuse 1: A - DAPO"]["last"]["mean"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert (summ["paired"]["reuse 1: A - DAPO"]["ties"]) == 1
    assert summ["regimes"]["reuse 4"]["A"]["collapses"] == 1 and summ["regimes"]["reuse 1"]["A"]["collapses"] == 0
    assert summ["reuse_effect"]["A"]["last"]["mean"] == pytest.approx((0.1 + 0.2 - 0.3) / 3)
    assert summ["regimes"]["reuse 4"]["A"]["train_s"] == pytest.approx(2.0)  # evaluations excluded
    assert all(v for k, v in summ["invariants"].items() if isinstance(v, bool))
    runs[0]["start"] = "other"  # a run from another checkpoint, one with fewer samples: the invariants say so
    runs[1]["samples"] = 16
    inv = offpolicy.summarize(s, [{"sft_accuracy": 0.4}], runs)["invariants"]
    assert not inv["same_start_per_seed"] and not inv["equal_samples_per_regime"]
    assert inv["same_prompts_per_seed"] and inv["equal_steps_per_regime"]


def test_collapse_means_falling_more_than_the_drop_below_the_best_and_staying_there():
    assert offpolicy.collapse_index([0.4, 0.8, 0.65, 0.3], 0.10) == 2
    assert offpolicy.collapse_index([0.4, 0.8, 0.6, 0.75], 0.10) is None  # came back within 0.10 of the best
    assert offpolicy.collapse_index([0.4, 0.8, 0.71], 0.10) is None  # 0.09 below: not a collapse
    assert offpolicy.collapse_index([0.5, 0.5], 0.10) is None


def test_offpolicy_resume_refuses_another_toy_task_version(tmp_path):
    s = dataclasses.replace(offpolicy.QUICK, cache_dir=str(tmp_path / "toy"), output_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="made with toy task version 0123456789"):
        offpolicy.run(s, log=lambda *a: None, previous={"settings": {"toy_fingerprint": "0123456789"}, "runs": []})


def test_the_frozen_toy_is_every_task_module_and_its_hash_covers_them_all(tmp_path):
    """The benchmarks run a frozen copy of the toy task: task.py and every toy module it imports (the split package),
    imported from the copy, and the hash that keys the cached SFT starts changes with any of them."""
    import inspect
    import types

    s = types.SimpleNamespace(toy_path=None, cache_dir=str(tmp_path / "cache"))
    _common.freeze_toy(s)
    toy = _common.toy_module(s)
    assert sorted(os.listdir(s.toy_path)) == ["__init__.py", *_common.toy_task_files(s.toy_path)]
    assert {"problems.py", "warmup.py", "build.py"} <= set(os.listdir(s.toy_path))
    fingerprint = _common.toy_fingerprint(s.toy_path)
    for name in ("toy_reward", "sft_warmup", "build_toy_model"):
        # from a frozen copy with this hash (this one, or an identical one an earlier benchmark in this process froze)
        folder = os.path.dirname(inspect.getfile(getattr(toy, name)))
        assert os.path.basename(folder) == "toy_frozen" and _common.toy_fingerprint(folder) == fingerprint, folder
    before = _common.toy_fingerprint(s.toy_path)
    with open(os.path.join(s.toy_path, "problems.py"), "a") as f:
        f.write("\n# changed\n")
    assert _common.toy_fingerprint(s.toy_path) != before


def test_offpolicy_regimes_and_their_validation():
    names = [g["name"] for g in offpolicy.regimes(offpolicy.FULL)]
    assert names == ["reuse 1", "reuse 4", "reuse 16", "reuse 16, lr 0.001"]
    assert offpolicy.FULL.max_steps % 16 == 0 and len(offpolicy.FULL.seeds) >= 6
    stress = offpolicy.regimes(offpolicy.FULL)[-1]
    assert stress["stress"] and stress["learning_rate"] > 3 * offpolicy.FULL.learning_rate
    with pytest.raises(ValueError, match="reuse_levels: 5 does not divide max_steps=96"):
        offpolicy.regimes(dataclasses.replace(offpolicy.FULL, reuse_levels=(1, 5)))


def test_offpolicy_run_configs(tmp_path):
    """What each run trains with: the regime's reuse and learning rate, the method's own objective, one beta."""
    s = dataclasses.replace(offpolicy.FULL, output_dir=str(tmp_path))
    stress = offpolicy.regimes(s)[-1]["name"]
    configs = {(m, g["name"]): offpolicy.run_config(s, m, g["name"], 3)[1] for m in s.methods
               for g in offpolicy.regimes(s)}
    for (m, regime), c in configs.items():
        assert c.max_steps == 96 and c.per_device_train_batch_size == 64 and c.num_generations == 8
        assert c.gradient_accumulation_steps == 1 and c.num_iterations == 1 and c.seed == 3 and c.data_seed == 3
        assert c.steps_per_generation == (1 if regime == "reuse 1" else 4 if regime == "reuse 4" else 16)
        assert c.learning_rate == (1e-3 if regime == stress else 3e-4)
        assert c.beta == (0.0 if m == "DAPO" else offpolicy.KL_BETA)
    c = configs[("RPG-REINFORCE-UFKL std", "reuse 4")]
    assert (c.rpg_divergence, c.rpg_estimator, c.scale_rewards, c.rpg_reference) == ("ufkl", "reinforce", "group",
                                                                                     "sampling")
    assert (c.epsilon, c.epsilon_high, c.rpg_dual_clip_c, c.loss_type) == (0.2, 0.28, 10.0, "dapo")
    assert configs[("RPG-REINFORCE-URKL", "reuse 4")].scale_rewards == "none"
    c = configs[("RPG-REINFORCE-URKL periodic", "reuse 16")]
    assert c.rpg_reference == "periodic" and c.rpg_reference_update_steps == offpolicy.PERIODIC_UPDATE_STEPS
    c = configs[("GRPO", "reuse 16")]
    assert (c.loss_type, c.epsilon, c.epsilon_high, c.scale_rewards) == ("grpo", 0.2, None, "group")
    c = configs[("DAPO", "reuse 16")]
    assert (c.loss_type, c.epsilon, c.epsilon_high, c.scale_rewards) == ("dapo", 0.2, 0.28, "group")
    cls, _ = offpolicy.run_config(s, "GRPO", "reuse 1", 0)
    assert issubclass(cls, offpolicy.DriftMixin)


def test_summarize_drift_known_values():
    log_w = torch.log(torch.tensor([1.0, 1.5, 0.5, 20.0]))
    records = [{"step": 0, "log_w": torch.zeros(2), "adv": torch.tensor([1.0, -1.0]), "kl_weight": None},
               {"step": 1, "log_w": log_w, "adv": torch.tensor([1.0, 1.0, -1.0, -1.0]), "kl_weight": None}]
    d = offpolicy.summarize_drift(records, reuse=2, eps_low=0.2, eps_high=0.28)  # floats kept to 6 digits
    w = torch.tensor([1.0, 1.0, 1.0, 1.5, 0.5, 20.0], dtype=torch.float64)
    assert d["tokens"] == 6 and d["w_max"] == pytest.approx(20.0, rel=1e-5)
    assert d["w_min"] == pytest.approx(0.5, rel=1e-5)
    assert d["kl_sampler"] == pytest.approx(float((w - 1 - w.log()).mean()), rel=1e-5)
    assert d["clip_high"] == pytest.approx(1 / 6, rel=1e-5)  # w = 1.5 with A > 0
    assert d["clip_low"] == pytest.approx(1 / 6, rel=1e-5)  # w = 0.5 with A < 0
    assert d["clip_dual"] == pytest.approx(1 / 6, rel=1e-5)  # w = 20 with A < 0
    assert d["outside_trust_region"] == pytest.approx(3 / 6, rel=1e-5)
    assert d["w_quantiles"]["0.5"] == pytest.approx(1.0, rel=1e-5)
    assert [p["position"] for p in d["by_position"]] == [0, 1]
    assert d["by_position"][0]["kl_sampler"] == 0.0 and d["by_position"][1]["outside_trust_region"] == 0.75
    assert "kl_share" not in d  # not known for these records


@pytest.mark.parametrize("kind", ["rpg", "grpo"])
def test_drift_mixin_records_log_w_of_each_training_micro_batch(tmp_path, kind):
    """The recorder on a real trainer: the first step of a reused batch is on-policy (w = 1 up to rounding), the
    second has drifted; RPG and GRPO are measured by the same code."""
    from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer

    path = save_tiny_model(str(tmp_path / "model"))
    args = cpu_args(tmp_path / "out", max_steps=2, steps_per_generation=2, beta=0.1)
    config = RPGConfig(**args) if kind == "rpg" else GRPOConfig(**args)
    base = RPGTrainer if kind == "rpg" else GRPOTrainer
    cls = type("Recorded", (offpolicy.DriftMixin, base), {})
    trainer = cls(model=path, reward_funcs=length_reward, args=config, train_dataset=tiny_dataset(16))
    trainer.train()
    records = trainer.drift_records
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["log_w"].numel() > 0 and r["log_w"].shape == r["adv"].shape for r in records)
    assert records[0]["log_w"].abs().max() < 1e-4
    assert records[1]["log_w"].abs().max() > 1e-3  # lr 1e-2: the second mini-batch is off-policy
    assert all(r["kl_weight"] is not None for r in records)  # URKL with the sampler as reference / GRPO's k3
    d = trainer.drift_summary(2, 0.2, 0.2)
    assert d["tokens"] == sum(r["log_w"].numel() for r in records) and d["kl_share"] > 0


class _Written(Exception):
    """Raised by the stand-in `write_json`: where a benchmark's `main` writes its results."""


@pytest.mark.parametrize("module", ["learning", "offpolicy", "cost", "bandit_optimum", "smollm2"])
def test_quick_runs_write_outside_the_committed_results(module, monkeypatch):
    """`--quick` writes to outputs/benchmarks/ (git-ignored), never over benchmarks/results/, the committed record;
    a full run still writes the record. The benchmark itself is stubbed out: only where `main` writes is checked."""
    import importlib
    import subprocess

    bench = importlib.import_module(f"benchmarks.{module}")

    def written(path, obj):
        raise _Written(path)

    monkeypatch.setattr(_common, "write_json", written)
    if hasattr(bench, "write_json"):
        monkeypatch.setattr(bench, "write_json", written)
    if module == "bandit_optimum":
        monkeypatch.setattr(bench, "train_policy", lambda *a: {"to_reverse": 0.0, "to_forward": 0.0,
                                                               "cpu_seconds": 0.0})
        monkeypatch.setattr(bench, "summarize", lambda *a: {})
        argv = ["--methods", next(iter(bench.METHODS)), "--seeds", "0"]
    else:
        monkeypatch.setattr(bench, "run", lambda *a, **k: {"machine": {}})
        monkeypatch.setattr(bench, "plot", lambda *a: None)
        argv = []
    paths = {}
    for quick in (True, False):
        with pytest.raises(_Written) as written_to:
            bench.main(argv + (["--quick"] if quick else []))
        paths[quick] = os.path.abspath(str(written_to.value))
    results = os.path.abspath(_common.RESULTS_DIR)
    assert os.path.dirname(paths[False]) == results  # the record
    assert not paths[True].startswith(results + os.sep) and paths[True].startswith(_common.QUICK_RESULTS_DIR)
    ignored = subprocess.run(["git", "check-ignore", "-q", paths[True]], cwd=os.path.dirname(results))
    assert ignored.returncode == 0, f"{paths[True]} is not ignored by git"


def test_cost_vllm_ratios_are_paired():
    """`python -m benchmarks.cost_vllm`: each ratio is the geometric mean of the paired ratios (per
    round on CPU, per repetition on GPU) with its 95% interval; the table names the passes and every ratio."""
    from benchmarks import cost_vllm

    times = {"RPG(engine)": [0.75, 0.8, 0.7], "RPG(recompute)": [1.0, 1.0, 1.0], "GRPO(beta=0)": [1.0, 1.05, 0.95],
             "GRPO(beta>0)": [1.25, 1.25, 1.25]}
    passes = {m: {"policy_no_grad": 0 if m == "RPG(engine)" else 1, "reference": int("beta>0" in m),
                  "policy_grad": 1} for m in times}
    cpu = dataclasses.replace(cost_vllm.QUICK, lengths=(8,))
    gpu = dataclasses.replace(cost_vllm.CUDA_QUICK, lengths=(8,), repetitions=3)
    cpu_runs = [{"length": 8, "train_cpu_s": times, "passes_per_batch": passes}]
    gpu_runs = [{"method": m, "length": 8, "repetition": rep, "train_s": t, "passes_per_batch": passes[m]}
                for m, ts in times.items() for rep, t in enumerate(ts)]
    want = math.exp(statistics.fmean(math.log(a / b) for a, b in zip(times["RPG(engine)"], times["GRPO(beta=0)"])))
    for s, runs, unit in ((cpu, cpu_runs, "round"), (gpu, gpu_runs, "repetition")):
        summary = cost_vllm.summarize(s, runs)
        row = summary["by_length"]["8"]
        assert row["paired_by"] == unit and row["RPG(engine)/GRPO(beta=0)"]["ratio"] == pytest.approx(want)
        assert row["RPG(engine)/RPG(recompute)"]["ratio"] == pytest.approx((0.75 * 0.8 * 0.7) ** (1 / 3))
        assert row["RPG(engine)/GRPO(beta>0)"]["low"] < row["RPG(engine)/GRPO(beta>0)"]["ratio"] < 0.65
        table = cost_vllm.markdown({"settings": cost._to_jsonable(s), "summary": summary, "n_params": 1000})
        assert "| 8 | RPG(engine) | 0 + 0 (+ 1) |" in table and "RPG(engine) / RPG(recompute) [95% CI]" in table
        assert f"paired by {unit}" in table


@pytest.mark.slow
def test_cost_vllm_smoke(tmp_path, keep_threads):
    """The four trainers in this process on a replayed engine output (the CPU path): "engine" makes no no-grad
    pass, the others one per generation batch (GRPO(beta>0) a reference pass too)."""
    from _fake_vllm import installed

    from benchmarks import cost_vllm

    s = dataclasses.replace(cost_vllm.QUICK, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, lengths=(8,), train_rounds=2, cache_dir=str(tmp_path / "cost"))
    with installed():
        result = cost_vllm.run(s, log=lambda *a: None, spawn=False)
    (run,) = result["runs"]
    passes = run["passes_per_batch"]
    assert passes["RPG(engine)"]["policy_no_grad"] == 0 and passes["RPG(recompute)"]["policy_no_grad"] == 1
    assert passes["GRPO(beta>0)"]["reference"] == 1 and passes["GRPO(beta=0)"]["reference"] == 0
    assert all(len(t) == 2 and min(t) > 0 for t in run["train_cpu_s"].values())


def test_smollm2_summary_pairs_runs_by_seed():
    """benchmarks/smollm2.py's summary: final accuracies per method, gains over the shared start, and paired
    differences (same seed) to GRPO with their t-interval."""
    from benchmarks import smollm2

    def acc(sampled, greedy):
        return {"sampled": sampled, "greedy": greedy}

    def run(method, seed, start, last):
        return {"method": method, "seed": seed, "accuracy": [(0, acc(start, 0.8)), (24, acc(last, 0.9))],
                "rewards": [start, last], "total_s": 10.0}

    runs = [run("RPG", 0, 0.1, 0.7), run("GRPO", 0, 0.1, 0.5), run("RPG", 1, 0.2, 0.8), run("GRPO", 1, 0.2, 0.7),
            run("RPG", 2, 0.1, 0.9), run("GRPO", 2, 0.1, 0.6)]
    summary = smollm2.summarize(runs)
    rpg = summary["methods"]["RPG"]
    assert rpg["sampled_mean"] == pytest.approx(0.8) and rpg["sampled_gain"] == pytest.approx(0.8 - 0.4 / 3)
    assert rpg["greedy_mean"] == pytest.approx(0.9) and rpg["reward_last"] == pytest.approx(0.8)
    paired = summary["paired"]["RPG - GRPO"]["sampled"]
    diffs = [0.2, 0.1, 0.3]  # per seed
    sd = statistics.stdev(diffs)
    assert paired["mean"] == pytest.approx(0.2) and paired["n"] == 3
    assert paired["half_width"] == pytest.approx(4.303 * sd / math.sqrt(3), rel=1e-3)
    assert "RPG - GRPO" in smollm2.markdown({"summary": summary, "settings": {
        "max_steps": 24, "generation_batches": 6, "reuse": 4, "seeds": [0, 1, 2], "eval_samples": 4}})


def test_smollm2_saves_after_every_run_resumes_what_is_missing_and_plots(tmp_path, monkeypatch, keep_threads):
    """benchmarks/smollm2.py's driver, with the model, the start's evaluation and the training stubbed out: the
    partial result is written after every run, the shared start is step 0 of each run, ``--resume`` trains only the
    (method, seed) pairs missing from the file and reuses its starts, and ``--summarize`` rewrites the plot."""
    import trl_rpg.smollm2
    from benchmarks import smollm2

    trained, evaluated, snapshots = [], [], []

    def evaluate_start(s, path, seed):
        evaluated.append(seed)
        return {"seed": seed, "accuracy": {"greedy": 0.8, "sampled": 0.1 + seed / 10}}

    def train_one(s, path, method, seed):
        trained.append((method, seed))
        last = {"greedy": 0.9, "sampled": 0.5 + seed / 10 + (0.1 if method == "GRPO" else 0.0)}
        return {"method": method, "seed": seed, "accuracy": [(s.max_steps, last)], "rewards": [0.1, 0.6],
                "total_s": 1.0, "log_means": {}}

    real_write = smollm2.write_json

    def write_json(path, obj):
        snapshots.append((len(obj["runs"]), obj["complete"]))
        real_write(path, obj)

    monkeypatch.setattr(trl_rpg.smollm2, "prepare_smollm2", lambda *a, **k: "model")
    monkeypatch.setattr(smollm2, "evaluate_start", evaluate_start)
    monkeypatch.setattr(smollm2, "train_one", train_one)
    monkeypatch.setattr(smollm2, "write_json", write_json)
    out = tmp_path / "smollm2.json"
    s = dataclasses.replace(smollm2.FULL, seeds=(0, 1), methods=("RPG-REINFORCE-URKL", "GRPO"), workers=1)
    first = smollm2.run(s, log=lambda *a: None, json_path=str(out))
    assert trained == smollm2.jobs(s) == [("RPG-REINFORCE-URKL", 0), ("GRPO", 0), ("RPG-REINFORCE-URKL", 1),
                                          ("GRPO", 1)]
    assert snapshots == [(1, False), (2, False), (3, False), (4, False)] and first["complete"]
    assert all(r["accuracy"][0] == (0, {"greedy": 0.8, "sampled": 0.1 + r["seed"] / 10}) for r in first["runs"])
    assert first["summary"]["paired"]["RPG-REINFORCE-URKL - GRPO"]["sampled"]["mean"] == pytest.approx(-0.1)

    partial = json.loads(out.read_text())  # as a crash after the second run would have left it
    partial["runs"] = partial["runs"][:2]
    partial["complete"] = False
    out.write_text(json.dumps(partial))
    trained.clear(), evaluated.clear()
    monkeypatch.setattr(smollm2, "plot", lambda result, path: str(path))
    resumed = smollm2.main(["--resume", str(out), "--workers", "1"])
    assert trained == [("RPG-REINFORCE-URKL", 1), ("GRPO", 1)] and evaluated == []  # the starts came from the file
    assert resumed["complete"] and [(r["method"], r["seed"]) for r in resumed["runs"]] == smollm2.jobs(s)
    assert resumed["summary"] == json.loads(json.dumps(first["summary"]))
    assert smollm2.settings_from_dict(resumed["settings"]) == s

    monkeypatch.undo()
    png = smollm2.plot(json.loads(out.read_text()), str(tmp_path / "smollm2.png"))
    assert png is None or os.path.getsize(png) > 0


def test_a_worker_process_is_replaced_after_its_share_of_runs(monkeypatch):
    """A long benchmark's workers are fresh processes after every `workers * TASKS_PER_WORKER` runs (they grew to
    12 GiB each and swapped otherwise): the runs of one chunk and of the next share no process, and every run's
    result comes back in job order."""
    monkeypatch.setattr(_common, "TASKS_PER_WORKER", 2)
    with _common.WorkerPool(2) as pool:
        pids = pool.map(os.getpid, [()] * 9)
    chunks = [set(pids[i:i + 4]) for i in range(0, 9, 4)]
    assert len(pids) == 9 and all(isinstance(pid, int) for pid in pids)
    assert not chunks[0] & chunks[1] and not chunks[1] & chunks[2] and os.getpid() not in pids
    with _common.WorkerPool(2, tasks_per_worker=1) as pool:  # a real model's benchmark: a fresh process per run
        pids = pool.map(os.getpid, [()] * 4)
    assert not set(pids[:2]) & set(pids[2:]) and len(pids) == 4


def test_the_training_side_runs_with_the_allocator_pinned_and_a_trainer_run_with_the_defaults(monkeypatch):
    """`PINNED_MALLOC` reaches the training side's process (three trainers in threads: glibc's per-thread arenas
    and moving mmap threshold made the ratio depend on allocation history), not a single trainer's run;
    `--default-malloc` turns it off."""
    seen = {}

    def fake_run(command, env=None, **kwargs):
        spec = json.load(open(command[-1]))
        seen[spec["method"]] = env
        with open(spec["out"], "w") as f:
            json.dump({}, f)
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(cost.subprocess, "run", fake_run)
    for key in cost.PINNED_MALLOC:
        monkeypatch.delenv(key, raising=False)
    cost._spawn(cost.QUICK, None, 8)
    cost._spawn(cost.QUICK, "RPG", 8)
    assert all(seen[None][k] == v for k, v in cost.PINNED_MALLOC.items())
    assert not set(cost.PINNED_MALLOC) & set(seen["RPG"])
    cost._spawn(dataclasses.replace(cost.QUICK, pinned_malloc=False), None, 8)
    assert not set(cost.PINNED_MALLOC) & set(seen[None])
    ran = []
    monkeypatch.setattr(cost, "run", lambda s, *a, **k: ran.append(s) or (_ for _ in ()).throw(SystemExit(0)))
    for argv, pinned in (([], True), (["--default-malloc"], False)):
        with pytest.raises(SystemExit):
            cost.main(argv)
        assert ran[-1].pinned_malloc is pinned
    with pytest.raises(SystemExit):
        cost.make_parser("cost_vllm").parse_args(["--default-malloc"])
