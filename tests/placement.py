"""Where each test runs, in one table: for every test folder (and the files that differ from their folder), the venvs
whose `make test` step runs it, the markers it gets, whether it starts other programs, and why.

    python -m tests.placement        prints the table

How a venv picks its tests: each of the Makefile's `test-*` targets runs pytest in one venv with a marker expression
(`SELECTIONS` below; tests/project/test_placement.py fails when the Makefile's `pytest_run` calls say otherwise).
The markers come from this table: tests/conftest.py gives every test the markers of its longest matching row that
sets some (`FOLDER_MARKERS`), `launches` to the rows' `launches` paths and `launching_tests` (`LAUNCHING_PATHS`,
`LAUNCHING_TESTS`: `make test-quick` leaves them out, and tests/helpers/launches.py fails a test that starts a
program unmarked), and `one_stack` to the TRL command-line tests `.venv-axolotl` need not run again
(`ONE_STACK_TESTS`). Each row's `venvs` is what the selections give for its markers; the test above checks that
too, so the column cannot go stale. Which steps `make test` runs and their time budgets: the Makefile's
`TEST_STEPS` (tools/test_steps.py).

Adding a test (docs/development.md "How to add a test to the right venv"): put it in the folder of what it tests; a
new folder gets a row here; a file that needs another venv, or starts programs, gets a row of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

CORE, AXOLOTL, AXOLOTL_LATEST, OPENCOMPASS, SWIFT = (
    ".venv",
    ".venv-axolotl",
    ".venv-axolotl-latest",
    ".venv-opencompass",
    ".venv-swift",
)


@dataclass(frozen=True)
class Place:
    #: a folder or file under tests/ (POSIX); a test gets the markers of its longest matching row that sets some
    path: str
    #: the markers every test in it gets; None (files only): its folder's
    markers: tuple[str, ...] | None
    #: the venvs whose `make test` step runs it (what SELECTIONS give for these markers)
    venvs: tuple[str, ...]
    why: str
    #: every test in it starts other programs (itself or through its module / session fixtures)
    launches: bool = False
    #: single tests (function names) that start programs, in a file whose other tests start none
    launching_tests: tuple[str, ...] = ()


def _file(path: str, why: str, *tests: str, venvs: tuple[str, ...] = (CORE,)) -> Place:
    """A file of a folder's venv whose listed tests (all of them when none are listed) start other programs."""
    return Place(path, None, venvs, why, launches=not tests, launching_tests=tests)


