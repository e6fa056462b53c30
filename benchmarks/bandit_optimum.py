"""Where each trainer's KL term takes the policy: a contextual bandit trained by the real trainers.

    python -m benchmarks.bandit_optimum            # every method x 5 seeds (docs/benchmarks.md, section 5)
    python -m benchmarks.bandit_optimum --quick    # every method x 2 seeds

A handful of one-token prompts; each completion is one token (``max_completion_length=1``) drawn from the whole
(tiny) vocabulary; the reward is a table ``r[prompt][token]``; the KL reference is the initial model, fixed. With
``A = r - mean(group)`` (``scale_rewards="none"``, ``num_generations = G``) the expected policy gradient is that of
``E_pi[(G - 1)/G * r]``, so each regularised objective ``E_pi[r_eff] - beta * D(pi, ref)`` has an analytic optimum
per prompt (``docs/math.md``, "The KL vocabulary"):

- reverse KL (RPG ``rkl``, ``urkl``; TRL's k3 weighted by ``w``): ``pi = ref * exp(r_eff / beta) / Z``;
- forward KL (RPG ``fkl``, ``ufkl``; TRL's k3 without the weight): ``pi = beta * ref / (lam - r_eff)`` with the
  ``lam > max r_eff`` that makes ``sum pi = 1``.

The unnormalised divergences have the optima of their normalised counterparts here: a softmax policy sums to one,
and on that family UKL equals KL. Every generation batch is reused for several optimizer steps (off-policy,
``w != 1``), and the trained policy is read exactly (the softmax of the model's logits at the completion position),
not by sampling. ``tests/test_bandit_optimum.py`` runs :func:`train_policy` for every method at seed 0, with
thresholds taken from this benchmark's spread over seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace

import torch

#: The bandit's vocabulary: the two special tokens the trainers need, and four letters. Every token is an action.
TOKENS = ("<pad>", "<eos>", "a", "b", "c", "d")
#: The prompts (one token each).
PROMPTS = ("a", "b", "c")
#: The design, for the first prompt: the reference (the initial model's distribution) and the reward of each token.
#: Chosen (a small search) so that the two optima are far apart (total variation 0.36) while no probability of the
#: reference or of either optimum is below 0.035, so that no run has to find a token it almost never samples.
REFERENCE_DESIGN = (0.14, 0.18, 0.04, 0.51, 0.06, 0.07)
REWARD_DESIGN = (0.75, 0.0, 1.0, 0.0, 0.75, 0.5)


def _rotated(design, prompt: int) -> tuple:
    """Prompt k sees the design with the tokens rotated by 2k (each prompt has a different best token)."""
    shift = 2 * prompt
    return tuple(design[(j - shift) % len(design)] for j in range(len(design)))


#: r[prompt][token] and the initial model's pi(token | prompt).
REWARDS = tuple(_rotated(REWARD_DESIGN, k) for k in range(len(PROMPTS)))
REFERENCE = tuple(_rotated(REFERENCE_DESIGN, k) for k in range(len(PROMPTS)))

#: method -> (trainer, its settings, the optimum its on-policy gradient belongs to: docs/math.md, "The KL
#: vocabulary"). The RPG methods use an explicit RPGConfig with the initial model as reference; GRPOTrainer's
#: reference is the initial model.
METHODS = {
    **{f"RPG-{est}-{div}": ("rpg", {"rpg_divergence": div, "rpg_estimator": est},
                            "reverse" if div in ("rkl", "urkl") else "forward")
       for div in ("fkl", "ufkl", "rkl", "urkl") for est in ("reinforce", "differentiable")},
    "GRPO-k3": ("grpo", {"use_bias_correction_kl": False}, "forward"),
    "GRPO-k3-corrected": ("grpo", {"use_bias_correction_kl": True}, "reverse"),
}
EXPECTED_OPTIMUM = {name: optimum for name, (_, _, optimum) in METHODS.items()}


@dataclass(frozen=True)
class Settings:
    beta: float = 0.25
    num_generations: int = 8
    reuse: int = 4  # optimizer steps per generation batch (steps_per_generation; gradient_accumulation_steps = 1)
    max_steps: int = 300
    learning_rate: float = 3e-2
    lr_scheduler_type: str = "linear"
    prompt_copies: int = 4  # each optimizer step sees every prompt `prompt_copies` times (groups of G)
    hidden_size: int = 16


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def save_model(path: str, settings: Settings, seed: int) -> str:
    """A random tiny Qwen2 over `TOKENS` whose distribution at each prompt is exactly `REFERENCE`, and its tokenizer,
    saved to `path` (the trainers load the model, and TRL its reference model, from there).

    The network is random (seeded); only the output layer is then solved for: with `h_k` the final hidden state of
    prompt k, `W h_k = log REFERENCE[k]` for the three prompts (least-norm solution), so the reference is the same for
    every seed and only the rest of the network, and the sampling, vary with it.
    """
    from trl_rpg.toy import build_model

    tok = tokenizer()
    model = build_model(tok, hidden_size=settings.hidden_size, num_layers=1, num_heads=2, num_key_value_heads=1,
                        intermediate_size=2 * settings.hidden_size, seed=seed, tie_word_embeddings=False,
                        bos_token_id=tok.eos_token_id)
    with torch.no_grad():
        hidden = torch.stack([model.model(input_ids=torch.tensor([tok(p)["input_ids"]])).last_hidden_state[0, -1]
                              for p in PROMPTS]).double()  # (prompts, hidden)
        logits = torch.tensor(REFERENCE, dtype=torch.float64).log()  # (prompts, tokens)
        model.lm_head.weight.copy_((torch.linalg.pinv(hidden) @ logits).T.float())
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@torch.no_grad()
def policy_table(model, tok) -> torch.Tensor:
    """pi(token | prompt) exactly: the softmax of the logits at the completion position, (prompts, tokens)."""
    model.eval()
    rows = []
    for prompt in PROMPTS:
        ids = torch.tensor([tok(prompt)["input_ids"]], device=model.device)
        rows.append(torch.softmax(model(input_ids=ids).logits[0, -1].double(), -1).cpu())
    return torch.stack(rows)


def reverse_optimum(ref: torch.Tensor, r_eff: torch.Tensor, beta: float) -> torch.Tensor:
    """argmax over distributions of E_pi[r_eff] - beta * KL(pi || ref): ref * exp(r_eff / beta), normalised."""
    return torch.softmax(ref.log() + r_eff / beta, -1)


def forward_optimum(ref: torch.Tensor, r_eff: torch.Tensor, beta: float) -> torch.Tensor:
    """argmax of E_pi[r_eff] - beta * KL(ref || pi): pi = beta * ref / (lam - r_eff), lam > max r_eff with sum 1
    (stationarity r_eff + beta * ref / pi = lam; sum pi decreases in lam, so bisection finds it), row by row."""
    rows = []
    for q, r in zip(ref, r_eff):
        lo, hi = r.max().item(), r.max().item() + beta + 1.0  # sum pi >= 1 just above max r; <= beta/(beta+1) < 1
        for _ in range(200):
            lam = 0.5 * (lo + hi)
            lo, hi = (lam, hi) if (beta * q / (lam - r)).sum() > 1 else (lo, lam)
        rows.append(beta * q / (0.5 * (lo + hi) - r))
    return torch.stack(rows)


def effective_rewards(settings: Settings) -> torch.Tensor:
    """(G - 1)/G * r: the group-mean baseline holds the sample's own reward with weight 1/G."""
    g = settings.num_generations
    return torch.tensor(REWARDS, dtype=torch.float64) * (g - 1) / g


