"""TRL's real vLLM generation path through RPGTrainer and GRPOTrainer, on CPU, with a fake engine (issue 25).

Every user who trains at scale generates with vLLM (colocate, or `trl vllm-serve`). Here TRL's own code for it runs
unchanged: `VLLMGeneration` (engine construction, `generate`, `sync_weights` with PEFT's merge and unmerge, the
server-mode metadata pass), `extract_logprobs`, and GRPOTrainer's importance-sampling correction built from the
engine's log-probs. Only the engine is fake: `tests/vllm_stub`, a `vllm` package with the names TRL imports (`LLM`,
`SamplingParams`, `RequestOutput`, `vllm.sampling_params.StructuredOutputsParams`, and the weight-transfer modules
`trl.generation.vllm_client` imports) and a `*.dist-info` so `importlib.metadata` sees vLLM 0.28 installed. Its
`LLM` loads its own copy of the model from the `model=` path TRL gives, changes its weights only through what TRL's
sync sends (`load_weights`), samples with them, and returns log-probs as vLLM does with
`logprobs_mode="processed_logprobs"` (after temperature, min-p, top-k, top-p), optionally from a perturbed sampler
(`FAKE_VLLM_KERNEL_MISMATCH`: the kernel mismatch the correction exists for), and records every sync.

Why a stub package rather than an injected generation object (as trl-cgrpo does): an injected object replaces
`VLLMGeneration` and so tests none of the code a vLLM user runs (the sync and its PEFT merge, the server metadata,
`extract_logprobs`, the engine's seeds and logprobs mode); the stub replaces only what lies beyond TRL's import of
`vllm`, and it works as well in a launched two-process run (through `PYTHONPATH`). It must never leak into the rest of
the suite (code that picks a vLLM backend when vLLM "is installed" would pick it): `_fake_vllm.installed()` puts it
on `sys.path` for one test only, re-runs TRL's guarded `from vllm import ...` in `trl.generation.vllm_generation`,
and afterwards removes the path, the `vllm` modules, the names and the environment variables TRL's colocate mode
sets (`test_fake_vllm_leaves_nothing_behind`). Server mode reaches a `FakeVLLMClient` patched in where TRL looks
`VLLMClient` up; its "server" is the same fake engine. `tests/_equivalence.py::pretend_vllm` (made-up sampler
log-probs injected into a trainer built without vLLM) is retired: the claims it served are checked here on the real
path.

The claims (the wrong lines that make them fail are rows of scripts/check_mutations.py, each seen caught):

- After every sync the engine holds the policy: full fine-tuning, and LoRA, where the engine must get base + the
  merged "default" adapter only, never RPG's frozen "ref" adapter. PEFT's `merge_adapter()` (which TRL's sync calls)
  merges the *active* adapters, so "ref" would be merged too if it were active; RPG activates it only inside
  `use_adapter` blocks that restore the policy's adapter, so RPG needs no code of its own here (the wrong line: a
  reference forward that leaves "ref" active). Colocate and server mode, RPGTrainer and GRPOTrainer. The engine
  really generated with those weights: TRL's own `sampling/sampling_logp_difference` is float noise at temperature
  0.7, so the engine's log-probs are the processed ones. With a moving reference, the sync after a reference update
  sends the policy, not the reference, and there is one sync per generation batch. The two wrong lines behind those
  last two (no sync after a reference update, the reference's weights synced) could only be TRL's: RPG has no line
  that triggers a sync or chooses what it sends. Both were checked by hand on a copy of TRL 1.16 put first on
  `PYTHONPATH` (a sync only at step 0: "one sync per generation batch" fails; `VLLMGeneration(model=self.ref_model)`:
  "the engine received weights 0.0367 away from the policy's" at sync 1).
- Where RPG reduces to GRPO (beta = 0, differentiable, no dual clip, `rpg_sampler_logps="recompute"`: mu = pi_old as
  in GRPO; "engine" is tests/test_sampler_logps.py's) the two sample the same completions and train to
  the same parameters with vLLM generation, in every `vllm_importance_sampling_mode`, the sampler perturbed so that
  the correction acts (wrong line: the ratio not applied).
- With beta > 0 the correction weighs every term of the loss, the KL term included, with the ratio TRL builds from
  the engine's own log-probs; a rejected sequence gets no gradient from any term (docs/math.md section 4b; wrong
  lines: the ratio applied twice, or left off the tokens only the KL term acts on).
- Two processes in colocate mode, DDP and ZeRO-3 (one launch each, `tests/distributed/vllm_script.py`): each rank's
  engine holds the policy after every sync (ZeRO-3: gathered per parameter, or whole for the LoRA merge), both
  engines receive the same weights, each samples its own completions (TRL seeds it with the rank); under DDP RPG
  also trains to GRPO's parameters with the correction on.
- Truncated sampling (`top_p < 1`, `top_k > 0`, `min_p > 0`) warns at construction where vLLM's correction or a
  reference other than the sampler relies on the sampler's support, and the reason is shown: the ratio TRL builds
  is the kept probability mass (docs/math.md section 4c; wrong lines: either warning condition dropped).

Cost: about 15 s of single-process tests and two two-process launches (about 25 s and 37 s of CPU) on 2 cores.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _equivalence import base_settings, config_pair, lora_config, make_trainer, max_difference, parameters, prompts
from _fake_vllm import STUB, difference, engine_of, installed, record_syncs, served
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from test_distributed import deepspeed_cpu_ops  # noqa: F401  (the fixture: DeepSpeed's CPU op, built once)
from trl import GRPOConfig, GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer

KERNEL_MISMATCH_ENV = "FAKE_VLLM_KERNEL_MISMATCH"  # tests/vllm_stub/vllm/__init__.py

#: Engine weights vs the policy's after a sync: room for float32 rounding of PEFT's merge (measured: 0.0, full and
#: LoRA).
SYNC_ATOL = 1e-6
#: TRL's max |old log-prob - engine log-prob| with an unperturbed engine: float noise of two forward passes (measured:
#: 4.8e-7).
LOGP_ATOL = 1e-4
#: What the policy must move between the first and the last sync, and the reference (and the policy with "ref" merged
#: in) differ from it at the last, for the checks to mean anything (measured: 0.056-0.063 moved, 0.010-0.063 apart).
MIN_MOVEMENT = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("vllm_model")))


@pytest.fixture
def fake_vllm():
    with installed():
        yield


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_fake_vllm_leaves_nothing_behind():
    """Inside `installed()` TRL sees vLLM 0.28 installed and bound the stub's names; after it nothing is left: not
    the import, not TRL's names, not the environment variables TRL's colocate mode sets."""
    from trl.generation import vllm_generation
    from trl.import_utils import is_vllm_available

    rank = os.environ.get("RANK")
    with installed():
        assert is_vllm_available(min_version="0.28.0") and "LLM" in vars(vllm_generation)
        os.environ["RANK"] = "7"
    assert not is_vllm_available() and importlib.util.find_spec("vllm") is None
    assert "LLM" not in vars(vllm_generation) and os.environ.get("RANK") == rank


# ----------------------------------------------------------------------------------------------------------------
# Weight sync: the engine holds the policy
# ----------------------------------------------------------------------------------------------------------------


def trainer_for(kind: str, model_dir: str, output_dir, mode: str = "colocate", peft: bool = False, **settings):
    """RPG (beta 0.05, a reference updated every 3 steps) or GRPO (beta 0.04, the initial model as reference),
    generating with the fake vLLM: one generation batch per 2 optimizer steps, 6 steps, temperature 0.7. Without
    gradient checkpointing (not what is tested here; faster, and a wrong active adapter then reaches the sync
    instead of failing first in the backward pass's recomputation)."""
    common = dict(max_steps=6, steps_per_generation=2, use_vllm=True, vllm_mode=mode, temperature=0.7,
                  learning_rate=2e-2, gradient_checkpointing=False, **settings)
    if kind == "rpg":
        args = RPGConfig(**cpu_args(output_dir, beta=0.05, rpg_reference="periodic", rpg_reference_update_steps=3,
                                    **common))
    else:
        args = GRPOConfig(**cpu_args(output_dir, beta=0.04, **common))
    trainer_cls = RPGTrainer if kind == "rpg" else GRPOTrainer
    return trainer_cls(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                       peft_config=lora_config() if peft else None)


SYNC_RUNS = [pytest.param("rpg", "colocate", False, id="rpg-colocate-full"),
             pytest.param("rpg", "colocate", True, id="rpg-colocate-lora"),
             pytest.param("grpo", "colocate", False, id="grpo-colocate-full"),
             pytest.param("grpo", "colocate", True, id="grpo-colocate-lora"),
             pytest.param("rpg", "server", True, id="rpg-server-lora"),
             pytest.param("grpo", "server", False, id="grpo-server-full")]


@pytest.mark.parametrize("kind,mode,peft", SYNC_RUNS)
def test_engine_holds_the_policy_after_every_sync(fake_vllm, model_dir, tmp_path, kind, mode, peft):
    """After each sync the engine's weights are the policy's (LoRA: base + the merged "default" adapter, never
    "ref"), not the reference's; one sync per generation batch, each generation served right after its sync, from
    those weights (TRL's old log-probs equal the engine's processed ones)."""
    with served(model_dir) as clients:
        trainer = trainer_for(kind, model_dir, tmp_path, mode, peft)
        expected = record_syncs(trainer)
        trainer.train()
    engine, generations = engine_of(trainer), trainer.args.max_steps // 2
    assert len(engine.syncs) == len(expected) == generations, "one sync per generation batch"
    assert sorted({request.sync_count for request in engine.requests}) == list(range(1, generations + 1))
    for k, (sync, want) in enumerate(zip(engine.syncs, expected)):
        received = dict(sync.weights)
        assert len(received) == len(sync.weights), f"sync {k}: a tensor was sent twice"
        gap = difference(received, want["policy"])
        assert gap <= SYNC_ATOL, f"sync {k}: the engine received weights {gap:.3g} away from the policy's"
    assert difference(dict(engine.model.named_parameters()), expected[-1]["policy"]) <= SYNC_ATOL
    # the checks can see what they guard against: the policy moved; at the last sync (RPG: the first after the
    # reference update at step 3) the reference, and the policy with "ref" merged in, differ from the policy
    last = expected[-1]
    gaps = {"moved": difference(expected[0]["policy"], last["policy"]),
            "reference": difference(last["reference"], last["policy"])}
    if "with_ref" in last:
        gaps["with_ref"] = difference(last["with_ref"], last["policy"])
    assert min(gaps.values()) > MIN_MOVEMENT, gaps
    differences = logged(trainer, "sampling/sampling_logp_difference/max")
    assert len(differences) >= generations and max(differences) < LOGP_ATOL
    if mode == "server":
        (client,) = clients
        assert client.calls == ["init_communicator"] + ["update_named_params", "reset_prefix_cache",
                                                        "generate"] * generations


# ----------------------------------------------------------------------------------------------------------------
# Where RPG is GRPO: the same parameters with vLLM generation, every importance-sampling mode
# ----------------------------------------------------------------------------------------------------------------

#: The sampler's logit perturbation: mean |log(pi_old / mu)| 0.24 per token (measured).
KERNEL_MISMATCH = 0.3
#: Truncation / rejection bounds: per token, and per sequence (a sum of up to 8 token log-ratios).
CLIP = {"token": (0.8, 1.25), "sequence": (0.5, 2.0)}
PARAM_ATOL = 1e-5  # as tests/test_grpo_equivalence.py (measured there: 0.0 for differentiable configurations)
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def correction_settings(mode: str) -> dict:
    low, high = CLIP[mode.split("_")[0]]
    return dict(use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_correction=True,
                vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=low,
                vllm_importance_sampling_clip_max=high)


@pytest.mark.parametrize("mode", MODES)
def test_rpg_trains_like_grpo_with_vllm_generation(fake_vllm, model_dir, tmp_path, monkeypatch, mode):
    """beta = 0, differentiable, no dual clip: RPGTrainer and GRPOTrainer sample the same completions from the
    engine and end with the same parameters; the sampler differs from the policy and the correction acts (ratios
    truncated, or rejected)."""
    monkeypatch.setenv(KERNEL_MISMATCH_ENV, str(KERNEL_MISMATCH))
    grpo_args, rpg_args = config_pair(tmp_path, base_settings(learning_rate=0.3, **correction_settings(mode)),
                                      rpg_sampler_logps="recompute")  # mu = pi_old, as GRPO (test_sampler_logps.py)
    runs = {}
    for name, trainer_cls, args in (("grpo", GRPOTrainer, grpo_args), ("rpg", RPGTrainer, rpg_args)):
        runs[name] = make_trainer(trainer_cls, model_dir, args, prompts(16))
        runs[name].train()
    grpo, rpg = runs["grpo"], runs["rpg"]
    assert [r.completions for r in engine_of(rpg).requests] == [r.completions for r in engine_of(grpo).requests]
    assert max_difference(parameters(rpg), parameters(grpo)) <= PARAM_ATOL
    assert logged(rpg, "loss") == pytest.approx(logged(grpo, "loss"), rel=1e-5, abs=1e-7)
    assert max_difference(parameters(grpo), initial_parameters(model_dir)) > 1e-2
    assert min(logged(grpo, "sampling/sampling_logp_difference/mean")) > 0.05  # mu != pi_old
    low, high = CLIP[mode.split("_")[0]]
    if mode.endswith("truncate"):
        assert max(logged(grpo, "sampling/importance_sampling_ratio/max")) == pytest.approx(high)
    else:
        assert min(logged(grpo, "sampling/importance_sampling_ratio/min")) == 0.0
        assert max(logged(grpo, "sampling/importance_sampling_ratio/max")) > 1.0


def initial_parameters(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {n: p.detach().float() for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}


# ----------------------------------------------------------------------------------------------------------------
# beta > 0: the correction weighs every term, with the engine's own log-probs
# ----------------------------------------------------------------------------------------------------------------


def expected_ratio(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """vLLM's correction as docs/math.md section 4b states it: pi_old / mu per token or per sequence, truncated
    to [C_min, C_max] or set to 0 outside it."""
    low, high = CLIP[mode.split("_")[0]]
    log_ratio = (old - sampler) * mask
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    ratio = log_ratio.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(low, high)
    return torch.where((ratio < low) | (ratio > high), torch.zeros_like(ratio), ratio)


def engine_logprobs(engine, inputs) -> torch.Tensor:
    """The log-probs the engine returned for each completion of a batch (found by prompt and completion tokens)."""
    served = {(tuple(r.prompt_token_ids), tuple(c)): lp for r in engine.requests
              for c, lp in zip(r.completions, r.logprobs)}
    rows = []
    for prompt, pmask, completion, cmask in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                                                inputs["completion_mask"]):
        key = (tuple(prompt[pmask.bool()].tolist()), tuple(completion[cmask.bool()].tolist()))
        values = served[key]
        rows.append(values + [0.0] * (completion.numel() - len(values)))
    return torch.tensor(rows)


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_correction_weighs_every_term_with_the_engine_logprobs(fake_vllm, model_dir, tmp_path, monkeypatch, mode):
    """The ratio in TRL's batch is built from the engine's own log-probs (the perturbed sampler's), and the
    trainer's per-token gradient is that ratio times the objective library's, for the whole loss and for the KL
    term alone (A = 0); a rejected sequence gets no gradient from any term. A distinct reference (the initial
    model), beta 0.5, clip widths that never act (tests/test_kl_every_token.py's layout)."""
    from test_kl_every_token import library_token_gradient, trainer_token_gradient

    monkeypatch.setenv(KERNEL_MISMATCH_ENV, str(KERNEL_MISMATCH))
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, steps_per_generation=4, beta=0.5, rpg_reference="initial",
                                learning_rate=0.05, rpg_dual_clip_c=None, epsilon=10.0, epsilon_high=10.0,
                                temperature=0.7, **correction_settings(mode)))
    trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    trainer.model.train()
    inputs = dict(trainer._buffered_inputs[3])
    mask = inputs["completion_mask"].float()
    sampler = engine_logprobs(engine_of(trainer), inputs)
    torch.testing.assert_close(inputs["sampling_per_token_logps"] * mask, sampler * mask)
    ratio = expected_ratio(inputs["old_per_token_logps"], sampler, mask, mode)
    torch.testing.assert_close(inputs["importance_sampling_ratio"], ratio)
    assert (ratio.expand_as(mask)[mask.bool()] != 1).float().mean() > 0.5  # the correction is not the identity

    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    advantages = inputs["advantages"].unsqueeze(1).expand_as(logps)
    torch.testing.assert_close(grad * mask, ratio * library_token_gradient(trainer, inputs, logps, advantages) * mask,
                               rtol=1e-5, atol=1e-9)
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])  # the KL term alone
    grad, logps, _ = trainer_token_gradient(trainer, inputs)
    kl_only = library_token_gradient(trainer, inputs, logps, torch.zeros_like(advantages))
    assert (kl_only * mask).abs().max() > 0
    torch.testing.assert_close(grad * mask, ratio * kl_only * mask, rtol=1e-5, atol=1e-9)
    if mode.endswith("mask"):
        rejected = (ratio.expand_as(mask) == 0) & mask.bool()
        assert rejected.any() and (~rejected & mask.bool()).any()
        assert (grad[rejected] == 0).all()


