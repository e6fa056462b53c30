"""Cost benchmark: step time and peak memory of RPG, GRPO (beta > 0) and GRPO (beta = 0), interleaved.

    python -m benchmarks.cost                    # CPU: ~24M-parameter random-init Qwen2, completions 64/128/256
    python -m benchmarks.cost --quick            # CPU, small model, short completions (about 2 min)
    python -m benchmarks.cost --device cuda      # GPU: bf16, Qwen2-0.5B-shaped random-init model
    python -m benchmarks.cost_vllm               # vLLM generation: RPG with the engine's log-probs against RPG
                                                 # recomputing them and GRPO (its own command, same options)

One invocation runs, for each repetition and each completion length, the three trainers one after the other
(A B C, B C A, C A B, ...: the order rotates with the repetition), each in a fresh subprocess so that its peak
memory is its own:

* ``RPG``: ``RPGTrainer``, beta > 0, reference = the sampling policy (``rpg_reference="sampling"``, the default).
* ``GRPO(beta>0)``: TRL's ``GRPOTrainer`` with the same beta (loads a reference model, one extra forward pass per
  generation batch).
* ``GRPO(beta=0)``: TRL's ``GRPOTrainer`` without KL.

All three use the same model, data, batch layout (each generation batch reused for ``reuse`` optimizer steps),
clip (0.2 / 0.28) and token-mean aggregation, so the only difference is how the KL term is paid for. Generation is
forced to the full completion length (``min_new_tokens``), and the reward is a fixed pseudo-random function of the
completion text (the reward does not change the compute). The whole-step time is the time of one generation cycle
(generation + scoring + ``reuse`` optimizer steps) divided by ``reuse``, median over the measured cycles (the first
``warmup_cycles`` are dropped); on CPU both the wall time and the process CPU time are reported, and the ratios use
the CPU time, which other jobs on a shared machine disturb much less than the wall time. Peak memory is the
process's peak RSS on CPU (``getrusage``), and ``torch.cuda.max_memory_allocated`` on GPU.

Generation dominates the whole step and its run-to-run noise drowns differences of a few percent, so the training
side is also timed on its own (:func:`run_training_side`, ``--rounds``): per length, one process builds the three
trainers, feeds each the same fixed generated batch (no sampling), and runs their generation cycles in turn,
``train_rounds`` interleaved rounds; the per-round ratios RPG / GRPO give a 95% interval. Ratios whose denominator
measured 0 are reported as undefined.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from ._common import (
    CACHE_DIR,
    UNDEFINED,
    ci95,
    default_results_path,
    fmt,
    fmt_ratio,
    loadavg,
    machine_info,
    markdown_table,
    moved_flag,
    ratio,
    write_json,
)

BETA = 0.04
METHODS = ("RPG", "GRPO(beta>0)", "GRPO(beta=0)")


@dataclass
class Settings:
    device: str = "cpu"
    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 2
    intermediate_size: int = 1536
    lengths: tuple = (64, 128, 256)
    repetitions: int = 3
    per_device_train_batch_size: int = 2  # completions per optimizer step
    num_generations: int = 2
    reuse: int = 2  # optimizer steps per generation batch
    warmup_cycles: int = 1
    measured_cycles: int = 2
    threads: int = 1  # torch threads per run on CPU (1: robust on a shared machine)
    gradient_checkpointing: bool = True  # TRL's GRPOConfig default, the same for all three trainers
    methods: tuple = METHODS
    beta: float = BETA
    # training side on its own (one fixed generated batch; run_training_side): measured interleaved rounds
    train_rounds: int = 20
    # the training side's process with glibc's allocator pinned (`PINNED_MALLOC`); False: glibc's defaults
    pinned_malloc: bool = True
    cache_dir: str = os.path.join(CACHE_DIR, "cost")
    timeout_s: int = 600


#: The training side's process runs the three trainers in threads of one process, where glibc's allocator gives each
#: thread its own arena and moves its mmap threshold with what was freed last: which trainer then pays fresh-page
#: faults every step depends on the allocation history, not on its code. Measured at 128 tokens (15 rounds, quiet
#: machine): RPG / GRPO(beta=0) 1.072 [1.034, 1.111] with the defaults (1.037 with the trainers' order swapped), 0.987
#: [0.962, 1.012] with one arena, 0.990 [0.964, 1.016] with a fixed mmap threshold; at 256 tokens the defaults gave
#: 0.976 (RPG faster). Run alone, each in its own process, the two trainers allocate the same (torch's memory profile:
#: the same sizes, 19,532 against 19,541 page faults per step). Pinned: one arena, a fixed mmap threshold, no trimming.
PINNED_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                 "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}

FULL = Settings()
QUICK = Settings(hidden_size=256, num_layers=4, intermediate_size=1024, lengths=(32, 64), repetitions=2,
                 train_rounds=8)
CUDA = Settings(device="cuda", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                lengths=(256, 512, 1024), repetitions=3, per_device_train_batch_size=16, num_generations=8,
                measured_cycles=3)
CUDA_QUICK = dataclasses.replace(CUDA, lengths=(128, 256), repetitions=1, measured_cycles=2)


# ---------------------------------------------------------------------------------------------------------------------
# Model and data
# ---------------------------------------------------------------------------------------------------------------------


def model_dir(s: Settings) -> str:
    dtype = "bf16" if s.device == "cuda" else "fp32"
    tag = f"h{s.hidden_size}-l{s.num_layers}-a{s.num_heads}-kv{s.num_kv_heads}-i{s.intermediate_size}-{dtype}"
    return os.path.join(s.cache_dir, tag)


def build_model(s: Settings) -> tuple[str, int]:
    """Save a random-init Qwen2 model (toy tokenizer) to the cache; return its path and parameter count."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trl_rpg.toy import task as toy

    path = model_dir(s)
    marker = os.path.join(path, "n_params.json")
    if os.path.exists(marker):
        with open(marker) as f:
            return path, json.load(f)["n_params"]
    tokenizer = toy.build_tokenizer()
    tokenizer.model_max_length = 4096
    model = toy.build_model(
        tokenizer, hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads, seed=0,
        num_key_value_heads=s.num_kv_heads, intermediate_size=s.intermediate_size,
        max_position_embeddings=max(s.lengths) + 64,
    )
    if s.device == "cuda":
        model = model.to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(marker, "w") as f:
        json.dump({"n_params": n_params}, f)
    assert isinstance(model, Qwen2ForCausalLM)
    return path, n_params