PLACES: tuple[Place, ...] = (
    # --- the loss library and the TRL integration ----------------------------------------------------------------
    Place("losses", ("loss_library",), (CORE,), "pure torch: the same torch as .venv-axolotl's, run once"),
    _file(
        "losses/test_triton.py",
        "Triton is installed only in .venv-axolotl (its CPU interpreter); the H100 compile check runs ptxas",
        "test_kernel_compiles_for_an_h100_without_a_gpu",
        venvs=(CORE, AXOLOTL),
    ),
    Place(
        "losses/test_kernel_contract.py",
        None,
        (CORE, AXOLOTL),
        "the Triton kernel's contract: run where Triton is (.venv-axolotl) as well",
    ),
    Place(
        "losses/test_row_backends_contract.py",
        None,
        (CORE, AXOLOTL),
        "the row math's selection and the kernel's self-checks: run where Triton is (.venv-axolotl) as well",
    ),
    Place(
        "trl",
        ("trl_trainer",),
        (CORE, AXOLOTL),
        "real TRL SFTTrainer runs: on TRL of .venv and TRL 1.9 of Axolotl",
    ),
    Place(
        "trl/test_model_forward_scaling.py",
        (),
        (CORE,),
        "the patched forward on models built in code, no TRL trainer",
    ),
    Place(
        "trl/test_model_forward_heads.py",
        (),
        (CORE,),
        "the patched forward on models built in code, no TRL trainer",
    ),
    _file(
        "trl/test_emo_lm_recipes.py",
        "runs the recipes' scripts",
        "test_table1_recipe_dry_run_prints_accepted_commands",
        "test_table2_oracle_data_needs_its_files_then_runs_the_same_loop",
        venvs=(CORE, AXOLOTL),
    ),
    _file(
        "trl/test_options.py",
        "runs the options module as a program",
        "test_module_prints_the_loss_table_then_the_option_table",
        venvs=(CORE, AXOLOTL),
    ),
    _file(
        "trl/test_output_lock.py",
        "a second process holds or probes the lock",
        "test_another_process_is_refused_while_the_lock_is_held_and_free_after",
        "test_a_folder_another_process_holds_is_refused_in_one_line",
        venvs=(CORE, AXOLOTL),
    ),
    Place(
        "trl/cli",
        ("trl_cli",),
        (CORE, AXOLOTL),
        "`trl sft` / `distmatch-trl sft` from a wheel venv, on both TRL stacks (but ONE_STACK_TESTS: .venv only)",
        launches=True,
    ),
    # --- the frameworks' own venvs ----------------------------------------------------------------------------------
    Place(
        "axolotl",
        ("axolotl_env",),
        (AXOLOTL, AXOLOTL_LATEST),
        "imports Axolotl: both Axolotl venvs (0.19 and the newest)",
    ),
    _file("axolotl/test_activation_hook.py", "the real `axolotl train` CLI", venvs=(AXOLOTL, AXOLOTL_LATEST)),
    _file(
        "axolotl/test_documented_commands.py",
        "the documented `axolotl train` run",
        venvs=(AXOLOTL, AXOLOTL_LATEST),
    ),
    _file("axolotl/test_resume.py", "`axolotl train` runs and resumes", venvs=(AXOLOTL, AXOLOTL_LATEST)),
    _file(
        "axolotl/test_trainer.py", "training through Axolotl starts programs", venvs=(AXOLOTL, AXOLOTL_LATEST)
    ),
    Place(
        "eval/opencompass",
        ("opencompass_env",),
        (OPENCOMPASS,),
        "OpenCompass pins numpy<2 and transformers<5: its own venv",
        launches=True,
    ),
    Place("swift", ("swift_env",), (SWIFT,), "ms-swift pins trl<1.0: its own venv", launches=True),
    Place(
        "distributed",
        ("multiprocess",),
        (CORE,),
        "2-process DeepSpeed / DDP / FSDP2 launches (SKIP_MULTIPROCESS=1 leaves them out)",
        launches=True,
    ),
    # --- the rest runs in .venv ------------------------------------------------------------------------------------
    Place("distmatch", (), (CORE,), "the torch-free bottom layer"),
    _file(
        "distmatch/test_errors.py", "a fresh interpreter", "test_the_hook_prints_one_line_only_for_refusals"
    ),
    _file(
        "distmatch/test_optional.py",
        "a fresh interpreter",
        "test_importing_packages_does_not_import_optional_frameworks",
    ),
    Place("hooks", (), (CORE,), "the activation hooks"),
    _file("hooks/test_install_pth.py", "fresh interpreters read the written .pth files"),
    _file(
        "hooks/test_import_hook.py",
        "a fresh interpreter",
        "test_importing_a_hook_imports_only_the_standard_library",
    ),
    Place("eval", (), (CORE,), "the evaluation: lm-eval and the metrics are in .venv"),
    _file(
        "eval/test_cli.py",
        "`distmatch-eval` and a fresh interpreter",
        "test_console_script_is_declared_and_runs",
        "test_metrics_module_imports_without_heavy_dependencies",
    ),
    _file("eval/test_cli_input_files.py", "`distmatch-eval`", "test_the_console_command_refuses_in_one_line"),
    _file(
        "eval/test_code_tasks.py",
        "the sandbox runs the solutions",
        "test_canonical_solutions_pass_and_wrong_ones_fail",
        "test_plus_tests_catch_what_the_base_tests_miss",
    ),
    _file(
        "eval/test_documented_commands.py",
        "the documented commands",
        "test_documented_distmatch_eval_command_runs",
        "test_documented_recipe_dry_run_prints_accepted_commands",
    ),
    Place(
        "eval/lm_eval_tasks",
        (),
        (CORE,),
        "real `lm_eval` runs and the wheel venv (eval/lm_eval_tasks/conftest.py)",
        launches=True,
    ),
    Place(
        "eval/novelty", (), (CORE,), "NoveltyBench: its rules, tiny models built in code, lm-eval in-process"
    ),
    _file(
        "eval/novelty/test_novelty_tasks.py",
        "lm-eval's simple_evaluate runs `git describe`",
        "test_lm_eval_task_reports_the_rules_on_its_samples",
    ),
    Place("eval/sandbox", (), (CORE,), "the code sandbox (Linux namespaces: runs wherever .venv does)"),
    _file("eval/sandbox/test_contracts.py", "real programs in the sandbox"),
    _file("eval/sandbox/test_sandbox.py", "real attacks in the sandbox"),
    Place("benchmarks", (), (CORE,), "the benchmark scripts and the GPU check's CPU side"),
    _file("benchmarks/test_benchmarks.py", "the benchmark scripts in subprocesses"),
    _file(
        "benchmarks/test_gpu_check.py",
        "the GPU check's dry run",
        "test_cpu_dry_run_runs_every_step_and_writes_the_summary",
        "test_size_check_fails_with_one_clear_line",
    ),
    Place("demo", (), (CORE,), "`make demo`'s pipeline (its stack is .venv's)"),
    _file(
        "demo/test_demo.py", "the recipes' dry runs", "test_recipe_dry_run", "test_recipes_exist_and_parse"
    ),
    Place("project", (), (CORE,), "the repository's own rules: docs, Makefile, layout, tools"),
    _file("project/test_dist.py", "builds and installs the wheel"),
    _file("project/test_environments.py", "asks the framework venvs' interpreters"),
    _file("project/test_extending.py", "runs the generator and tests in a scratch copy"),
    _file("project/test_makefile_stamps.py", "runs make in a scratch folder"),
    _file("project/test_no_deps_install.py", "a bare venv"),
    _file("project/test_project_venvs.py", "the project's venvs' interpreters"),
    _file("project/test_suite_steps.py", "runs make and the step runner"),
    _file("project/test_warm_cli.py", "forks and starts commands"),
    _file(
        "project/test_placement.py",
        "collects a scratch copy's tests with pytest",
        "test_the_documented_recipe_puts_a_new_test_where_the_table_says",
    ),
    _file(
        "project/test_collection.py",
        "collects in a subprocess",
        "test_the_filter_selects_what_importing_every_module_selects",
    ),
    _file(
        "project/test_documented_commands.py",
        "`make -n`",
        "test_make_command_dry_runs",
        "test_make_dry_run_fails_on_an_unknown_target",
    ),
    _file(
        "project/test_generated.py",
        "the generator's check",
        "test_committed_configs_equal_what_the_generator_writes",
    ),
    _file(
        "project/test_import_cycles.py",
        "fresh interpreters",
        "test_bottom_layer_imports_no_framework",
        "test_every_eval_tasks_module_imports_alone",
    ),
    _file(
        "project/test_installer.py",
        "pip and uv",
        "test_pip_config_list_is_read_environment_first",
        "test_uv_installs_into_the_venv_it_is_given",
    ),
    _file(
        "project/test_mutants.py",
        "the mutation runner on a mini repository",
        "test_parallel_run_reports_caught_and_survived_and_leaves_the_tree_alone",
    ),
)


