"""RPG under DeepSpeed ZeRO-3 and DDP, two processes on CPU, for real (issue 4).

Each fixture launches `tests/distributed/train_script.py` with `accelerate launch` and one of the shipped configs
in `accelerate_configs/`, rewritten for CPU (`use_cpu`, `num_processes: 2`, `mixed_precision: no`; for ZeRO-3 the
inline DeepSpeed settings go to a JSON file that adds `stage3_param_persistence_threshold: 0`, see
`_deepspeed_config_file`), and reads the JSON each rank writes. Run them alone with `pytest -m distributed`.
DeepSpeed's JIT-compiled CPU op is built once, in one process, before the first DeepSpeed launch
(`deepspeed_cpu_ops`).

Why the losses of different process layouts can be compared step by step:

- Completions are a fixed function of the prompt (`FixedCompletionRPGTrainer`): sampling draws from a different
  random stream on each rank, so sampled completions would differ between layouts.
- `shuffle_dataset=False` and the same global batch: 1 process x 8 completions or 2 processes x 4.
- Batch reuse comes from `num_iterations=2` (each generation batch is used for two optimizer steps) with
  `steps_per_generation=1`: every optimizer step sees the whole generation batch in every layout. With
  `steps_per_generation > 1`, TRL shuffles each rank's share of the batch with the global RNG and splits it into
  per-step slices, so the examples that meet in one optimizer step would depend on the layout.
- `beta=0.05` and a "periodic" reference updated every 3 steps, so the reference (a partitioned reference model, or
  the "ref" LoRA adapter) and its updates are part of every loss compared.

What is left differs only in the order of floating-point sums (gradient all-reduce / reduce-scatter, loss
reduction): losses must agree within LOSS_RTOL / LOSS_ATOL, probe log-probs within PROBE_ATOL.
"""

from __future__ import annotations

import fcntl
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml
from _processes import free_port as _free_port
from _tiny import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "accelerate_configs"
SCRIPT = ROOT / "tests" / "distributed" / "train_script.py"
DOCS = ROOT / "docs" / "distributed.md"

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6  # per-step loss, distributed vs single process (measured: < 1e-7)
PROBE_ATOL = 1e-5  # log-probs of the probe sequence (measured: < 5e-7)
LAUNCH_TIMEOUT = 600
# Under ZeRO-3 the trainer gathers parameters a bounded group at a time (trl_rpg.trainers.reference.ZERO3_GATHER_NUMEL
# elements); the tiny model's largest parameter has 2048, so with 3000 reference updates, checkpoints and restores
# go through many groups.
ZERO3_GATHER_NUMEL = 3000

distributed = pytest.mark.distributed
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")

#: The shipped configs and what each must say.
SHIPPED = {
    "single_process.yaml": {"distributed_type": "NO", "num_processes": 1},
    "multi_gpu.yaml": {"distributed_type": "MULTI_GPU"},
    "deepspeed_zero1.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 1},
    "deepspeed_zero2.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 2},
    "deepspeed_zero3.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "zero3_save_16bit_model": True},
    "deepspeed_zero3_offload.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 3,
                                     "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
    "fsdp2.yaml": {"distributed_type": "FSDP", "fsdp_version": 2},
    "multi_node_deepspeed_zero3.yaml": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "num_machines": 2},
}

#: Layouts used by the tests: a shipped config and the overrides that make it run on two CPU processes.
LAYOUTS = {
    "single": ("single_process.yaml", {"use_cpu": True, "mixed_precision": "no"}, 1),
    "ddp": ("multi_gpu.yaml", {"use_cpu": True, "num_processes": 2, "mixed_precision": "no"}, 2),
    # DeepSpeed runs on CPU through DS_ACCELERATOR=cpu (set in `_env`), not through `use_cpu`
    "zero2": ("deepspeed_zero2.yaml", {"num_processes": 2, "mixed_precision": "no"}, 2),
    "zero3": ("deepspeed_zero3.yaml", {"num_processes": 2, "mixed_precision": "no"}, 2),
}

# Builds DeepSpeed's CPU communication op (a C++ JIT extension, ~1.5 min on 2 cores) once, in one process. Every
# DeepSpeed process loads it at start-up; on a fresh machine two ranks would otherwise compile it concurrently.
PREBUILD = "from deepspeed.comm.torch import build_shm_op; print('deepspeed shm op:', build_shm_op())"


# ----------------------------------------------------------------------------------------------------------------
# Launch helpers
# ----------------------------------------------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env.update({
        "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    })
    return env