# ----------------------------------------------------------------------------------------------------------------
# Truncated sampling (docs/math.md section 4c)
# ----------------------------------------------------------------------------------------------------------------


def truncation_warnings(tmp_path, **settings) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RPGConfig(**cpu_args(tmp_path, **settings))
    return [str(w.message) for w in caught if "truncates sampling" in str(w.message)]


@pytest.mark.parametrize("cut", [{"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05}, {"generation_kwargs": {"top_k": 5}}],
                         ids=["top_p", "top_k", "min_p", "generation_kwargs"])
def test_truncated_sampling_warns_where_a_term_relies_on_the_sampler_support(tmp_path, cut):
    """A warning at construction, naming the setting, with vLLM's correction or a reference other than the
    sampler; none without truncation, and none where nothing relies on the sampler's support."""
    correction = dict(use_vllm=True, vllm_importance_sampling_correction=True)
    reference = dict(beta=0.1, rpg_reference="initial")
    for settings in (correction, reference):
        (message,) = truncation_warnings(tmp_path, **cut, **settings)
        assert next(iter((cut.get("generation_kwargs") or cut).items()))[0] in message
    assert truncation_warnings(tmp_path, **correction, **reference) == []  # no truncation
    assert truncation_warnings(tmp_path, **cut) == []  # the sampler as reference, no vLLM
    assert truncation_warnings(tmp_path, **cut, use_vllm=True, vllm_importance_sampling_correction=False) == []


def test_truncated_sampling_puts_the_kept_mass_into_the_ratio(fake_vllm, model_dir, tmp_path):
    """Why the warning: with top_k the engine's processed log-probs are renormalised over the kept tokens, so TRL's
    ratio pi_old / mu is the kept mass of pi_old at every token (no kernel mismatch here), not 1."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, use_vllm=True, top_k=3, beta=0.0))
    trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    inputs = trainer._buffered_inputs[0]
    mask = inputs["completion_mask"].bool()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():  # the engine still holds the weights the batch was generated (and pi_old computed) with
        logits = engine_of(trainer).model(input_ids=ids, attention_mask=attention).logits
    probs = torch.softmax(logits[:, inputs["prompt_ids"].size(1) - 1:-1].float(), -1)  # each completion position
    kept_mass = probs.topk(3, dim=-1).values.sum(-1)
    log_ratio = inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]
    torch.testing.assert_close(log_ratio[mask], kept_mass.log()[mask], rtol=0, atol=1e-5)
    assert kept_mass[mask].max() < 0.5  # far from 1: the bias is the size of the cut mass


# ----------------------------------------------------------------------------------------------------------------
# Two processes, colocate: DDP and ZeRO-3 (one launch each, several checks per launch)
# ----------------------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
VLLM_SCRIPT = ROOT / "tests" / "distributed" / "vllm_script.py"


def sync_run(name: str, trainer: str = "rpg", peft: bool = False) -> dict:
    config = dict(max_steps=6, steps_per_generation=2, use_vllm=True, vllm_mode="colocate", temperature=0.7,
                  learning_rate=2e-2, gradient_checkpointing=False)
    config.update(dict(beta=0.05, rpg_reference="periodic", rpg_reference_update_steps=3) if trainer == "rpg" else
                  dict(beta=0.04))
    return {"name": name, "trainer": trainer, "peft": peft, "config": config}


def equivalence_runs() -> list[dict]:
    settings = base_settings(learning_rate=0.3, max_steps=4, steps_per_generation=4,
                             **correction_settings("token_truncate"))
    rpg = dict(settings, rpg_estimator="differentiable", rpg_dual_clip_c=None, rpg_reference="sampling",
               rpg_sampler_logps="recompute")
    return [{"name": "grpo_beta0", "trainer": "grpo", "config": settings, "mismatch": KERNEL_MISMATCH},
            {"name": "rpg_beta0", "trainer": "rpg", "config": rpg, "mismatch": KERNEL_MISMATCH,
             "compare_to": "grpo_beta0"}]


def launch_vllm(directory: Path, layout: str, model_dir: str, runs: list[dict]) -> list[dict]:
    """tests/distributed/vllm_script.py under `layout` (tests/test_distributed.py's CPU configs), the fake vLLM on
    PYTHONPATH; returns each rank's results."""
    from test_distributed import _cpu_config, _env, _free_port

    directory.mkdir(parents=True, exist_ok=True)
    config, processes = _cpu_config(directory, layout)
    spec = {"model_dir": model_dir, "output_dir": str(directory / "out"), "result": str(directory / "result"),
            "runs": runs}
    (directory / "spec.json").write_text(json.dumps(spec))
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(STUB), env["PYTHONPATH"]])
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port",
           str(_free_port()), str(VLLM_SCRIPT), str(directory / "spec.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=directory)
    (directory / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{output}")
    return [json.loads(Path(f"{spec['result']}.rank{rank}.json").read_text()) for rank in range(processes)]


def assert_two_engines_hold_the_policy(ranks: list[dict], run: str, generations: int):
    for rank, results in enumerate(ranks):
        r = results[run]
        assert r["num_processes"] == 2 and r["seed"] == rank  # TRL seeds each rank's engine with its index
        assert r["syncs"] == r["observed_syncs"] == generations and r["sent_twice"] == 0
        assert r["sync_counts"] == list(range(1, generations + 1))
        assert max(r["sync_differences"]) <= SYNC_ATOL, (run, rank, r["sync_differences"])
        assert r["moved"] > MIN_MOVEMENT and max(r["logp_difference"]) < LOGP_ATOL
        assert r["reference_gap"] > MIN_MOVEMENT  # the sync after the reference update is not the reference
        if r["with_ref_gap"] is not None:
            assert r["with_ref_gap"] > MIN_MOVEMENT
    assert ranks[0][run]["digests"] == pytest.approx(ranks[1][run]["digests"], rel=1e-12)  # one policy, two engines
    assert ranks[0][run]["completions"] != ranks[1][run]["completions"]  # each engine sampled its own


@pytest.mark.distributed
def test_two_processes_each_engine_holds_the_policy_ddp(model_dir, tmp_path):
    """DDP, two processes, each with its colocated engine: RPG (full, LoRA with the "ref" adapter) and, where RPG
    reduces to GRPO, both trainers to the same parameters with the correction on."""
    ranks = launch_vllm(tmp_path, "ddp", model_dir, [sync_run("rpg_full"), sync_run("rpg_lora", peft=True),
                                                      *equivalence_runs()])
    for run in ("rpg_full", "rpg_lora"):
        assert_two_engines_hold_the_policy(ranks, run, generations=3)
    for results in ranks:
        assert results["rpg_beta0"]["difference_to"] <= PARAM_ATOL
        assert results["rpg_beta0"]["completions"] == results["grpo_beta0"]["completions"]


@pytest.mark.distributed
@pytest.mark.usefixtures("deepspeed_cpu_ops")
def test_two_processes_each_engine_holds_the_policy_zero3(model_dir, tmp_path):
    """DeepSpeed ZeRO-3, two processes: TRL gathers each partitioned parameter for the sync (full fine-tuning),
    or the whole model to merge the LoRA adapter; each engine still receives exactly the policy."""
    ranks = launch_vllm(tmp_path, "zero3", model_dir, [sync_run("rpg_full"), sync_run("rpg_lora", peft=True)])
    for run in ("rpg_full", "rpg_lora"):
        assert all(results[run]["is_deepspeed"] for results in ranks)
        assert_two_engines_hold_the_policy(ranks, run, generations=3)