def optima(ref: torch.Tensor, settings: Settings) -> dict[str, torch.Tensor]:
    """The reverse-KL and forward-KL optima (those of URKL / UFKL too: a softmax policy sums to one)."""
    r_eff = effective_rewards(settings)
    return {"reverse": reverse_optimum(ref, r_eff, settings.beta),
            "forward": forward_optimum(ref, r_eff, settings.beta)}


def distance(p: torch.Tensor, q: torch.Tensor) -> float:
    """Total variation, the largest over the prompts."""
    return (0.5 * (p - q).abs().sum(-1)).max().item()


class TableReward:
    """The reward table: r[prompt_index][completion token]."""

    __name__ = "table_reward"

    def __call__(self, completion_ids, prompt_index, **kwargs):
        return [REWARDS[i][ids[0]] if ids else 0.0 for i, ids in zip(prompt_index, completion_ids)]


def config_kwargs(settings: Settings, seed: int, output_dir: str) -> dict:
    copies = settings.prompt_copies
    return dict(
        output_dir=output_dir, per_device_train_batch_size=len(PROMPTS) * copies * settings.num_generations,
        gradient_accumulation_steps=1, steps_per_generation=settings.reuse, num_generations=settings.num_generations,
        max_completion_length=1, max_steps=settings.max_steps, beta=settings.beta, scale_rewards="none",
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, temperature=1.0, learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_scheduler_type, warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", logging_steps=settings.max_steps, report_to="none", use_cpu=True, bf16=False,
        save_strategy="no", seed=seed, dataloader_num_workers=0, disable_tqdm=True,
    )


