"""`trl-rpg demo`: a short variant runs end to end and writes model, plot and metrics; the full demo (slow) raises
held-out accuracy by a clear margin."""

import json
import time

import pytest

from trl_rpg import cli
from trl_rpg.cli import toy_demo as demo
from trl_rpg.toy import task as toy_task

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_outputs(out, result):
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "README.md", "metrics.json"):
        assert (out / name).exists(), name
    assert (out / "curves.png").read_bytes()[:8] == PNG_MAGIC
    assert result["plot"] == str(out / "curves.png")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["accuracy_before"] == result["accuracy_before"]
    assert metrics["accuracy_after"] == result["accuracy_after"]
    assert "2505.17508" in (out / "README.md").read_text()
    # the saved model loads and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_rpg.toy import task as toy

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    accuracy = toy.evaluate_accuracy(model, tokenizer, toy.make_dataset(result["num_eval_problems"],
                                                                         seed=toy.EVAL_SEED, split="test"))
    assert accuracy == pytest.approx(result["accuracy_after"], abs=1e-6)


def test_short_demo_runs_and_writes_model_plot_and_metrics(tmp_path, capsys):
    out = tmp_path / "demo"
    # 60 warm-up steps: the fewest after which some completions are right (a model that is never right gives no
    # reward spread: the run would learn nothing, and end with the no-learning-signal warning)
    result = demo.run_demo(str(out), seed=0, max_steps=2, eval_every=1, sft_steps=60, num_eval_problems=24,
                           num_train_problems=128)
    printed = capsys.readouterr().out
    assert "held-out accuracy before RPG:" in printed and "held-out accuracy after RPG:" in printed
    assert "accuracy before:" in printed and "after:" in printed
    assert 0.0 <= result["accuracy_before"] <= 1.0 and 0.0 <= result["accuracy_after"] <= 1.0
    # the reward of the batch trained on is logged at every step (step 2 reuses step 1's batch)
    assert [step for step, _ in result["rewards"]] == [1, 2]
    assert all(0.0 <= r <= 1.0 for _, r in result["rewards"])
    assert [step for step, _ in result["accuracy"]] == [0, 1, 2]  # before, every step, after
    assert result["rpg"]["divergence"] == "urkl" and result["rpg"]["estimator"] == "reinforce"
    assert result["rpg"]["beta"] == 1e-4 and result["rpg"]["reference"] == "sampling"
    _check_outputs(out, result)
    _check_card(out, result)


def _check_card(out, result):
    """The demo model's card: the toy prompt format in a quick start that runs, what the training did, and the
    measured accuracy before and after (not TRL's generic question, an empty "Training procedure")."""
    import contextlib
    import io
    import re

    card = (out / "README.md").read_text()
    assert "time machine" not in card and "8888" not in card
    before, after = result["accuracy_before"], result["accuracy_after"]
    assert f"**{before:.1%} before RPG, {after:.1%} after**" in card
    procedure = card.split("## Training procedure", 1)[1].split("##", 1)[0]
    assert "warmed up for 60 supervised steps" in procedure
    assert "trained with `RPGTrainer` for 2 optimizer steps" in procedure
    assert "each generation batch reused for 2 optimizer steps" in procedure
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", card, re.S).group(1)
    assert "'8+7-9=?'" in code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "quick start", "exec"), {})
    assert re.fullmatch(r"[0-9+\-=,]*\n", printed.getvalue()), printed.getvalue()  # an answer in the toy format


def test_curve_legend_names_both_reward_lines(tmp_path, monkeypatch):
    import matplotlib.axes

    labels = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: labels.append(k.get("label")) or original(self, *a, **k))
    demo.plot_curves([(1, 0.2), (2, 0.4), (3, 0.5)], [(0, 0.1), (3, 0.6)], str(tmp_path / "c.png"))
    assert labels[0] == "training reward (the batch of each step)" and all(labels), labels


def test_demo_command_passes_its_options(monkeypatch, tmp_path):
    seen = {}

    def fake_run_demo(**kwargs):
        seen.update(kwargs)
        return {"accuracy_before": 0.25, "accuracy_after": 0.5}

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    assert cli.main(["demo", "--output_dir", str(tmp_path), "--seed", "3", "--max_steps", "7",
                     "--rpg_divergence", "fkl"]) == 0
    assert seen["output_dir"] == str(tmp_path) and seen["seed"] == 3 and seen["max_steps"] == 7
    assert seen["rl_overrides"] == {"rpg_divergence": "fkl"} and seen["num_threads"] == 1
    assert seen["eval_every"] == demo.DEMO_EVAL_EVERY and seen["sft_steps"] == toy_task.DEFAULT_SFT_STEPS
    assert cli.main(["demo", "--output_dir", str(tmp_path), "--sft_steps", "20"]) == 0 and seen["sft_steps"] == 20
    with pytest.raises(SystemExit):
        cli.main(["demo", "--rpg_divergence", "nope"])
    help_text = cli.make_demo_parser().format_help()
    assert "--output_dir" in help_text and "--max_steps" in help_text and "no download" in help_text


@pytest.mark.slow
def test_full_demo_raises_held_out_accuracy_clearly(tmp_path):
    """The README's claim: the default demo (seed 0) improves held-out accuracy by a clear margin. The bar,
    `demo.DEMO_MIN_GAIN` (0.07), is half the lowest gain measured on any machine and seed (+0.148; seeds 0-7 here:
    +0.228 to +0.434): a run that does not learn gains exactly 0 (learning_rate=0: 0.400 -> 0.400), and one whose
    objective has the wrong sign loses accuracy (reward_weights=[-1]: 0.400 -> 0.048), so either fails it; the spread
    between machines does not."""
    out = tmp_path / "demo"
    start = time.perf_counter()
    result = demo.run_demo(str(out), seed=0)
    elapsed = time.perf_counter() - start
    gain = result["accuracy_after"] - result["accuracy_before"]
    print(f"full demo: {result['accuracy_before']:.3f} -> {result['accuracy_after']:.3f} in {elapsed:.0f}s")
    assert gain >= demo.DEMO_MIN_GAIN, result
    _check_outputs(out, result)
