"""Cost benchmark: step time and peak memory of RPG, GRPO (beta > 0) and GRPO (beta = 0), interleaved.

    python -m benchmarks.cost                    # CPU: ~24M-parameter random-init Qwen2, completions 64/128/256
    python -m benchmarks.cost --quick            # CPU, small model, short completions (about 2 min)
    python -m benchmarks.cost --device cuda      # GPU: bf16, Qwen2-0.5B-shaped random-init model

One invocation runs, for each repetition and each completion length, the three trainers one after the other
(A B C, B C A, C A B, ...: the order rotates with the repetition), each in a fresh subprocess so that its peak memory is its own:

* ``RPG``: ``RPGTrainer``, beta > 0, reference = the sampling policy (``rpg_reference="sampling"``, the default).
* ``GRPO(beta>0)``: TRL's ``GRPOTrainer`` with the same beta (loads a reference model, one extra forward pass per
  generation batch).
* ``GRPO(beta=0)``: TRL's ``GRPOTrainer`` without KL.

All three use the same model, data, batch layout (each generation batch reused for ``reuse`` optimizer steps),
clip (0.2 / 0.28) and token-mean aggregation, so the only difference is how the KL term is paid for. Generation is
forced to the full completion length (``min_new_tokens``), and the reward is a fixed pseudo-random function of the
completion text (the reward does not change the compute). The step time is the time of one generation cycle
(generation + scoring + ``reuse`` optimizer steps) divided by ``reuse``, median over the measured cycles (the first
``warmup_cycles`` are dropped); on CPU both the wall time and the process CPU time are reported, and the ratios use
the CPU time, which other jobs on a shared machine disturb much less than the wall time. Peak memory is the process's peak RSS on CPU (``getrusage``), and
``torch.cuda.max_memory_allocated`` on GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from ._common import CACHE_DIR, RESULTS_DIR, fmt, loadavg, machine_info, markdown_table, write_json

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
    cache_dir: str = os.path.join(CACHE_DIR, "cost")
    timeout_s: int = 600


FULL = Settings()
QUICK = Settings(hidden_size=256, num_layers=4, intermediate_size=1024, lengths=(32, 64), repetitions=2)
CUDA = Settings(device="cuda", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                lengths=(256, 512, 1024), repetitions=3, per_device_train_batch_size=16, num_generations=8,
                measured_cycles=3)
CUDA_QUICK = dataclasses.replace(CUDA, lengths=(128, 256), repetitions=1, measured_cycles=2)


# ----------------------------------------------------------------------------------------------------------------------
# Model and data
# ----------------------------------------------------------------------------------------------------------------------


def model_dir(s: Settings) -> str:
    dtype = "bf16" if s.device == "cuda" else "fp32"
    tag = f"h{s.hidden_size}-l{s.num_layers}-a{s.num_heads}-kv{s.num_kv_heads}-i{s.intermediate_size}-{dtype}"
    return os.path.join(s.cache_dir, tag)


def build_model(s: Settings) -> tuple[str, int]:
    """Save a random-init Qwen2 model (toy tokenizer) to the cache; return its path and parameter count."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trl_rpg import toy

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


# ----------------------------------------------------------------------------------------------------------------------
# One run (in a child process)
# ----------------------------------------------------------------------------------------------------------------------


