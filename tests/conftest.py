import os
import sys

# Tiny models run fastest single-threaded (measured: thread start-up dominates their small matmuls); launched
# subprocesses (accelerate, torchrun) inherit the setting through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(__file__))  # test helpers such as _enumeration.py and _tiny.py


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory):
    """The toy task's default warmed-up model (the full warm-up, the longest build of the suite), built once per
    session and saved: `trl_rpg.toy.build_toy_model(toy_model_dir)` with the default settings loads it (its cache)."""
    from trl_rpg.toy import build_toy_model

    path = tmp_path_factory.mktemp("toy") / "toy-model"
    build_toy_model(path)
    return path


def pytest_collection_modifyitems(config, items):
    """The README's command runs the suite on two workers (pytest-xdist, `-n 2 --dist loadgroup`): the multi-process
    tests (marked `distributed`: they bind ports and each takes both cores) run one after another on one worker, and
    every other test file stays whole on one worker (its module fixtures built once). Without xdist: nothing."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        group = "multi-process" if item.get_closest_marker("distributed") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))