def train_policy(method: str, seed: int, settings: Settings, workdir: str) -> dict:
    """Train `method` on the bandit from the seed's initial model; return the reference, the trained policy (both
    read exactly) and their distances to the two optima."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer

    kind, extra, _ = METHODS[method]
    model_dir = os.path.join(workdir, f"init-{seed}")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        save_model(model_dir, settings, seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = len(PROMPTS) * 64
    data = Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(rows)],
                              "prompt_index": [i % len(PROMPTS) for i in range(rows)]})
    kwargs = config_kwargs(settings, seed, os.path.join(workdir, f"{method}-{seed}"))
    if kind == "rpg":
        args = RPGConfig(**kwargs, rpg_reference="initial", **extra)
        trainer_cls = RPGTrainer
    else:
        args = GRPOConfig(**kwargs, **extra)
        trainer_cls = GRPOTrainer
    trainer = trainer_cls(model=model_dir, reward_funcs=TableReward(), args=args, train_dataset=data,
                          processing_class=tok)
    ref = policy_table(trainer.model, tok)
    reference_error = (ref - torch.tensor(REFERENCE, dtype=torch.float64)).abs().max().item()
    if reference_error > 1e-4:
        raise RuntimeError(f"the initial model's distribution is {reference_error:.2e} away from REFERENCE")
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    pi = policy_table(trainer.accelerator.unwrap_model(trainer.model), tok)
    best = optima(ref, settings)
    return {"method": method, "seed": seed, "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu_seconds, 2), "ref": ref.tolist(), "policy": pi.tolist(),
            "to_reverse": distance(pi, best["reverse"]), "to_forward": distance(pi, best["forward"]),
            "optima_apart": distance(best["reverse"], best["forward"])}


def summarize(runs: list[dict], settings: Settings) -> dict:
    """Per method: total variation to its own optimum and to the other (over seeds), and the seed spread (the
    largest distance between two seeds' trained policies: the reference, hence the optima, is the same for every
    seed, so the policies are directly comparable)."""
    ref = torch.tensor(REFERENCE, dtype=torch.float64)
    best = optima(ref, settings)
    out = {"optima_apart": distance(best["reverse"], best["forward"]),
           "reference_to_reverse": distance(ref, best["reverse"]),
           "reference_to_forward": distance(ref, best["forward"]),
           "optima": {k: v.tolist() for k, v in best.items()}, "methods": {}}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        own = EXPECTED_OPTIMUM[method]
        other = "forward" if own == "reverse" else "reverse"
        to_own = [r[f"to_{own}"] for r in mine]
        policies = [torch.tensor(r["policy"], dtype=torch.float64) for r in mine]
        spread = max((distance(p, q) for k, p in enumerate(policies) for q in policies[k + 1:]), default=None)
        out["methods"][method] = {
            "expected": own, "seeds": [r["seed"] for r in mine], "to_own_mean": statistics.mean(to_own),
            "to_own_max": max(to_own), "to_other_min": min(r[f"to_{other}"] for r in mine), "seed_spread": spread,
            "cpu_seconds_mean": statistics.mean(r["cpu_seconds"] for r in mine)}
    return out


def tables(summary: dict) -> str:
    from ._common import fmt, markdown_table

    rows = [[f"`{m}`", v["expected"], fmt(v["to_own_mean"]), fmt(v["to_own_max"]), fmt(v["to_other_min"]),
             fmt(v["seed_spread"]), fmt(v["cpu_seconds_mean"], 1)] for m, v in summary["methods"].items()]
    header = ["method", "its optimum", "TV to it (mean)", "(max)", "TV to the other (min)", "seed spread",
              "CPU s / run"]
    return (markdown_table(header, rows) + f"\n\nOptima apart: {fmt(summary['optima_apart'])} (TV); the reference "
            f"is {fmt(summary['reference_to_reverse'])} from the reverse-KL optimum and "
            f"{fmt(summary['reference_to_forward'])} from the forward-KL optimum.")


def main(argv=None):
    from ._common import default_results_path, machine_info, write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="2 seeds")
    p.add_argument("--seeds", type=int, nargs="+", help="override the seeds (default 0-4; --quick: 0-1)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the methods")
    p.add_argument("--max-steps", type=int, help=f"optimizer steps per run (default {Settings.max_steps})")
    p.add_argument("--learning-rate", type=float, help=f"peak learning rate (default {Settings.learning_rate})")
    p.add_argument("--output", help="JSON path (default benchmarks/results/bandit_optimum.json; --quick: "
                                     "outputs/benchmarks/bandit_optimum_quick.json)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    overrides = {"max_steps": a.max_steps, "learning_rate": a.learning_rate}
    settings = replace(Settings(), **{k: v for k, v in overrides.items() if v is not None})
    seeds = a.seeds or ((0, 1) if a.quick else (0, 1, 2, 3, 4))
    output = a.output or default_results_path("bandit_optimum", a.quick)
    info = machine_info()
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for method in a.methods or METHODS:
            for seed in seeds:
                r = train_policy(method, seed, settings, workdir)
                runs.append(r)
                print(f"{method:26s} seed {seed}: TV to reverse {r['to_reverse']:.4f}, to forward "
                      f"{r['to_forward']:.4f} ({r['cpu_seconds']:.1f} s CPU)", flush=True)
                summary = summarize(runs, settings)
                write_json(output, {"machine": info, "settings": asdict(settings), "summary": summary, "runs": runs})
    print(tables(summary))
    print(f"results: {output}")


if __name__ == "__main__":
    main()
