"""tests/helpers/warm_cli.py: a command forked from the warm interpreter ends as the same command started cold (exit
status, output, `sys.argv`, environment, working folder, `sys.excepthook`, `atexit`), and a difference is caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env
from tests.helpers.warm_cli import WarmCli

#: a console script of this interpreter; what it does depends on its first argument
SCRIPT = """#!{python}
import atexit, os, sys
sys.path.insert(0, {repo!r})
from distmatch.errors import DistMatchConfigError, print_config_errors_as_one_line

print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("WARM_TEST"), "main", __name__)
atexit.register(lambda: print("atexit ran"))
what = sys.argv[1]
if what == "exit3":
    sys.exit(3)
if what == "message":
    sys.exit("a message on stderr")
if what == "raise":
    raise ValueError("boom")
if what == "refuse":
    print_config_errors_as_one_line()
    raise DistMatchConfigError("gem_beta=0 is invalid")
"""


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> WarmCli:
    cli = WarmCli(Path(sys.executable), tmp_path_factory.mktemp("warm"), preload=("json",), hooked=("trl",))
    yield cli
    cli.close()


@pytest.fixture
def fresh(tmp_path: Path) -> WarmCli:
    """A warm interpreter of this test's own: its programs have not been checked against a cold start yet."""
    cli = WarmCli(Path(sys.executable), tmp_path, preload=("json",), hooked=("trl",))
    yield cli
    cli.close()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    from tests.helpers.env import REPO_ROOT

    path = tmp_path / "tool"
    path.write_text(SCRIPT.format(python=sys.executable, repo=str(REPO_ROOT)))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("what", "status", "in_stdout", "in_stderr"),
    [
        ("ok", 0, "atexit ran", ""),
        ("exit3", 3, "atexit ran", ""),
        ("message", 1, "argv ['message']", "a message on stderr"),
        ("raise", 1, "atexit ran", "ValueError: boom"),
        ("refuse", 2, "atexit ran", "error: gem_beta=0 is invalid"),
    ],
)
def test_a_warm_run_ends_as_a_cold_run(warm, script, tmp_path, what, status, in_stdout, in_stderr):
    folder = tmp_path / "work"
    folder.mkdir()
    hot = warm.run([script, what], folder, WARM_TEST="x")
    cold = subprocess.run(
        [str(script), what], cwd=folder, capture_output=True, text=True, env=cli_env(folder, WARM_TEST="x")
    )
    assert hot.returncode == cold.returncode == status, (hot, cold)
    assert f"cwd {folder} env x main __main__" in hot.stdout and in_stdout in hot.stdout, hot.stdout
    assert hot.stdout == cold.stdout and in_stderr in hot.stderr and in_stderr in cold.stderr, (hot, cold)
    if what == "refuse":
        assert (
            "Traceback" not in hot.stderr
            and hot.stderr.strip().splitlines()[-1] == "error: gem_beta=0 is invalid"
        )


def test_python_dash_m_and_dash_c(warm, tmp_path):
    hot = warm.run([sys.executable, "-c", "import sys; print(sys.argv); sys.exit(5)", "a"], tmp_path)
    assert (hot.returncode, hot.stdout.strip()) == (5, "['-c', 'a']")
    hot = warm.run([sys.executable, "-m", "json.tool", "--help"], tmp_path)
    assert hot.returncode == 0 and "json.tool" in hot.stdout


def test_a_difference_from_the_cold_start_fails(fresh, tmp_path):
    """The first command of each program also runs cold, and a program whose warm run differs fails the test that
    ran it (here the difference is what the warm interpreter preloaded)."""
    argv = [sys.executable, "-c", "import sys; sys.exit(4 if 'json' in sys.modules else 0)"]
    with pytest.raises(AssertionError, match="warm and cold runs of .* differ"):
        fresh.run(argv, tmp_path)


#: exits 2 and prints an `error:` line that names whether the warm interpreter's preload is there
SAYS_WHERE = "import sys; print('error: ' + ('warm' if 'json' in sys.modules else 'cold')); sys.exit(2)"


def test_the_same_status_with_other_error_lines_fails(fresh, tmp_path):
    with pytest.raises(AssertionError, match="warm and cold runs of .* differ"):
        fresh.run([sys.executable, "-c", SAYS_WHERE], tmp_path)


def test_each_dash_m_module_is_its_own_program(fresh, tmp_path):
    """`python -m A` agreeing with its cold start says nothing of `python -m B`: B is checked too."""
    (tmp_path / "says_where.py").write_text(SAYS_WHERE)
    first = fresh.run([sys.executable, "-m", "json.tool", str(tmp_path / "missing.json")], tmp_path)
    assert first.returncode != 0  # a refusal that agrees with its cold start
    with pytest.raises(AssertionError, match="warm and cold runs of .* -m says_where differ"):
        fresh.run([sys.executable, "-m", "says_where"], tmp_path)


def test_a_command_with_other_start_settings_runs_cold(fresh, tmp_path):
    """`PYTHONPATH` is read at interpreter start only: a command that sets it otherwise is not forked."""
    env = dict(cli_env(tmp_path), PYTHONPATH=str(tmp_path))
    out = fresh.run_in([sys.executable, "-c", SAYS_WHERE], tmp_path, env)
    assert (out.returncode, out.stdout.strip()) == (2, "error: cold")