def pseudo_reward(completions, **kwargs):
    """Reward-agnostic: a fixed pseudo-random number in [0, 1) per completion text (nonzero advantages)."""
    import zlib

    texts = [c if isinstance(c, str) else str(c[-1].get("content", "")) for c in completions]
    return [(zlib.crc32(t.encode()) % 1000) / 1000.0 for t in texts]


# ---------------------------------------------------------------------------------------------------------------------
# One run (in a child process)
# ---------------------------------------------------------------------------------------------------------------------


def _rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _setup_process(s: Settings):
    """Quiet libraries; the run's torch threads on CPU."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    if s.device == "cpu":
        torch.set_num_threads(s.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def make_trainer(s: Settings, method: str, length: int, out_dir: str, max_steps: int, callbacks=()):
    """The trainer of ``method`` at completion length ``length``: the same model, data, batch layout and clip for all
    three, so that only how the KL term is paid for differs."""
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer
    from trl_rpg.toy import task as toy

    cuda = s.device == "cuda"
    path = model_dir(s)
    tokenizer = AutoTokenizer.from_pretrained(path)
    n_prompts = max_steps * s.per_device_train_batch_size // s.num_generations + 8
    dataset = toy.make_dataset(n_prompts, seed=0, split="train")
    common = {
        "output_dir": out_dir, "seed": 0, "max_steps": max_steps,
        "per_device_train_batch_size": s.per_device_train_batch_size, "num_generations": s.num_generations,
        "gradient_accumulation_steps": 1, "steps_per_generation": s.reuse, "max_completion_length": length,
        "generation_kwargs": {"min_new_tokens": length}, "temperature": 1.0, "learning_rate": 1e-5,
        "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "scale_rewards": "none", "report_to": "none",
        "save_strategy": "no", "logging_steps": 1, "disable_tqdm": True, "dataloader_num_workers": 0,
        "log_level": "error", "use_cpu": not cuda, "bf16": cuda, "gradient_checkpointing": s.gradient_checkpointing,
        "model_init_kwargs": {"dtype": "bfloat16" if cuda else "float32"},
    }
    if method == "RPG":
        config = RPGConfig(beta=s.beta, rpg_reference="sampling", rpg_divergence="urkl",
                           rpg_estimator="reinforce", **common)
        cls = RPGTrainer
    elif method == "GRPO(beta>0)":
        config, cls = GRPOConfig(beta=s.beta, **common), GRPOTrainer
    elif method == "GRPO(beta=0)":
        config, cls = GRPOConfig(beta=0.0, **common), GRPOTrainer
    else:
        raise ValueError(f"method: {method!r} is not one of {list(METHODS)}")
    trainer = cls(model=path, reward_funcs=pseudo_reward, args=config, train_dataset=dataset,
                  processing_class=tokenizer, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    return trainer


def run_one(s: Settings, method: str, length: int, out_dir: str) -> dict:
    """Train a few cycles of ``method`` at completion length ``length``; return timings and peak memory."""
    import resource

    _setup_process(s)
    import torch
    import trl  # noqa: F401  (imported before the start RSS is read, as before any model is loaded)
    from transformers import TrainerCallback

    import trl_rpg  # noqa: F401

    rss_start = _rss_kib()  # after imports, before any model is loaded
    cuda = s.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    cycles = s.warmup_cycles + s.measured_cycles
    max_steps = cycles * s.reuse

    marks: list[tuple[float, float]] = []  # (wall, process CPU) at the start and after every optimizer step
    lengths: list[float] = []

    def mark():
        if cuda:
            torch.cuda.synchronize()
        marks.append((time.perf_counter(), time.process_time()))

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            mark()

        def on_step_end(self, args, state, control, **kw):
            mark()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    trainer = make_trainer(s, method, length, out_dir, max_steps, callbacks=[Timer()])
    has_ref = trainer.ref_model is not None

    # Count the sequences each log-prob forward pass covers, by kind: the policy without gradient (the sampler's
    # log-probs of a reused batch), the reference model, and the policy with gradient (the training step).
    passes = {"policy_no_grad": 0, "reference": 0, "policy_grad": 0}
    logps_fn = trainer._get_per_token_logps_and_entropies
    ref_model = trainer.ref_model

    def counted(model, input_ids, *a, **k):
        kind = ("reference" if ref_model is not None and model is ref_model
                else "policy_grad" if torch.is_grad_enabled() else "policy_no_grad")
        passes[kind] += int(input_ids.size(0))
        return logps_fn(model, input_ids, *a, **k)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    def per_step(k):  # per-step time (k=0 wall, k=1 CPU) of each measured cycle
        steps = [b[k] - a[k] for a, b in itertools.pairwise(marks)]
        cycles = [sum(steps[i:i + s.reuse]) for i in range(0, len(steps), s.reuse)]
        return [c / s.reuse for c in cycles[s.warmup_cycles:]], steps

    wall, steps = per_step(0)
    cpu, _ = per_step(1)
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = {
        "method": method, "length": length, "step_s": statistics.median(wall), "step_s_cycles": wall,
        "step_cpu_s": statistics.median(cpu), "step_cpu_s_cycles": cpu,
        "all_steps_s": [round(x, 3) for x in steps], "mean_completion_length": (statistics.fmean(lengths) if lengths
                                                                          else None),
        # forward passes over the generation batch, per generation cycle (1.0 = every completion once)
        "passes_per_batch": {k: v / (cycles * s.per_device_train_batch_size * s.reuse) for k, v in passes.items()},
        "reference_model": has_ref, "peak_rss_mib": peak_rss_kib / 1024, "rss_start_mib": rss_start / 1024,
    }
    if cuda:
        result["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


# ---------------------------------------------------------------------------------------------------------------------
# The training side on its own: one fixed generated batch, the three trainers' cycles interleaved in one process
# ---------------------------------------------------------------------------------------------------------------------


def fixed_completions(s: Settings, length: int, n: int) -> list[list[int]]:
    """``n`` fixed completions of exactly ``length`` tokens (pseudo-random digits and operators, no eos): the
    "generated" batch every trainer is fed in the training-side timing."""
    import random

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(s))
    vocab = tokenizer.convert_tokens_to_ids(list("0123456789+-=,"))
    rng = random.Random(f"fixed-batch-{length}")
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(n)]


class _Baton:
    """Turn-taking between trainer threads: ``turns`` is the order of the cycles (one trainer name per cycle); a
    trainer runs a cycle only when it is its turn, so exactly one trainer computes at any time."""

    def __init__(self, turns: list[str], timeout_s: float):
        import threading

        self.turns, self.index, self.timeout_s = turns, 0, timeout_s
        self.executed: list[str] = []  # the cycles in the order they ran
        self.cond = threading.Condition()
        self.failed: BaseException | None = None

    def wait_for(self, name: str) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: self.failed is not None or (
                self.index < len(self.turns) and self.turns[self.index] == name), timeout=self.timeout_s)
            if self.failed is not None:
                raise RuntimeError("another trainer failed") from self.failed
            if not ok:
                raise TimeoutError(f"{name}: no turn within {self.timeout_s}s (turn {self.index})")

    def done(self, name: str) -> None:
        with self.cond:
            self.executed.append(name)
            self.index += 1
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.failed = exc
            self.cond.notify_all()


def run_training_side(s: Settings, length: int, out_dir: str) -> dict:
    """Time the training side of the three trainers on one fixed generated batch, interleaved.

    Each trainer is built as in :func:`run_one`, but its generation returns :func:`fixed_completions` (so every
    trainer trains on the same completions, rewards and advantages, and no time goes to sampling). What a cycle
    (``reuse`` optimizer steps on one generation batch) then times is the training side: the no-grad log-prob pass
    of the sampler (and, for ``GRPO(beta>0)``, of the reference model), reward scoring, and per optimizer step the
    log-prob pass with gradient, the loss, backward, gradient clipping and RPG's non-finite-gradient guard, and the
    optimizer step. The trainers run in threads that take turns cycle by cycle (``warmup_cycles`` rounds, then
    ``train_rounds`` measured rounds; the order rotates every round: A B C, B C A, C A B), so slow drifts of the
    machine's speed hit all three alike and the per-round ratios are paired.
    """
    import threading

    _setup_process(s)
    import torch
    from transformers import TrainerCallback

    cuda = s.device == "cuda"
    rounds = s.warmup_cycles + s.train_rounds
    methods = list(s.methods)
    turns = [m for r in range(rounds) for m in methods[r % len(methods):] + methods[:r % len(methods)]]
    baton = _Baton(turns, timeout_s=s.timeout_s)
    n_batch = s.per_device_train_batch_size * s.reuse
    fixed = fixed_completions(s, length, n_batch)
    cycles: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    batches: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}

    def clock():
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    class Turns(TrainerCallback):
        def __init__(self, name):
            self.name, self.t0 = name, None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:  # first step of a cycle: wait for this trainer's turn
                baton.wait_for(self.name)
                self.t0 = clock()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:  # last step of the cycle
                t1 = clock()
                cycles[self.name].append((t1[0] - self.t0[0], t1[1] - self.t0[1]))
                part_cycles[self.name].append(dict(parts[self.name]))
                parts[self.name].clear()
                baton.done(self.name)

        def on_log(self, args, state, control, logs=None, **kw):
            # the first step of each cycle generated its batch (RPGTrainer logs the reward on every step that
            # trains on a batch, GRPOTrainer on the generating step only): what this trainer was fed
            if logs and "reward" in logs and (state.global_step - 1) % s.reuse == 0:
                batches[self.name].append((round(float(logs["reward"]), 6),
                                           float(logs.get("completions/mean_length", float("nan")))))

    def replay(prompt_ids, *a, **k):  # replaces generation: the fixed completions, in order
        return [list(fixed[i % n_batch]) for i in range(len(prompt_ids))], None

    parts: dict[str, dict[str, float]] = {m: {} for m in methods}  # seconds spent in each part, this cycle
    part_cycles: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    trainers = {}
    for m in methods:
        turns = Turns(m)
        trainer = make_trainer(s, m, length, os.path.join(out_dir, m), rounds * s.reuse, callbacks=[turns])
        run_last(trainer, turns)
        trainer._generate_single_turn = replay
        time_parts(trainer, parts[m], clock)
        trainers[m] = trainer

    def target(m):
        try:
            trainers[m].train()
        except BaseException as exc:  # noqa: BLE001  (handed to the main thread)
            baton.fail(exc)

    threads = [threading.Thread(target=target, args=(m,), name=f"train-{m}") for m in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if baton.failed is not None:
        raise RuntimeError(f"training-side timing at length {length} failed") from baton.failed
    warm = s.warmup_cycles
    return {"length": length, "rounds": s.train_rounds, "turns": baton.executed[warm * len(methods):],
            "step_s": {m: [c[0] / s.reuse for c in cycles[m][warm:]] for m in methods},
            "step_cpu_s": {m: [c[1] / s.reuse for c in cycles[m][warm:]] for m in methods},
            "parts_s": {m: [{k: v / s.reuse for k, v in c.items()} for c in part_cycles[m][warm:]] for m in methods},
            "batches": batches}


def run_last(trainer, callback) -> None:
    """Move `callback` to the end of `trainer`'s callbacks, so that its `on_step_end` (where a cycle's clock stops and
    the turn passes on) runs after every other callback's: the work the trainer adds there (RPG's `ParameterGuard`)
    counts in its own cycle, not in the next trainer's (its thread would still be computing when that one starts,
    and the CPU clock is the process's)."""
    trainer.remove_callback(callback)
    trainer.add_callback(callback)


