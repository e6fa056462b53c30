"""Helpers shared by the benchmarks: machine description, markdown tables, statistics."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
CACHE_DIR = os.environ.get("TRL_RPG_BENCH_CACHE", os.path.join(HERE, ".cache"))
#: Where `--quick` runs write by default: not `RESULTS_DIR`, whose committed files are the record (git ignores
#: `outputs/`).
QUICK_RESULTS_DIR = os.path.join(os.path.dirname(HERE), "outputs", "benchmarks")


def default_results_path(name: str, quick: bool) -> str:
    """A benchmark's default results file: `RESULTS_DIR/<name>.json` for a full run (the record, committed), and
    `QUICK_RESULTS_DIR/<name>_quick.json` for a `--quick` one, so a smoke run never overwrites the record."""
    if quick:
        return os.path.join(QUICK_RESULTS_DIR, f"{name}_quick.json")
    return os.path.join(RESULTS_DIR, f"{name}.json")


def moved_flag(flag: str, module: str) -> str:
    """The error of a flag that became its own command (issue 48: a benchmark never imports its extension)."""
    return f"{flag} is now its own command: python -m {module} (its options: python -m {module} --help)"


def machine_info() -> dict:
    """Date, host, CPU model, core count, memory, load, git commit, library versions."""
    info: dict = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "nproc": os.cpu_count(),
        "command": " ".join(["python", "-m", _module_name()] + sys.argv[1:]),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["mem_total_gib"] = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        info["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                                            text=True, cwd=HERE, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], check=False, capture_output=True, text=True,
                               cwd=HERE, timeout=10).stdout.strip()
        info["git_dirty"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = "unknown"
    try:
        import torch
        import transformers
        import trl

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["trl"] = trl.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        pass
    return info


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else os.path.basename(sys.argv[0])


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def mean_std(xs) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=1, sort_keys=False, default=str, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def save_figure(fig, path: str) -> str:
    """Lay out ``fig``, write it to ``path`` (its folder made), close it; return ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _clean(o):
    """NaN/inf -> None (strict JSON), tuples -> lists, recursively."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


# ---------------------------------------------------------------------------------------------------------------------
# Ratios and intervals of measured quantities
# ---------------------------------------------------------------------------------------------------------------------

#: What a table prints for a ratio whose denominator measured 0 (or is missing).
UNDEFINED = "undefined"


def ratio(numerator, denominator) -> float | None:
    """``numerator / denominator`` of two measured quantities, or ``None`` when it is undefined (a missing or
    non-finite value, or a denominator that measured 0)."""
    if numerator is None or denominator is None:
        return None
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator == 0:
        return None
    return numerator / denominator


def fmt_ratio(x, digits=3) -> str:
    """A ratio for a table: :data:`UNDEFINED` when :func:`ratio` returned ``None``."""
    return UNDEFINED if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


# two-sided 95% Student-t quantiles by degrees of freedom
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
       12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 19: 2.09, 24: 2.06, 29: 2.05, 39: 2.02, 59: 2.00, 119: 1.98}


def t95(df: int) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom (the nearest tabulated df below)."""
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def ci95(xs) -> dict:
    """Mean and 95% t-interval half-width of (paired) differences; the half-width is NaN below 2 values."""
    mean, sd = mean_std(xs)
    n = len([x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))])
    if n < 2:
        return {"mean": mean, "half_width": float("nan"), "n": n}
    return {"mean": mean, "half_width": t95(n - 1) * sd / math.sqrt(n), "n": n}


# ---------------------------------------------------------------------------------------------------------------------
# The toy task: frozen task code, cached SFT start per seed, worker processes (learning.py, offpolicy.py)
# ---------------------------------------------------------------------------------------------------------------------
#
# Functions here take a settings object with the fields ``toy_path``, ``cache_dir``, ``sft_steps``,
# ``num_train_problems`` and ``eval_problems`` (both benchmarks' ``Settings`` have them).


