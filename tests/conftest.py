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
    run and saved: `trl_rpg.toy.build_toy_model(toy_model_dir)` with the default settings loads it (its cache).
    Under pytest-xdist the workers share it: the first builds it, the others wait for it and load it."""
    from filelock import FileLock

    from trl_rpg.toy import build_toy_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder = root / "toy-shared"
    folder.mkdir(exist_ok=True)
    with FileLock(str(folder / ".lock")):
        build_toy_model(folder / "toy-model")
    return folder / "toy-model"


#: The multi-process tests (marked `distributed`: they bind ports and each takes both cores), by file and test function
#: ("*": the whole file). Under pytest-xdist (the README's `-n 2 --dist loadfile`) they are one scope, run one after
#: another on one worker; every other test file is a scope of its own, run whole on one worker (its module fixtures
#: built once). The collection refuses a `distributed` test missing here.
MULTI_PROCESS_TESTS = {
    "test_distributed.py": "*",
    "test_async_distributed.py": "*",
    "test_cli.py": {"test_two_processes_on_cpu_run_and_the_failing_ones_status_is_returned"},
    "test_cli_launcher.py": {
        "test_sigterm_or_sigint_to_the_launcher_of_two_processes_exits_143_or_130_without_a_traceback"},
    "test_dynamic_sampling.py": {"test_two_processes_stay_in_step"},
    "test_grpo_equivalence.py": {"test_ddp_two_processes_train_like_grpo"},
    "test_sampler_logps.py": {"test_two_processes_engine_trains_to_recompute_parameters"},
    "test_stuck_reward.py": {"test_a_reward_stuck_on_one_of_two_processes_ends_the_run_naming_it"},
    "test_vllm_generation.py": {"test_two_processes_each_engine_holds_the_policy_ddp",
                                "test_two_processes_each_engine_holds_the_policy_zero3"},
}


def xdist_scope(nodeid: str) -> str:
    """The scope of a test under `--dist loadfile`: "multi-process" for the tests above, else its file."""
    path, _, rest = nodeid.partition("::")
    listed = MULTI_PROCESS_TESTS.get(os.path.basename(path))
    name = rest.split("[", 1)[0].split("::")[-1]
    return "multi-process" if listed == "*" or (listed and name in listed) else path


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own choice; a hook of xdist only
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class MultiProcessFirst(OrderedDict):
        """The scopes waiting for a worker, the multi-process one first: the longest, and one test at a time."""

        def __setitem__(self, scope, tests):
            super().__setitem__(scope, tests)
            if scope == "multi-process":
                self.move_to_end(scope, last=False)

    class FilesAndMultiProcessTests(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = MultiProcessFirst()

        def _split_scope(self, nodeid):
            return xdist_scope(nodeid)

    return FilesAndMultiProcessTests(config, log)


def pytest_collection_modifyitems(config, items):
    """Every `distributed` test is listed in MULTI_PROCESS_TESTS (else two of them could run at once under xdist)."""
    for item in items:
        if item.get_closest_marker("distributed") and xdist_scope(item.nodeid) != "multi-process":
            raise pytest.UsageError(f"{item.nodeid} is marked distributed but not listed in MULTI_PROCESS_TESTS "
                                    "(tests/conftest.py)")
