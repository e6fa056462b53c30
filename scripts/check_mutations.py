"""Mutation check: each entry changes one line of the package the way a plausible bug would, runs the tests meant to
catch it, and reports whether they fail (they must). The tree is restored from git after each mutation.

    python scripts/check_mutations.py            # all mutations (76; about 18 minutes on 2 cores)
    python scripts/check_mutations.py --list     # what is checked, and by which tests
    python scripts/check_mutations.py -k ddp     # the mutations whose name contains "ddp"

Needs a clean git tree for the files it mutates (it refuses otherwise) and the test extras (`pip install -e
".[test]"`). Exit status 0 when every mutation is caught, 1 when one survives.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: str  # pytest arguments


MUTATIONS = [
    Mutation("dapo normaliser without the accumulation factor", "trl_rpg/loss.py",
             "normalizer = normalizer * how.accumulation_steps / how.steps_per_generation",
             "normalizer = normalizer / how.steps_per_generation",
             "tests/test_grpo_equivalence.py -k each_aggregation"),
    Mutation("bnpo without the division by the accumulation steps", "trl_rpg/loss.py",
             "        loss = masked.sum() / mask.sum().clamp(min=1.0)\n",
             "        loss = masked.sum() / mask.sum().clamp(min=1.0) * how.accumulation_steps\n",
             "tests/test_grpo_equivalence.py -k each_aggregation"),
    Mutation("adaptive moving average with decay and 1 - decay swapped", "trl_rpg/reference.py",
             "self.decay * self.average + (1 - self.decay) * step",
             "(1 - self.decay) * self.average + self.decay * step",
             "tests/test_adaptive_reference.py"),
    Mutation("adaptive moving average updated every micro-batch", "trl_rpg/trainer.py",
             "            if acc.sync_gradients:  # the last micro-batch of the optimizer step",
             "            if True:",
             "tests/test_adaptive_reference.py"),
    Mutation("entropy bonus with the wrong sign", "trl_rpg/loss.py",
             "    return -coef * entropy / accumulation_steps",
             "    return coef * entropy / accumulation_steps",
             "tests/test_grpo_equivalence.py -k entropy_bonus"),
    Mutation("entropy mask ignored", "trl_rpg/trainer.py",
             "            advantages = advantages * entropy_mask",
             "            pass",
             "tests/test_grpo_equivalence.py -k top_entropy_quantile_trains"),
    Mutation("off-policy mask ignored", "trl_rpg/trainer.py",
             "            advantages = advantages * self.get_off_policy_mask(",
             "            advantages = advantages + 0 * self.get_off_policy_mask(",
             "tests/test_grpo_equivalence.py -k off_policy_mask"),
    Mutation("kl_ema not restored on resume", "trl_rpg/reference.py",
             '            self.trigger.average = state["kl_ema"]',
             "            pass",
             "tests/test_adaptive_reference.py -k resume"),
    Mutation("dual-clip boundary w >= c changed to w > c", "trl_rpg/objectives.py",
             "dual = ~positive & (w >= c)",
             "dual = ~positive & (w > c)",
             "tests/test_rpg_clip.py"),
    Mutation("log-ratio clamp removed", "trl_rpg/objectives.py",
             "log_w = (logp_safe - logmu).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)",
             "log_w = (logp_safe - logmu)",
             "tests/test_objective_numerics.py"),
    Mutation("vLLM importance-sampling ratio not applied", "trl_rpg/trainer.py",
             '            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]',
             "            pass",
             "tests/test_grpo_equivalence.py -k vllm"),
    Mutation("guard acts on fp16 overflow instead of leaving it to the gradient scaler", "trl_rpg/gradient_guard.py",
             "    if deepspeed or has_scaler or grad_norm is None:",
             "    if deepspeed or grad_norm is None:",
             "tests/test_gradient_guard.py -k fp16"),
    Mutation("guard acts under DeepSpeed (ddp)", "trl_rpg/gradient_guard.py",
             "    if deepspeed or has_scaler or grad_norm is None:",
             "    if has_scaler or grad_norm is None:",
             "tests/test_distributed.py -k zero3_skips"),
    Mutation("dr_grpo normaliser over all processes' rows (ddp)", "trl_rpg/loss.py",
             "        loss = masked.sum() / (per_token_loss.size(0) * how.max_completion_length)",
             "        loss = masked.sum() / (per_token_loss.size(0) * how.num_processes * how.max_completion_length)",
             "tests/test_grpo_equivalence.py -k ddp"),
    Mutation("dapo eval normaliser without the division by processes (ddp)", "trl_rpg/loss.py",
             "        normalizer = num_items_in_batch.clamp(min=1.0) / how.num_processes\n",
             "        normalizer = num_items_in_batch.clamp(min=1.0) / (how.num_processes if how.training else 1)\n",
             "tests/test_grpo_equivalence.py -k ddp"),
    Mutation("adaptive entropy controller fed one process's mean (ddp)", "trl_rpg/trainer.py",
             '                world = window_entropy(acc.reduce(self._entropy_window_stats, reduction="sum"))',
             "                world = window_entropy(self._entropy_window_stats)",
             "tests/test_grpo_equivalence.py -k ddp"),
    Mutation("main process checks every process's buffer (two nodes with local disks, ddp)",
             "trl_rpg/checkpoint/manifest.py",
             "        selected = [name for name in files if name not in rank_files]",
             "        selected = list(files)",
             "tests/test_distributed.py -k two_nodes"),
    Mutation("reward models wrapped like reward functions", "trl_rpg/trainer.py",
             "self.reward_funcs = [f if isinstance(f, nn.Module) else checked_reward_function(",
             "self.reward_funcs = [f if False else checked_reward_function(",
             "tests/test_grpo_equivalence.py -k reward_model"),
    Mutation("peft_config not passed on to TRL", "trl_rpg/trainer.py",
             "            super().__init__(model, reward_funcs, args, *positional, **kwargs)",
             "            super().__init__(model, reward_funcs, args, *positional,"
             " **{k: v for k, v in kwargs.items() if k != 'peft_config'})",
             "tests/test_grpo_equivalence.py -k lora_trains"),
    Mutation("stored old log-probs ignored (batch reuse through num_iterations)", "trl_rpg/trainer.py",
             "sampling_logps = per_token_logps.detach() if old is None else old",
             "sampling_logps = per_token_logps.detach()",
             "tests/test_grpo_equivalence.py -k num_iterations"),
    Mutation("a configuration with no training step accepted", "trl_rpg/config.py",
             "        if self.max_steps <= 0 and not (_finite(self.num_train_epochs) and self.num_train_epochs > 0):",
             "        if False:",
             "tests/test_training_on_nothing.py -k no_training_step"),
    Mutation("no warning when resuming a finished run", "trl_rpg/checkpoint/selection.py",
             "    if 0 < max_steps <= step:",
             "    if False:",
             "tests/test_training_on_nothing.py -k finished_run"),
    Mutation("a run with no optimizer step exits 0", "trl_rpg/learning_signal.py",
             "    if global_step == 0:",
             "    if False:",
             "tests/test_training_on_nothing.py"),
    Mutation("a step skipped by the guard counts as carrying signal", "trl_rpg/learning_signal.py",
             "    if any(c is None for c in causes):\n        return SKIPPED if skipped else None",
             "    if any(c is None for c in causes):\n        return None",
             "tests/test_learning_signal.py tests/test_training_on_nothing.py -k skipped"),
    Mutation("masked completion tokens count as trained on", "trl_rpg/learning_signal.py",
             "    mask = loss_mask.detach() != 0",
             "    mask = torch.ones_like(loss_mask, dtype=torch.bool)",
             "tests/test_training_on_nothing.py -k masked"),
    Mutation("groups without reward spread count as spread", "trl_rpg/learning_signal.py",
             "        spread += int(informative.sum())",
             "        spread += informative.numel()",
             "tests/test_learning_signal.py -k group_carries_signal"),
    Mutation("no warning after steps without signal", "trl_rpg/learning_signal.py",
             "            if sum(self.streak.values()) == WARN_AFTER:",
             "            if False:",
             "tests/test_training_on_nothing.py -k signal_in_some"),
    Mutation("signal counted before a resumed checkpoint forgotten", "trl_rpg/learning_signal.py",
             '            self.prior_steps_with_signal = int(saved.get("steps_with_signal", 0))',
             "            self.prior_steps_with_signal = 0",
             "tests/test_training_on_nothing.py -k resumed"),
    Mutation("a run without learning signal exits 0", "trl_rpg/trainer.py",
             "            raise learning_signal.NoLearningSignal(error)",
             "            pass",
             "tests/test_training_on_nothing.py -k groups_never"),
    Mutation("reward-model scores unchecked", "trl_rpg/learning_signal.py",
             "        if not isinstance(func, nn.Module):\n            continue",
             "        if True:\n            continue",
             "tests/test_training_on_nothing.py -k overflow"),
    Mutation("learning-signal token counts not summed over processes", "trl_rpg/trainer.py",
             '                lambda t: self.accelerator.reduce(t, reduction="sum")))',
             "                lambda t: t))",
             "tests/test_training_on_nothing.py -k summed"),
    Mutation("TRL's masks gate the whole per-token loss (the KL term too)", "trl_rpg/trainer.py",
             "        if self.use_vllm and self.vllm_importance_sampling_correction:  # mu != pi_old",
             "        per_token_loss = per_token_loss * (advantages != 0)\n"
             "        if self.use_vllm and self.vllm_importance_sampling_correction:  # mu != pi_old",
             "tests/test_kl_every_token.py -k mask_leaves"),
    Mutation("REINFORCE KL weight from the sequence ratio (GSPO)", "trl_rpg/objectives.py",
             "g = w * x.adv + x.beta * divergence.kl_weight(x.w.detach(), x.log_r.detach(), x.rho)",
             "g = w * x.adv + x.beta * divergence.kl_weight(w, x.log_r.detach(), x.rho)",
             "tests/test_kl_every_token.py -k sequence"),
    Mutation("differentiable KL term through the sequence ratio (GSPO)", "trl_rpg/objectives.py",
             "    kl = x.beta * divergence.value(x.w, x.log_r, x.rho)",
             "    kl = x.beta * divergence.value(x.reward_w, x.log_r, x.rho)",
             "tests/test_kl_every_token.py -k sequence"),
    Mutation("an upgraded GRPOConfig with beta > 0 keeps the sampler reference (beta inert)", "trl_rpg/config.py",
             '            values["rpg_reference"] = "initial"',
             "            pass",
             "tests/test_beta_keeps_its_meaning.py -k initial_model"),
    Mutation("no warning for a KL term that is zero by construction", "trl_rpg/config.py",
             "        if kl_term_is_inert(self):",
             "        if False:",
             "tests/test_beta_keeps_its_meaning.py -k warns"),
    Mutation("no start-up line saying what is optimised", "trl_rpg/trainer.py",
             "            logger.warning(describe_objective(self.args))",
             "            pass",
             "tests/test_beta_keeps_its_meaning.py -k one_line"),
    Mutation("LoRA reference adapter left in PEFT's float32 next to a bf16 adapter", "trl_rpg/reference.py",
             "            param.data = param.data.to(source.dtype)",
             "            pass",
             "tests/test_reference_schedule.py -k dtype"),
    Mutation("a reused batch's reward logged only on the step that generated it", "trl_rpg/trainer.py",
             "            carry_forward(self._metrics[\"train\"], self._batch_metrics)",
             "            pass",
             "tests/test_metrics.py -k every_step"),
    Mutation("metric sums reduced with mean instead of sum over processes (ddp)", "trl_rpg/trainer.py",
             'stats, entropies, mask, policy_loss, lambda t: acc.reduce(t, reduction="sum"), acc.gather,',
             'stats, entropies, mask, policy_loss, lambda t: acc.reduce(t, reduction="mean"), acc.gather,',
             "tests/test_grpo_equivalence.py -k ddp"),
    Mutation("evaluation batches feed the adaptive reference trigger", "trl_rpg/trainer.py",
             '        if mode == "train" and self.reference.trigger is not None:',
             "        if self.reference.trigger is not None:",
             "tests/test_adaptive_reference.py -k evaluation"),
    Mutation("rpg_reward_timeout not passed to the reward wrapper", "trl_rpg/trainer.py",
             "            f, name, timeout=args.rpg_reward_timeout) for f, name in",
             "            f, name, timeout=None) for f, name in",
             "tests/test_reward_timeout.py"),
    Mutation("a fraction's sign dropped", "trl_rpg/rewards/grading.py",
             '            return -value if m.group(1) == "-" else value',
             "            return value",
             "tests/test_grading.py -k negative_fraction"),
    Mutation("the unscored-batch warning on batch 1 only", "trl_rpg/validation.py",
             "        return self.batches - self.scored == 1",
             "        return self.batches == 1",
             "tests/test_reward_inputs.py -k unscored_batch"),
    Mutation("dual clip applied whatever the sign of A'", "trl_rpg/objectives.py",
             "dual = ~positive & (w >= c)",
             "dual = (w >= c)",
             "tests/test_rpg_clip.py -k negative_effective"),
    Mutation("zero-advantage tokens counted in clip_frac_high", "trl_rpg/objectives.py",
             '{"high": high & nonzero,',
             '{"high": high,',
             "tests/test_rpg_clip.py -k zero_advantage"),
    Mutation("model card clip row shows epsilon for epsilon_high", "trl_rpg/model_card.py",
             "`({args.epsilon}, {args.epsilon_high}, ",
             "`({args.epsilon}, {args.epsilon}, ",
             "tests/test_model_card.py -k settings"),
    Mutation("dynamic-sampling metric always the first reward function", "trl_rpg/dynamic_sampling.py",
             "rewards = rewards_per_func[:, self.column:self.column + 1]",
             "rewards = rewards_per_func[:, :1]",
             "tests/test_dynamic_sampling.py -k second_reward"),
    Mutation("dynamic-sampling prompt cursor not restored", "trl_rpg/dynamic_sampling.py",
             '        cursor = int(state.get("prompts_drawn", 0))',
             "        cursor = 0",
             "tests/test_dynamic_sampling.py -k continues"),
    Mutation("dynamic-sampling group unscored when any function is NaN", "trl_rpg/dynamic_sampling.py",
             "scored = ~torch.isnan(grouped).all(-1)",
             "scored = ~torch.isnan(grouped).any(-1)",
             "tests/test_dynamic_sampling.py -k scores_nothing"),
    Mutation("dynamic-sampling top-up takes the latest dropped groups first", "trl_rpg/dynamic_sampling.py",
             "rest = [r for r in records if not r.informative]",
             "rest = [r for r in reversed(records) if not r.informative]",
             "tests/test_dynamic_sampling.py -k earliest"),
    Mutation("no warning when dynamic sampling keeps no group for many rounds", "trl_rpg/dynamic_sampling.py",
             "                self._warn_if_idle(idle, buffer, round_index + 1)",
             "                pass",
             "tests/test_dynamic_sampling.py -k without_a_kept"),
    Mutation("TRL's rotation left on inside the save (before the manifest exists)", "trl_rpg/trainer.py",
             "self.args.save_total_limit = None",
             "pass",
             "tests/test_checkpoints.py -k full_disk_in_the_second_save"),
    Mutation("a buffer plan with one missing rank not dropped (all for any)", "trl_rpg/checkpoint/buffers.py",
             "    if any(rows is None or len(rows) != steps_per_generation for rows in saved_rows):",
             "    if all(rows is None or len(rows) != steps_per_generation for rows in saved_rows):",
             "tests/test_checkpoints.py -k buffer_restore_plan"),
    Mutation("skipped_steps not restored on resume", "trl_rpg/trainer.py",
             '        self.skipped_steps = int(state.get("skipped_steps", 0))',
             "        self.skipped_steps = 0",
             "tests/test_checkpoint_state.py"),
    Mutation("checkpoint checksums not compared (checkpoint files)", "trl_rpg/checkpoint/manifest.py",
             '        if digests[name]["sha256"] != files[name]["sha256"]:',
             "        if False:",
             "tests/test_checkpoints.py -k zeroed_region"),
    Mutation("manifest file names outside the checkpoint folder accepted (checkpoint files)",
             "trl_rpg/checkpoint/manifest.py",
             "    outside = [name for name in files if not _inside(name)]",
             "    outside = []",
             "tests/test_checkpoints.py -k outside_the_folder"),
    Mutation("a symbolic link in a checkpoint accepted (checkpoint files)", "trl_rpg/checkpoint/manifest.py",
             "        if os.path.islink(os.path.join(directory, *parts[:depth])):",
             "        if False:",
             "tests/test_checkpoints.py -k symlinked"),
    Mutation("rotation counts incomplete checkpoints (checkpoint rotation)", "trl_rpg/checkpoint/selection.py",
             "    complete = [p for p in folders if is_complete(p)]",
             "    complete = list(folders)",
             "tests/test_checkpoints.py -k rotation"),
    Mutation("another run's checkpoint resumed (run identity)", "trl_rpg/checkpoint/identity.py",
             '    if old["parameters"] != new["parameters"]:',
             "    if False:",
             "tests/test_checkpoints.py -k another_runs_checkpoint"),
    Mutation("cli: a failed multi-process child reported as exit 1", "trl_rpg/cli.py",
             "        return _exit_status(first.exitcode)",
             "        return 1",
             "tests/test_cli.py -k two_processes"),
    Mutation("cli: several CPU processes launched as one", "trl_rpg/cli.py",
             "if args.num_processes > 1 and not _launches_distributed(args) and devices != 1:",
             "if args.num_processes > 1 and not _launches_distributed(args) and devices > 1:",
             "tests/test_cli.py -k passes_accelerate_the_values"),
    Mutation("cli: the training process outlives its launcher", "trl_rpg/cli.py",
             "        stop_with_launcher()\n",
             "        pass\n",
             "tests/test_cli.py -k sigkill"),
    Mutation("cli: the working directory first on the training process's sys.path", "trl_rpg/cli.py",
             '"PYTHONSAFEPATH": "1"}',
             "}",
             "tests/test_cli.py -k resumes_with_true"),
    Mutation("cli: --resume_from_checkpoint True taken as a path", "trl_rpg/cli.py",
             "trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))",
             "trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)",
             "tests/test_cli.py -k resumes_with_true"),
    Mutation("cli: a dotted reward name not checked to be a reward function", "trl_rpg/cli.py",
             "    check_reward_callable(path, func)\n",
             "    pass\n",
             "tests/test_cli.py -k dotted_name"),
    Mutation("cli: data without a prompt column passed on", "trl_rpg/cli.py",
             '    if columns is not None and "prompt" not in columns:\n        raise ValueError(f"The data set',
             '    if False:\n        raise ValueError(f"The data set',
             "tests/test_cli.py -k prompt_column"),
    Mutation("cli: a missing local model path not checked at launch", "trl_rpg/cli.py",
             "    if name and looks_like_local_path(name) and not Path(name).expanduser().exists():",
             "    if False:",
             "tests/test_cli.py -k mistyped_local_model"),
    Mutation("cli: no warning for an output_dir holding checkpoints", "trl_rpg/cli.py",
             "    warn_if_output_dir_holds_checkpoints(prog, parsed[1])\n",
             "    pass\n",
             "tests/test_cli.py -k exits_with_the_training_process_status"),
    Mutation("cli: GRPO help texts left untrue under RPG", "trl_rpg/cli.py",
             "        parser._option_string_actions[flag].help = help_text",
             "        pass",
             "tests/test_cli.py -k tells_rpg_defaults"),
    Mutation("cli: --num_processes N with a one-process config run once", "trl_rpg/cli.py",
             '    if distributed_type == "NO":',
             "    if False:",
             "tests/test_cli.py -k one_process_asked_twice"),
    Mutation("cli: python -m trl_rpg keeps the working directory first on sys.path", "trl_rpg/__main__.py",
             "    del sys.path[0]\n",
             "    pass\n",
             "tests/test_cli.py -k python_m_trl_rpg"),
    Mutation("cli: DeepSpeed's CPU notice printed on every run", "trl_rpg/cli.py",
             'logging.getLogger("DeepSpeed").addFilter(_WithoutDeepSpeedCpuNotice())',
             "_WithoutDeepSpeedCpuNotice()",
             "tests/test_cli.py -k resumes_with_true"),
    Mutation("demo: the model card left generic", "trl_rpg/toy/demo.py",
             "    complete_demo_card(os.path.join(",
             "    (lambda *a, **k: None)(os.path.join(",
             "tests/test_demo.py -k short_demo"),
    Mutation("RKL regularises with FKL's weight (bandit optimum)", "trl_rpg/objectives.py",
             "kl_weight=lambda w, log_r, rho: -w * (log_r + 1.0),",
             "kl_weight=lambda w, log_r, rho: rho,",
             "tests/test_bandit_optimum.py -k reinforce-rkl"),
    Mutation("URKL's differentiable term is k2's, exact only on-policy (bandit identity with TRL)",
             "trl_rpg/objectives.py",
             "value=lambda w, log_r, rho: w * log_r + rho - w,",
             "value=lambda w, log_r, rho: 0.5 * log_r**2,",
             "tests/test_bandit_optimum.py -k trl_corrected"),
    Mutation("clipped KL part against a fixed log rho (issue 27: pushes away from the reference)",
             "trl_rpg/objectives.py",
             "    log_r_bar = torch.where(inside, log_r, log_r.clamp(min=lower, max=upper))",
             "    log_r_bar = log_w_bar - x.log_rho",
             "tests/test_rpg_clip_reference.py -k never_pushes_away"),
    Mutation("reference ratio clipped inside the trust region too", "trl_rpg/objectives.py",
             "    log_r_bar = torch.where(inside, log_r, log_r.clamp(min=lower, max=upper))",
             "    log_r_bar = log_r.clamp(min=lower, max=upper)",
             "tests/test_rpg_clip_reference.py -k exact_inside"),
    Mutation("clipped KL part keeps rho, clipping r only (unbounded)", "trl_rpg/objectives.py",
             "    rho_bar = torch.where(inside, x.rho, (log_w_bar - log_r_bar).exp())",
             "    rho_bar = x.rho",
             "tests/test_rpg_clip_reference.py -k bounded"),
]


def run(mutation: Mutation) -> tuple[bool, str, float]:
    """Apply `mutation`, run its tests, restore the file; returns (caught, first failing test, seconds)."""
    path = ROOT / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.name}: the line to mutate occurs {text.count(mutation.old)} times in "
                         f"{mutation.path} (expected once); update scripts/check_mutations.py.")
    start = time.perf_counter()
    try:
        path.write_text(text.replace(mutation.old, mutation.new))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               *mutation.tests.split()], cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(text)
    failed = next((line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    if proc.returncode == 5:  # pytest ran no test (a selector that matches nothing): nothing caught the mutation
        failed = "no test selected by " + mutation.tests
    return proc.returncode not in (0, 5), failed, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only the mutations whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.k in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    {m.path}: {m.old.strip()!r} -> {m.new.strip()!r}\n    pytest {m.tests}")
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *{m.path for m in chosen}], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        raise SystemExit(f"check_mutations: commit or stash the changes to these files first:\n{dirty}")
    survived = []
    for m in chosen:
        caught, failed, seconds = run(m)
        print(f"{'caught  ' if caught else 'SURVIVED'} {m.name} ({seconds:.0f} s){': ' + failed if failed else ''}",
              flush=True)
        if not caught:
            survived.append(m.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