#: The parts of a training step that differ between the trainers, timed inside `run_training_side`: the loss
#: computation without the model's log-prob pass (RPG's objective, masks, aggregation and metrics, or GRPO's), and
#: the gradient-norm hook (`_get_grad_norm`: the norm clipping computes, plus RPG's non-finite-gradient guard).
PARTS = ("loss_without_model", "grad_norm_and_guard")


def time_parts(trainer, totals: dict[str, float], clock) -> None:
    """Accumulate into `totals` the wall time of the `PARTS` of `trainer`'s steps (wrapping its methods)."""
    compute_loss, logps, grad_norm = (trainer._compute_loss, trainer._get_per_token_logps_and_entropies,
                                      trainer._get_grad_norm)
    inside = {"loss": False}

    def timed_logps(*args, **kwargs):
        t0 = clock()[0]
        try:
            return logps(*args, **kwargs)
        finally:
            if inside["loss"]:  # the model pass inside the loss is not part of the loss computation
                totals["loss_without_model"] = totals.get("loss_without_model", 0.0) - (clock()[0] - t0)

    def timed_loss(*args, **kwargs):
        t0 = clock()[0]
        inside["loss"] = True
        try:
            return compute_loss(*args, **kwargs)
        finally:
            inside["loss"] = False
            totals["loss_without_model"] = totals.get("loss_without_model", 0.0) + (clock()[0] - t0)

    def timed_grad_norm(*args, **kwargs):
        t0 = clock()[0]
        try:
            return grad_norm(*args, **kwargs)
        finally:
            totals["grad_norm_and_guard"] = totals.get("grad_norm_and_guard", 0.0) + (clock()[0] - t0)

    trainer._compute_loss = timed_loss
    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer._get_grad_norm = timed_grad_norm