def _rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_one(s: Settings, method: str, length: int, out_dir: str) -> dict:
    """Train a few cycles of ``method`` at completion length ``length``; return timings and peak memory."""
    import resource
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    if s.device == "cpu":
        torch.set_num_threads(s.threads)
    import transformers
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer, toy

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = model_dir(s)
    rss_start = _rss_kib()  # after imports, before any model is loaded
    cuda = s.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tokenizer = AutoTokenizer.from_pretrained(path)
    cycles = s.warmup_cycles + s.measured_cycles
    max_steps = cycles * s.reuse
    n_prompts = max_steps * s.per_device_train_batch_size // s.num_generations + 8
    dataset = toy.make_dataset(n_prompts, seed=0, split="train")
    common = dict(
        output_dir=out_dir, seed=0, max_steps=max_steps, per_device_train_batch_size=s.per_device_train_batch_size,
        num_generations=s.num_generations, gradient_accumulation_steps=1, steps_per_generation=s.reuse,
        max_completion_length=length, generation_kwargs={"min_new_tokens": length}, temperature=1.0,
        learning_rate=1e-5, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, scale_rewards="none",
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        log_level="error", use_cpu=not cuda, bf16=cuda, gradient_checkpointing=s.gradient_checkpointing,
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
    )
    if method == "RPG":
        config = RPGConfig(beta=s.beta, rpg_reference="sampling", rpg_divergence="urkl",
                           rpg_estimator="reinforce", **common)
        cls = RPGTrainer
    elif method == "GRPO(beta>0)":
        config, cls = GRPOConfig(beta=s.beta, **common), GRPOTrainer
    elif method == "GRPO(beta=0)":
        config, cls = GRPOConfig(beta=0.0, **common), GRPOTrainer
    else:
        raise ValueError(method)

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

    trainer = cls(model=path, reward_funcs=pseudo_reward, args=config, train_dataset=dataset,
                  processing_class=tokenizer, callbacks=[Timer()])
    has_ref = trainer.ref_model is not None
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout

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
        steps = [b[k] - a[k] for a, b in zip(marks[:-1], marks[1:])]
        cycles = [sum(steps[i:i + s.reuse]) for i in range(0, len(steps), s.reuse)]
        return [c / s.reuse for c in cycles[s.warmup_cycles:]], steps

    wall, steps = per_step(0)
    cpu, _ = per_step(1)
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = dict(
        method=method, length=length, step_s=statistics.median(wall), step_s_cycles=wall,
        step_cpu_s=statistics.median(cpu), step_cpu_s_cycles=cpu,
        all_steps_s=[round(x, 3) for x in steps], mean_completion_length=(statistics.fmean(lengths) if lengths
                                                                          else None),
        # forward passes over the generation batch, per generation cycle (1.0 = every completion once)
        passes_per_batch={k: v / (cycles * s.per_device_train_batch_size * s.reuse) for k, v in passes.items()},
        reference_model=has_ref, peak_rss_mib=peak_rss_kib / 1024, rss_start_mib=rss_start / 1024,
    )
    if cuda:
        result["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


# ----------------------------------------------------------------------------------------------------------------------
# Driver: interleaved runs, each in a subprocess
# ----------------------------------------------------------------------------------------------------------------------


def _spawn(s: Settings, method: str, length: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="trl-rpg-cost-") as tmp:
        spec = os.path.join(tmp, "spec.json")
        out = os.path.join(tmp, "result.json")
        with open(spec, "w") as f:
            json.dump(dict(settings=_to_jsonable(s), method=method, length=length, out=out,
                           output_dir=os.path.join(tmp, "run")), f)
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if s.device == "cpu":
            env["OMP_NUM_THREADS"] = str(s.threads)
            env["CUDA_VISIBLE_DEVICES"] = ""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.cost", "--child", spec], env=env, cwd=root,
                              capture_output=True, text=True, timeout=s.timeout_s)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{method} L={length} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out) as f:
            result = json.load(f)
        result["process_s"] = round(time.perf_counter() - t0, 1)
        return result


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
    summary = summarize(s, runs)
    return dict(settings=_to_jsonable(s), n_params=n_params, machine=info, wall_s=round(time.perf_counter() - t0, 1),
                summary=summary, runs=runs)


