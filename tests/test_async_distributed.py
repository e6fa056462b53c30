"""AsyncRPGTrainer on two CPU processes (`torch.distributed.run`, gloo, DDP) against one process on the same samples
(`tests/distributed/async_script.py`): the stand-in worker samples at staleness 0 from one seed, each micro-batch
holds the same 8 samples (1 x 8 or 2 x 4, one row per process), and plain SGD without clipping makes the parameters
proportional to the gradient's scale, so a token normaliser that drops or multiplies the process count (DDP
gradients 1/N or N times TRL's) moves them by far more than the tolerance. A parameter made NaN on one process after
an optimizer step stops both (the parameter guard's all-reduce)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _processes import free_port as _free_port
from _tiny import save_tiny_model
from transformers import AutoModelForCausalLM

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed" / "async_script.py"
PARAM_ATOL = 1e-5  # one process against two (measured: 2e-8; the steps move them by 0.07)


def _run(cmd: list[str], cwd: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    (cwd / f"log{len(list(cwd.glob('log*')))}.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{output}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("async-distributed")
    model_dir = save_tiny_model(str(folder / "model"))
    result = str(folder / "result")

    def spec(name, runs):
        path = folder / f"{name}.json"
        path.write_text(json.dumps({"model_dir": model_dir, "output_dir": str(folder / "out"), "result": result,
                                    "runs": runs}))
        return str(path)

    _run([sys.executable, str(SCRIPT), spec("one", [{"name": "one", "per_device": 8}])], folder)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
          str(SCRIPT), spec("two", [{"name": "two", "per_device": 4},
                                    {"name": "poisoned", "per_device": 4, "poison_rank": 1, "poison_step": 2,
                                     "max_steps": 2}])],
         folder)

    def ranks(name, n):
        return [json.loads(Path(f"{result}.{name}.rank{r}.json").read_text()) for r in range(n)]

    return {"model_dir": model_dir, "one": torch.load(f"{result}.one.pt"), "two": torch.load(f"{result}.two.pt"),
            "ranks": {"one": ranks("one", 1), "two": ranks("two", 2), "poisoned": ranks("poisoned", 2)}}


@pytest.mark.distributed
def test_two_processes_train_to_the_one_process_parameters(runs):
    assert [r["processes"] for r in runs["ranks"]["two"]] == [2, 2]
    assert all(r["error"] is None and r["step"] == 3 for r in runs["ranks"]["one"] + runs["ranks"]["two"])
    initial = dict(AutoModelForCausalLM.from_pretrained(runs["model_dir"]).named_parameters())
    moved = max((runs["one"][n] - initial[n].detach()).abs().max().item() for n in initial)
    difference = max((runs["one"][n] - runs["two"][n]).abs().max().item() for n in initial)
    assert moved > 1000 * PARAM_ATOL
    assert difference <= PARAM_ATOL, difference


@pytest.mark.distributed
def test_a_parameter_made_nan_on_one_process_stops_both(runs):
    first, second = runs["ranks"]["poisoned"]
    assert first["error"].startswith("NonFiniteParameters: AsyncRPGTrainer: after optimizer step 2 a parameter held "
                                     "by another process is not finite")
    assert second["error"].startswith("NonFiniteParameters: AsyncRPGTrainer: after optimizer step 2 "
                                      "`model.embed_tokens.weight` is not finite")
    assert first["step"] == second["step"] == 2 and first["finite"] and not second["finite"]
