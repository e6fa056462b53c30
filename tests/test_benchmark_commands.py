"""Each benchmark extension is its own command and no file of benchmarks/ imports one that imports it back (issue 48):
`python -m benchmarks.asynchronous_tuned`, `benchmarks.learning_tuned`, `benchmarks.cost_vllm` (with
`benchmarks.cost`'s options and a hidden `--child SPEC` for its spawned runs); the base modules' old flags
(`--tuned`, `--vllm`) name the new command."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import asynchronous, asynchronous_tuned, cost, cost_vllm, learning, learning_tuned  # noqa: E402


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules of benchmarks/ (`modules`) that the file `path` imports, anywhere in it (relative or absolute)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "benchmarks"):
            module = (node.module or "").removeprefix("benchmarks").lstrip(".").split(".")[0]
            found.update([module] if module else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks."))
    return found & modules


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph` (module -> the modules it imports), each as the path that closes it."""
    found, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                found.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_no_import_circle_in_benchmarks():
    files = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {m: imports_of(p, set(files)) - {m} for m, p in files.items()}
    assert graph["asynchronous_tuned"] >= {"asynchronous"} and graph["cost_vllm"] >= {"cost"}  # the reader reads
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("module, flag, command", [(asynchronous, "--tuned", "benchmarks.asynchronous_tuned"),
                                                   (learning, "--tuned", "benchmarks.learning_tuned"),
                                                   (cost, "--vllm", "benchmarks.cost_vllm")])
def test_an_old_flag_names_its_new_command(module, flag, command, capsys):
    with pytest.raises(SystemExit) as exit_:
        module.main(["--quick", flag])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"error: {flag} is now its own command: python -m {command} (its options: python -m "
                         f"{command} --help)"), last


@pytest.mark.parametrize("module", [asynchronous_tuned, learning_tuned, cost_vllm])
def test_an_extension_is_its_own_command(module, capsys):
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {module.__name__} [-h] [--quick]")


def test_cost_vllm_takes_the_cost_benchmarks_options(tmp_path, monkeypatch, capsys):
    seen = []

    def run(s):
        seen.append(s)
        return {"machine": {"date_utc": "today", "command": "python -m benchmarks.cost_vllm"}, "wall_s": 1.0}

    monkeypatch.setattr(cost_vllm, "run", run)
    monkeypatch.setattr(cost_vllm, "markdown", lambda result: "the table")
    out = tmp_path / "r.json"
    cost_vllm.main(["--quick", "--lengths", "16", "24", "--rounds", "3", "--threads", "2", "--output", str(out)])
    (s,) = seen
    assert (s.lengths, s.train_rounds, s.threads, s.methods) == ((16, 24), 3, 2, cost_vllm.METHODS)
    assert s.hidden_size == cost_vllm.QUICK.hidden_size and s.device == "cpu"
    assert json.loads(out.read_text())["wall_s"] == 1.0 and "the table" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # its own flag is not among its options
        cost_vllm.main(["--vllm"])
    assert "unrecognized arguments: --vllm" in capsys.readouterr().err


def test_cost_vllm_spawns_its_children_through_child(tmp_path, monkeypatch):
    """`_spawn` runs `python -m benchmarks.cost_vllm --child SPEC`; that command line (run here, in this process)
    runs the spec's run and writes what `_spawn` reads back."""
    commands = []

    def subprocess_run(cmd, **kwargs):
        commands.append(cmd)
        assert cmd[:3] == [sys.executable, "-m", "benchmarks.cost_vllm"] and kwargs["cwd"] == cost_vllm.ROOT
        cost_vllm.main(cmd[3:])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def not_the_child(*args, **kwargs):
        raise AssertionError("--child ran the whole benchmark")

    monkeypatch.setattr(cost_vllm.subprocess, "run", subprocess_run)
    monkeypatch.setattr(cost_vllm, "run", not_the_child)
    monkeypatch.setattr(cost_vllm, "run_replayed", lambda s, length, out: {"length": length, "rounds": s.train_rounds,
                                                                            "out_dir": out})
    monkeypatch.setattr(cost_vllm, "run_one", lambda s, m, length, out: {"method": m, "length": length})
    s = cost_vllm.QUICK
    assert cost_vllm._spawn(s, None, 8)["rounds"] == s.train_rounds
    assert cost_vllm._spawn(s, "RPG(engine)", 16) == {"method": "RPG(engine)", "length": 16}
    assert [c[3] for c in commands] == ["--child", "--child"] and all(os.path.isabs(c[4]) for c in commands)


@pytest.mark.parametrize("module,levels,regime", [(asynchronous_tuned, "staleness", "regime_staleness"),
                                                  (learning_tuned, "reuse_levels", "regime_reuse")])
def test_a_tuned_command_runs_the_arms_and_levels_asked_for(module, levels, regime, tmp_path, monkeypatch):
    """`--methods`, `--levels`, `--regime-levels` (a regime curve of the baseline alone, as docs/benchmarks.md's
    asynchronous regime search ran) reach the settings the run gets; an arm the benchmark lacks is refused."""
    seen = {}

    def fake_run(s, json_path=None, previous=None):
        seen["s"] = s
        raise SystemExit(0)

    monkeypatch.setattr(module, "run", fake_run)
    baseline = module.DESIGN.baseline
    with pytest.raises(SystemExit):
        module.main(["--methods", baseline, "--levels", "1", "8", "--find-regime", "--regime-levels", "16", "96",
                     "--output", str(tmp_path / "r.json")])
    s = seen["s"]
    assert s.methods == (baseline,) and getattr(s, levels) == (1, 8) and getattr(s, regime) == (16, 96)
    assert s.find_regime
    with pytest.raises(SystemExit) as error:
        module.main(["--methods", "no such arm", "--output", str(tmp_path / "r.json")])
    assert error.value.code == 2


@pytest.mark.parametrize("module,levels", [(asynchronous_tuned, "staleness"), (learning_tuned, "reuse_levels")])
def test_a_resumed_results_file_grows_by_the_arms_and_levels_asked_for(module, levels, tmp_path, monkeypatch):
    """`--resume FILE --methods ... --levels ...`: the file's settings with those replaced, its runs handed on; without
    them the file's own; an arm the benchmark lacks is refused there too."""
    seen = {}

    def fake_run(s, json_path=None, previous=None):
        seen.update(s=s, previous=previous, json_path=json_path)
        raise SystemExit(0)

    monkeypatch.setattr(module, "run", fake_run)
    baseline, other = module.DESIGN.baseline, [m for m in module.DESIGN.regularised if m != module.DESIGN.baseline][0]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"settings": {"methods": [baseline], levels: [4], "workers": 1},
                                "runs": [{"phase": "tune", "method": baseline}]}))
    with pytest.raises(SystemExit):
        module.main(["--resume", str(path)])
    assert seen["s"].methods == (baseline,) and getattr(seen["s"], levels) == (4,)
    with pytest.raises(SystemExit):
        module.main(["--resume", str(path), "--methods", baseline, other, "--levels", "8", "2"])
    assert seen["s"].methods == (baseline, other) and getattr(seen["s"], levels) == (8, 2)
    assert seen["previous"]["runs"] == [{"phase": "tune", "method": baseline}] and seen["json_path"] == str(path)
    with pytest.raises(SystemExit) as error:
        module.main(["--resume", str(path), "--methods", "no such arm"])
    assert error.value.code == 2
