"""benchmarks/asynchronous.py's bookkeeping, on made-up runs (no training): which beta the sweep picks, which beta
each main run gets, the summary's table and paired differences, what a resumed run skips."""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from benchmarks import asynchronous as bench  # noqa: E402


def made_up(method, staleness, seed, accs, phase="main", beta=None, job_beta=None):
    return {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "beta": beta,
            "job_beta": job_beta, "accuracy": [[8 * i, a] for i, a in enumerate(accs)], "steps": 16,
            "samples": 1024, "prompt_digest": f"p{seed}", "start": f"ckpt{seed}", "dropped": 0, "train_s": 5.0,
            "eval_s": 1.0, "log_means": {"kl": 0.01 * (staleness + 1)}}


def test_the_sweep_picks_the_best_mean_final_accuracy_per_divergence():
    s = dataclasses.replace(bench.FULL, sweep_betas=(0.1, 0.3, 1.0))
    runs = [made_up("AsyncRPG-URKL", 8, seed, [0.4, final], "sweep", beta)
            for seed, beta, final in [(8, 0.1, 0.5), (9, 0.1, 0.5), (8, 0.3, 0.6), (9, 0.3, 0.6), (8, 1.0, 0.7),
                                      (9, 1.0, 0.3)]]
    runs += [made_up("AsyncRPG-UFKL", 8, seed, [0.4, 0.5], "sweep", beta) for seed in (8, 9)
             for beta in (0.1, 0.3, 1.0)]
    assert bench.choose_betas(s, runs) == {"urkl": 0.3, "ufkl": 0.1}  # a tie goes to the smaller beta
    assert [j for j in bench.sweep_jobs(s) if j[2] == 8 and j[3] == 0.1] == [
        ("AsyncRPG-URKL", 8, 8, 0.1, "sweep"), ("AsyncRPG-UFKL", 8, 8, 0.1, "sweep")]  # no AsyncGRPO, no beta=0
    assert bench.sweep_jobs(dataclasses.replace(s, betas={"urkl": 1.0, "ufkl": 1.0})) == []


def test_main_runs_get_their_divergences_beta_only():
    jobs = bench.main_jobs(dataclasses.replace(bench.FULL, seeds=(0,), staleness=(2,)), {"urkl": 1.0, "ufkl": 0.3})
    assert {j[0]: j[3] for j in jobs} == {"AsyncGRPO": None, "AsyncRPG-URKL": 1.0, "AsyncRPG-UFKL": 0.3,
                                          "AsyncRPG beta=0": None}


def test_the_summary_pairs_each_method_with_async_grpo_by_seed():
    s = dataclasses.replace(bench.FULL, seeds=(0, 1), staleness=(0, 8), methods=("AsyncGRPO", "AsyncRPG-URKL"))
    runs = [made_up("AsyncGRPO", st, seed, [0.45, 0.7, 0.5 + 0.1 * seed]) for st in (0, 8) for seed in (0, 1)]
    runs += [made_up("AsyncRPG-URKL", st, seed, [0.45, 0.72, 0.6 + 0.1 * seed]) for st in (0, 8) for seed in (0, 1)]
    result = {"settings": bench.settings_dict(dataclasses.replace(s, toy_path=None)), "betas": {"urkl": 1.0},
              "runs": runs}
    summary = bench.summarize(s, result)
    paired = summary["paired"]["8|AsyncRPG-URKL"]
    assert abs(paired["last"]["mean"] - 0.1) < 1e-12 and paired["last"]["n"] == 2
    assert abs(paired["best"]["mean"] - 0.02) < 1e-12  # best: 0.72 against 0.7 (seed 0), 0.72 against 0.7 (seed 1)
    row = summary["table"]["8|AsyncGRPO"]
    assert row["collapses"] == 1  # seed 0 falls 0.2 below its best and stays there
    assert abs(row["drift"]["kl"] - 0.09) < 1e-12
    assert summary["invariants"] == {"same_start_per_seed": True, "same_steps_and_samples": True,
                                     "nothing_dropped": True}
    result["summary"] = summary
    text = bench.markdown(result)
    assert "| 8 | AsyncRPG-URKL | +0.100 ±" in text and "no sample dropped yes" in text