@dataclass(frozen=True)
class Selection:
    """One `pytest_run` of the Makefile: its target, venv, marker expression and paths (none: all of tests/)."""

    target: str
    venv: str
    markers: str
    paths: tuple[str, ...] = ()


NOT_ENV_MARKED = "not axolotl_env and not opencompass_env and not swift_env"
SELECTIONS: tuple[Selection, ...] = (
    Selection("test-quick", CORE, f"{NOT_ENV_MARKED} and not launches and not multiprocess"),
    Selection("test-core", CORE, NOT_ENV_MARKED),
    Selection("test-axolotl", AXOLOTL, "axolotl_env or trl_trainer or (trl_cli and not one_stack)"),
    Selection(
        "test-axolotl",
        AXOLOTL,
        "loss_library",
        (
            "tests/losses/test_triton.py",
            "tests/losses/test_kernel_contract.py",
            "tests/losses/test_row_backends_contract.py",
        ),
    ),
    Selection("test-axolotl-latest", AXOLOTL_LATEST, "axolotl_env"),
    Selection("test-opencompass", OPENCOMPASS, "opencompass_env"),
    Selection("test-swift", SWIFT, "swift_env", ("tests/swift",)),
)

# What tests/conftest.py reads.
FOLDER_MARKERS: dict[str, tuple[str, ...]] = {p.path: p.markers for p in PLACES if p.markers is not None}
LAUNCHING_PATHS: tuple[str, ...] = tuple(p.path for p in PLACES if p.launches)
LAUNCHING_TESTS: dict[str, tuple[str, ...]] = {p.path: p.launching_tests for p in PLACES if p.launching_tests}


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


def table() -> str:
    """The table as text: path, venvs, markers, launches, why."""
    rows = [("path under tests/", "venvs", "markers", "launches", "why")]
    for p in PLACES:
        markers = "(folder's)" if p.markers is None else " ".join(p.markers) or "-"
        launches = "all" if p.launches else ", ".join(p.launching_tests) and f"{len(p.launching_tests)} tests"
        rows.append((p.path, " ".join(p.venvs), markers, launches or "-", p.why))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows
    )


if __name__ == "__main__":
    print(table())