def _deepspeed_config_file(inline: dict, directory: Path) -> dict:
    """The shipped inline `deepspeed_config`, as a DeepSpeed JSON file with `stage3_param_persistence_threshold: 0`.

    DeepSpeed keeps parameters smaller than that threshold (1e5 elements by default) whole on every rank; every
    parameter of the tiny test model is smaller, so with the default nothing would be partitioned at all.
    """
    zero = {"stage": inline["zero_stage"], "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": bool(inline.get("zero3_save_16bit_model", False))}
    for kind in ("optimizer", "param"):
        device = inline.get(f"offload_{kind}_device", "none")
        if device != "none":
            zero[f"offload_{kind}"] = {"device": device}
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
              "fp16": {"enabled": "auto"}, "zero_optimization": zero}
    path = directory / "deepspeed.json"
    path.write_text(json.dumps(config, indent=1))
    return {"deepspeed_config_file": str(path), "zero3_init_flag": bool(inline.get("zero3_init_flag", False)),
            "deepspeed_multinode_launcher": inline.get("deepspeed_multinode_launcher", "standard")}


def _cpu_config(directory: Path, layout: str) -> tuple[Path, int]:
    name, overrides, processes = LAYOUTS[layout]
    with open(CONFIGS / name) as f:
        config = yaml.safe_load(f)
    config.update(overrides)
    if config.get("deepspeed_config"):
        config["deepspeed_config"] = _deepspeed_config_file(config["deepspeed_config"], directory)
        config.pop("mixed_precision")  # the JSON file's "auto" takes it from the training arguments (bf16=False)
    path = directory / f"cpu_{name}"
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path, processes


