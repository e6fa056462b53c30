"""Cost benchmark, vLLM generation: the training side per generation batch of RPG with the engine's own sampler
log-probs (``rpg_sampler_logps="engine"``) against RPG recomputing them and TRL's ``GRPOTrainer`` (beta = 0 and
beta > 0), interleaved.

    python -m benchmarks.cost --vllm                  # CPU, through the fake engine of tests/vllm_stub
    python -m benchmarks.cost --vllm --quick          # CPU, small model, short completions
    python -m benchmarks.cost --vllm --device cuda    # GPU: real vLLM (colocate), bf16, Qwen2-0.5B-shaped model

Four trainers, the same model, data and batch layout (each generation batch reused for ``reuse`` = 4 optimizer
steps), vLLM colocate generation forced to the full completion length (``ignore_eos``), TRL's importance-sampling
correction on (its default):

* ``RPG(engine)``: mu is the engine's log-probs: no no-grad pass over the generation batch, no correction.
* ``RPG(recompute)``: the trainer recomputes pi_old (TRL's pass) and applies TRL's correction pi_old / mu.
* ``GRPO(beta=0)``: TRL's ``GRPOTrainer`` with vLLM: the same pass and correction.
* ``GRPO(beta>0)``: the same plus a reference model and its forward pass.

Each (repetition, trainer) is a fresh subprocess (one colocated engine per process, as vLLM wants it); the order
rotates with the repetition (A B C D, B C D A, ...). A run trains ``warmup_cycles + measured_cycles`` generation
cycles; a cycle's training side is its time minus the time inside the engine (``VLLMGeneration.generate`` and
``sync_weights``: the fake engine's sampling on CPU, vLLM's on GPU), divided by ``reuse``: scoring, the no-grad
passes, and per optimizer step the pass with gradient, loss, backward, clipping and the optimizer step. Each run
gives the median over its measured cycles (CPU time on CPU, wall time on GPU); the ratios are geometric means of the
per-repetition ratios (paired: the four runs of a repetition follow each other) with 95% t-intervals.
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

FULL = dataclasses.replace(cost.FULL, lengths=(64,), repetitions=4, reuse=4, methods=METHODS, warmup_cycles=1,
                           measured_cycles=2)
QUICK = dataclasses.replace(cost.QUICK, lengths=(32,), repetitions=3, reuse=4, methods=METHODS, warmup_cycles=1,
                            measured_cycles=2)
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


def _spawn(s, method: str, length: int) -> dict:
    """:func:`run_one` in a fresh process (on CPU with the fake engine first on its path)."""
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
        proc = subprocess.run([sys.executable, "-m", "benchmarks.cost_vllm", spec], env=env, cwd=ROOT,
                              check=False, capture_output=True, text=True, timeout=s.timeout_s)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{method} L={length} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def run(s, log=print, spawn=True) -> dict:
    info = machine_info()
    t0 = time.perf_counter()
    path, n_params = cost.build_model(s)
    log(f"model: {n_params / 1e6:.1f}M parameters ({path})")
    runs = []
    for rep in range(s.repetitions):
        order = list(s.methods[rep % len(s.methods):]) + list(s.methods[:rep % len(s.methods)])
        for length in s.lengths:
            for method in order:
                if spawn:
                    r = _spawn(s, method, length)
                else:
                    with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-vllm-") as tmp:
                        r = run_one(s, method, length, tmp)
                r.update(repetition=rep, loadavg=loadavg())
                runs.append(r)
                log(f"  rep {rep} L={length:4d} {method:15s} training side {r['train_s']:.3f}s wall, "
                    f"{r['train_cpu_s']:.3f}s CPU per step ({time.perf_counter() - t0:.0f}s elapsed)")
    return {"settings": cost._to_jsonable(s), "n_params": n_params, "machine": info,
            "wall_s": round(time.perf_counter() - t0, 1), "summary": summarize(s, runs), "runs": runs}


def summarize(s, runs: list[dict]) -> dict:
    """Per length: each trainer's median training side per optimizer step, its passes, and the `RATIOS` with 95%
    intervals, paired by repetition (CPU time on CPU, wall time on GPU)."""
    key = "train_s" if s.device == "cuda" else "train_cpu_s"
    out: dict = {"time": "wall" if s.device == "cuda" else "CPU", "by_length": {}}
    for length in s.lengths:
        mine = [r for r in runs if r["length"] == length]
        row: dict = {}
        for m in s.methods:
            rs = sorted((r for r in mine if r["method"] == m), key=lambda r: r["repetition"])
            if rs:
                row[m] = {"train_s_median": statistics.median(r[key] for r in rs), "train_s_all": [r[key] for r in rs],
                          "passes_per_batch": rs[0]["passes_per_batch"]}
        for a, b in RATIOS:
            if a in row and b in row:
                row[f"{a}/{b}"] = cost.ratio_ci(row[a]["train_s_all"], row[b]["train_s_all"])
        out["by_length"][str(length)] = row
    return out


def markdown(result: dict) -> str:
    s, summary = result["settings"], result["summary"]
    kind = summary["time"]
    rows, ratio_rows = [], []
    for length, row in summary["by_length"].items():
        for m in s["methods"]:
            if m in row:
                p = row[m]["passes_per_batch"]
                rows.append([length, m, f"{p['policy_no_grad']:g} + {p['reference']:g} (+ {p['policy_grad']:g})",
                             fmt(row[m]["train_s_median"], 4)])
        ratio_rows.append([length] + [cost._ci_cell(row.get(f"{a}/{b}")) for a, b in RATIOS])
    cuda = s["device"] == "cuda"
    head = (f"Model: random-init Qwen2, {result['n_params'] / 1e6:.1f}M parameters (hidden {s['hidden_size']}, "
            f"{s['num_layers']} layers), {'bf16' if cuda else 'fp32'} on {s['device']}; vLLM colocate "
            f"({'real vLLM' if cuda else 'the fake engine of tests/vllm_stub'}), TRL's correction on; "
            f"{s['per_device_train_batch_size']} completions per optimizer step, each generation batch reused for "
            f"{s['reuse']} steps; gradient checkpointing {'on' if s['gradient_checkpointing'] else 'off'}; "
            f"beta = {s['beta']}; {s['repetitions']} interleaved repetitions (one process per run), median of "
            f"{s['measured_cycles']} measured cycles each. Training side = cycle time minus the engine's "
            f"(generation and weight sync), per optimizer step.\n\n")
    table = markdown_table(["completion length", "trainer", "log-prob passes per batch: no-grad policy + reference "
                            "(+ training)", f"training side per step, {kind} (s)"], rows)
    ratios = markdown_table(["completion length"] + [f"{a} / {b} [95% CI]" for a, b in RATIOS], ratio_rows)
    return head + table + "\n\nRatios (< 1: the first is cheaper), paired by repetition:\n\n" + ratios


def main(a) -> dict:
    """`python -m benchmarks.cost --vllm ...` (the parsed arguments of `benchmarks.cost`)."""
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


def _child(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    r = run_one(cost._from_jsonable(spec["settings"]), spec["method"], spec["length"], spec["output_dir"])
    with open(spec["out"], "w") as f:
        json.dump(r, f)


if __name__ == "__main__":
    _child(sys.argv[1])
