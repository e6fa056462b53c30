"""benchmarks/tuning.py: the tuning protocol, driven by cheap made-up objectives (no training).

A fake benchmark loop asks the protocol for its pending runs, scores them with a known function of (lr, beta, seed)
and repeats until nothing is pending: the chosen setting, the extended grid, the budget stop and the resumed search
are checked against what the function's optimum says they must be.
"""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import tuning  # noqa: E402

PROTOCOL = tuning.Protocol(tuning_seeds=(100, 101), reported_seeds=tuple(range(12)),
                           learning_rates=(1.5e-4, 3e-4, 6e-4), betas=(0.1, 0.3, 1.0), budget=60)
METHODS = {"GRPO": False, "RPG": True}


def peaked(lr_best, beta_best=None):
    """Accuracy peaked (log-quadratic) at lr_best (and beta_best), plus a small seed effect."""
    def score(method, setting, seed):
        value = 0.8 - 0.1 * math.log(setting["learning_rate"] / lr_best) ** 2 + 0.001 * (seed - 100)
        if "beta" in setting and beta_best is not None:
            value -= 0.05 * math.log(setting["beta"] / beta_best) ** 2
        return value
    return score


def drive(protocol, methods, objective, runs=None, stop_after=None):
    """The benchmark's loop: run what is pending (in order), record each run, until nothing is (or `stop_after`
    runs, an interruption)."""
    runs = list(runs or [])
    while True:
        jobs = tuning.pending_jobs(protocol, methods, runs)
        if not jobs:
            return runs
        for method, setting, seed in jobs:
            if stop_after is not None and len(runs) >= stop_after:
                return runs
            runs.append({"phase": "tune", "method": method, "setting": setting, "seed": seed,
                         "score": objective(method, setting, seed)})


def states(protocol, methods, runs):
    return {m: tuning.tuning_state(protocol, reg, tuning.scores_of(runs, m)) for m, reg in methods.items()}


def test_an_optimum_inside_the_grid_is_chosen_without_extending():
    runs = drive(PROTOCOL, METHODS, peaked(3e-4, 0.3))
    chosen = tuning.chosen_settings(PROTOCOL, METHODS, runs)
    assert chosen == {"GRPO": {"learning_rate": 3e-4}, "RPG": {"learning_rate": 3e-4, "beta": 0.3}}
    st = states(PROTOCOL, METHODS, runs)
    assert st["RPG"]["runs"] == 18 and st["GRPO"]["runs"] == 6  # 3 x 3 and 3 settings, x 2 tuning seeds
    assert st["RPG"]["extensions"] == [] and st["RPG"]["stopped_by"] is None
    assert {r["seed"] for r in runs} == set(PROTOCOL.tuning_seeds)


def test_an_optimum_past_an_edge_extends_the_grid_multiplicatively_until_it_is_inside():
    runs = drive(PROTOCOL, METHODS, peaked(2.4e-3, 0.03))
    st = states(PROTOCOL, METHODS, runs)
    assert st["GRPO"]["best"] == {"learning_rate": pytest.approx(2.4e-3)}
    assert [e["value"] for e in st["GRPO"]["extensions"]] == pytest.approx([1.2e-3, 2.4e-3, 4.8e-3])
    assert st["GRPO"]["stopped_by"] is None and st["GRPO"]["grid"]["learning_rate"][-1] == pytest.approx(4.8e-3)
    rpg = st["RPG"]  # beta extended downwards (divided by 3) past its low edge; lr upwards: both within budget
    assert rpg["best"]["beta"] == pytest.approx(0.1 / 3) and rpg["best"]["learning_rate"] == pytest.approx(2.4e-3)
    assert {(e["axis"], e["side"]) for e in rpg["extensions"]} == {("learning_rate", "high"), ("beta", "low")}
    assert rpg["runs"] <= PROTOCOL.budget and rpg["stopped_by"] is None


def test_the_budget_stops_an_extension_and_the_state_says_so():
    runs = drive(PROTOCOL, METHODS, peaked(1e-15, 0.3))  # the optimum is far below the grid
    st = states(PROTOCOL, METHODS, runs)
    rpg, grpo = st["RPG"], st["GRPO"]
    assert rpg["stopped_by"] == "budget" and rpg["edge"] == {"axis": "learning_rate", "side": "low"}
    assert rpg["runs"] <= PROTOCOL.budget < rpg["runs"] + 3 * len(PROTOCOL.tuning_seeds)  # the next row won't fit
    assert grpo["stopped_by"] == "budget" and grpo["runs"] == PROTOCOL.budget  # one value per extension: 2 runs each
    assert all(r["setting"]["learning_rate"] >= grpo["grid"]["learning_rate"][0] for r in runs)
    assert "budget reached with the best on an edge (learning_rate low)" in tuning.grid_markdown(st)


