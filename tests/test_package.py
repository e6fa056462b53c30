"""The package as a user installs it: the sdist and the wheel built from it carry LICENSE and NOTICE, the bundled
AIME/AMC data and the accelerate configs; installed in a clean virtual environment, `trl-rpg demo` runs and
`--accelerate_config deepspeed_zero3` resolves to the config inside the installed package.

How the clean environment is made without copying torch (GBs): `python -m venv --without-pip` gives an interpreter
whose site-packages holds only the installed wheel (pip from this environment installs into it with `--python`);
a `.pth` file there appends this environment's site-packages to `sys.path` as a plain directory, so the dependencies
(torch, TRL, ...) import from it, while its `.pth` files, among them the editable install's finder that maps
`trl_rpg` to the checkout, are not executed (Python runs `.pth` files only in site directories). `trl_rpg` therefore
imports from the wheel, which the test checks (`trl_rpg.__file__`). The source is copied to a temporary folder
first, so the build writes nothing into the checkout. About 15 s on 2 cores: the builds take ~5 s, the demo (20
warm-up steps, 2 RPG steps) ~10 s.
"""

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "accelerate_configs").glob("*.yaml"))
DATA = sorted(p.name for p in (ROOT / "trl_rpg" / "data").glob("*.parquet"))


def _run(cmd, cwd, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
                       OMP_NUM_THREADS="1", **env)
    proc = subprocess.run(cmd, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist built from a copy of the source, the wheel built from the sdist (as pip builds one from PyPI), and
    a clean virtual environment with the wheel installed."""
    root = tmp_path_factory.mktemp("package")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "accelerate_configs", src / "accelerate_configs")
    shutil.copytree(ROOT / "trl_rpg", src / "trl_rpg", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    dist = root / "dist"
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"], src)
    (sdist,) = dist.glob("trl_rpg-*.tar.gz")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(sdist)], root)
    (wheel,) = dist.glob("trl_rpg-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        root).stdout.strip())
    (purelib / "_dependencies_from_the_test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
          str(wheel)], root)
    return {"root": root, "sdist": sdist, "wheel": wheel, "venv": venv, "purelib": purelib}


def test_the_sdist_carries_license_notice_data_and_configs(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        notice = tar.extractfile(f"{built['sdist'].name[:-len('.tar.gz')]}/NOTICE").read().decode()
    assert {"LICENSE", "NOTICE", "pyproject.toml"} <= names
    assert {f"trl_rpg/data/{name}" for name in DATA} <= names
    assert {f"trl_rpg/accelerate_configs/{name}" for name in CONFIGS} <= names
    assert notice == (ROOT / "NOTICE").read_text()


def test_the_wheel_carries_license_notice_data_and_configs(built):
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = set(whl.namelist())
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        metadata = whl.read(f"{info}/METADATA").decode()
        license_text = whl.read(f"{info}/licenses/LICENSE").decode()
        data = {name: whl.read(f"trl_rpg/data/{name}") for name in DATA}
    assert f"{info}/licenses/NOTICE" in names and "Apache License" in license_text
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata and "License-File: NOTICE" in metadata
    assert DATA == ["aime-2024.parquet", "aime25.parquet", "amc-23.parquet"]
    assert all(content == (ROOT / "trl_rpg" / "data" / name).read_bytes() for name, content in data.items())
    assert {f"trl_rpg/accelerate_configs/{name}" for name in CONFIGS} <= names and len(CONFIGS) >= 8


def test_the_installed_wheel_runs_the_demo_and_finds_its_own_configs(built):
    """`trl-rpg demo --max_steps 2` from the clean environment's console script (the cheapest settings: 20 warm-up
    steps, no evaluation between steps); its exit status is the demo's rule (0 unless accuracy fell)."""
    elsewhere = built["root"] / "elsewhere"
    elsewhere.mkdir()
    code = ("import trl_rpg, trl_rpg.cli as cli; print(trl_rpg.__file__); "
            "print(cli.resolve_accelerate_config(['--accelerate_config', 'deepspeed_zero3'])[1])")
    package, config = _run([str(built["venv"] / "bin" / "python"), "-c", code], elsewhere).stdout.split()[-2:]
    assert Path(package).is_relative_to(built["purelib"])
    assert Path(config) == built["purelib"] / "trl_rpg" / "accelerate_configs" / "deepspeed_zero3.yaml"

    out = elsewhere / "demo"
    script = built["venv"] / "bin" / "trl-rpg"
    assert script.read_text().startswith(f"#!{built['venv'] / 'bin' / 'python'}")
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([str(script), "demo", "--max_steps", "2", "--sft_steps", "20", "--eval_every", "0",
                           "--output_dir", str(out)], cwd=elsewhere, env=environment, capture_output=True, text=True,
                          timeout=600, check=False)
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else None
    assert metrics is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == (0 if metrics["accuracy_after"] >= metrics["accuracy_before"] else 1), proc.stderr
    assert metrics["max_steps"] == 2 and "[4/4] held-out accuracy after RPG" in proc.stdout
    assert {"model.safetensors", "config.json", "tokenizer.json", "curves.png", "README.md"} <= {
        p.name for p in out.iterdir()}


def test_citation_file_cites_the_paper_as_the_model_card_does_and_this_version():
    import re

    import yaml

    from trl_rpg import __version__
    from trl_rpg.trainers.model_card import RPG_PAPER

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    paper = cff["preferred-citation"]
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "Apache-2.0" and cff["version"] == __version__
    assert re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1) == __version__
    assert paper["title"] == RPG_PAPER["title"] and paper["year"] == 2026
    assert f"arXiv:{RPG_PAPER['id']}" in {i["value"] for i in paper["identifiers"]}
    names = " and ".join(f"{a['given-names']} {a['family-names']}" for a in paper["authors"])
    assert f"author       = {{{names}}}" in RPG_PAPER["citation"]
