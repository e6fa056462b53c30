"""Off-policy sweep: RPG against GRPO and DAPO as each generation batch is reused for more optimizer steps.

    python -m benchmarks.offpolicy --workers 2   # full: 7 methods x 4 regimes x 6 seeds x 96 steps
    python -m benchmarks.offpolicy --quick       # 7 methods x 4 regimes x 2 seeds x 32 steps

The paper's runs reuse each rollout batch for 16 optimizer steps (512 prompts per rollout, 32 per mini-batch), so
most updates are off-policy: that is where an off-policy-correct KL gradient and RPG-Style Clip should matter. This
benchmark trains the toy task (``trl_rpg.toy.task``) with the **reuse factor** (optimizer steps per generation batch,
``steps_per_generation``) at 1, 4 and 16, plus a learning-rate stress at reuse 16. Every optimizer step uses the same
number of completions and every completion is used once, so within a regime (and across reuse factors too) all
methods get the same optimizer steps and the same generated samples; only the size of the generation batch, and so
how far the policy drifts from the sampler before a batch is used up, changes. Every method starts, per seed, from
the same cached SFT checkpoint and sees the same prompts in the same order (checked: each run records a digest of
the prompts it scored).

Drift is measured the same way for every trainer: :class:`DriftMixin` records ``log w = logp - old_logp`` of the
valid tokens of each training micro-batch (``old_logp``: the sampler's log-probs that TRL stores for a reused batch;
none on-policy, where ``w = 1``), and reports its quantiles, the share of tokens in each clip region, and the KL
divergence from the sampler to the trained policy.

The toy-task machinery (frozen task code, cached SFT start per seed, worker processes) is shared with
``benchmarks/learning.py`` through ``benchmarks/_common.py``. Results are written after every finished run, so a
crash loses little: ``--resume FILE`` continues a partial results file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from ._common import (
    CACHE_DIR,
    WorkerPool,
    build_checkpoint,
    ci95,
    default_results_path,
    fmt,
    freeze_toy,
    init_worker,
    loadavg,
    machine_info,
    markdown_table,
    mean_std,
    save_figure,
    toy_fingerprint,
    toy_rl_kwargs,
    toy_rl_run,
    write_json,
)

#: KL coefficient of every KL-regularised method (RPG variants and GRPO). Measured on this task (see
#: docs/benchmarks.md): with the paper's 1e-4, or 0.04, the KL term's share of the per-token gradient weight at reuse
#: 16 is too small to act; at 0.3 it is measurable for both RPG (KL to the sampler) and GRPO (k3 to the SFT start).
KL_BETA = 0.3
#: Optimizer steps between reference updates of the "periodic" RPG variant (the reference then lags the sampler).
PERIODIC_UPDATE_STEPS = 32
#: Dual-clip bound c of RPG-Style Clip (the paper's released scripts); the drift tables count tokens beyond it for
#: every method.
DUAL_CLIP_C = 10.0

# RPG with the paper's settings (beta aside): RPG-REINFORCE, RPG-Style Clip (0.2, 0.28, c = 10), reference = the
# sampling policy, advantage = reward - group mean, token-mean aggregation.
RPG_PAPER = {"epsilon": 0.2, "epsilon_high": 0.28, "rpg_dual_clip_c": DUAL_CLIP_C, "rpg_reference": "sampling",
             "rpg_estimator": "reinforce", "scale_rewards": "none", "loss_type": "dapo"}
# "kl": True marks the KL-regularised methods (their beta is Settings.beta).
METHODS: dict[str, dict] = {
    "RPG-REINFORCE-URKL": {"trainer": "rpg", "kl": True, **RPG_PAPER, "rpg_divergence": "urkl"},
    "RPG-REINFORCE-UFKL": {"trainer": "rpg", "kl": True, **RPG_PAPER, "rpg_divergence": "ufkl"},
    "RPG-REINFORCE-URKL std": {"trainer": "rpg", "kl": True, **RPG_PAPER, "rpg_divergence": "urkl",
                               "scale_rewards": "group"},
    "RPG-REINFORCE-UFKL std": {"trainer": "rpg", "kl": True, **RPG_PAPER, "rpg_divergence": "ufkl",
                               "scale_rewards": "group"},
    "RPG-REINFORCE-URKL periodic": {"trainer": "rpg", "kl": True, **RPG_PAPER, "rpg_divergence": "urkl",
                                    "rpg_reference": "periodic",
                                    "rpg_reference_update_steps": PERIODIC_UPDATE_STEPS},
    # TRL's GRPO: k3 penalty against the initial (SFT) model, TRL 1.16's defaults otherwise (clip 0.2 / 0.2,
    # std-scaled advantages, use_bias_correction_kl=True: the k3 term weighted by w), per-sequence aggregation.
    "GRPO": {"trainer": "grpo", "kl": True, "loss_type": "grpo", "epsilon": 0.2, "scale_rewards": "group"},
    # DAPO: no KL, clip-higher (0.2 / 0.28), std-scaled advantages, token-mean aggregation.
    "DAPO": {"trainer": "grpo", "kl": False, "beta": 0.0, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28,
             "scale_rewards": "group"},
}
# Not in the default set (--methods): the beta = 0 twin of RPG-REINFORCE-URKL, to see what its KL term does, and
# GRPO with the k3 term as GRPO wrote it (not weighted by w: the forward-KL gradient
# off-policy, docs/math.md section 2).
METHODS["RPG-REINFORCE-URKL beta=0"] = {**METHODS["RPG-REINFORCE-URKL"], "kl": False, "beta": 0.0}
METHODS["GRPO k3 unweighted"] = {**METHODS["GRPO"], "use_bias_correction_kl": False}
DEFAULT_METHODS = ("RPG-REINFORCE-URKL", "RPG-REINFORCE-UFKL", "RPG-REINFORCE-URKL std", "RPG-REINFORCE-UFKL std",
                   "RPG-REINFORCE-URKL periodic", "GRPO", "DAPO")


@dataclass
class Settings:
    seeds: tuple = tuple(range(6))
    methods: tuple = DEFAULT_METHODS
    reuse_levels: tuple = (1, 4, 16)  # optimizer steps per generation batch
    max_steps: int = 96  # optimizer steps of every run: a multiple of every reuse level
    learning_rate: float | None = 3e-4  # the learning benchmark's tuned rate (TRL's linear decay)
    stress_learning_rate: float | None = 1e-3  # 3.3x: the extra regime at the largest reuse level (None: skip)
    beta: float = KL_BETA
    per_device_train_batch_size: int | None = 64  # completions per optimizer step (8 prompts x 8)
    num_generations: int | None = 8
    temperature: float | None = 1.0
    max_completion_length: int | None = None  # None: trl_rpg.toy.task.MAX_COMPLETION_LENGTH
    num_train_problems: int = 2000
    eval_problems: int = 256
    eval_every: int = 8  # optimizer steps between held-out evaluations (and before training, and at the end)
    collapse_drop: float = 0.10  # collapse: held-out accuracy more than this below its best, staying there
    sft_steps: int | None = None  # None: trl_rpg.toy.task defaults (the learning benchmark's checkpoints are reused)
    workers: int = 2
    toy_path: str | None = None  # set by run(): a frozen copy of the toy task (trl_rpg/toy) every worker imports
    cache_dir: str = os.path.join(CACHE_DIR, "toy")
    output_dir: str = os.path.join(CACHE_DIR, "runs-offpolicy")


FULL = Settings()
QUICK = Settings(seeds=(0, 1), max_steps=32, eval_problems=128)


def regimes(s: Settings) -> list[dict]:
    """The regimes of the sweep: each reuse level at the tuned learning rate, then the stress rate at the largest
    reuse level. Every run of a regime has the same optimizer steps and generated samples."""
    for r in s.reuse_levels:
        if r < 1 or s.max_steps % r:
            raise ValueError(f"reuse_levels: {r} does not divide max_steps={s.max_steps}; every reuse level must be "
                             "an integer >= 1 that divides max_steps (whole generation batches)")
    out = [{"name": f"reuse {r}", "reuse": r, "learning_rate": s.learning_rate, "stress": False}
           for r in s.reuse_levels]
    if s.stress_learning_rate is not None:
        top = max(s.reuse_levels)
        out.append({"name": f"reuse {top}, lr {s.stress_learning_rate:g}", "reuse": top,
                    "learning_rate": s.stress_learning_rate, "stress": True})
    return out


def _regime(s: Settings, name: str) -> dict:
    return next(g for g in regimes(s) if g["name"] == name)


# ---------------------------------------------------------------------------------------------------------------------
# Drift, measured the same way for every trainer
# ---------------------------------------------------------------------------------------------------------------------


class DriftMixin:
    """Trainer mixin (put it before ``RPGTrainer`` or ``GRPOTrainer``): records ``log w = logp - old_logp`` of the
    valid tokens of every training micro-batch, with the sign of their advantage and the optimizer step.

    ``logp`` is the first log-prob pass with gradient inside ``_compute_loss`` (the one the loss uses); ``old_logp``
    is ``inputs["old_per_token_logps"]`` (the sampler's log-probs of a reused batch; absent on-policy, where both
    trainers use ``logp`` itself, so ``w = 1``). :meth:`drift_summary` reduces the records.
    """

    drift_records: list

    def _compute_loss(self, model, inputs):
        self._drift_capture = True
        self._drift_logps = None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._drift_capture = False
        if self.model.training and self._drift_logps is not None:
            self._record_drift(self._drift_logps, inputs)
        return loss

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        import torch

        if getattr(self, "_drift_capture", False) and self._drift_logps is None and torch.is_grad_enabled():
            self._drift_logps = out[0].detach()
        return out

    def _record_drift(self, logps, inputs):
        import torch

        mask = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].bool()
        old = inputs.get("old_per_token_logps")
        log_w = torch.zeros_like(logps) if old is None else logps - old
        adv = inputs["advantages"]
        adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(logps)
        kl_weight = self._drift_kl_weight(log_w, logps, inputs)
        if not hasattr(self, "drift_records"):
            self.drift_records = []
        self.drift_records.append({
            "step": self.state.global_step,  # the optimizer step this micro-batch belongs to (0-based)
            "log_w": log_w[mask].float().cpu(),
            "adv": adv[mask].float().cpu(),
            "kl_weight": None if kl_weight is None else kl_weight[mask].float().cpu(),
        })

    def _drift_kl_weight(self, log_w, logps, inputs):
        """|gradient weight| of the KL term per token, where it is known in closed form (else None): RPG-REINFORCE
        with the sampler as reference (docs/math.md section 2: C_KL of URKL = -beta w log w, of UFKL = beta (1 - w))
        and GRPO's k3 against the reference model (d/dlogp of beta k3, times w and plus beta w k3 when TRL's
        ``use_bias_correction_kl`` weights k3 by w)."""
        import torch

        args = self.args
        beta = float(getattr(args, "beta", 0.0) or 0.0)
        if beta == 0.0:
            return None
        w = log_w.clamp(-20, 20).exp()
        divergence = getattr(args, "rpg_divergence", None)
        if divergence is not None:
            if getattr(args, "rpg_reference", None) != "sampling" or args.rpg_estimator != "reinforce":
                return None
            if divergence == "urkl":
                return (beta * w * log_w).abs()
            if divergence == "ufkl":
                return (beta * (1.0 - w)).abs()
            return None
        ref = inputs.get("ref_per_token_logps")
        if ref is None:
            return None
        x = (ref - logps).clamp(-20, 20)
        dk3 = 1.0 - torch.exp(x)  # d k3(x) / d logp, x = logref - logp
        if getattr(args, "use_bias_correction_kl", False):
            k3 = torch.exp(x) - x - 1.0
            return (beta * w * (k3 + dk3)).abs()
        return (beta * dk3).abs()

    def drift_summary(self, reuse: int, eps_low: float, eps_high: float) -> dict:
        return summarize_drift(getattr(self, "drift_records", []), reuse, eps_low, eps_high)


W_QUANTILES = (0.001, 0.01, 0.05, 0.5, 0.95, 0.99, 0.999)


def summarize_drift(records: list[dict], reuse: int, eps_low: float, eps_high: float) -> dict:
    """Reduce :class:`DriftMixin` records: quantiles of ``w`` over all training tokens, the share of tokens in each
    clip region (by the sign of the advantage: ``high`` A > 0 and w > 1 + eps_high, ``low`` A < 0 and
    w < 1 - eps_low, ``dual`` A < 0 and w > c; the method's own eps) and outside [1 - 0.2, 1 + 0.28] whatever the
    sign, the KL divergence from the sampler to the policy (``KL(mu || pi) = E_mu[w - 1 - log w]``, the k3
    estimate), the same by position within the reuse cycle, and the KL term's share of the gradient weight
    (``sum |C_KL| / sum |w A|``) where known."""
    import torch

    if not records:
        return {}
    log_w = torch.cat([r["log_w"] for r in records]).double()
    adv = torch.cat([r["adv"] for r in records]).double()
    w = log_w.clamp(-20, 20).exp()
    n = max(1, log_w.numel())

    def share(x):
        return float(x.sum()) / n

    q = torch.quantile(w.float(), torch.tensor(W_QUANTILES)) if log_w.numel() <= 16_000_000 else None
    out = {
        "tokens": log_w.numel(),
        "w_quantiles": {f"{p:g}": float(v) for p, v in zip(W_QUANTILES, q.tolist())} if q is not None else None,
        "w_min": float(w.min()), "w_max": float(w.max()),
        "mean_abs_log_w": float(log_w.abs().mean()),
        "kl_sampler": float((w - 1.0 - log_w).mean()),
        "clip_high": share((adv > 0) & (w > 1.0 + eps_high)),
        "clip_low": share((adv < 0) & (w < 1.0 - eps_low)),
        "clip_dual": share((adv < 0) & (w > DUAL_CLIP_C)),
        "outside_trust_region": share((w < 0.8) | (w > 1.28)),
    }
    kl = [r["kl_weight"] for r in records if r["kl_weight"] is not None]
    if len(kl) == len(records):
        kl_sum = float(torch.cat(kl).double().sum())
        pg_sum = float((w * adv).abs().sum())
        out["kl_share"] = kl_sum / pg_sum if pg_sum > 0 else None
    by_pos = []
    for k in range(reuse):
        sel = [r for r in records if r["step"] % reuse == k]
        if not sel:
            continue
        lw = torch.cat([r["log_w"] for r in sel]).double()
        ww = lw.clamp(-20, 20).exp()
        by_pos.append({"position": k, "mean_abs_log_w": float(lw.abs().mean()) if lw.numel() else 0.0,
                       "kl_sampler": float((ww - 1.0 - lw).mean()) if lw.numel() else 0.0,
                       "outside_trust_region": float(((ww < 0.8) | (ww > 1.28)).double().mean()) if lw.numel()
                       else 0.0})
    out["by_position"] = by_pos
    return _round(out)


def _round(o, digits: int = 6):
    """Floats to ``digits`` significant digits, recursively (keeps the results file small)."""
    if isinstance(o, float):
        return float(f"{o:.{digits}g}")
    if isinstance(o, dict):
        return {k: _round(v, digits) for k, v in o.items()}
    if isinstance(o, list):
        return [_round(v, digits) for v in o]
    return o


# ---------------------------------------------------------------------------------------------------------------------
# One run (in a worker process)
# ---------------------------------------------------------------------------------------------------------------------

_LOGGED = ("rpg/", "loss", "kl", "entropy", "grad_norm", "clip_ratio/")
_LOG_MEANS = ("kl", "entropy", "grad_norm", "rpg/divergence", "rpg/w_mean", "rpg/w_max", "rpg/clip_frac_high",
              "rpg/clip_frac_low", "rpg/clip_frac_dual", "clip_ratio/region_mean", "clip_ratio/high_mean",
              "clip_ratio/low_mean", "rpg/reference_updates")


def method_kwargs(s: Settings, method: str) -> tuple[str, dict]:
    """(trainer kind, config overrides) of ``method``: its spec with Settings.beta for the KL methods."""
    spec = dict(METHODS[method])
    kind = spec.pop("trainer")
    if spec.pop("kl"):
        spec["beta"] = s.beta
    return kind, spec


def run_config(s: Settings, method: str, regime: str, seed: int):
    """(trainer class with :class:`DriftMixin`, config) of one run: the toy's RL settings, the regime's reuse and
    learning rate, the method's own settings."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer

    g = _regime(s, regime)
    kind, spec = method_kwargs(s, method)
    if g["learning_rate"] is not None:
        spec["learning_rate"] = g["learning_rate"]
    out = os.path.join(s.output_dir, f"{method}-{regime}-seed{seed}".replace(" ", "_").replace(",", ""))
    kwargs = toy_rl_kwargs(s, seed, out, g["reuse"], s.max_steps, spec)
    config = (RPGConfig if kind == "rpg" else GRPOConfig)(**kwargs)
    base = RPGTrainer if kind == "rpg" else GRPOTrainer
    return type(f"Drift{base.__name__}", (DriftMixin, base), {}), config


def train_one(s: Settings, method: str, regime: str, seed: int) -> dict:
    """Train ``method`` in ``regime`` from the seed's SFT checkpoint; return curves, drift, invariants, timings."""
    init_worker()
    g = _regime(s, regime)
    cls, config = run_config(s, method, regime, seed)
    eps_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon

    def after(trainer):
        return {"drift": trainer.drift_summary(g["reuse"], config.epsilon, eps_high)}

    r = toy_rl_run(s, seed, cls, config, s.eval_every, log_keys=_LOGGED, after_train=after)
    logs = {}
    for k in _LOG_MEANS:
        vals = [row[k] for row in r["logs"] if isinstance(row.get(k), (int, float)) and math.isfinite(row[k])]
        if vals:
            logs[k] = round(statistics.fmean(vals), 6)
    return {"method": method, "regime": regime, "seed": seed, "reuse": g["reuse"],
            "learning_rate": config.learning_rate, "beta": config.beta, "accuracy": r["accuracy"],
            "rewards": r["rewards"], "samples": r["samples"], "steps": r["steps"], "prompt_digest": r["prompt_digest"],
            "start": r["start"], "train_s": r["train_s"], "eval_s": r["eval_s"], "total_s": r["total_s"],
            "drift": r["drift"], "log_means": logs}


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------


def jobs(s: Settings) -> list[tuple[str, str, int]]:
    """(method, regime, seed) of every run, seed-major, so that a partial result holds whole seeds."""
    return [(m, g["name"], seed) for seed in s.seeds for g in regimes(s) for m in s.methods]


def run(s: Settings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    """Build the SFT starts, run every (method, regime, seed) not already in ``previous``; write the partial
    result to ``json_path`` after every run; return runs and summary."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    regimes(s)  # validate before any work
    info = machine_info()
    freeze_toy(s)
    earlier = (previous or {}).get("settings", {}).get("toy_fingerprint")
    if earlier is not None and earlier != toy_fingerprint(s.toy_path):
        raise ValueError(f"--resume: the results file was made with toy task version {earlier}, but "
                         "the toy task (trl_rpg/toy) is "
                         f"now version {toy_fingerprint(s.toy_path)}; its runs cannot be continued with this task "
                         "(start a new results file)")
    t0 = time.perf_counter()
    prev_wall = (previous or {}).get("wall_s") or 0.0
    loads = [loadavg()]
    done = {(r["method"], r["regime"], r["seed"]): r for r in (previous or {}).get("runs", [])}
    todo = [j for j in jobs(s) if j not in done]
    runs = list(done.values())
    result = {"settings": settings_dict(s), "machine": info, "complete": False, "loadavg_samples": loads,
              "runs": runs}
    with WorkerPool(s.workers) as pool:
        sft = pool.map(build_checkpoint, [(s, seed) for seed in s.seeds])
        result["sft"] = sft
        log(f"SFT checkpoints ready ({time.perf_counter() - t0:.0f}s): "
            + ", ".join(f"seed {r['seed']} acc {r['sft_accuracy']:.3f}" for r in sft))
        log(f"{len(todo)} runs to do ({len(done)} already done)")

        def finished(i, r):
            runs.append(r)
            loads.append(loadavg())
            result["wall_s"] = round(time.perf_counter() - t0 + prev_wall, 1)
            if json_path:
                write_json(json_path, result)
            d = r["drift"]
            log(f"  [{len(runs)}/{len(todo) + len(done)}] {r['method']} | {r['regime']} | seed {r['seed']}: "
                f"acc {r['accuracy'][0][1]:.3f} -> {r['accuracy'][-1][1]:.3f} (best "
                f"{max(a for _, a in r['accuracy']):.3f}), w max {d.get('w_max', float('nan')):.2f}, "
                f"KL(mu|pi) {d.get('kl_sampler', float('nan')):.4f}, {r['train_s']}s, "
                f"{time.perf_counter() - t0:.0f}s elapsed")

        pool.map(train_one, [(s, *j) for j in todo], on_result=finished)
    order = {j: i for i, j in enumerate(jobs(s))}
    runs.sort(key=lambda r: order.get((r["method"], r["regime"], r["seed"]), len(order)))
    result.update(complete=True, wall_s=round(time.perf_counter() - t0 + prev_wall, 1),
                  summary=summarize(s, sft, runs))
    return result


def settings_dict(s: Settings) -> dict:
    d = asdict(s)
    d.pop("cache_dir"), d.pop("output_dir")
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d.pop("toy_path")
    d["regimes"] = regimes(s)
    d["methods_config"] = {m: dict(zip(("trainer", "config"), method_kwargs(s, m))) for m in s.methods}
    return d


def settings_from_dict(d: dict) -> Settings:
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()
                       if k in known and k not in ("cache_dir", "output_dir", "toy_path")})


# ---------------------------------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------------------------------


def collapse_index(accuracy: list[float], drop: float) -> int | None:
    """Index of the first evaluation from which held-out accuracy stays more than ``drop`` below the best reached up
    to that evaluation until the end of the run (a collapse), or None."""
    best = -math.inf
    for i, a in enumerate(accuracy):
        best = max(best, a)
        if all(b < best - drop for b in accuracy[i:]):
            return i
    return None


def _runs(runs, method=None, regime=None):
    return [r for r in runs if (method is None or r["method"] == method) and (regime is None or r["regime"] == regime)]


def summarize(s: Settings, sft: list[dict], runs: list[dict]) -> dict:
    """Per (regime, method): final / best held-out accuracy, collapses, drift, time; paired differences; invariants.
    Handles partial results (whatever runs exist)."""
    out: dict = {"sft_accuracy": statistics.fmean(r["sft_accuracy"] for r in sft) if sft else None,
                 "regimes": {}, "paired": {}, "reuse_effect": {}, "invariants": invariants(runs)}
    for g in regimes(s):
        table = {}
        for m in s.methods:
            rs = _runs(runs, m, g["name"])
            if not rs:
                continue
            last = [r["accuracy"][-1][1] for r in rs]
            best = [max(a for _, a in r["accuracy"]) for r in rs]
            coll = [collapse_index([a for _, a in r["accuracy"]], s.collapse_drop) for r in rs]
            row = {"n_seeds": len(rs), "last": mean_std(last), "best": mean_std(best),
                   "collapses": sum(c is not None for c in coll),
                   "train_s": statistics.fmean(r["train_s"] - r.get("eval_s", 0.0) for r in rs)}
            row["drift"] = _mean_drift([r["drift"] for r in rs])
            row["log_means"] = {k: statistics.fmean(r["log_means"][k] for r in rs if k in r["log_means"])
                                for k in _LOG_MEANS if any(k in r["log_means"] for r in rs)}
            table[m] = row
        out["regimes"][g["name"]] = table
        pairs = [(m, base) for base in ("DAPO", "GRPO") for m in s.methods if m != base] + list(EXTRA_PAIRS)
        for m, base in pairs:
            if m in s.methods and base in s.methods:
                d_last, d_best = _paired(runs, m, base, g["name"])
            else:
                continue
            if d_last:
                out["paired"][f"{g['name']}: {m} - {base}"] = {
                    "regime": g["name"], "method": m, "base": base, "last": ci95(d_last), "best": ci95(d_best),
                    "wins": sum(d > 0 for d in d_last), "ties": sum(d == 0 for d in d_last),
                    "losses": sum(d < 0 for d in d_last)}
    plain = [g for g in regimes(s) if not g["stress"]]
    if len(plain) > 1:
        lo, hi = plain[0]["name"], plain[-1]["name"]
        for m in s.methods:
            a = {r["seed"]: r for r in _runs(runs, m, hi)}
            b = {r["seed"]: r for r in _runs(runs, m, lo)}
            d = [a[k]["accuracy"][-1][1] - b[k]["accuracy"][-1][1] for k in sorted(set(a) & set(b))]
            if d:
                out["reuse_effect"][m] = {"from": lo, "to": hi, "last": ci95(d)}
    return out


#: Paired comparisons made besides "each method against DAPO and GRPO", when both methods ran: what RPG's KL term
#: does (against its beta = 0 twin), and GRPO's k3 as GRPO wrote it against RPG.
EXTRA_PAIRS = (("RPG-REINFORCE-URKL", "RPG-REINFORCE-URKL beta=0"), ("GRPO k3 unweighted", "RPG-REINFORCE-URKL"),
               ("GRPO k3 unweighted", "RPG-REINFORCE-UFKL std"))


def _paired(runs, m, base, regime):
    by_seed = {r["seed"]: r for r in _runs(runs, base, regime)}
    pairs = [(r, by_seed[r["seed"]]) for r in _runs(runs, m, regime) if r["seed"] in by_seed]
    d_last = [a["accuracy"][-1][1] - b["accuracy"][-1][1] for a, b in pairs]
    d_best = [max(x for _, x in a["accuracy"]) - max(x for _, x in b["accuracy"]) for a, b in pairs]
    return d_last, d_best


def _mean_drift(ds: list[dict]) -> dict:
    """Mean over seeds of each run's drift figures (``w_max``: the largest over seeds)."""
    ds = [d for d in ds if d]
    if not ds:
        return {}
    out = {k: statistics.fmean(d[k] for d in ds) for k in ("mean_abs_log_w", "kl_sampler", "clip_high", "clip_low",
                                                          "clip_dual", "outside_trust_region")}
    out["w_max"] = max(d["w_max"] for d in ds)
    out["w_min"] = min(d["w_min"] for d in ds)
    qs = [d["w_quantiles"] for d in ds if d.get("w_quantiles")]
    if qs:
        out["w_quantiles"] = {p: statistics.fmean(q[p] for q in qs) for p in qs[0]}
    shares = [d["kl_share"] for d in ds if d.get("kl_share") is not None]
    out["kl_share"] = statistics.fmean(shares) if shares else None
    positions = [d.get("by_position") or [] for d in ds]
    if positions and positions[0]:
        out["last_position_kl_sampler"] = statistics.fmean(p[-1]["kl_sampler"] for p in positions if p)
        out["last_position_outside"] = statistics.fmean(p[-1]["outside_trust_region"] for p in positions if p)
    return out


def invariants(runs: list[dict]) -> dict:
    """What must hold by construction, checked on the runs: per seed one SFT start (same checkpoint and same step-0
    accuracy) and one prompt order for every method and regime; per regime one number of optimizer steps and of
    generated samples for every method and seed."""
    starts, orders, steps, samples = {}, {}, {}, {}
    for r in runs:
        starts.setdefault(r["seed"], set()).add((r["start"], r["accuracy"][0][1]))
        orders.setdefault(r["seed"], set()).add(r["prompt_digest"])
        steps.setdefault(r["regime"], set()).add(r["steps"])
        samples.setdefault(r["regime"], set()).add(r["samples"])
    return {
        "same_start_per_seed": all(len(v) == 1 for v in starts.values()),
        "same_prompts_per_seed": all(len(v) == 1 for v in orders.values()),
        "equal_steps_per_regime": all(len(v) == 1 for v in steps.values()),
        "equal_samples_per_regime": all(len(v) == 1 for v in samples.values()),
        "steps": {k: sorted(v) for k, v in steps.items()},
        "samples": {k: sorted(v) for k, v in samples.items()},
    }


# ---------------------------------------------------------------------------------------------------------------------
# Tables and plot
# ---------------------------------------------------------------------------------------------------------------------


def _pm(ms, digits=3):
    m, sd = ms
    return f"{fmt(m, digits)} ± {fmt(sd, digits)}"


def _diff(c: dict) -> str:
    """A paired difference: mean ± 95% half-width."""
    return f"{c['mean']:+.3f} ± {fmt(c['half_width'])}"


def _pct(x, digits=2):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    summ = result["summary"]
    names = [g["name"] for g in regimes(s)]
    n = len(s.seeds)
    parts = []
    inv = summ["invariants"]
    parts.append(
        f"SFT start: held-out accuracy {fmt(summ['sft_accuracy'])} (mean over {n} seeds); {s.max_steps} optimizer "
        f"steps of {s.per_device_train_batch_size} completions in every run; beta = {s.beta} for the KL methods. "
        f"Invariants checked on the runs: same SFT start per seed {'yes' if inv['same_start_per_seed'] else 'NO'}, "
        f"same prompt order per seed {'yes' if inv['same_prompts_per_seed'] else 'NO'}, equal optimizer steps per "
        f"regime {'yes' if inv['equal_steps_per_regime'] else 'NO'}, equal generated samples per regime "
        f"{'yes' if inv['equal_samples_per_regime'] else 'NO'}.")
    # 1. headline: final accuracy per regime
    header = ["method"] + [f"{g}: final (best) acc" for g in names] + [f"collapses ({' / '.join(names)})"]
    rows = []
    for m in s.methods:
        cells, coll = [m], []
        for g in names:
            row = summ["regimes"].get(g, {}).get(m)
            if row is None:
                cells.append("–")
                coll.append("–")
                continue
            cells.append(f"{_pm(row['last'])} ({fmt(row['best'][0])})")
            coll.append(f"{row['collapses']}/{row['n_seeds']}")
        rows.append(cells + [" / ".join(coll)])
    parts.append("Held-out accuracy at the last step, mean ± sd over seeds (best over the run, mean), and collapses "
                 f"(held-out accuracy more than {s.collapse_drop:.2f} below its best and staying there):\n\n"
                 + markdown_table(header, rows))
    # 2. paired differences: each method against DAPO and GRPO (one row per regime and method), then the extras
    paired = summ["paired"]

    def cell(p):
        return "–" if p is None else f"{_diff(p['last'])} ({p['wins']}/{p['ties']}/{p['losses']})"

    prow = []
    for g in names:
        for m in s.methods:
            a, b = paired.get(f"{g}: {m} - DAPO"), paired.get(f"{g}: {m} - GRPO")
            if a or (b and m != "DAPO"):  # DAPO - GRPO is GRPO's row, negated
                prow.append([g, m, cell(a), _diff(a["best"]) if a else "–", cell(b), _diff(b["best"]) if b else "–"])
    if prow:
        parts.append("Paired by seed (same start, same prompts): difference in held-out accuracy to DAPO and to GRPO, "
                     "mean ± 95% t-interval half-width (an interval containing 0: no detectable difference), and "
                     "seeds better / equal / worse:\n\n"
                     + markdown_table(["regime", "method", "final − DAPO", "best − DAPO", "final − GRPO",
                                       "best − GRPO"], prow))
    xrow = [[p["regime"], f"{p['method']} − {p['base']}", cell(p), _diff(p["best"])] for p in paired.values()
            if (p["method"], p["base"]) in EXTRA_PAIRS]
    if xrow:
        parts.append("Further paired comparisons (same layout):\n\n"
                     + markdown_table(["regime", "comparison", "final", "best"], xrow))
    erow = [[m, e["from"] + " → " + e["to"], _diff(e["last"])] for m, e in summ["reuse_effect"].items()]
    if erow:
        parts.append("Effect of reuse on each method (paired by seed): final accuracy at the largest reuse minus at "
                     "reuse 1, mean ± 95% half-width:\n\n" + markdown_table(["method", "regimes", "difference"], erow))
    # 3. drift
    drow = []
    for g in names:
        for m in s.methods:
            row = summ["regimes"].get(g, {}).get(m)
            if row is None or not row["drift"]:
                continue
            d = row["drift"]
            q = d.get("w_quantiles") or {}
            quantiles = " / ".join(fmt(q.get(k)) for k in ("0.01", "0.5", "0.99", "0.999"))
            drow.append([g, m, quantiles, f"{d['w_max']:.2f}", _pct(d["outside_trust_region"]),
                         f"{_pct(d['clip_high'])} / {_pct(d['clip_low'])} / {_pct(d['clip_dual'], 3)}",
                         fmt(d["kl_sampler"], 4), fmt(d.get("last_position_kl_sampler"), 4),
                         _pct(d.get("kl_share"), 1), fmt(row["train_s"], 0)])
    if drow:
        parts.append(
            "Drift reached, measured the same way for every method (log w = logp − old logp of every training "
            "token; mean over seeds): `w` quantiles 1% / 50% / 99% / 99.9% and the largest `w`; tokens with `w` "
            "outside [0.8, 1.28]; tokens in the clip regions by advantage sign (high: A > 0, w > 1 + ε_high; low: "
            "A < 0, w < 1 − ε_low; dual: A < 0, w > 10); KL(sampler ‖ policy) per token (k3 estimate), over the run "
            "and at the last step of each generation batch; the KL term's share of the per-token gradient weight "
            "Σ|C_KL| / Σ|w·A| (RPG with the sampler as reference and GRPO; – where not known in closed form); "
            "seconds per run of training, evaluations excluded:\n\n"
            + markdown_table(["regime", "method", "w 1% / 50% / 99% / 99.9%", "w max", "outside [0.8, 1.28]",
                              "clip high / low / dual", "KL(μ‖π)", "KL(μ‖π), last step of batch", "KL share",
                              "s/run"], drow))
    return "\n\n".join(parts)


def plot(result: dict, path: str) -> str | None:
    """Against the reuse factor, one line per method: final held-out accuracy (error bars: 95% t-interval of the
    mean over seeds), its paired difference to DAPO (same seed; 95% t-interval), and the drift reached (KL from the
    sampler to the policy per token, mean over seeds, bars min-max; 0 on-policy, so reuse 1 is left out). The
    learning-rate stress regime is drawn as separate hollow points on the right."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    s = settings_from_dict(result["settings"])
    runs = result["runs"]
    gs = regimes(s)
    base = "DAPO" if "DAPO" in s.methods else s.methods[-1]
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.2))
    xs = list(range(len(gs)))
    offsets = {m: (i - (len(s.methods) - 1) / 2) * 0.035 for i, m in enumerate(s.methods)}

    def final(r):
        return r["accuracy"][-1][1]

    def ci_points(m, values_by_regime):
        pts = []
        for x, g in zip(xs, gs):
            vals = values_by_regime(g["name"])
            if vals:
                c = ci95(vals)
                hw = 0.0 if math.isnan(c["half_width"]) else c["half_width"]
                pts.append((x + offsets[m], c["mean"], (hw, hw), g["stress"]))
        return pts

    def range_points(m, value):
        pts = []
        for x, g in zip(xs, gs):
            vals = [v for v in (value(r) for r in _runs(runs, m, g["name"])) if v]
            if vals and g["reuse"] > 1:
                mean = statistics.fmean(vals)
                pts.append((x + offsets[m], mean, (mean - min(vals), max(vals) - mean), g["stress"]))
        return pts

    def draw(ax, m, pts, color=None):
        plain = [p for p in pts if not p[3]]
        line = ax.errorbar([p[0] for p in plain], [p[1] for p in plain], capsize=3, marker="o", label=m,
                           linewidth=1.5, color=color,
                           yerr=[[p[2][0] for p in plain], [p[2][1] for p in plain]])
        stress = [p for p in pts if p[3]]
        if stress:
            ax.errorbar([p[0] for p in stress], [p[1] for p in stress], capsize=3, marker="s", linestyle="none",
                        color=line[0].get_color(), mfc="none",
                        yerr=[[p[2][0] for p in stress], [p[2][1] for p in stress]])
        return line[0].get_color()

    colors = {}
    for m in s.methods:
        colors[m] = draw(axes[0], m, ci_points(m, lambda g, m=m: [final(r) for r in _runs(runs, m, g)]))
    for m in s.methods:
        if m == base:
            axes[1].axhline(0.0, color=colors[m], linewidth=1.5, label=f"{m} (baseline)")
            continue

        def diffs(g, m=m):
            by_seed = {r["seed"]: r for r in _runs(runs, base, g)}
            return [final(r) - final(by_seed[r["seed"]]) for r in _runs(runs, m, g) if r["seed"] in by_seed]

        draw(axes[1], m, ci_points(m, diffs), color=colors[m])
    for m in s.methods:
        draw(axes[2], m, range_points(m, lambda r: (r["drift"] or {}).get("kl_sampler")), color=colors[m])
    axes[2].set_yscale("log")
    labels = [g["name"].replace(", ", "\n") for g in gs]
    for ax in axes:
        ax.set_xticks(xs, labels)
        ax.set_xlabel("optimizer steps per generation batch (reuse factor)")
        ax.grid(alpha=0.3)
    n = len({r["seed"] for r in runs})
    axes[0].set(ylabel="final held-out accuracy (greedy)", title=f"Final held-out accuracy (mean ± 95% CI, {n} seeds)")
    axes[1].set(ylabel=f"final accuracy − {base}'s (same seed)",
                title=f"Paired difference to {base} (mean ± 95% CI)")
    axes[2].set(ylabel="KL(sampler ‖ policy) per training token (k3)",
                title="Drift reached (mean, bars min–max over seeds; 0 at reuse 1)")
    axes[0].legend(fontsize=8, loc="lower left")
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def _report(result: dict, json_path: str, png: str | None) -> None:
    m = result["machine"]
    print()
    print(f"## Off-policy sweep ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})")
    print(f"command: `{m['command']}`; {m.get('nproc')} cores ({m.get('cpu', '?')}), wall "
          f"{result.get('wall_s', 0):.0f}s, load average at start {m.get('loadavg_start')}, at end "
          f"{result.get('loadavg_end')}")
    print()
    print(markdown(result))
    print(f"\nJSON: {json_path}\nplot: {png}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="2 seeds, 32 steps per run")
    p.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the methods (with --resume: add)")
    p.add_argument("--reuse", type=int, nargs="+", help="override the reuse levels (each must divide --max-steps)")
    p.add_argument("--max-steps", type=int, help="optimizer steps per run")
    p.add_argument("--learning-rate", type=float, help="the tuned learning rate (default 3e-4)")
    p.add_argument("--stress-learning-rate", type=float, help="learning rate of the stress regime (0: none)")
    p.add_argument("--beta", type=float, help=f"KL coefficient of the KL methods (default {KL_BETA})")
    p.add_argument("--workers", type=int, help="parallel worker processes (default 2)")
    p.add_argument("--output", help="JSON path (default benchmarks/results/offpolicy.json; --quick: "
                                     "outputs/benchmarks/offpolicy_quick.json)")
    p.add_argument("--resume", metavar="JSON", help="continue a results file (same settings; --methods adds methods)")
    p.add_argument("--summarize", metavar="JSON", help="recompute the summary, tables and plot of a results file")
    a = p.parse_args(argv)
    if a.summarize:
        with open(a.summarize) as f:
            result = json.load(f)
        s = settings_from_dict(result["settings"])
        result["summary"] = summarize(s, result.get("sft", []), result["runs"])
        png = plot(result, os.path.splitext(a.summarize)[0] + ".png")
        write_json(a.summarize, result)
        _report(result, a.summarize, png)
        return result
    previous = None
    if a.resume:
        with open(a.resume) as f:
            previous = json.load(f)
        s = settings_from_dict(previous["settings"])
        if a.workers:
            s.workers = a.workers
        if a.methods:  # add methods to a finished or partial sweep (its other settings stay)
            s.methods = tuple(s.methods) + tuple(m for m in a.methods if m not in s.methods)
        json_path = a.resume
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
        for name, value in (("seeds", a.seeds), ("methods", a.methods), ("reuse_levels", a.reuse),
                            ("max_steps", a.max_steps), ("learning_rate", a.learning_rate), ("beta", a.beta),
                            ("workers", a.workers)):
            if value is not None:
                setattr(s, name, tuple(value) if isinstance(value, list) else value)
        if a.stress_learning_rate is not None:
            s.stress_learning_rate = a.stress_learning_rate or None
        json_path = a.output or default_results_path("offpolicy", a.quick)
    try:
        regimes(s)
    except ValueError as e:
        p.error(str(e))
    result = run(s, json_path=json_path, previous=previous)
    if previous is not None:
        result["machine"]["command_first"] = previous["machine"].get("command")
        result["machine"]["date_utc_first"] = previous["machine"].get("date_utc")
    png = plot(result, os.path.splitext(json_path)[0] + ".png")
    result["plot"] = os.path.relpath(png, os.path.dirname(json_path)) if png else None
    result["loadavg_end"] = loadavg()
    write_json(json_path, result)
    _report(result, json_path, png)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