def launch(directory: Path, name: str, layout: str, model_dir: str, runs: list[dict]) -> dict:
    """Run train_script.py under `layout`; returns {"ranks": [rank0 results, ...], "seconds": wall time}."""
    directory = directory / name
    directory.mkdir(parents=True, exist_ok=True)
    config, processes = _cpu_config(directory, layout)
    spec = {"model_dir": model_dir, "output_dir": str(directory / "out"), "result": str(directory / "result"),
            "runs": runs}
    if layout == "zero3":
        spec["gather_numel"] = ZERO3_GATHER_NUMEL
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
           "--main_process_port", str(_free_port()), str(SCRIPT), str(spec_path)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, cwd=directory)
    seconds = time.perf_counter() - start
    (directory / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{output}")
    ranks = []
    for rank in range(processes):
        with open(f"{spec['result']}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    print(f"[distributed] {name}: {layout}, {processes} process(es), {seconds:.1f} s")
    return {"ranks": ranks, "seconds": seconds, "dir": directory}


def launch_two_nodes(directory: Path, name: str, model_dir: str, runs: list[dict], must_succeed: bool = True,
                     timeout: float = LAUNCH_TIMEOUT) -> dict:
    """Run train_script.py as two "machines" of one process each (DDP on CPU), each in its own working directory
    (`directory/node0`, `directory/node1`): a relative `output_dir` then lands on a separate "disk" per node, as on a
    cluster whose nodes write checkpoints to local disks. Returns {"codes": exit codes, "logs": each node's output,
    "ranks": results (when both succeeded), "dirs": the node directories, "seconds": wall time}."""
    spec = {"model_dir": model_dir, "output_dir": "out", "result": str(directory / "result"), "runs": runs}
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    port, procs, dirs = _free_port(), [], []
    start = time.perf_counter()
    for node in range(2):
        node_dir = directory / f"node{node}"
        node_dir.mkdir(exist_ok=True)
        config_path, _ = _cpu_config(node_dir, "ddp")
        config = yaml.safe_load(config_path.read_text())
        config.update({"num_machines": 2, "machine_rank": node, "main_process_ip": "127.0.0.1",
                       "main_process_port": port})
        config_path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_path), str(SCRIPT),
               str(spec_path)]
        log = open(node_dir / "log.txt", "w")
        procs.append((subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=node_dir), log))
        dirs.append(node_dir)
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                other.kill()
            codes.append("timeout")
        log.close()
    seconds = time.perf_counter() - start
    logs = [(d / "log.txt").read_text() for d in dirs]
    print(f"[distributed] {name}: 2 nodes x 1 process, exit codes {codes}, {seconds:.1f} s")
    if codes != [0, 0]:
        if must_succeed:
            tails = "\n".join(f"--- node {n}:\n{log[-3000:]}" for n, log in enumerate(logs))
            pytest.fail(f"two-node launch {name} ended with {codes}:\n{tails}")
        return {"codes": codes, "logs": logs, "dirs": dirs, "seconds": seconds}
    ranks = []
    for rank in range(2):
        with open(f"{spec['result']}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return {"codes": codes, "logs": logs, "ranks": ranks, "dirs": dirs, "seconds": seconds}


def agreement_run(name: str, peft: bool, per_device: int, **config) -> dict:
    """A run whose per-step losses do not depend on the process layout (see the module docstring)."""
    settings = dict(max_steps=6, num_iterations=2, per_device_train_batch_size=per_device, shuffle_dataset=False,
                    rpg_reference="periodic", rpg_reference_update_steps=3, beta=0.05,
                    learning_rate=1e-2 if peft else 1e-3)
    settings.update(config)
    return {"name": name, "peft": peft, "fixed_completions": True, "probe": True, "config": settings}


def losses(result: dict) -> dict[int, float]:
    return {int(k): v for k, v in result["losses"].items()}


def max_abs_diff(a, b) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def assert_losses_match(actual: dict, expected: dict, what: str, steps=None):
    got, want = losses(actual), losses(expected)
    steps = sorted(want) if steps is None else steps
    assert set(steps) <= set(got), f"{what}: logged steps {sorted(got)}, expected {steps}"
    worst = max(abs(got[s] - want[s]) for s in steps)
    print(f"[distributed] {what}: max |loss difference| over steps {steps} = {worst:.3g}")
    for s in steps:
        assert math.isfinite(got[s])
        assert abs(got[s] - want[s]) <= LOSS_ATOL + LOSS_RTOL * abs(want[s]), (
            f"{what}: step {s} loss {got[s]!r} vs {want[s]!r} (rtol={LOSS_RTOL}, atol={LOSS_ATOL})")


def assert_probes_match(actual: dict, expected: dict, what: str, steps=None):
    got = {p["step"]: p for p in actual["probes"]}
    want = {p["step"]: p for p in expected["probes"]}
    steps = sorted(want) if steps is None else steps
    worst = 0.0
    for s in steps:
        for key in ("policy", "reference"):
            if want[s][key] is None:
                assert got[s][key] is None
                continue
            diff = max_abs_diff(got[s][key], want[s][key])
            worst = max(worst, diff)
            assert diff <= PROBE_ATOL, f"{what}: {key} log-probs at step {s} differ by {diff} (> {PROBE_ATOL})"
    print(f"[distributed] {what}: max |probe log-prob difference| = {worst:.3g}")


def assert_zero3_partitioned(ranks: list[dict], run: str, reference: bool):
    """Every parameter above DeepSpeed's persistence threshold is split between the two ranks, not replicated."""
    for rank, result in enumerate(ranks):
        result = result[run]
        assert result["is_deepspeed"] and result["zero_stage"] == 3 and result["num_processes"] == 2
        assert result["partitions"], "no optimizer step recorded"
        for record in result["partitions"]:
            for key in ("policy", "reference") if reference else ("policy",):
                part = record[key]
                assert part is not None, f"rank {rank}, step {record['step']}: the {key} has no ZeRO-3 parameters"
                full, local = part["partitioned_full_numel"], part["partitioned_local_numel"]
                # only DeepSpeed's "persistent" parameters (norms, biases of this tiny model) stay whole
                assert full >= 0.95 * part["full_numel"], part
                # this rank holds half of every partitioned parameter (rounded up: one element of padding at most)
                assert full / 2 <= local <= full / 2 + part["num_params"], part
                # between optimizer steps no partitioned parameter is gathered on this rank
                assert part["materialised"] == [], f"rank {rank}, step {record['step']}, {key}: {part}"
    sizes = [r[run]["partitions"][0]["policy"] for r in ranks]
    print(f"[distributed] {run}: policy elements {sizes[0]['full_numel']}, per rank "
          f"{[s['partitioned_local_numel'] + s['persistent_numel'] for s in sizes]}")


def probe_logps(model, tokenizer) -> list[float]:
    """The probe log-probs of tests/distributed/train_script.py, computed with a plainly loaded model."""
    sys.path.insert(0, str(SCRIPT.parent))
    from train_script import PROBE_COMPLETION, PROBE_PROMPT

    prompt = tokenizer(PROBE_PROMPT, add_special_tokens=False)["input_ids"]
    completion = tokenizer(PROBE_COMPLETION, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: one launch each, shared by the tests that read it
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def deepspeed_cpu_ops():
    """Build DeepSpeed's JIT CPU op once, in a single process, under a file lock (also safe with pytest-xdist)."""
    lock_path = Path(tempfile.gettempdir()) / "trl_rpg_deepspeed_prebuild.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", PREBUILD], env=_env(), capture_output=True, text=True,
                                  timeout=LAUNCH_TIMEOUT)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if proc.returncode != 0:
        pytest.fail(f"building DeepSpeed's CPU op failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    print(f"[distributed] DeepSpeed CPU op ready in {time.perf_counter() - start:.1f} s")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def model_dir(workdir):
    return save_tiny_model(str(workdir / "tiny_model"))


@pytest.fixture(scope="module")
def single(workdir, model_dir):
    """The single-process reference: 1 process x 8 completions per step, full fine-tuning and LoRA."""
    return launch(workdir, "single", "single", model_dir,
                  [agreement_run("full", False, 8, save_strategy="steps", save_steps=3),
                   agreement_run("lora", True, 8)])


@pytest.fixture(scope="module")
def zero3(workdir, model_dir, deepspeed_cpu_ops):
    """ZeRO-3, 2 processes x 4 completions per step: full fine-tuning (checkpoint at step 3), then LoRA."""
    full = agreement_run("full", False, 4, save_strategy="steps", save_steps=3)
    full["save_model"] = str(workdir / "zero3_full_saved")
    lora = agreement_run("lora", True, 4)
    lora["save_model"] = str(workdir / "zero3_lora_saved")
    return launch(workdir, "zero3", "zero3", model_dir, [full, lora])


@pytest.fixture(scope="module")
def ddp_full(workdir, model_dir):
    return launch(workdir, "ddp_full", "ddp", model_dir,
                  [agreement_run("full", False, 4, save_strategy="steps", save_steps=3)])


def _resumed_on(workdir, model_dir, name, layout, per_device, checkpoint):
    run = agreement_run("full", False, per_device, output_dir=str(workdir / f"{name}_out"))
    run["resume_from_checkpoint"] = str(checkpoint)
    return launch(workdir, name, layout, model_dir, [run])


@pytest.fixture(scope="module")
def one_to_two(workdir, model_dir, single):
    """The single-process checkpoint of step 3 (inside a reused batch) resumed by 2 DDP processes."""
    return _resumed_on(workdir, model_dir, "one_to_two", "ddp", 4, single["dir"] / "out" / "full" / "checkpoint-3")


@pytest.fixture(scope="module")
def two_to_one(workdir, model_dir, ddp_full):
    """The 2-process DDP checkpoint of step 3 resumed by 1 process."""
    checkpoint = ddp_full["dir"] / "out" / "full" / "checkpoint-3"
    return _resumed_on(workdir, model_dir, "two_to_one", "single", 8, checkpoint)


@pytest.fixture(scope="module")
def two_nodes(workdir, model_dir):
    """Two nodes with node-local disks: a run checkpointed at step 3 (`save_on_each_node=True`); a resume from
    `out/full/checkpoint-3` (relative: each node reads its own disk) while node 1's checkpoint lacks the model
    weights, which transformers 5 writes on global rank 0 only; then node 0's model files copied to node 1, as a
    sync would, and the resume again."""
    directory = workdir / "two_nodes"
    launch_two_nodes(directory, "first", model_dir, [
        agreement_run("full", False, 4, save_strategy="steps", save_steps=3, save_on_each_node=True)])
    resume = agreement_run("full", False, 4, save_on_each_node=True, output_dir="out/resumed")
    resume["resume_from_checkpoint"] = "out/full/checkpoint-3"
    checkpoints = [directory / f"node{n}" / "out" / "full" / "checkpoint-3" for n in range(2)]
    on_node1_after_save = sorted(p.name for p in checkpoints[1].iterdir())
    without_weights = launch_two_nodes(directory, "without_weights", model_dir, [resume], must_succeed=False,
                                       timeout=180)
    for name in ("config.json", "generation_config.json", "model.safetensors"):  # what node 1 lacks
        shutil.copy(checkpoints[0] / name, checkpoints[1] / name)
    resumed = launch_two_nodes(directory, "resumed", model_dir, [resume])
    return {"checkpoints": checkpoints, "on_node1_after_save": on_node1_after_save,
            "without_weights": without_weights, "resumed": resumed}


class _Payload:
    """Unpickling this runs code: it creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def tampered_copy(checkpoint: Path, destination: Path, marker: Path) -> Path:
    """A copy of `checkpoint` whose DeepSpeed model-state files (read by every rank on resume) hold a pickled payload
    that creates `marker` if it is ever unpickled, the manifest rewritten to match (as whoever hands out a checkpoint
    can do)."""
    from trl_rpg.run.checkpoint import MANIFEST_FILE, file_record

    shutil.copytree(checkpoint, destination)
    manifest = json.loads((destination / MANIFEST_FILE).read_text())
    for shard in sorted(destination.glob("global_step*/*model_states.pt")):
        torch.save({"module": _Payload(str(marker))}, shard)
        manifest["files"][str(shard.relative_to(destination))] = file_record(str(shard))
    (destination / MANIFEST_FILE).write_text(json.dumps(manifest))
    return destination


@pytest.fixture(scope="module")
def zero3_resumed(workdir, model_dir, zero3):
    """The ZeRO-3 checkpoint of step 3 resumed; then, in the same launch, a copy of it holding a pickled payload."""
    checkpoint = zero3["dir"] / "out" / "full" / "checkpoint-3"
    run = agreement_run("full", False, 4, output_dir=str(workdir / "zero3_resumed_out"))
    run["resume_from_checkpoint"] = str(checkpoint)
    tampered = agreement_run("tampered", False, 4, output_dir=str(workdir / "zero3_tampered_out"))
    tampered.update(expect_error=True, resume_from_checkpoint=str(
        tampered_copy(checkpoint, workdir / "zero3_tampered", workdir / "zero3_payload_ran")))
    return launch(workdir, "zero3_resumed", "zero3", model_dir, [run, tampered])


@pytest.fixture(scope="module")
def zero2(workdir, model_dir, deepspeed_cpu_ops):
    """ZeRO-2, 2 processes: a run checkpointed at step 3 (inside a reused batch) and, in the same launch, that
    checkpoint resumed to the same last step."""
    full = agreement_run("full", False, 4, max_steps=4, save_strategy="steps", save_steps=3)
    resumed = agreement_run("resumed", False, 4, max_steps=4)
    resumed["resume_from_checkpoint"] = str(workdir / "zero2" / "out" / "full" / "checkpoint-3")
    return launch(workdir, "zero2", "zero2", model_dir, [full, resumed])


@pytest.fixture(scope="module")
def zero3_modes(workdir, model_dir, deepspeed_cpu_ops):
    """The other reference schedules under ZeRO-3, with real (sampled) generation."""
    common = dict(max_steps=4, num_iterations=2, per_device_train_batch_size=4)
    runs = [
        {"name": "initial_full", "probe": True, "config": dict(common, rpg_reference="initial", beta=0.05)},
        {"name": "adaptive_lora", "peft": True, "probe": True,
         "config": dict(common, rpg_reference="adaptive", rpg_reference_kl_target=1e-7, beta=0.05)},
        {"name": "sampling_full", "config": dict(common, max_steps=2)},
        # DeepSpeed owns its gradients: a non-finite step is skipped by DeepSpeed, not by RPG's guard
        dict(agreement_run("poisoned_full", False, 4, max_steps=3), poison_step=2),
    ]
    return launch(workdir, "zero3_modes", "zero3", model_dir, runs)


# ----------------------------------------------------------------------------------------------------------------
# Shipped configs (fast; not marked distributed)
# ----------------------------------------------------------------------------------------------------------------


def test_shipped_accelerate_configs_load_and_are_documented():
    from accelerate.commands.config.config_args import load_config_from_file

    shipped = sorted(os.path.basename(p) for p in glob.glob(str(CONFIGS / "*.yaml")))
    assert shipped == sorted(SHIPPED)
    docs = DOCS.read_text()
    for name, expected in SHIPPED.items():
        config = load_config_from_file(str(CONFIGS / name))
        settings = {"distributed_type": str(config.distributed_type.value), "num_processes": config.num_processes,
                    "num_machines": config.num_machines, **(config.deepspeed_config or {}),
                    **(config.fsdp_config or {})}
        for key, value in expected.items():
            assert settings.get(key) == value, f"{name}: {key}={settings.get(key)!r}, expected {value!r}"
        assert re.search(rf"accelerate launch [^\n]*--config_file accelerate_configs/{re.escape(name)}", docs), (
            f"{DOCS} has no `accelerate launch --config_file accelerate_configs/{name}` line")


# ----------------------------------------------------------------------------------------------------------------
# ZeRO-3, full fine-tuning
# ----------------------------------------------------------------------------------------------------------------


@distributed
@needs_deepspeed
def test_zero3_full_parameters_are_partitioned(zero3):
    assert_zero3_partitioned(zero3["ranks"], "full", reference=True)  # the "periodic" reference model too


@distributed
@needs_deepspeed
def test_zero3_full_losses_match_single_process(zero3, single):
    for rank in zero3["ranks"]:  # every rank logs the same (all-reduced) loss
        assert_losses_match(rank["full"], single["ranks"][0]["full"], "ZeRO-3 full vs 1 process")
    assert_probes_match(zero3["ranks"][0]["full"], single["ranks"][0]["full"], "ZeRO-3 full vs 1 process")


@distributed
@needs_deepspeed
def test_zero3_full_saved_model_reloads_with_from_pretrained(zero3, workdir, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = workdir / "zero3_full_saved"
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trained = zero3["ranks"][0]["full"]
    reloaded = probe_logps(model, tokenizer)
    diff = max_abs_diff(reloaded, trained["final_policy_probe"])
    print(f"[distributed] ZeRO-3 full: reloaded vs trained max |log-prob difference| = {diff:.3g}")
    assert diff <= PROBE_ATOL
    # and it is the trained model, not the initial one
    assert max_abs_diff(reloaded, trained["probes"][0]["policy"]) > 100 * PROBE_ATOL


@distributed
@needs_deepspeed
def test_zero3_resume_reproduces_uninterrupted_run(zero3_resumed, zero3):
    checkpoint = zero3["dir"] / "out" / "full" / "checkpoint-3"
    assert (checkpoint / "rpg_checkpoint_complete.json").exists()
    # The reference was updated at step 3, after batch B (generated at step 3) was scored against the old one, so
    # step 4 reuses the restored buffer and rescores it with the restored reference: both are needed to match.
    assert (checkpoint / "rpg_reference.safetensors").exists()  # gathered from the partitions of the reference model
    resumed, uninterrupted = zero3_resumed["ranks"][0]["full"], zero3["ranks"][0]["full"]
    # it did resume: training began at step 3 (a fresh run would reproduce the losses too, the data being fixed)
    assert [p["step"] for p in resumed["probes"]] == [3, 4, 5, 6]
    assert [p["step"] for p in resumed["partitions"]] == [4, 5, 6]
    assert_losses_match(resumed, uninterrupted, "ZeRO-3 resumed at step 3 vs uninterrupted", steps=[4, 5, 6])
    assert_probes_match(resumed, uninterrupted, "ZeRO-3 resumed at step 3 vs uninterrupted", steps=[3, 4, 5, 6])
    assert resumed["reference_updates"] == uninterrupted["reference_updates"] == 2


@distributed
@needs_deepspeed
def test_zero3_resume_refuses_a_pickled_payload_without_running_it(zero3_resumed, workdir):
    """DeepSpeed's loader calls torch.load(weights_only=False); RPGTrainer makes it weights-only (issue 26, s. 4)."""
    for rank in zero3_resumed["ranks"]:
        error = rank["tampered"]["error"]
        assert error.startswith("CheckpointError: ") and "holds more than tensors and plain data" in error, error
    assert not (workdir / "zero3_payload_ran").exists()


@distributed
@needs_deepspeed
def test_zero2_resume_reproduces_uninterrupted_run(zero2):
    """DeepSpeed's files of a ZeRO-2 checkpoint, loaded weights-only, restore the run exactly."""
    resumed, uninterrupted = zero2["ranks"][0]["resumed"], zero2["ranks"][0]["full"]
    assert resumed["zero_stage"] == 2 and [p["step"] for p in resumed["probes"]] == [3, 4]
    assert_losses_match(resumed, uninterrupted, "ZeRO-2 resumed at step 3 vs uninterrupted", steps=[4])
    assert_probes_match(resumed, uninterrupted, "ZeRO-2 resumed at step 3 vs uninterrupted", steps=[3, 4])
    assert resumed["reference_updates"] == uninterrupted["reference_updates"] == 1


@distributed
@needs_deepspeed
def test_zero_checkpoints_load_weights_only_and_refuse_a_resume_without_deepspeed(zero2, zero3, model_dir, tmp_path):
    """Each real ZeRO-2 / ZeRO-3 file loads weights-only with DeepSpeed's types allowed (`_compat`); the manifest
    records the stage, and one process without DeepSpeed refuses the checkpoint (it would restart the optimizer and
    the learning-rate schedule) naming how to resume it."""
    from _resume_script import make_trainer

    from trl_rpg.run import checkpoint as ckpt
    for stage, launched in ((2, zero2), (3, zero3)):
        directory = launched["dir"] / "out" / "full" / "checkpoint-3"
        assert ckpt.read_manifest(str(directory))["run"]["deepspeed_zero_stage"] == stage
        shards = sorted(directory.glob("global_step3/*.pt"))
        assert len(shards) == (4 if stage == 3 else 3)
        with ckpt.deepspeed_loads_weights_only(str(directory)):
            for shard in shards:
                torch.load(shard, map_location="cpu", weights_only=False)  # as DeepSpeed's loader calls it
        trainer = make_trainer(model_dir, tmp_path / f"zero{stage}", "periodic")
        with pytest.raises(ckpt.RunMismatch, match=f"written under DeepSpeed ZeRO-{stage}; this run does not use"):
            trainer.train(resume_from_checkpoint=str(directory))


# ----------------------------------------------------------------------------------------------------------------
# ZeRO-3, LoRA
# ----------------------------------------------------------------------------------------------------------------


@distributed
@needs_deepspeed
def test_zero3_lora_parameters_are_partitioned(zero3):
    assert_zero3_partitioned(zero3["ranks"], "lora", reference=False)  # the reference is the "ref" adapter


@distributed
@needs_deepspeed
def test_zero3_lora_losses_match_single_process(zero3, single):
    for rank in zero3["ranks"]:
        assert_losses_match(rank["lora"], single["ranks"][0]["lora"], "ZeRO-3 LoRA vs 1 process")
    assert_probes_match(zero3["ranks"][0]["lora"], single["ranks"][0]["lora"], "ZeRO-3 LoRA vs 1 process")


@distributed
@needs_deepspeed
def test_zero3_lora_saved_adapter_loads_with_peft(zero3, workdir, model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = workdir / "zero3_lora_saved"
    assert (saved / "adapter_config.json").exists() and not (saved / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, saved)
    trained = zero3["ranks"][0]["lora"]
    reloaded = probe_logps(model, AutoTokenizer.from_pretrained(model_dir))
    diff = max_abs_diff(reloaded, trained["final_policy_probe"])
    print(f"[distributed] ZeRO-3 LoRA: reloaded vs trained max |log-prob difference| = {diff:.3g}")
    assert diff <= PROBE_ATOL
    assert max_abs_diff(reloaded, trained["probes"][0]["policy"]) > 100 * PROBE_ATOL


# ----------------------------------------------------------------------------------------------------------------
# Reference schedules under ZeRO-3
# ----------------------------------------------------------------------------------------------------------------


@distributed
@needs_deepspeed
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_zero3_periodic_reference_changes_exactly_when_due(kind, zero3):
    """rpg_reference_update_steps=3: the reference log-probs change at steps 3 and 6, only there, to the policy's."""
    result = zero3["ranks"][0][kind]
    probes = {p["step"]: p for p in result["probes"]}
    assert sorted(probes) == [0, 1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        before, after = probes[step - 1]["reference"], probes[step]["reference"]
        if step % 3 == 0:  # due: pi_ref <- pi_theta
            assert max_abs_diff(after, before) > 100 * PROBE_ATOL, f"step {step}: reference did not change"
            assert max_abs_diff(after, probes[step]["policy"]) <= 1e-6, f"step {step}: reference != policy"
        else:
            assert after == before, f"step {step}: reference changed although no update was due"
    assert result["reference_updates"] == 2


@distributed
@needs_deepspeed
def test_zero3_initial_adaptive_and_sampling_references(zero3_modes):
    for rank in zero3_modes["ranks"]:
        for name, result in rank.items():
            steps = losses(result)
            assert steps and all(math.isfinite(v) for v in steps.values()), f"{name}: {steps}"
        # "initial": a partitioned reference model that never moves
        initial = rank["initial_full"]
        assert initial["reference_updates"] == 0
        assert all(r["reference"] is not None for r in initial["partitions"])
        first = initial["probes"][0]
        assert all(p["reference"] == first["reference"] for p in initial["probes"])
        assert max_abs_diff(first["reference"], first["policy"]) <= 1e-6  # the initial policy
        assert max_abs_diff(initial["probes"][-1]["policy"], first["policy"]) > 100 * PROBE_ATOL  # policy moved
        # "adaptive" with LoRA: the "ref" adapter is replaced by the policy's adapter whenever the divergence
        # average passes the (tiny) target, which happens on reused batches
        adaptive = rank["adaptive_lora"]
        assert adaptive["reference_updates"] >= 1
        for before, after in zip(adaptive["probes"], adaptive["probes"][1:]):
            updated = after["reference_updates"] > before["reference_updates"]
            if updated:
                assert max_abs_diff(after["reference"], after["policy"]) <= 1e-6, after
            else:
                assert after["reference"] == before["reference"], (before, after)
        # "sampling": no reference model at all
        assert all(r["reference"] is None for r in rank["sampling_full"]["partitions"])
    assert_zero3_partitioned(zero3_modes["ranks"], "initial_full", reference=True)
    assert_zero3_partitioned(zero3_modes["ranks"], "adaptive_lora", reference=False)
    assert_zero3_partitioned(zero3_modes["ranks"], "sampling_full", reference=False)


@distributed
@needs_deepspeed
def test_zero3_skips_a_step_whose_gradient_norm_is_not_finite(zero3_modes):
    """What `trl_rpg/run/gradient_guard.py` documents: under DeepSpeed the guard stands aside and DeepSpeed itself
    skips a
    step whose global gradient norm is not finite (here ZeRO-3 in fp32); the parameters do not move at that step and
    training goes on after it."""
    for rank in zero3_modes["ranks"]:
        result = rank["poisoned_full"]
        probes = {p["step"]: p["policy"] for p in result["probes"]}
        assert sorted(probes) == [0, 1, 2, 3]
        assert max_abs_diff(probes[1], probes[0]) > 100 * PROBE_ATOL  # step 1 trains
        assert probes[2] == probes[1]  # the poisoned step 2 moved nothing
        assert max_abs_diff(probes[3], probes[2]) > 100 * PROBE_ATOL  # step 3 trains again
        assert all(math.isfinite(v) for v in probes[3])
        assert result["skipped_steps"] == 0  # RPG's guard did not act: DeepSpeed did


# ----------------------------------------------------------------------------------------------------------------
# DDP
# ----------------------------------------------------------------------------------------------------------------


@distributed
def test_ddp_losses_match_single_process(ddp_full, single):
    for rank in ddp_full["ranks"]:
        result = rank["full"]
        assert not result["is_deepspeed"] and result["num_processes"] == 2
        assert_losses_match(result, single["ranks"][0]["full"], "DDP full vs 1 process")
    assert_probes_match(ddp_full["ranks"][0]["full"], single["ranks"][0]["full"], "DDP full vs 1 process")


@distributed
def test_two_nodes_with_local_disks_resume_exactly(two_nodes, single):
    """Each node holds only its own process's generation buffer on its disk, and, with `save_on_each_node`, its own
    copy of the optimizer, the scheduler and RPG's state and manifest. Resume verifies on each node what that node
    reads and continues as the uninterrupted single-process run does.

    transformers 5 writes the model weights on global rank 0 only, even with `save_on_each_node` (its
    `should_save_on_this_rank`): without them node 1 cannot resume (GRPOTrainer neither). That run must fail at
    once, naming the checkpoint, not hang; with node 0's model files synced to node 1 it resumes exactly."""
    missing = {"config.json", "model.safetensors"} - set(two_nodes["on_node1_after_save"])
    assert missing == {"config.json", "model.safetensors"}  # the transformers behaviour described
    failed = two_nodes["without_weights"]
    assert failed["codes"][0] not in (0, "timeout") and failed["codes"][1] not in (0, "timeout"), failed["codes"]
    assert "Can't find a valid checkpoint at out/full/checkpoint-3" in failed["logs"][1]
    for node, path in enumerate(two_nodes["checkpoints"]):
        buffers = sorted(p.name for p in path.glob("rpg_generation_buffer_rank*.safetensors"))
        assert buffers == [f"rpg_generation_buffer_rank{node}.safetensors"], (node, buffers)  # node-local disks
        manifest = json.loads((path / "rpg_checkpoint_complete.json").read_text())
        assert manifest["world_size"] == 2 and len(manifest["rank_files"]) == 2  # both processes' files listed
    for rank in two_nodes["resumed"]["ranks"]:
        result = rank["full"]
        assert result["num_processes"] == 2
        assert [p["step"] for p in result["probes"]] == [3, 4, 5, 6]  # it did resume at step 3
    result = two_nodes["resumed"]["ranks"][0]["full"]
    assert_losses_match(result, single["ranks"][0]["full"], "two nodes: resumed vs uninterrupted", steps=[4, 5, 6])
    assert_probes_match(result, single["ranks"][0]["full"], "two nodes: resumed vs uninterrupted", steps=[4, 5, 6])


# ----------------------------------------------------------------------------------------------------------------
# Resume on another number of processes
# ----------------------------------------------------------------------------------------------------------------


@distributed
@pytest.mark.parametrize("change", ["one_to_two", "two_to_one"])
def test_resume_on_another_number_of_processes_splits_the_buffered_batch(change, request, single):
    """A checkpoint written by 1 (2) processes inside a reused generation batch resumes on 2 (1): the buffered batch
    is redistributed (each optimizer step trains on the same rows), nothing hangs, and the run continues as the
    uninterrupted single-process run does."""
    resumed = request.getfixturevalue(change)
    log = (resumed["dir"] / "log.txt").read_text()
    written_by, resumed_by = (1, 2) if change == "one_to_two" else (2, 1)
    assert f"on {resumed_by} processes (written by {written_by}): each buffered micro-batch is split" in log
    result = resumed["ranks"][0]["full"]
    assert [p["step"] for p in result["probes"]] == [3, 4, 5, 6]  # it did resume at step 3
    assert_losses_match(result, single["ranks"][0]["full"], f"{change}: resumed vs uninterrupted", steps=[4, 5, 6])
    assert_probes_match(result, single["ranks"][0]["full"], f"{change}: resumed vs uninterrupted", steps=[4, 5, 6])
    assert result["reference_updates"] == single["ranks"][0]["full"]["reference_updates"]