def ratio_ci(numerators: list[float], denominators: list[float]) -> dict | None:
    """Paired ratio of two trainers' times: the geometric mean of the per-round ratios and its 95% t-interval
    (computed on the log-ratios); None when a time measured 0 or fewer than 2 rounds are paired."""
    pairs = [(a, b) for a, b in zip(numerators, denominators) if a and b and a > 0 and b > 0]
    if len(pairs) < 2 or len(pairs) < len(numerators):
        return None
    c = ci95([math.log(a / b) for a, b in pairs])
    return {"ratio": math.exp(c["mean"]), "low": math.exp(c["mean"] - c["half_width"]),
            "high": math.exp(c["mean"] + c["half_width"]), "n": c["n"]}


# ---------------------------------------------------------------------------------------------------------------------
# Driver: interleaved runs, each in a subprocess
# ---------------------------------------------------------------------------------------------------------------------


def _spawn(s: Settings, method: str | None, length: int) -> dict:
    """:func:`run_one` (``method``) or, with ``method=None``, :func:`run_training_side` in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-") as tmp:
        spec = os.path.join(tmp, "spec.json")
        out = os.path.join(tmp, "result.json")
        with open(spec, "w") as f:
            json.dump({"settings": _to_jsonable(s), "method": method, "length": length, "out": out,
                           "output_dir": os.path.join(tmp, "run")}, f)
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if s.device == "cpu":
            env["OMP_NUM_THREADS"] = str(s.threads)
            env["CUDA_VISIBLE_DEVICES"] = ""
        if method is None and s.pinned_malloc:
            env.update(PINNED_MALLOC)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.cost", "--child", spec], env=env, cwd=root,
                              check=False, capture_output=True, text=True, timeout=_child_timeout(s, method))
        if proc.returncode != 0 or not os.path.exists(out):
            what = method or "training side"
            raise RuntimeError(f"{what} L={length} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out) as f:
            result = json.load(f)
        result["process_s"] = round(time.perf_counter() - t0, 1)
        return result


def _child_timeout(s: Settings, method: str | None) -> float:
    """Seconds a child may run: `timeout_s` for one trainer's run; for the training side, which runs every trainer
    for `warmup_cycles + train_rounds` rounds, `timeout_s` per 20 rounds (the default count)."""
    if method is not None:
        return s.timeout_s
    return s.timeout_s * max(1.0, (s.warmup_cycles + s.train_rounds) / 20)


def _to_jsonable(s: Settings) -> dict:
    d = asdict(s)
    d["lengths"] = list(d["lengths"])
    d["methods"] = list(d["methods"])
    return d


def _from_jsonable(d: dict) -> Settings:
    d = dict(d)
    d["lengths"] = tuple(d["lengths"])
    d["methods"] = tuple(d["methods"])
    return Settings(**d)


def run(s: Settings, log=print, spawn=True) -> dict:
    info = machine_info()
    t0 = time.perf_counter()
    path, n_params = build_model(s)
    log(f"model: {n_params / 1e6:.1f}M parameters ({path})")
    runs = []
    for rep in range(s.repetitions):
        # interleaved A B C, then B C A, then C A B, ...: no trainer always runs first (or right after another)
        order = list(s.methods[rep % len(s.methods):]) + list(s.methods[:rep % len(s.methods)])
        for length in s.lengths:
            for method in order:
                if spawn:
                    r = _spawn(s, method, length)
                else:
                    with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-") as tmp:
                        r = run_one(s, method, length, tmp)
                r["repetition"] = rep
                r["loadavg"] = loadavg()
                runs.append(r)
                mem = r.get("peak_allocated_mib", r["peak_rss_mib"])
                log(f"  rep {rep} L={length:4d} {method:13s} step {r['step_s']:.3f}s  peak {mem:.0f} MiB  "
                    f"(completion length {r['mean_completion_length']}, {time.perf_counter() - t0:.0f}s elapsed)")
    train_side = []
    for length in s.lengths if s.train_rounds > 0 else ():
        if spawn:
            r = _spawn(s, None, length)
        else:
            with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-") as tmp:
                r = run_training_side(s, length, tmp)
        r["loadavg"] = loadavg()
        train_side.append(r)
        log(f"  training side L={length:4d}: median step " + ", ".join(
            f"{m} {statistics.median(r['step_s'][m]):.3f}s" for m in s.methods)
            + f" ({s.train_rounds} rounds, {time.perf_counter() - t0:.0f}s elapsed)")
    summary = summarize(s, runs, train_side)
    return {"settings": _to_jsonable(s), "n_params": n_params, "machine": info,
            "wall_s": round(time.perf_counter() - t0, 1), "summary": summary, "runs": runs,
            "training_side": train_side}


def summarize(s: Settings, runs: list[dict], train_side: list[dict] | None = None) -> dict:
    mem_key = "peak_allocated_mib" if s.device == "cuda" else "peak_rss_mib"
    out: dict = {"memory": mem_key, "by_length": {}}
    for length in s.lengths:
        row = {}
        for m in s.methods:
            rs = [r for r in runs if r["method"] == m and r["length"] == length]
            if not rs:
                continue
            row[m] = {
                "step_s_median": statistics.median(r["step_s"] for r in rs),
                "step_s_all": [round(r["step_s"], 4) for r in rs],
                "step_cpu_s_median": statistics.median(r["step_cpu_s"] for r in rs),
                "mem_mib_median": statistics.median(r[mem_key] for r in rs),
                "mem_above_start_mib": (statistics.median(r[mem_key] - r["rss_start_mib"] for r in rs)
                                     if mem_key == "peak_rss_mib" else None),
                "reference_model": rs[0]["reference_model"],
                "passes_per_batch": rs[0].get("passes_per_batch"),
                "completion_length": statistics.fmean(r["mean_completion_length"] or 0 for r in rs),
            }
        for other in ("GRPO(beta>0)", "GRPO(beta=0)"):
            if "RPG" in row and other in row:
                # None (printed "undefined") where a denominator measured 0: e.g. no RSS growth above the start
                # of a run that reuses memory its process already held
                row[f"RPG/{other}"] = {
                    "step_time": ratio(row["RPG"]["step_s_median"], row[other]["step_s_median"]),
                    "step_cpu_time": ratio(row["RPG"]["step_cpu_s_median"], row[other]["step_cpu_s_median"]),
                    "memory": ratio(row["RPG"]["mem_mib_median"], row[other]["mem_mib_median"]),
                    "memory_above_start": ratio(row["RPG"]["mem_above_start_mib"], row[other]["mem_above_start_mib"]),
                }
        out["by_length"][str(length)] = row
    for t in train_side or []:
        out["by_length"].setdefault(str(t["length"]), {})["training_side"] = summarize_training_side(s, t)
    return out


def summarize_training_side(s: Settings, t: dict) -> dict:
    """Median step time of each trainer on the fixed batch, and the paired ratios RPG / other with 95% intervals
    (CPU time on CPU, wall time on GPU)."""
    key = "step_s" if s.device == "cuda" else "step_cpu_s"
    out = {"rounds": t["rounds"], "time": "wall" if s.device == "cuda" else "CPU"}
    for m in s.methods:
        if t[key].get(m):
            out[m] = {"step_s_median": statistics.median(t["step_s"][m]),
                      "step_cpu_s_median": statistics.median(t["step_cpu_s"][m])}
    for other in ("GRPO(beta>0)", "GRPO(beta=0)"):
        if "RPG" in out and other in out:
            out[f"RPG/{other}"] = ratio_ci(t[key]["RPG"], t[key][other])
    for m in s.methods:  # the parts that differ between the trainers (absent in results of older versions)
        cycles = t.get("parts_s", {}).get(m)
        if cycles and m in out:
            out[m]["parts_ms_median"] = {p: 1e3 * statistics.median(c.get(p, 0.0) for c in cycles) for p in PARTS}
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    summ = result["summary"]
    cuda = s["device"] == "cuda"
    mem_label = "peak allocated (MiB)" if cuda else "peak RSS (MiB)"
    header = (["completion length", "trainer", "reference model",
               "forward passes per batch: no-grad policy + reference (+ training)", "median step, wall (s)"]
              + ([] if cuda else ["median step, CPU (s)"]) + ["step time relative to RPG", mem_label]
              + ([] if cuda else ["RSS above start (MiB)"]))
    rows = []
    for length, row in summ["by_length"].items():
        for m in s["methods"]:
            if m not in row:
                continue
            r = row[m]
            key = "step_s_median" if cuda else "step_cpu_s_median"
            rel = ratio(r[key], row["RPG"][key]) if "RPG" in row else None
            p = r.get("passes_per_batch") or {}
            passes = (f"{p.get('policy_no_grad', 0):g} + {p.get('reference', 0):g} (+ {p.get('policy_grad', 0):g})"
                      if p else "–")
            cells = [length, m, "yes" if r["reference_model"] else "no", passes, f"{r['step_s_median']:.3f}"]
            if not cuda:
                cells.append(f"{r['step_cpu_s_median']:.3f}")
            cells += [fmt_ratio(rel, 2), f"{r['mem_mib_median']:.0f}"]
            if not cuda:
                cells.append(f"{r['mem_above_start_mib']:.0f}")
            rows.append(cells)
    table1 = markdown_table(header, rows)
    kind = "wall" if cuda else "CPU"
    header2 = (["completion length", f"step {kind} time RPG/GRPO(β>0)", f"step {kind} time RPG/GRPO(β=0)"]
               + ([] if cuda else ["step wall time RPG/GRPO(β>0)", "step wall time RPG/GRPO(β=0)"])
               + ["memory RPG/GRPO(β>0)", "memory RPG/GRPO(β=0)"]
               + ([] if cuda else ["RSS above start RPG/GRPO(β>0)"]))
    rows2 = []
    for length, row in summ["by_length"].items():
        a, b = row.get("RPG/GRPO(beta>0)"), row.get("RPG/GRPO(beta=0)")
        if not a or not b:
            continue
        if cuda:
            cells = [length, fmt_ratio(a["step_time"]), fmt_ratio(b["step_time"])]
        else:
            cells = [length, fmt_ratio(a["step_cpu_time"]), fmt_ratio(b["step_cpu_time"]), fmt_ratio(a["step_time"]),
                     fmt_ratio(b["step_time"])]
        cells += [fmt_ratio(a["memory"]), fmt_ratio(b["memory"])]
        if not cuda:
            cells.append(fmt_ratio(a["memory_above_start"]))
        rows2.append(cells)
    threads = "" if cuda else f" with {s['threads']} torch thread(s)"
    head = (f"Model: random-init Qwen2, {result['n_params'] / 1e6:.1f}M parameters (hidden {s['hidden_size']}, "
            f"{s['num_layers']} layers, intermediate {s['intermediate_size']}), {'bf16' if cuda else 'fp32'} on "
            f"{s['device']}{threads}; "
            f"{s['per_device_train_batch_size']} completions per optimizer step, "
            f"{s['num_generations']} per prompt, each generation batch reused for {s['reuse']} steps; "
            f"gradient checkpointing {'on' if s.get('gradient_checkpointing', True) else 'off'}; "
            f"beta = {s['beta']}; {s['repetitions']} interleaved repetitions, median of "
            f"{s['measured_cycles']} measured cycles each.\n\n")
    note = ""
    if any(UNDEFINED in str(c) for row in rows + rows2 for c in row):
        note = (f"\n\n{UNDEFINED}: the denominator measured 0 (e.g. a run whose peak RSS did not rise above its "
                "RSS at the start, as when runs share one process), so the ratio has no value.")
    return (head + table1 + "\n\nRatios (< 1: RPG is cheaper):\n\n" + markdown_table(header2, rows2) + note
            + training_side_markdown(result))


def _ci_cell(r: dict | None) -> str:
    if not r:
        return UNDEFINED
    return f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def target_verdict(r: dict | None, tolerance: float = 0.02) -> str:
    """Whether a ratio's 95% interval shows RPG within ``tolerance`` of the other trainer's time (or faster)."""
    if not r:
        return "not measured"
    if r["high"] <= 1.0 + tolerance:
        return "met"
    if r["low"] > 1.0 + tolerance:
        return "missed"
    return "not resolved (the interval straddles the bound)"


def training_side_markdown(result: dict) -> str:
    """The training-side table (fixed generated batch, interleaved rounds) with the whole-step ratios beside it."""
    s = result["settings"]
    rows, verdicts = [], []
    for length, row in result["summary"]["by_length"].items():
        t = row.get("training_side")
        if not t:
            continue
        kind = t["time"]
        key = "step_s_median" if kind == "wall" else "step_cpu_s_median"
        whole = "step_time" if kind == "wall" else "step_cpu_time"
        cells = [length] + [fmt(t[m][key], 4) if m in t else "–" for m in METHODS]
        a, b = t.get("RPG/GRPO(beta>0)"), t.get("RPG/GRPO(beta=0)")
        wa, wb = row.get("RPG/GRPO(beta>0)") or {}, row.get("RPG/GRPO(beta=0)") or {}
        cells += [_ci_cell(a), _ci_cell(b), fmt_ratio(wa.get(whole)), fmt_ratio(wb.get(whole)),
                  fmt_ratio(wb.get("memory"))]
        rows.append(cells)
        verdicts.append(f"{length}: {target_verdict(b)}")
    if not rows:
        return ""
    kind = next(r["training_side"]["time"] for r in result["summary"]["by_length"].values() if "training_side" in r)
    n = next(r["training_side"]["rounds"] for r in result["summary"]["by_length"].values() if "training_side" in r)
    header = (["completion length"] + [f"{m} train step, {kind} (s)" for m in METHODS]
              + ["train step RPG/GRPO(β>0) [95% CI]", "train step RPG/GRPO(β=0) [95% CI]",
                 "whole step RPG/GRPO(β>0)", "whole step RPG/GRPO(β=0)", "peak memory RPG/GRPO(β=0)"])
    return (parts_markdown(result) + "\n\nTraining side on its own: the same fixed generated batch "
            f"({s['per_device_train_batch_size']} "
            f"completions per optimizer step, {s['reuse']} steps per batch) fed to each trainer (log-prob passes, "
            f"scoring, loss, backward, clipping and guard, optimizer step; no generation), {n} interleaved rounds in "
            f"one process, median {kind} time per optimizer step; ratios are geometric means of the per-round "
            "ratios with 95% t-intervals; whole-step ratios (medians, with generation) from the table above:\n\n"
            + markdown_table(header, rows)
            + "\n\nTarget RPG within 2% of GRPO(β=0) (upper end of the training-side interval ≤ 1.02): "
            + "; ".join(verdicts) + ".")


def parts_markdown(result: dict) -> str:
    """What differs inside a training step: the loss computation without the model pass, and the gradient-norm
    hook with RPG's guard, per optimizer step (medians over the rounds), against GRPO(beta=0)'s whole training step."""
    rows = []
    for length, row in result["summary"]["by_length"].items():
        t = row.get("training_side") or {}
        if not all(m in t and "parts_ms_median" in t[m] for m in ("RPG", "GRPO(beta=0)")):
            continue
        rpg, grpo = t["RPG"]["parts_ms_median"], t["GRPO(beta=0)"]["parts_ms_median"]
        step_ms = 1e3 * t["GRPO(beta=0)"]["step_s_median"]
        cells = [length]
        for part in PARTS:
            diff = rpg[part] - grpo[part]
            cells += [f"{rpg[part]:.2f}", f"{grpo[part]:.2f}", f"{diff:+.2f} ({100 * diff / step_ms:+.2f}%)"]
        rows.append(cells)
    if not rows:
        return ""
    header = ["completion length"]
    for part, label in zip(PARTS, ("loss without the model pass", "gradient norm + guard")):
        header += [f"{label}: RPG (ms)", f"{label}: GRPO(β=0) (ms)", "RPG − GRPO(β=0) (share of GRPO(β=0)'s step)"]
    return ("\n\nThe parts of a training step that differ between the trainers, timed in the same rounds (wall "
            "time per optimizer step, median over the rounds): the loss computation without the model's log-prob "
            "pass (objective, masks, aggregation, metrics) and the gradient-norm hook (the norm clipping computes, "
            "plus RPG's guard):\n\n" + markdown_table(header, rows))


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    s = result["settings"]
    summ = result["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    lengths = [int(x) for x in summ["by_length"]]
    for m in s["methods"]:
        key = "step_s_median" if s["device"] == "cuda" else "step_cpu_s_median"
        ys = [summ["by_length"][str(L)][m][key] for L in lengths]
        ms = [summ["by_length"][str(L)][m]["mem_mib_median"] for L in lengths]
        axes[0].plot(lengths, ys, marker="o", label=m)
        axes[1].plot(lengths, ms, marker="o", label=m)
    axes[0].set(xlabel="completion length (tokens)",
                ylabel="median time per optimizer step (s)" + ("" if s["device"] == "cuda" else ", CPU time"),
                title="Step time")
    axes[1].set(xlabel="completion length (tokens)",
                ylabel="peak allocated (MiB)" if s["device"] == "cuda" else "peak RSS (MiB)", title="Peak memory")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_parser(name: str = "cost", description: str | None = __doc__) -> argparse.ArgumentParser:
    """The command line of a cost benchmark: `python -m benchmarks.<name>` (this module's, and
    benchmarks/cost_vllm.py's with `name="cost_vllm"`); `--child SPEC` (hidden) is the entry of a spawned run."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False, prog=f"python -m benchmarks.{name}")
    p.add_argument("--quick", action="store_true", help="small model, short completions, 2 repetitions")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--lengths", type=int, nargs="+", help="override the completion lengths")
    p.add_argument("--repetitions", type=int, help="override the number of interleaved repetitions")
    p.add_argument("--threads", type=int, help="torch threads per run on CPU (default 1)")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the training-side timing (0: skip it)")
    if name == "cost":  # the threaded training side's allocator (`PINNED_MALLOC`)
        p.add_argument("--default-malloc", action="store_true",
                       help="the training side with glibc's allocator defaults instead of PINNED_MALLOC")
    p.add_argument("--output", help=f"JSON path (default benchmarks/results/{name}_<device>.json; --quick: "
                                     f"outputs/benchmarks/{name}_<device>_quick.json)")
    p.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = make_parser()
    if "--vllm" in argv:  # vLLM generation is its own command: this module does not import it
        p.error(moved_flag("--vllm", "benchmarks.cost_vllm"))
    a = p.parse_args(argv)
    if a.child:
        with open(a.child) as f:
            spec = json.load(f)
        settings = _from_jsonable(spec["settings"])
        if spec["method"] is None:
            r = run_training_side(settings, spec["length"], spec["output_dir"])
        else:
            r = run_one(settings, spec["method"], spec["length"], spec["output_dir"])
        with open(spec["out"], "w") as f:
            json.dump(r, f)
        return r
    if a.device == "cuda":
        s = dataclasses.replace(CUDA_QUICK if a.quick else CUDA)
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
    if a.lengths:
        s.lengths = tuple(a.lengths)
    if a.repetitions:
        s.repetitions = a.repetitions
    if a.threads:
        s.threads = a.threads
    if a.rounds is not None:
        s.train_rounds = a.rounds
    if a.default_malloc:
        s.pinned_malloc = False
    json_path = a.output or default_results_path(f"cost_{a.device}", a.quick)
    result = run(s)
    png = plot(result, os.path.splitext(json_path)[0] + ".png")
    result["loadavg_end"] = loadavg()
    write_json(json_path, result)
    m = result["machine"]
    print()
    print(f"## Cost benchmark ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})")
    print(f"command: `{m['command']}`; {m.get('nproc')} cores ({m.get('cpu', '?')}"
          f"{', ' + m['gpu'] if m.get('gpu') else ''}), wall {result['wall_s']:.0f}s, load average at start "
          f"{m.get('loadavg_start')}, at end {result['loadavg_end']}")
    print()
    print(markdown(result))
    print(f"\nJSON: {json_path}\nplot: {png}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
