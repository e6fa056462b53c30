"""`trl-rpg demo --async` (issue 47): AsyncRPGTrainer against TRL's AsyncGRPOTrainer on the toy task, on CPU with the
stand-in worker, every sample `--staleness` versions old; it prints both held-out accuracies and their difference.
Run here at its `--quick` size (2 steps each: the numbers mean nothing, the plumbing and the printed comparison do)."""

import json
import re

import pytest

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402

from trl_rpg import AsyncRPGConfig, cli, toy  # noqa: E402
from trl_rpg.cli import async_toy_demo as async_demo
from trl_rpg.toy import async_rollouts  # noqa: E402


def test_demo_async_trains_both_at_the_staleness_asked_and_prints_the_comparison(tmp_path, monkeypatch, capsys):
    workers, configs = [], []

    class Recorded(async_rollouts.StaleRolloutWorker):
        def __init__(self, *args, **kwargs):
            workers.append(kwargs["staleness"])
            super().__init__(*args, **kwargs)

    def config(*args, **kwargs):
        configs.append(made := make_config(*args, **kwargs))
        return made

    make_config = async_demo.async_demo_config
    monkeypatch.setattr(async_rollouts, "StaleRolloutWorker", Recorded)
    monkeypatch.setattr(async_demo, "async_demo_config", config)
    out = tmp_path / "demo"
    assert cli.main(["demo", "--async", "--quick", "--staleness", "3", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert workers == [3, 3]  # both runs sample 3 versions back
    grpo, rpg = configs
    assert type(grpo) is AsyncGRPOConfig and isinstance(rpg, AsyncRPGConfig)
    assert grpo.max_staleness == rpg.max_staleness == 3 and grpo.max_steps == rpg.max_steps == 2
    assert grpo.learning_rate == rpg.learning_rate == 1.5e-4 and rpg.beta == 1.0
    assert grpo.lr_scheduler_type == rpg.lr_scheduler_type == "constant"
    metrics = json.loads((out / "metrics.json").read_text())
    accuracy = metrics["accuracy"]
    shown = re.search(r"held-out accuracy: start ([\d.]+)%, AsyncGRPO ([\d.]+)%, AsyncRPG ([\d.]+)%", printed)
    assert shown, printed
    assert [float(x) for x in shown.groups()] == [round(accuracy[k] * 100, 1) for k in ("start", "AsyncGRPO",
                                                                                         "AsyncRPG")]
    difference = re.search(r"AsyncRPG - AsyncGRPO: ([+-][\d.]+) points \(staleness 3, one seed", printed)
    assert difference, printed
    assert float(difference.group(1)) == round((accuracy["AsyncRPG"] - accuracy["AsyncGRPO"]) * 100, 1)
    assert metrics["staleness"] == 3 and metrics["max_steps"] == 2


def test_the_comparison_is_asyncrpg_minus_asyncgrpo_in_points():
    lines = async_demo.comparison_lines({"start": 0.4, "AsyncGRPO": 0.5, "AsyncRPG": 0.625}, 8, 256)
    assert lines[0] == "  held-out accuracy: start 40.0%, AsyncGRPO 50.0%, AsyncRPG 62.5%"
    assert lines[1].startswith("  AsyncRPG - AsyncGRPO: +12.5 points (staleness 8, one seed, 256 problems")


@pytest.mark.parametrize(("argv", "said"), [
    (["--staleness", "2"], "--staleness does not apply to --model toy without --async"),
    (["--staleness", "0"], "--staleness does not apply to --model toy without --async"),
    (["--quick"], "--quick does not apply to --model toy without --async"),
    (["--async", "--model", "smollm2"], "--model smollm2 does not apply to --async"),
    (["--async", "--eval_every", "3"], "--eval_every does not apply to --async"),
])
def test_demo_options_of_the_other_demo_are_refused(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", *argv])
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_the_stand_ins_are_public_in_trl_rpg_toy():
    from trl_rpg import _compat

    assert toy.StaleRolloutWorker is async_rollouts.StaleRolloutWorker
    assert toy.VarlenAttention is async_rollouts.VarlenAttention
    assert toy.async_trainer_on_cpu is _compat.async_trainer_on_cpu
