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
    "test_process_exit.py": {"test_two_gloo_processes_that_end_their_processes_exit_0"},
    "test_sampler_logps.py": {"test_two_processes_engine_trains_to_recompute_parameters"},
    "test_stuck_reward.py": {"test_a_reward_stuck_on_one_of_two_processes_ends_the_run_naming_it"},
    "test_vllm_generation.py": {"test_two_processes_each_engine_holds_the_policy_ddp",
                                "test_two_processes_each_engine_holds_the_policy_zero3"},
}


#: The smoke subset (marked `smoke` at collection): what CI runs on the oldest and the newest versions pyproject.toml
#: admits (.ci/run) beside the full suite on the reviewed ones: the trainer, the drop-in, the CLI, checkpoints and
#: resume, the asynchronous trainer, the environment and the upgrade guard's verdict; by file and test function ("*":
#: the whole file), as MULTI_PROCESS_TESTS (whose tests stay out: `-m "smoke and not distributed"`).
SMOKE_TESTS = {
    "test_drop_in.py": "*", "test_compat.py": "*", "test_environment.py": "*", "test_cli_launcher.py": "*",
    "test_version_shims.py": "*",
    "test_trainer_loss.py": {"test_rpg_metrics_are_logged", "test_loss_type_keeps_its_aggregation_meaning"},
    "test_cli_runs.py": {"test_every_way_a_cli_run_ends_goes_through_trainer_end",
                         "test_an_error_raised_in_training_is_the_last_line_printed_with_the_reward_functions_line"},
    "test_checkpoints.py": {"test_manifest_lists_what_the_checkpoint_holds",
                            "test_a_missing_file_is_refused_naming_it",
                            "test_resume_true_falls_back_to_the_previous_complete_checkpoint"},
    "test_resume.py": {"test_lora_run_resumes_with_its_reference_adapter"},
    "test_async_trainer.py": {"test_beta_zero_trains_to_async_grpo_parameters", "test_model_card",
                              "test_the_upgrade_guard_covers_the_async_trainer"},
    "test_upgrade_check.py": {"test_a_passed_check_names_the_package_and_the_class_whose_code_changed_once_per_"
                              "installed_version", "test_a_method_gone_or_a_name_trl_takes_is_its_owners_package"},
}


def _listed_in(tests: dict, nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    listed = tests.get(os.path.basename(path))
    return listed == "*" or bool(listed and rest.split("[", 1)[0].split("::")[-1] in listed)


def xdist_scope(nodeid: str) -> str:
    """The scope of a test under `--dist loadfile`: "multi-process" for the tests above, else its file."""
    return "multi-process" if _listed_in(MULTI_PROCESS_TESTS, nodeid) else nodeid.partition("::")[0]


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
    """Every `distributed` test is listed in MULTI_PROCESS_TESTS (else two of them could run at once under xdist);
    the tests of SMOKE_TESTS are marked `smoke`."""
    for item in items:
        if _listed_in(SMOKE_TESTS, item.nodeid):
            item.add_marker(pytest.mark.smoke)
        if item.get_closest_marker("distributed") and xdist_scope(item.nodeid) != "multi-process":
            raise pytest.UsageError(f"{item.nodeid} is marked distributed but not listed in MULTI_PROCESS_TESTS "
                                    "(tests/conftest.py)")