def test_an_interrupted_search_resumes_with_what_is_missing_and_ends_where_an_uninterrupted_one_does():
    objective = peaked(2.4e-3, 0.03)
    whole = drive(PROTOCOL, METHODS, objective)
    partial = drive(PROTOCOL, METHODS, objective, stop_after=7)
    assert len(partial) == 7
    missing = tuning.pending_jobs(PROTOCOL, METHODS, partial)
    done = {(r["method"], tuning.setting_key(r["setting"]), r["seed"]) for r in partial}
    assert not done & {(m, tuning.setting_key(s), seed) for m, s, seed in missing}  # nothing run twice
    resumed = drive(PROTOCOL, METHODS, objective, runs=partial)
    assert tuning.chosen_settings(PROTOCOL, METHODS, resumed) == tuning.chosen_settings(PROTOCOL, METHODS, whole)
    assert len(resumed) == len(whole)


def test_ties_go_to_the_smaller_learning_rate_and_a_diverged_setting_is_never_chosen():
    def flat(method, setting, seed):
        if setting["learning_rate"] == 6e-4 and seed == 101:
            return None  # diverged on one seed
        return 0.5 if setting["learning_rate"] in (3e-4, 6e-4) else 0.4
    runs = drive(PROTOCOL, {"GRPO": False}, flat)
    assert tuning.chosen_settings(PROTOCOL, {"GRPO": False}, runs) == {"GRPO": {"learning_rate": 3e-4}}

    def tie(method, setting, seed):
        return 0.5 if setting["learning_rate"] >= 3e-4 and setting["learning_rate"] <= 6e-4 else 0.1
    runs = drive(PROTOCOL, {"GRPO": False}, tie)
    assert tuning.chosen_settings(PROTOCOL, {"GRPO": False}, runs)["GRPO"] == {"learning_rate": 3e-4}

    runs = drive(PROTOCOL, {"GRPO": False}, lambda *a: None)
    assert states(PROTOCOL, {"GRPO": False}, runs)["GRPO"]["stopped_by"] == "diverged"
    with pytest.raises(RuntimeError, match="every setting diverged"):
        tuning.chosen_settings(PROTOCOL, {"GRPO": False}, runs)


@pytest.mark.parametrize("change,field", [
    ({"reported_seeds": tuple(range(1, 13)), "tuning_seeds": (0, 1)}, "reported_seeds must be disjoint"),
    ({"reported_seeds": tuple(range(11))}, "reported_seeds must hold at least 12"),
    ({"learning_rates": (3e-4,)}, "learning_rates must be at least 2"),
    ({"betas": (0.3, 0.1)}, "betas must be at least 2 positive finite values, increasing"),
    ({"budget": 17}, "budget must be an integer of at least the initial grid's runs \\(18\\)"),
    ({"lr_factor": 1.0}, "lr_factor must be a finite number > 1"),
])
def test_a_protocol_that_breaks_a_promise_is_refused_naming_the_field(change, field):
    import dataclasses

    with pytest.raises(ValueError, match=field):
        tuning.check_protocol(dataclasses.replace(PROTOCOL, **change))
    tuning.check_protocol(PROTOCOL)
    with pytest.raises(ValueError, match=r"reported runs on tuning seeds \[100\]"):
        tuning.check_reported(PROTOCOL, [3, 100])


def test_paired_intervals_say_no_detectable_difference_when_they_contain_zero():
    assert tuning.paired([0.1, -0.1, 0.05, -0.05] * 3)["verdict"] == tuning.NO_DIFFERENCE
    clear = tuning.paired([0.10, 0.12, 0.09, 0.11] * 3)
    assert clear["verdict"] == "higher" and clear["n"] == 12
    assert tuning.paired([-0.10, -0.12, -0.09, -0.11])["verdict"] == "lower"
    assert tuning.paired([0.1])["verdict"] == "too few seeds"
    assert tuning.paired_text(tuning.paired([0.1, -0.1, 0.0])).endswith("(no detectable difference)")


def test_the_sensitivity_plot_and_the_whole_grid(tmp_path):
    runs = drive(PROTOCOL, METHODS, peaked(3e-4, 0.3))
    st = states(PROTOCOL, METHODS, runs)
    assert [lr for lr, _ in tuning.sensitivity(st["RPG"])] == [1.5e-4, 3e-4, 6e-4]  # at the chosen beta only
    table = tuning.grid_markdown(st)
    assert table.count("chosen") == 2 and table.count("| RPG |") == 9 + 1 and "best inside the grid" in table
    assert tuning.plot_sensitivity(st, str(tmp_path / "s.png"), "test") and (tmp_path / "s.png").stat().st_size > 0
