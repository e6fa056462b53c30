"""How much beta moves the trained parameters on the toy task under std-normalised advantages (issue 43 item 5).

For each setting (divergence, estimator, reference) and seed, RPGTrainer trains the warmed-up toy model for a fixed
number of steps at every beta in `BETAS` (same seed, same data), and the effect of beta is
`||theta(beta) - theta(0)|| / ||theta(0) - theta_start||`: the parameters' departure from the beta = 0 run, as a
fraction of how far the beta = 0 run moved. Each generation batch is reused (`steps_per_generation` > 1) so the policy
leaves the sampler and the KL term is not inert (`trl_rpg.trainers.describe.inert_kl_reason`). A reference other
than the sampler needs beta > 0: there theta(0) is the run at `BASELINE_BETA` = 1e-9. The threshold of
`trl_rpg.trainers.describe.beta_too_small_warning` comes from these figures (docs/benchmarks.md).

    nice -n 10 python -m benchmarks.beta_effect            # resumable: finished runs are read back from the JSON

Output: benchmarks/results/beta_effect.json (commit, settings, one row per run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import warnings

import torch

BETAS = (0.0, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
SEEDS = (0, 1, 2)
#: (divergence, estimator, reference) settings measured; "periodic" refreshes the reference every `PERIODIC_EVERY`
#: optimizer steps, out of step with the generation batches (every 4: a reference refreshed with them is the sampler).
SETTINGS = (("urkl", "reinforce", "sampling"), ("ufkl", "differentiable", "sampling"),
            ("urkl", "reinforce", "periodic"))
PERIODIC_EVERY = 3
RL_ARGS = dict(max_steps=8, per_device_train_batch_size=32, num_generations=8, steps_per_generation=4,
               learning_rate=1e-4, lr_scheduler_type="constant", scale_rewards="group")
#: The baseline of a reference other than the sampler, which RPGConfig refuses at beta = 0.
BASELINE_BETA = 1e-9
OUT = os.path.join(os.path.dirname(__file__), "results", "beta_effect.json")
TOY_DIR = os.environ.get("BETA_EFFECT_TOY_DIR", "/tmp/betawarn/toy")


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().clone() for p in model.parameters()])


def train_once(setting, beta, seed, start_state, tokenizer, dataset, logdir):
    from trl_rpg.cli.toy_demo import demo_config_kwargs
    from trl_rpg.toy import task as toy
    from trl_rpg.trainers.config import RPGConfig
    from trl_rpg.trainers.trainer import RPGTrainer

    divergence, estimator, reference = setting
    model, _ = toy.build_toy_model(output_dir=TOY_DIR)
    model.load_state_dict(start_state)
    kwargs = demo_config_kwargs(logdir, seed=seed, **RL_ARGS)
    kwargs.update(beta=beta, rpg_divergence=divergence, rpg_estimator=estimator, rpg_reference=reference)
    if reference == "periodic":
        kwargs["rpg_reference_update_steps"] = PERIODIC_EVERY
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = RPGConfig(**kwargs)
        trainer = RPGTrainer(model=model, reward_funcs=toy.toy_reward, args=args, train_dataset=dataset,
                             processing_class=tokenizer)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    kl = [h["kl"] for h in logs if "kl" in h]
    return flat(trainer.model), {"reward": sum(h["reward"] for h in logs) / max(1, len(logs)),
                                 "kl_mean": sum(kl) / len(kl) if kl else None}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    from trl_rpg.toy import task as toy

    results = {"rows": []}
    if os.path.exists(ns.out):
        with open(ns.out) as f:
            results = json.load(f)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results.update(commit=results.get("commit", commit), betas=list(BETAS), seeds=ns.seeds,
                   settings=[list(s) for s in SETTINGS], rl_args=RL_ARGS, periodic_every=PERIODIC_EVERY,
                   baseline_beta_of_periodic=BASELINE_BETA,
                   effect="||theta(beta) - theta(0)|| / ||theta(0) - theta_start||", toy="build_toy_model() seed 0")
    done = {(r["divergence"], r["estimator"], r["reference"], r["seed"], r["beta"]) for r in results["rows"]}
    model, tokenizer = toy.build_toy_model(output_dir=TOY_DIR)
    start_state = {k: v.clone() for k, v in model.state_dict().items()}
    start = flat(model)
    for setting in SETTINGS:
        for seed in ns.seeds:
            if all((*setting, seed, b) in done for b in BETAS):
                continue
            dataset = toy.make_dataset(toy.TRAIN_NUM_PROBLEMS, seed=seed, split="train")
            base = None
            for beta in BETAS:
                t = time.perf_counter()
                # a reference other than the sampler needs beta > 0 (RPGConfig): its baseline is beta = 1e-9
                trained_beta = BASELINE_BETA if beta == 0.0 and setting[2] != "sampling" else beta
                theta, logged = train_once(setting, trained_beta, seed, start_state, tokenizer, dataset,
                                           "/tmp/betawarn/run")
                if beta == 0.0:
                    base, moved = theta, float((theta - start).norm())
                    effect = 0.0
                else:
                    effect = float((theta - base).norm()) / moved
                row = dict(divergence=setting[0], estimator=setting[1], reference=setting[2], seed=seed, beta=beta,
                           effect=effect, moved=moved, seconds=round(time.perf_counter() - t, 1), **logged)
                print(json.dumps(row), flush=True)
                if (*setting, seed, beta) not in done:
                    results["rows"].append(row)
            with open(ns.out, "w") as f:
                json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