def summarize(s: Settings, runs: list[dict]) -> dict:
    mem_key = "peak_allocated_mib" if s.device == "cuda" else "peak_rss_mib"
    out: dict = {"memory": mem_key, "by_length": {}}
    for length in s.lengths:
        row = {}
        for m in s.methods:
            rs = [r for r in runs if r["method"] == m and r["length"] == length]
            if not rs:
                continue
            row[m] = dict(
                step_s_median=statistics.median(r["step_s"] for r in rs),
                step_s_all=[round(r["step_s"], 4) for r in rs],
                step_cpu_s_median=statistics.median(r["step_cpu_s"] for r in rs),
                mem_mib_median=statistics.median(r[mem_key] for r in rs),
                mem_above_start_mib=(statistics.median(r[mem_key] - r["rss_start_mib"] for r in rs)
                                     if mem_key == "peak_rss_mib" else None),
                reference_model=rs[0]["reference_model"],
                passes_per_batch=rs[0].get("passes_per_batch"),
                completion_length=statistics.fmean(r["mean_completion_length"] or 0 for r in rs),
            )
        for other in ("GRPO(beta>0)", "GRPO(beta=0)"):
            if "RPG" in row and other in row:
                row[f"RPG/{other}"] = dict(
                    step_time=row["RPG"]["step_s_median"] / row[other]["step_s_median"],
                    step_cpu_time=row["RPG"]["step_cpu_s_median"] / row[other]["step_cpu_s_median"],
                    memory=row["RPG"]["mem_mib_median"] / row[other]["mem_mib_median"],
                    memory_above_start=(row["RPG"]["mem_above_start_mib"] / row[other]["mem_above_start_mib"]
                                        if row["RPG"]["mem_above_start_mib"] else None),
                )
        out["by_length"][str(length)] = row
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    summ = result["summary"]
    cuda = s["device"] == "cuda"
    mem_label = "peak allocated (MiB)" if cuda else "peak RSS (MiB)"
    header = (["completion length", "trainer", "reference model", "forward passes per batch: no-grad policy + "
               "reference (+ training)", "median step, wall (s)"]
              + ([] if cuda else ["median step, CPU (s)"]) + ["step time relative to RPG", mem_label]
              + ([] if cuda else ["RSS above start (MiB)"]))
    rows = []
    for length, row in summ["by_length"].items():
        for m in s["methods"]:
            if m not in row:
                continue
            r = row[m]
            key = "step_s_median" if cuda else "step_cpu_s_median"
            rel = r[key] / row["RPG"][key] if "RPG" in row else float("nan")
            p = r.get("passes_per_batch") or {}
            passes = (f"{p.get('policy_no_grad', 0):g} + {p.get('reference', 0):g} (+ {p.get('policy_grad', 0):g})"
                      if p else "–")
            cells = [length, m, "yes" if r["reference_model"] else "no", passes, f"{r['step_s_median']:.3f}"]
            if not cuda:
                cells.append(f"{r['step_cpu_s_median']:.3f}")
            cells += [f"{rel:.2f}", f"{r['mem_mib_median']:.0f}"]
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
            cells = [length, fmt(a["step_time"]), fmt(b["step_time"])]
        else:
            cells = [length, fmt(a["step_cpu_time"]), fmt(b["step_cpu_time"]), fmt(a["step_time"]),
                     fmt(b["step_time"])]
        cells += [fmt(a["memory"]), fmt(b["memory"])]
        if not cuda:
            cells.append(fmt(a["memory_above_start"]))
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
    return head + table1 + "\n\nRatios (< 1: RPG is cheaper):\n\n" + markdown_table(header2, rows2)


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small model, short completions, 2 repetitions")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--lengths", type=int, nargs="+", help="override the completion lengths")
    p.add_argument("--repetitions", type=int, help="override the number of interleaved repetitions")
    p.add_argument("--threads", type=int, help="torch threads per run on CPU (default 1)")
    p.add_argument("--output", help="JSON path (default benchmarks/results/cost_<device>[_quick].json)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        with open(a.child) as f:
            spec = json.load(f)
        r = run_one(_from_jsonable(spec["settings"]), spec["method"], spec["length"], spec["output_dir"])
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
    name = f"cost_{a.device}" + ("_quick" if a.quick else "")
    json_path = a.output or os.path.join(RESULTS_DIR, f"{name}.json")
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