def init_worker() -> None:
    """One torch thread per process (tiny models oversubscribe a small CPU otherwise), quiet libraries."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001, S110  (quieting is best effort)  # pragma: no cover
        pass


_TOY_MODULES: dict = {}


def toy_task_files(folder: str) -> list[str]:
    """The files of the toy task in ``folder``: ``task.py`` and the toy modules it imports, following relative
    imports (``from .problems import ...``) transitively."""
    import ast

    todo, seen = ["task"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(folder, f"{name}.py")) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                if node.level != 1 or not node.module:
                    raise RuntimeError(f"trl_rpg/toy/{name}.py line {node.lineno}: the toy task's modules import one "
                                       "another as 'from .module import name' (the rest of the package absolutely), "
                                       "or their frozen copy cannot be imported")
                todo.append(node.module)
    return sorted(f"{name}.py" for name in seen)


def _live_toy_folder() -> str:
    from trl_rpg.toy import task as toy

    return os.path.dirname(toy.__file__)


def toy_fingerprint(path: str | None = None) -> str:
    """Short hash of the toy task code (the files of :func:`toy_task_files` in ``path``, the package's when None): a
    cached checkpoint is reused only with the code it was built for."""
    import hashlib

    folder = _live_toy_folder() if path is None else path
    digest = hashlib.sha256()
    for name in toy_task_files(folder):
        with open(os.path.join(folder, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()[:10]


def freeze_toy(s) -> None:
    """Copy the toy task's modules (``trl_rpg/toy/task.py`` and what it imports) into the cache (a folder named by
    their hash) so that every run of one benchmark uses the same task, data and reward code even if the package files
    change while the benchmark runs."""
    if s.toy_path is not None:
        return
    import shutil
    import tempfile

    folder = _live_toy_folder()
    dest = os.path.join(s.cache_dir, toy_fingerprint(folder), "toy_frozen")
    if not os.path.isdir(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        staging = tempfile.mkdtemp(dir=os.path.dirname(dest), prefix=".toy_frozen-")
        for name in toy_task_files(folder):
            shutil.copyfile(os.path.join(folder, name), os.path.join(staging, name))
        open(os.path.join(staging, "__init__.py"), "w").close()
        try:
            os.rename(staging, dest)
        except OSError:  # another process froze the same code first
            shutil.rmtree(staging, ignore_errors=True)
    s.toy_path = dest


def toy_module(s):
    """The frozen toy task of this benchmark (``trl_rpg.toy.task`` itself when none was frozen): its folder imported
    as a package of its own, named by its hash."""
    if s.toy_path is None:
        from trl_rpg.toy import task as toy

        return toy
    if s.toy_path not in _TOY_MODULES:
        import importlib
        import importlib.util

        package = f"_trl_rpg_toy_{toy_fingerprint(s.toy_path)}"
        if package not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                package, os.path.join(s.toy_path, "__init__.py"), submodule_search_locations=[s.toy_path])
            module = importlib.util.module_from_spec(spec)
            sys.modules[package] = module
            spec.loader.exec_module(module)
        _TOY_MODULES[s.toy_path] = importlib.import_module(f"{package}.task")
    return _TOY_MODULES[s.toy_path]


def checkpoint_dir(s, seed: int) -> str:
    """Where the SFT start of ``seed`` is cached (keyed by the toy code's hash and the SFT length)."""
    tag = f"seed{seed}" + (f"-sft{s.sft_steps}" if s.sft_steps is not None else "")
    return os.path.join(s.cache_dir, toy_fingerprint(s.toy_path), tag)


def build_checkpoint(s, seed: int) -> dict:
    """Build (or load from the cache) the SFT'd toy model for ``seed``; return its path and held-out accuracy."""
    init_worker()
    toy = toy_module(s)
    kw = {"num_train_problems": s.num_train_problems}
    if s.sft_steps is not None:
        kw["sft_steps"] = s.sft_steps
    t0 = time.perf_counter()
    path = checkpoint_dir(s, seed)
    model, tokenizer = toy.build_toy_model(path, seed=seed, **kw)
    build_s = time.perf_counter() - t0
    acc = toy.evaluate_accuracy(model, tokenizer, eval_dataset(s))
    return {"seed": seed, "path": path, "sft_accuracy": acc, "build_s": round(build_s, 1)}


def eval_dataset(s):
    """The held-out problems (test split, fixed seed) every run of a benchmark is evaluated on."""
    toy = toy_module(s)
    return toy.make_dataset(s.eval_problems, seed=toy.EVAL_SEED, split="test")


#: Fields of a benchmark's settings that override ``toy.RECOMMENDED_RL_ARGS`` when not None.
RL_OVERRIDABLE = ("per_device_train_batch_size", "num_generations", "learning_rate", "temperature",
                  "max_completion_length")


def toy_rl_kwargs(s, seed: int, out: str, reuse: int, max_steps: int, overrides: dict) -> dict:
    """``GRPOConfig``/``RPGConfig`` keyword arguments of one toy run: ``toy.RECOMMENDED_RL_ARGS``, the settings'
    overrides, the batch layout (``reuse`` optimizer steps per generation batch, no accumulation), then
    ``overrides`` (the method's own settings)."""
    args = dict(toy_module(s).RECOMMENDED_RL_ARGS)
    for name in RL_OVERRIDABLE:
        if getattr(s, name, None) is not None:
            args[name] = getattr(s, name)
    args.update(
        output_dir=out, seed=seed, data_seed=seed, max_steps=max_steps,
        gradient_accumulation_steps=1, steps_per_generation=reuse,
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, log_level="error",
    )
    args.pop("generation_batch_size", None)
    args.update(overrides)
    return args


def toy_rl_run(s, seed: int, trainer_cls, config, eval_every: int, log_keys=(), after_train=None,
               evaluation_context=None) -> dict:
    """Train ``trainer_cls`` (``RPGTrainer``, ``GRPOTrainer`` or a subclass) from the seed's cached SFT start.

    Held-out accuracy is measured before training and every ``eval_every`` optimizer steps (and at the end).
    Returns the accuracy curve, the mean reward of every generation batch, the number of completions generated
    (scored), a digest of the prompts in the order they were scored (equal digests = same prompts, same order),
    the optimizer steps done, the seconds of training (``train_s``, which includes the evaluations, ``eval_s``),
    the logged values of ``log_keys`` (names; an entry ending in "/" is a prefix) as one
    dict per log call. ``after_train(trainer)`` may return more entries for the result (e.g. what a
    recording trainer subclass collected). A run that RPGTrainer finds learned nothing (``NoLearningSignal``) is a
    result, with the reason in ``no_learning_signal`` (None otherwise). ``trainer_cls`` is called with the keyword
    arguments ``model``, ``reward_funcs``, ``args``, ``train_dataset``, ``processing_class`` and ``callbacks`` (a
    factory does for a trainer that needs more); ``evaluation_context(model)``, when given, is a context manager
    entered around each held-out evaluation.
    """
    import hashlib

    init_worker()
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback

    from trl_rpg.run.learning_signal import TRAINED_ON_NOTHING_REASON, NoLearningSignal

    toy = toy_module(s)
    t0 = time.perf_counter()
    path = checkpoint_dir(s, seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    eval_ds = eval_dataset(s)
    train_ds = toy.make_dataset(s.num_train_problems, seed=seed, split="train")
    max_steps = config.max_steps

    rewards: list[float] = []  # mean reward of each generation batch, in order
    samples = [0]
    digest = hashlib.sha256()

    def reward(prompts, completions, answer, **kw):
        r = toy.toy_reward(completions, answer)
        rewards.append(sum(r) / max(1, len(r)))
        samples[0] += len(r)
        for p in prompts:
            digest.update(json.dumps(p, sort_keys=True).encode())
        return r

    reward.__name__ = "toy_reward"
    curve: list[tuple[int, float]] = []
    log_rows: list[dict] = []
    eval_s = [0.0]

    def evaluate(step, model):
        import contextlib

        t = time.perf_counter()
        with evaluation_context(model) if evaluation_context else contextlib.nullcontext():
            curve.append((step, toy.evaluate_accuracy(model, tokenizer, eval_ds)))
        eval_s[0] += time.perf_counter() - t

    class Eval(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            evaluate(0, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            step = state.global_step
            if step % eval_every == 0 or step == max_steps:
                evaluate(step, model)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                keep = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and (
                    k in log_keys or any(k.startswith(p) for p in log_keys if p.endswith("/")))}
                keep["step"] = state.global_step
                log_rows.append(keep)

    trainer = trainer_cls(model=path, reward_funcs=reward, args=config, train_dataset=train_ds,
                          processing_class=tokenizer, callbacks=[Eval()])
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    t1 = time.perf_counter()
    try:  # RPGTrainer's verdict on a run that learned nothing is a result, not a crash (GRPOTrainer has none)
        no_signal = trainer.train().metrics.get(TRAINED_ON_NOTHING_REASON)
    except NoLearningSignal as error:  # rpg_require_learning_signal=True
        no_signal = str(error)
    train_s = time.perf_counter() - t1
    result = {"accuracy": [(st, round(a, 5)) for st, a in curve], "rewards": [round(x, 5) for x in rewards],
              "no_learning_signal": no_signal,
              "samples": samples[0], "prompt_digest": digest.hexdigest()[:16], "steps": trainer.state.global_step,
              "start": path, "train_s": round(train_s, 1), "eval_s": round(eval_s[0], 1), "logs": log_rows}
    if after_train is not None:
        result.update(after_train(trainer))
    result["total_s"] = round(time.perf_counter() - t0, 1)
    return result


#: Runs a worker process does before it is replaced by a fresh one: a long benchmark's workers grew without bound
#: otherwise (the asynchronous tuned comparison's two workers held 12 GiB each after ~170 runs, and swapped to a halt).
#: The pool itself is replaced (`ProcessPoolExecutor`'s own `max_tasks_per_child` hangs on Python 3.11 once a worker
#: retires: no new one starts).
TASKS_PER_WORKER = 8


class WorkerPool:
    """``workers`` spawned processes with one torch thread each (:func:`init_worker`), the pool replaced after every
    ``workers * tasks_per_worker`` runs (``TASKS_PER_WORKER`` when None), or inline when ``workers <= 1``. A real
    model's benchmark passes 1: a SmolLM2 worker kept its first run's ~6 GB through its second and was killed for
    memory."""

    def __init__(self, workers: int, tasks_per_worker: int | None = None):
        self.workers, self.tasks_per_worker = workers, tasks_per_worker
        self._pool = None

    def _new_pool(self):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                   initializer=init_worker)

    def __enter__(self):
        if self.workers > 1:
            self._pool = self._new_pool()
        else:
            init_worker()
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
        return False

    def map(self, fn, jobs: list[tuple], on_result=None) -> list:
        results = [None] * len(jobs)
        if self._pool is None:
            for i, job in enumerate(jobs):
                results[i] = fn(*job)
                if on_result is not None:
                    on_result(i, results[i])
            return results
        from concurrent.futures import as_completed

        chunk = self.workers * (TASKS_PER_WORKER if self.tasks_per_worker is None else self.tasks_per_worker)
        for start in range(0, len(jobs), chunk):
            if start:  # fresh processes for the next chunk of runs
                self._pool.shutdown(wait=True)
                self._pool = self._new_pool()
            futures = {self._pool.submit(fn, *job): start + i for i, job in enumerate(jobs[start:start + chunk])}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if on_result is not None:
                    on_result(i, results[i])
        return results
