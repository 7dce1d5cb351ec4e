"""Shared pytest set-up: offline everything, the repository root, and the markers each test folder sets.

Every folder under tests/ is a package (`__init__.py`), so a test module is imported as `tests.<folder>.<name>` with
the repository root on sys.path: folder names (`trl`, `axolotl`) never shadow the installed packages, and two folders
may hold files of the same name. Shared helpers: `from tests.helpers.tiny_model import build_tiny_llama`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.helpers import launches
from tests.helpers.cli import WheelVenv, build_wheel_venv
from tests.helpers.collection import module_could_match
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT, extensions_dir
from tests.helpers.once import build_once
from tests.helpers.warm_cli import WarmCli

# Set before any test module imports transformers / datasets / axolotl: no network in tests.
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)
# One DeepSpeed op build per venv, shared by every launch of the run (tests/helpers/env.py).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())


# The markers each folder's tests carry (a path under tests/, folder or file; the longest match wins, so a file entry
# overrides its folder's). The Makefile picks each venv's tests by these markers (see pyproject.toml's marker list);
# `slow` and one-off marks stay on the modules and tests themselves.
FOLDER_MARKERS: dict[str, tuple[str, ...]] = {
    "axolotl": ("axolotl_env",),
    "distributed": ("multiprocess",),
    "losses": ("loss_library",),
    "eval/opencompass": ("opencompass_env",),
    "swift": ("swift_env",),
    "trl": ("trl_trainer",),
    "trl/cli": ("trl_cli",),
    # The patched forward on models built in code, no TRL trainer: not run again in .venv-axolotl.
    "trl/test_model_forward_scaling.py": (),
    "trl/test_model_forward_heads.py": (),
}
TESTS_DIR = Path(__file__).resolve().parent


def _relative(path: Path) -> str | None:
    """`path` relative to tests/ (POSIX form); None outside tests/."""
    try:
        return path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return None


def _listed(relative: str, keys: Iterable[str]) -> list[str]:
    """The keys (paths under tests/, folders or files) that are `relative` or a folder holding it."""
    return [key for key in keys if relative == key or relative.startswith(key + "/")]


def folder_markers(path: Path) -> tuple[str, ...]:
    """The FOLDER_MARKERS entry for a test file: its longest matching path under tests/ (none outside tests/)."""
    relative = _relative(path)
    if relative is None:
        return ()
    matches = _listed(relative, FOLDER_MARKERS)
    return FOLDER_MARKERS[max(matches, key=len)] if matches else ()


# `launches` (tests/helpers/launches.py): the folders and files whose tests start other programs, themselves or
# through their module / session fixtures (a training launch, `lm_eval`, the sandbox, a fresh venv, `make -n`) ...
LAUNCHING_PATHS = (
    "axolotl/test_activation_hook.py",
    "axolotl/test_documented_commands.py",
    "axolotl/test_resume.py",
    "axolotl/test_trainer.py",
    "benchmarks/test_benchmarks.py",
    "distributed",
    "eval/lm_eval_tasks",
    "eval/opencompass",
    "eval/sandbox/test_contracts.py",
    "eval/sandbox/test_sandbox.py",
    "hooks/test_install_pth.py",
    "project/test_dist.py",
    "project/test_environments.py",
    "project/test_extending.py",
    "project/test_makefile_stamps.py",
    "project/test_no_deps_install.py",
    "project/test_project_venvs.py",
    "project/test_suite_steps.py",
    "project/test_warm_cli.py",
    "swift",
    "trl/cli",
)
# ... and single tests (by function name) in files whose other tests start nothing.
LAUNCHING_TESTS: dict[str, tuple[str, ...]] = {
    "benchmarks/test_gpu_check.py": (
        "test_cpu_dry_run_runs_every_step_and_writes_the_summary",
        "test_size_check_fails_with_one_clear_line",
    ),
    "demo/test_demo.py": ("test_recipe_dry_run", "test_recipes_exist_and_parse"),
    "distmatch/test_errors.py": ("test_the_hook_prints_one_line_only_for_refusals",),
    "distmatch/test_optional.py": ("test_importing_packages_does_not_import_optional_frameworks",),
    "eval/test_cli.py": (
        "test_console_script_is_declared_and_runs",
        "test_metrics_module_imports_without_heavy_dependencies",
    ),
    "eval/test_cli_input_files.py": ("test_the_console_command_refuses_in_one_line",),
    "project/test_installer.py": (
        "test_pip_config_list_is_read_environment_first",
        "test_uv_installs_into_the_venv_it_is_given",
    ),
    "eval/test_code_tasks.py": (
        "test_canonical_solutions_pass_and_wrong_ones_fail",
        "test_plus_tests_catch_what_the_base_tests_miss",
    ),
    "eval/test_documented_commands.py": (
        "test_documented_distmatch_eval_command_runs",
        "test_documented_recipe_dry_run_prints_accepted_commands",
    ),
    "losses/test_triton.py": ("test_kernel_compiles_for_an_h100_without_a_gpu",),
    "hooks/test_import_hook.py": ("test_importing_a_hook_imports_only_the_standard_library",),
    "project/test_collection.py": ("test_the_filter_selects_what_importing_every_module_selects",),
    "project/test_generated.py": ("test_committed_configs_equal_what_the_generator_writes",),
    "project/test_documented_commands.py": (
        "test_make_command_dry_runs",
        "test_make_dry_run_fails_on_an_unknown_target",
    ),
    "project/test_import_cycles.py": (
        "test_bottom_layer_imports_no_framework",
        "test_every_eval_tasks_module_imports_alone",
    ),
    "project/test_mutants.py": ("test_parallel_run_reports_caught_and_survived_and_leaves_the_tree_alone",),
    "trl/test_emo_lm_recipes.py": (
        "test_table1_recipe_dry_run_prints_accepted_commands",
        "test_table2_oracle_data_needs_its_files_then_runs_the_same_loop",
    ),
    "trl/test_options.py": ("test_module_prints_the_loss_table_then_the_option_table",),
    "trl/test_output_lock.py": (
        "test_another_process_is_refused_while_the_lock_is_held_and_free_after",
        "test_a_folder_another_process_holds_is_refused_in_one_line",
    ),
}


#: the record check on resume that runs on TRL 1.9 (before TRL loads anything): the cover of most record tests
RESUME_REFUSED = "test_trl_resume.py::test_resume_with_another_loss_is_refused[trl]"


# `one_stack`: command-line tests run on .venv's TRL only, not again on .venv-axolotl's TRL 1.9. Most are message
# checks on a refusal path (our option, file and record checks, before TRL trains) that the named test runs on every
# TRL stack. A few train: each of those adds nothing TRL-specific beyond the named test (the reason is written next to
# it), so every TRL-facing path (the parser hook, training, saving, resuming) still runs on both stacks. Test name ->
# the test that covers its path on TRL 1.9.
ONE_STACK_TESTS: dict[str, dict[str, str]] = {
    "trl/cli/test_trl_sft.py": {
        "test_trl_sft_refuses_settings_that_would_train_something_else[option_of_another_loss]": "[option_without_loss]",
        "test_trl_sft_refuses_settings_that_would_train_something_else[cost_embedding_path]": "[option_without_loss]",
        "test_trl_sft_refuses_settings_that_would_train_something_else[reference_without_anchored_loss]": "[bad_beta]",
        "test_trl_sft_unknown_loss_lists_the_choices[yaml]": "test_trl_sft_yaml_loss_with_another_loss_type_is_refused",
        "test_damaged_cost_embedding_files_are_refused_before_loading[corrupt_header]": "[truncated]",
        "test_damaged_cost_embedding_files_are_refused_before_loading[missing_shard]": "[truncated]",
        "test_damaged_cost_embedding_files_are_refused_before_loading[config_not_json]": "[truncated]",
        "test_cost_embedding_with_another_vocabulary_is_refused_while_parsing[distmatch-trl]": "[trl]",
        "test_reference_with_another_vocabulary_is_refused_while_parsing": "test_cost_embedding_with_another_vocabulary_"
        "is_refused_while_parsing[trl]",
        # each rank runs the hook's one-process path; the two-process launch itself is checked on .venv's TRL
        "test_trl_sft_two_processes_through_the_hook": "test_trl_sft_loss_flags_through_the_hook",
    },
    # The whole module: the run record, its checks and the model card's history are distmatch's own (JSON beside the
    # checkpoint, checked while parsing, before TRL loads anything). The TRL-facing paths they ride on run on TRL 1.9
    # in the tests named: a record-based refusal on resume, training against a reference checkpoint, saving the record
    # and the card in every checkpoint, a resume that changes the loss, and `trl sft --loss` training.
    "trl/cli/test_trl_records.py": {
        "test_the_record_identifies_the_reference_by_path_and_weights": (
            "test_trl_sft.py::test_trl_sft_asft_with_another_checkpoint_as_the_reference"
        ),
        "test_a_relative_reference_that_is_another_model_on_resume_is_refused": RESUME_REFUSED,
        "test_a_newer_versions_unknown_option_is_refused": RESUME_REFUSED,
        "test_a_hand_edited_record_value_is_refused_naming_the_record[0]": RESUME_REFUSED,
        "test_a_hand_edited_record_value_is_refused_naming_the_record[abc]": RESUME_REFUSED,
        "test_a_resume_folder_that_is_no_checkpoint_is_refused_before_loading[model]": RESUME_REFUSED,
        "test_a_resume_folder_that_is_no_checkpoint_is_refused_before_loading[missing]": RESUME_REFUSED,
        "test_a_resume_folder_that_is_no_checkpoint_is_refused_before_loading[output]": RESUME_REFUSED,
        "test_a_new_run_into_a_recorded_folder_is_refused": RESUME_REFUSED,
        # `--overwrite_run` removes the old run's checkpoints before TRL starts; the run it then trains is the named one
        "test_overwrite_run_removes_the_old_runs_checkpoints": "test_trl_sft.py::test_trl_sft_loss_flags_through_the_hook",
        # the history and the card's section are ours; the resume that changes the loss trains on TRL 1.9 there
        "test_a_loss_change_keeps_the_history_in_the_record_and_the_card": (
            "test_trl_resume.py::test_resume_with_allow_loss_change_trains_the_new_loss"
        ),
        **{
            f"test_a_reference_folder_without_complete_weights_is_refused_while_parsing[{damage}-{option}]": (
                "test_trl_sft.py::test_damaged_cost_embedding_files_are_refused_before_loading[truncated]"
            )
            for damage in ("no_weights", "truncated")
            for option in ("anchor_reference", "emo_cost_embedding")
        },
        **{
            f"test_options_that_train_nothing_or_overflow_are_refused[{case}]": (
                "test_trl_sft.py::test_trl_sft_refuses_settings_that_would_train_something_else[bad_beta]"
            )
            for case in ("equal_p_bounds", "prob_q_overflow", "kl_weight_overflow")
        },
    },
    "trl/cli/test_trl_resume.py": {
        "test_resume_with_another_loss_is_refused[distmatch-trl]": "[trl]",
        # the same trainer resumes; `distmatch-trl`'s parser runs on TRL 1.9 in test_distmatch_trl_without_the_hook
        "test_resume_without_loss_continues_with_the_recorded_loss[distmatch-trl]": "[trl]",
        "test_resume_with_other_options_is_refused": "test_resume_with_another_loss_is_refused[trl]",
    },
    "trl/cli/test_offline_example.py": {
        "test_a_data_file_as_dataset_name_is_refused_before_launch": "(the example's own check, before TRL: no TRL path)",
        # the example's data and printed command are ours; `trl sft --loss` trains on TRL 1.9 in the named test
        "test_the_printed_trl_command_trains_on_cpu": "test_trl_sft.py::test_trl_sft_loss_flags_through_the_hook",
    },
    "trl/cli/test_trl_faults.py": {
        # the output lock is distmatch's own (flock, TRL-free: tests/trl/test_output_lock.py runs on both), and the
        # resume from a complete checkpoint runs on TRL 1.9 in the named test; the disk-full test (our override of
        # transformers' private _save_checkpoint) runs on both
        "test_second_run_into_a_busy_folder_is_refused_and_kill9_then_resume_continues": (
            "test_trl_resume.py::test_resume_without_loss_continues_with_the_recorded_loss[trl]"
        ),
    },
}


def launches_marked(path: Path, name: str) -> bool:
    """Whether the test `name` (its function's name) in `path` is listed as starting other programs."""
    relative = _relative(path)
    if relative is None:
        return False
    return bool(_listed(relative, LAUNCHING_PATHS)) or name in LAUNCHING_TESTS.get(relative, ())


# The longest modules (minutes each: multi-process runs, many `trl sft` / `lm_eval` launches) are handed out first, so
# that pytest-xdist's two workers do not end with one of them running alone (`--dist loadscope` keeps a module on one
# worker and hands modules out in collection order). Order only: every module still runs all its tests in its order.
SLOW_MODULES_FIRST = (
    "trl/cli/test_trl_sft.py",
    "distributed/test_trl_distributed.py",
    "benchmarks/test_benchmarks.py",
    "trl/cli/test_trl_faults.py",
    "trl/cli/test_trl_resume.py",
    "eval/lm_eval_tasks/test_preflight.py",
    "distributed/test_zero3_fused.py",
    "axolotl/test_trainer.py",
    "axolotl/test_plugin.py",
    "axolotl/test_resume.py",
    "demo/test_demo.py",
    "distributed/test_fsdp2.py",
    "project/test_project_venvs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        relative = _relative(item.path)
        return (
            SLOW_MODULES_FIRST.index(relative) if relative in SLOW_MODULES_FIRST else len(SLOW_MODULES_FIRST)
        )

    items.sort(key=rank)  # stable: the order within a module, and of the other modules, is kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module, and the libraries they import, is loaded now and lives until the end: `gc.freeze()` takes
    these objects out of the cyclic collector's scans. The frameworks call `gc.collect()` often inside a training run
    (Axolotl's packing sampler for every batch plan, accelerate when it clears the device cache), and in a pytest
    process holding torch, transformers, TRL, Axolotl and lm-eval each call took about 0.45 s: three quarters of an
    in-process Axolotl training test. Nothing is skipped: what the tests create is collected as before; only the
    objects alive at this point are taken as alive for good."""
    gc.collect()
    gc.freeze()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave a test module unimported when none of its tests can match `-m` (tests/helpers/collection.py): each
    venv's run then imports only the frameworks of the tests it runs."""
    markexpr = config.getoption("markexpr")
    # DISTMATCH_COLLECT_ALL=1 imports every module (tests/project/test_collection.py compares the two).
    if not markexpr or os.environ.get("DISTMATCH_COLLECT_ALL") == "1":
        return None
    relative = _relative(collection_path)
    if relative is None or not (relative.endswith(".py") and collection_path.name.startswith("test_")):
        return None
    launching = bool(_listed(relative, LAUNCHING_PATHS))
    certain = set(folder_markers(collection_path)) | ({launches.MARKER} if launching else set())
    # The marks pytest_itemcollected adds to single tests.
    possible = {launches.MARKER} if relative in LAUNCHING_TESTS else set()
    possible |= {"one_stack"} if relative in ONE_STACK_TESTS else set()
    return None if module_could_match(collection_path, markexpr, certain, possible) else True


def pytest_itemcollected(item: pytest.Item) -> None:
    for name in folder_markers(item.path):
        item.add_marker(name)
    if launches_marked(item.path, getattr(item, "originalname", item.name)):
        item.add_marker(launches.MARKER)
    if item.name in ONE_STACK_TESTS.get(_relative(item.path) or "", {}):
        item.add_marker("one_stack")


# `launches`: a test that starts another program must carry the marker (tests/helpers/launches.py); with
# DISTMATCH_RECORD_LAUNCHES=<file> the run lists the launching tests there instead of failing them.
launches.install()
_RECORD_LAUNCHES = os.environ.get("DISTMATCH_RECORD_LAUNCHES")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    launches.start(item.nodeid)
    try:
        yield
    finally:
        launches.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    command = launches.launched.get(item.nodeid)
    if call.when != "teardown" or command is None or _RECORD_LAUNCHES or not report.passed:
        return
    if item.get_closest_marker(launches.MARKER) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a program ({command}) without the `{launches.MARKER}` marker: give it the "
            "marker (tests/conftest.py LAUNCHING_PATHS / LAUNCHING_TESTS, or @pytest.mark.launches) so that "
            "`make test-quick` leaves it out"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _RECORD_LAUNCHES:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        lines = "".join(f"{nodeid}\t{command}\n" for nodeid, command in sorted(launches.launched.items()))
        Path(f"{_RECORD_LAUNCHES}.{worker}").write_text(lines)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """Our wheel installed in a fresh venv (built once per test run, shared by the xdist workers; the TRL CLI and
    distributed tests use it)."""
    return build_once(tmp_path_factory, "wheel", build_wheel_venv)


@pytest.fixture(scope="session")
def warm_cli(wheel_venv: WheelVenv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmCli]:
    """`run_cli` for the refusal tests of the wheel venv's commands, forked from a warm interpreter
    (tests/helpers/warm_cli.py: each program's first command also runs cold, and the two must agree)."""
    cli = WarmCli(wheel_venv.python, tmp_path_factory.mktemp("warm_cli"))
    yield cli
    cli.close()
