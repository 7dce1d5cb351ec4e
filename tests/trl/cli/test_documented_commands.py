"""Every `trl sft` / `distmatch-trl sft` command shown in README.md and docs/ is accepted by our parser and checks.

The commands come from tests/helpers/doc_commands.py (family "trl") and are parsed exactly as `distmatch-trl sft` and
the `trl sft` hook parse them (TRL's parser over `DistMatchSFTConfig`, then `check_parsed`): a documented command that
would be refused (an option of another loss, a loss with another `loss_type`, ...) fails here. Model and data stay as
written: parsing reads no weights, and a hub id is not fetched (its vocabulary is then unknown); `--use_cpu` is added to
the commands marked `# needs: gpu` only (this machine has no GPU): any other must parse on a CPU machine as written.
Training them needs the hub (each says so: `# needs: ...`); the tiny end-to-end runs are in test_trl_sft.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT

COMMANDS = commands_of("trl")


def test_the_pages_show_sft_commands() -> None:
    """The reader (and this test) would notice if the examples vanished or stopped being shell blocks."""
    assert any(c.page == "README.md" for c in COMMANDS), ids(COMMANDS)
    assert any(c.page == "docs/trl.md" for c in COMMANDS), ids(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_command_is_accepted(command: DocCommand, monkeypatch) -> None:
    from trl_ext.cli import check_parsed, make_sft_parser

    monkeypatch.chdir(REPO_ROOT)  # `--config examples/...` as a reader in the repository runs it
    where, argv = command.where, command.program_argv
    program = " ".join(argv[:2])  # trl sft | distmatch-trl sft
    # + `--use_cpu` for a GPU command: transformers refuses bf16 (TRL's default, the recipes' `bf16: true`) on a
    # machine without a GPU while parsing. A command not marked `gpu` must say `--use_cpu` itself.
    argv = [*argv[2:], *(["--use_cpu", "true"] if "gpu" in command.needs else [])]
    parser = make_sft_parser(prog=program)
    try:
        parsed = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except SystemExit as err:  # argparse's refusal
        pytest.fail(f"{where}: `{command.text}` is refused by the parser (exit {err.code})")
    check_parsed(parsed[:4])
    training = parsed[1]
    assert training.output_dir, where
