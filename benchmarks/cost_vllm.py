"""Cost benchmark, vLLM generation: the training side per generation batch of RPG with the engine's own sampler
log-probs (``rpg_sampler_logps="engine"``) against RPG recomputing them and TRL's ``GRPOTrainer`` (beta = 0 and
beta > 0), interleaved.

    python -m benchmarks.cost_vllm                    # CPU, through the fake engine of tests/vllm_stub
    python -m benchmarks.cost_vllm --quick            # CPU, small model, short completions
    python -m benchmarks.cost_vllm --device cuda      # GPU: real vLLM (colocate), bf16, Qwen2-0.5B-shaped model

Options as `benchmarks.cost`'s (`cost.make_parser`): --lengths, --repetitions, --threads, --rounds, --output.

Four trainers, the same model, data and batch layout (each generation batch reused for ``reuse`` = 4 optimizer
steps), vLLM colocate generation forced to the full completion length (``ignore_eos``), TRL's importance-sampling
correction on (its default):

* ``RPG(engine)``: mu is the engine's log-probs: no no-grad pass over the generation batch, no correction.
* ``RPG(recompute)``: the trainer recomputes pi_old (TRL's pass) and applies TRL's correction pi_old / mu.
* ``GRPO(beta=0)``: TRL's ``GRPOTrainer`` with vLLM: the same pass and correction.
* ``GRPO(beta>0)``: the same plus a reference model and its forward pass.

What is timed is the training side of a generation cycle, per optimizer step: scoring, the no-grad passes, and per
optimizer step the pass with gradient, loss, backward, clipping and the optimizer step; never the engine's work.

* CPU (:func:`run_replayed`): one process builds the four trainers on the fake engine and replaces the engine's
  ``generate`` by a replay of one fixed batch (the same completion ids for all four, exactly the completion length,
  with fixed log-probs) and its weight sync by nothing; the trainers run their cycles in turn from four threads
  that pass a baton (``warmup_cycles`` rounds, then ``train_rounds`` measured rounds, the order rotating every
  round), CPU time per cycle. The ratios are geometric means of the per-round ratios with 95% t-intervals.
* GPU (:func:`run_one`, one process per run: one colocated vLLM engine per process, as vLLM wants it): each
  (repetition, trainer) trains ``warmup_cycles + measured_cycles`` cycles with real vLLM, and a cycle's training
  side is its wall time minus the time inside ``VLLMGeneration.generate`` and ``sync_weights``; the order rotates
  with the repetition (A B C D, B C D A, ...), and the ratios are geometric means of the per-repetition ratios.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from . import cost
from ._common import default_results_path, fmt, loadavg, machine_info, markdown_table, write_json

METHODS = ("RPG(engine)", "RPG(recompute)", "GRPO(beta=0)", "GRPO(beta>0)")
#: (numerator, denominator) of the reported ratios.
RATIOS = (("RPG(engine)", "GRPO(beta=0)"), ("RPG(engine)", "GRPO(beta>0)"), ("RPG(engine)", "RPG(recompute)"),
          ("RPG(recompute)", "GRPO(beta=0)"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "tests", "vllm_stub")

FULL = dataclasses.replace(cost.FULL, lengths=(64, 128), reuse=4, methods=METHODS, warmup_cycles=1,
                           train_rounds=20)
QUICK = dataclasses.replace(cost.QUICK, lengths=(32,), reuse=4, methods=METHODS, warmup_cycles=1, train_rounds=6)
CUDA = dataclasses.replace(cost.CUDA, lengths=(512, 1024), repetitions=4, reuse=4, methods=METHODS,
                           per_device_train_batch_size=16, num_generations=8, measured_cycles=3)
CUDA_QUICK = dataclasses.replace(CUDA, lengths=(256,), repetitions=2, measured_cycles=2)
#: vLLM's share of the GPU's memory in colocate mode (the trainer needs the rest).
GPU_MEMORY_UTILIZATION = 0.3


def make_trainer(s, method: str, length: int, out_dir: str, max_steps: int, callbacks=()):
    """The trainer of ``method``: vLLM colocate, the same model, data, batch layout and clip for all four."""
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer
    from trl_rpg.toy import task as toy

    cuda = s.device == "cuda"
    path = cost.model_dir(s)
    dataset = toy.make_dataset(max_steps * s.per_device_train_batch_size // s.num_generations + 8, seed=0,
                               split="train")
    common = {
        "output_dir": out_dir, "seed": 0, "max_steps": max_steps,
        "per_device_train_batch_size": s.per_device_train_batch_size, "num_generations": s.num_generations,
        "gradient_accumulation_steps": 1, "steps_per_generation": s.reuse, "max_completion_length": length,
        "temperature": 1.0, "learning_rate": 1e-5, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28,
        "scale_rewards": "none", "report_to": "none", "save_strategy": "no", "logging_steps": 1, "disable_tqdm": True,
        "dataloader_num_workers": 0, "log_level": "error", "use_cpu": not cuda, "bf16": cuda,
        "gradient_checkpointing": s.gradient_checkpointing, "model_init_kwargs": {"dtype": "bfloat16" if cuda else
                                                                                   "float32"},
        "use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True,
        "generation_kwargs": {"ignore_eos": True},  # every completion exactly `length` tokens
    }
    if cuda:
        common.update(vllm_gpu_memory_utilization=GPU_MEMORY_UTILIZATION, vllm_max_model_length=length + 128)
    if method.startswith("RPG"):
        mode = "engine" if method == "RPG(engine)" else "recompute"
        config, cls = RPGConfig(beta=s.beta, rpg_reference="sampling", rpg_divergence="urkl",
                                rpg_estimator="reinforce", rpg_sampler_logps=mode, **common), RPGTrainer
    elif method in ("GRPO(beta=0)", "GRPO(beta>0)"):
        config, cls = GRPOConfig(beta=0.0 if method == "GRPO(beta=0)" else s.beta, **common), GRPOTrainer
    else:
        raise ValueError(f"method: {method!r} is not one of {list(METHODS)}")
    trainer = cls(model=path, reward_funcs=cost.pseudo_reward, args=config, train_dataset=dataset,
                  processing_class=AutoTokenizer.from_pretrained(path), callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)
    return trainer


def run_one(s, method: str, length: int, out_dir: str) -> dict:
    """Train ``method`` for a few generation cycles; the training side of each (the engine's time taken out)."""
    cost._setup_process(s)
    import torch
    from transformers import TrainerCallback

    cuda = s.device == "cuda"
    cycles: list[tuple[float, float]] = []  # (wall, CPU) of each cycle's training side, per optimizer step
    engine = [0.0, 0.0]  # wall and CPU time spent inside the engine so far

    def clock():
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    class Cycles(TrainerCallback):
        start = None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:  # the step that generates
                self.start = (clock(), tuple(engine))

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:
                (wall0, cpu0), (engine_wall0, engine_cpu0) = self.start
                wall, cpu = clock()
                cycles.append(((wall - wall0 - (engine[0] - engine_wall0)) / s.reuse,
                               (cpu - cpu0 - (engine[1] - engine_cpu0)) / s.reuse))

    trainer = make_trainer(s, method, length, out_dir, (s.warmup_cycles + s.measured_cycles) * s.reuse,
                           callbacks=[Cycles()])
    generation = trainer.vllm_generation
    for name in ("generate", "sync_weights"):  # the engine's work, taken out of the cycle
        original = getattr(generation, name)

        def timed(*args, _original=original, **kwargs):
            t0 = clock()
            try:
                return _original(*args, **kwargs)
            finally:
                t1 = clock()
                engine[0] += t1[0] - t0[0]
                engine[1] += t1[1] - t0[1]

        setattr(generation, name, timed)
    rows = {"policy_no_grad": 0, "reference": 0, "policy_grad": 0}  # sequences per log-prob pass, by kind
    logps = trainer._get_per_token_logps_and_entropies

    def counted(model, input_ids, *args, **kwargs):
        kind = ("reference" if trainer.ref_model is not None and model is trainer.ref_model
                else "policy_grad" if torch.is_grad_enabled() else "policy_no_grad")
        rows[kind] += int(input_ids.size(0))
        return logps(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    measured = cycles[s.warmup_cycles:]
    batch = s.per_device_train_batch_size * s.reuse * len(cycles)
    return {"method": method, "length": length, "train_s": statistics.median(c[0] for c in measured),
            "train_cpu_s": statistics.median(c[1] for c in measured), "cycles": measured,
            "engine_s": engine[0], "passes_per_batch": {k: v / batch for k, v in rows.items()},
            "sampler_logps": getattr(getattr(trainer, "sampler_logps", None), "mode", None)}


def run_replayed(s, length: int, out_dir: str) -> dict:
    """The four trainers in this process on one replayed batch, their cycles interleaved (CPU; see the module)."""
    import threading

    cost._setup_process(s)
    from transformers import TrainerCallback

    rounds = s.warmup_cycles + s.train_rounds
    methods = list(s.methods)
    baton = cost._Baton([m for r in range(rounds) for m in methods[r % 4:] + methods[:r % 4]], s.timeout_s)
    n_batch = s.per_device_train_batch_size * s.reuse
    fixed = cost.fixed_completions(s, length, n_batch)
    cycles: dict[str, list[float]] = {m: [] for m in methods}
    rows = {m: {"policy_no_grad": 0, "reference": 0, "policy_grad": 0} for m in methods}

    class Turns(TrainerCallback):
        def __init__(self, name):
            self.name, self.t0 = name, 0.0

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:  # the step that generates: wait for this trainer's turn
                baton.wait_for(self.name)
                self.t0 = time.process_time()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % s.reuse == 0:
                cycles[self.name].append((time.process_time() - self.t0) / s.reuse)
                baton.done(self.name)

    def replay(prompts, *args, **kwargs):  # the engine's output: the fixed completions, log-prob -1 per token
        completions = [list(fixed[i % n_batch]) for i in range(len(prompts))]
        return prompts, completions, [[[-1.0] for _ in ids] for ids in completions], None

    trainers = {}
    for m in methods:
        import torch

        trainer = make_trainer(s, m, length, os.path.join(out_dir, m), rounds * s.reuse, callbacks=[Turns(m)])
        trainer.vllm_generation.generate, trainer.vllm_generation.sync_weights = replay, lambda: None
        logps = trainer._get_per_token_logps_and_entropies

        def counted(model, input_ids, *args, _m=m, _t=trainer, _logps=logps, **kwargs):
            kind = ("reference" if _t.ref_model is not None and model is _t.ref_model
                    else "policy_grad" if torch.is_grad_enabled() else "policy_no_grad")
            rows[_m][kind] += int(input_ids.size(0))
            return _logps(model, input_ids, *args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted
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
        raise RuntimeError(f"replayed training side at length {length} failed") from baton.failed
    return {"length": length, "rounds": s.train_rounds, "train_cpu_s": {m: c[s.warmup_cycles:] for m, c in
                                                                        cycles.items()},
            "passes_per_batch": {m: {k: v / (n_batch * rounds) for k, v in r.items()} for m, r in rows.items()}}


def _spawn(s, method: str | None, length: int) -> dict:
    """:func:`run_one` (``method``) or, with ``method=None``, :func:`run_replayed` in a fresh process (on CPU with
    the fake engine first on its path)."""
    with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-vllm-") as tmp:
        spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        with open(spec, "w") as f:
            json.dump({"settings": cost._to_jsonable(s), "method": method, "length": length, "out": out,
                       "output_dir": os.path.join(tmp, "run")}, f)
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        paths = [ROOT] + ([STUB] if s.device == "cpu" else []) + [p for p in [env.get("PYTHONPATH")] if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        if s.device == "cpu":
            env.update(OMP_NUM_THREADS=str(s.threads), CUDA_VISIBLE_DEVICES="")
        timeout = s.timeout_s * (1 if method else len(s.methods) * max(1.0, (s.warmup_cycles + s.train_rounds) / 20))
        proc = subprocess.run([sys.executable, "-m", "benchmarks.cost_vllm", "--child", spec], env=env, cwd=ROOT,
                              check=False, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            what = method or "replayed training side"
            raise RuntimeError(f"{what} L={length} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def run(s, log=print, spawn=True) -> dict:
    """CPU: :func:`run_replayed` per length; GPU: :func:`run_one` per repetition, length and trainer, interleaved.
    Returns the runs and their `summarize`."""
    info = machine_info()
    t0 = time.perf_counter()
    path, n_params = cost.build_model(s)
    log(f"model: {n_params / 1e6:.1f}M parameters ({path})")
    runs = []
    if s.device == "cpu":
        for length in s.lengths:
            if spawn:
                r = _spawn(s, None, length)
            else:
                with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-vllm-") as tmp:
                    r = run_replayed(s, length, tmp)
            r["loadavg"] = loadavg()
            runs.append(r)
            log(f"  L={length:4d}: median training side per step, CPU: " + ", ".join(
                f"{m} {statistics.median(r['train_cpu_s'][m]):.3f}s" for m in s.methods)
                + f" ({s.train_rounds} rounds, {time.perf_counter() - t0:.0f}s elapsed)")
    else:
        for rep in range(s.repetitions):
            order = list(s.methods[rep % len(s.methods):]) + list(s.methods[:rep % len(s.methods)])
            for length in s.lengths:
                for method in order:
                    r = _spawn(s, method, length)
                    r.update(repetition=rep, loadavg=loadavg())
                    runs.append(r)
                    log(f"  rep {rep} L={length:4d} {method:15s} training side {r['train_s']:.3f}s wall per step "
                        f"({time.perf_counter() - t0:.0f}s elapsed)")
    return {"settings": cost._to_jsonable(s), "n_params": n_params, "machine": info,
            "wall_s": round(time.perf_counter() - t0, 1), "summary": summarize(s, runs), "runs": runs}


def paired_times(s, runs: list[dict], length: int) -> tuple[dict, dict, str]:
    """Each trainer's training side per step at `length`, paired across trainers (by round on CPU, by repetition on
    GPU), its log-prob passes per batch, and what pairs them."""
    if s.device == "cpu":
        (r,) = [r for r in runs if r["length"] == length]
        return r["train_cpu_s"], r["passes_per_batch"], "round"
    times, passes = {}, {}
    for m in s.methods:
        rs = sorted((r for r in runs if r["length"] == length and r["method"] == m), key=lambda r: r["repetition"])
        if rs:
            times[m], passes[m] = [r["train_s"] for r in rs], rs[0]["passes_per_batch"]
    return times, passes, "repetition"


def summarize(s, runs: list[dict]) -> dict:
    """Per length: each trainer's median training side per optimizer step, its passes, and the `RATIOS` with 95%
    intervals (CPU time on CPU, wall time on GPU)."""
    out: dict = {"time": "wall" if s.device == "cuda" else "CPU", "by_length": {}}
    for length in s.lengths:
        times, passes, unit = paired_times(s, runs, length)
        row: dict = {"paired_by": unit}
        for m in s.methods:
            if times.get(m):
                row[m] = {"train_s_median": statistics.median(times[m]), "train_s_all": times[m],
                          "passes_per_batch": passes[m]}
        for a, b in RATIOS:
            if a in row and b in row:
                row[f"{a}/{b}"] = cost.ratio_ci(row[a]["train_s_all"], row[b]["train_s_all"])
        out["by_length"][str(length)] = row
    return out


def markdown(result: dict) -> str:
    s, summary = result["settings"], result["summary"]
    kind = summary["time"]
    rows, ratio_rows, unit = [], [], "round"
    for length, row in summary["by_length"].items():
        unit = row.get("paired_by", unit)
        for m in s["methods"]:
            if m in row:
                p = row[m]["passes_per_batch"]
                rows.append([length, m, f"{p['policy_no_grad']:g} + {p['reference']:g} (+ {p['policy_grad']:g})",
                             fmt(row[m]["train_s_median"], 4)])
        ratio_rows.append([length] + [cost._ci_cell(row.get(f"{a}/{b}")) for a, b in RATIOS])
    cuda = s["device"] == "cuda"
    how = (f"{s['repetitions']} interleaved repetitions (one process per run), median of {s['measured_cycles']} "
           "measured cycles each; training side = cycle wall time minus the engine's (generation and weight sync)"
           if cuda else f"the engine's output replayed (one fixed batch, generation and sync replaced), "
           f"{s['train_rounds']} interleaved rounds in one process, CPU time per cycle")
    head = (f"Model: random-init Qwen2, {result['n_params'] / 1e6:.1f}M parameters (hidden {s['hidden_size']}, "
            f"{s['num_layers']} layers), {'bf16' if cuda else 'fp32'} on {s['device']}; vLLM colocate "
            f"({'real vLLM' if cuda else 'the fake engine of tests/vllm_stub'}), TRL's correction on; "
            f"{s['per_device_train_batch_size']} completions per optimizer step, each generation batch reused for "
            f"{s['reuse']} steps; gradient checkpointing {'on' if s['gradient_checkpointing'] else 'off'}; "
            f"beta = {s['beta']}; {how}; per optimizer step.\n\n")
    table = markdown_table(["completion length", "trainer", "log-prob passes per batch: no-grad policy + reference "
                            "(+ training)", f"training side per step, {kind} (s)"], rows)
    ratios = markdown_table(["completion length"] + [f"{a} / {b} [95% CI]" for a, b in RATIOS], ratio_rows)
    return head + table + f"\n\nRatios (< 1: the first is cheaper), paired by {unit}:\n\n" + ratios


def main(argv=None) -> dict:
    """`python -m benchmarks.cost_vllm ...`: `benchmarks.cost`'s options; `--child SPEC` (hidden) runs one spawned
    run (:func:`_spawn`)."""
    a = cost.make_parser("cost_vllm", __doc__).parse_args(argv)
    if a.child:
        return _child(a.child)
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
    json_path = a.output or default_results_path(f"cost_vllm_{a.device}", a.quick)
    result = run(s)
    result["loadavg_end"] = loadavg()
    write_json(json_path, result)
    m = result["machine"]
    print(f"\n## Cost benchmark, vLLM generation ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})")
    print(f"command: `{m['command']}`; {m.get('nproc')} cores ({m.get('cpu', '?')}"
          f"{', ' + m['gpu'] if m.get('gpu') else ''}), wall {result['wall_s']:.0f}s, load average at start "
          f"{m.get('loadavg_start')}, at end {result['loadavg_end']}\n")
    print(markdown(result))
    print(f"\nJSON: {json_path}")
    return result


def _child(spec_path: str) -> dict:
    """The run that :func:`_spawn` describes in the JSON file `spec_path`; its result goes to the spec's `out`."""
    with open(spec_path) as f:
        spec = json.load(f)
    s = cost._from_jsonable(spec["settings"])
    r = (run_replayed(s, spec["length"], spec["output_dir"]) if spec["method"] is None else
         run_one(s, spec["method"], spec["length"], spec["output_dir"]))
    with open(spec["out"], "w") as f:
        json.dump(r, f)
    return r


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
