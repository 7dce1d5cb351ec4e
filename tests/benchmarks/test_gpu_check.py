"""The GPU kit and check (tools/gpu_kit.py, tools/gpu_check.sh; docs/benchmarks.md "The GPU check") on the CPU.

`make gpu-kit` needs PyPI, so here: its plan (what is carried beside the image), its wheels and its size check.
The check's arguments and its kit's install, then the check itself as a CPU dry run (`--device cpu`, tiny shapes)
with a one-wheel kit whose `.pth` file proves that the install plan's target folder is what every child process of
every step imports from. Its summary, training measurement and table: test_gpu_check_summary.py,
test_gpu_check_training.py, test_gpu_check_table.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

COMMANDS = commands_of("gpu-check")
AXOLOTL_RUNS = ["axolotl_ce", "axolotl_gem_ls"]  # the dry run's (tools/gpu_check_axolotl.py)


def _tool(name: str) -> ModuleType:
    return load_module(f"distmatch_tool_{name}", REPO_ROOT / "tools" / f"{name}.py")


def _module(name: str) -> ModuleType:
    """A module of the GPU check, imported as tools/gpu_check.py imports it (tools/ on sys.path)."""
    _tool("gpu_check")
    return importlib.import_module(name)


# ---------------------------------------------------------------------------------------------------------------
# make gpu-kit


def test_kit_carries_what_the_image_lacks_or_holds_at_another_version() -> None:
    kit = _tool("gpu_kit")
    image = {
        "torch": "2.11.0+image",
        "transformers": "5.17.0",
        "numpy": "2.5.5",
        "fsspec": "2026.9.0",
        "huggingface-hub": "1.33.0",
    }
    full = {
        **image,
        "triton": "3.6.0+image",
        "nvidia-cublas-cu13": "13.0",
        "cuda-bindings": "13.0",
        "trl": "1.16.0",
        "fsspec": "2026.8.0",  # datasets asks for another version than the image's: carried, it shadows the image's
    }
    want = {
        "fsspec": "2026.8.0",
        "huggingface-hub": "1.33.0",
        "trl": "1.16.0",
    }  # the hub client: always carried
    assert kit.kit_plan(image, full) == want


def test_stub_wheel_is_a_wheel_pip_reads(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    wheel = kit.write_wheel(tmp_path, "torch", "2.11.0+image", {"a.py": "x = 1\n"}, requires=("jinja2",))
    assert wheel.name == "torch-2.11.0+image-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("torch-2.11.0+image.dist-info/METADATA").decode()
        record = zf.read("torch-2.11.0+image.dist-info/RECORD").decode()
    assert "Version: 2.11.0+image" in meta and "Requires-Dist: jinja2" in meta
    assert record.startswith("a.py,sha256=")


def test_size_check_fails_with_one_clear_line(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * 2**20)
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=48)
    assert ok and line.startswith("gpu-kit size: wheels 1.0 MiB + working tree ") and line.endswith(": fits")
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=1)
    assert not ok and "limit 1 MiB (carry limit 64 MiB): TOO BIG" in line


# ---------------------------------------------------------------------------------------------------------------
# tools/gpu_check.py: its arguments and the kit's install


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_gpu_check_command_is_accepted(command: DocCommand) -> None:
    """Every `tools/gpu_check.sh ...` of the docs passes the driver's parser (the script hands it its arguments)."""
    check = _tool("gpu_check")
    argv = command.program_argv
    assert argv[0].endswith("tools/gpu_check.sh"), command.where
    check.parse_args(argv[1:])


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    check = _tool("gpu_check")
    assert check.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: "), (
        captured
    )
    return captured.err


REFUSALS = [
    (["--budget", "nan"], "--budget nan: a positive number"),
    (["--budget", "inf"], "--budget inf: a positive number"),
    (["--budget", "0"], "--budget 0.0: a positive number"),
    (["--budget", "-5"], "--budget -5.0: a positive number"),
    (["--budget", "soon"], "--budget: invalid float value"),
    (["--run-limit", "nan"], "--run-limit nan: a positive number"),
    (["--train-steps", "1"], "--train-steps 1: at least 2"),
    (["--steps", ""], "--steps is empty: a comma list of memory,train,axolotl,lm_eval,triton,parity,bench"),
    (["--steps", ","], "--steps is empty"),
    (["--steps", "train", "--runs", ""], "--runs is empty: a comma list of trl,"),
    (["--steps", "triton,nope"], "unknown step or run: nope (steps: memory,"),
    (["--runs", "trl,gem"], "unknown step or run: gem"),
    (["--device", "mps"], "--device 'mps': cuda, cuda:N (the GPU run) or cpu (the dry run) is accepted"),
    (["--out", "{file}/out"], "--out {file}/out: not a folder this user can write (Not a directory)"),
    (["--scratch", "{file}/s"], "--scratch {file}/s: not a folder this user can write"),
    (
        ["--kit", "{tmp}/no-kit"],
        "--kit {tmp}/no-kit: no such folder; the folder of `make gpu-kit`'s wheels",
    ),
    (["--kit", "{tmp}/empty"], "--kit {tmp}/empty: no *.whl in it"),
    (["--site", "{tmp}/home"], "--site {tmp}/home: not empty and not made by tools/gpu_check.py"),
]


@pytest.mark.parametrize(("extra", "named"), REFUSALS, ids=[" ".join(extra) for extra, _ in REFUSALS])
def test_bad_arguments_are_refused_in_one_line_before_any_work(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kit = _tool("gpu_kit")
    kit.write_wheel(tmp_path / "kit", "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    (tmp_path / "empty").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine\n")
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    fill = {"tmp": str(tmp_path), "file": str(tmp_path / "file")}
    folders = {
        "out": out,
        "site": tmp_path / "site",
        "scratch": tmp_path / "scratch",
        "kit": tmp_path / "kit",
    }
    argv = ["--device", "cpu", "--steps", "triton", *(f"--{name}={path}" for name, path in folders.items())]
    err = _refusal(argv + [word.format(**fill) for word in extra], capsys)
    assert named.format(**fill) in err
    assert not out.exists() or not list(out.iterdir())  # nothing ran, nothing written
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine\n"


def test_a_kit_for_another_python_is_refused_on_the_gpu_and_left_uninstalled_on_the_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make gpu-kit` builds for the image's Python 3.12: on another Python pip refuses such wheels, and nothing of
    them may be unpacked (the probe found a half-unpacked kit shadowing the venv's huggingface_hub)."""
    check, kit, runner = _tool("gpu_check"), _tool("gpu_kit"), _module("gpu_check_runner")
    verdicts = _module("gpu_check_verdicts")
    other = "cp312" if sys.version_info[:2] != (3, 12) else "cp311"
    wheels = tmp_path / "kit"
    pure = kit.write_wheel(wheels, "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    foreign = pure.with_name(f"compiled_pkg-1.0-{other}-{other}-manylinux_2_28_x86_64.whl")
    foreign.write_bytes(pure.read_bytes())
    assert check.wheels_not_for_this_python([pure, foreign]) == [foreign.name]
    args = check.parse_args(["--device", "cpu", "--kit", str(wheels)])
    found, skip = check.resolve_kit(args)
    assert found == wheels and skip.startswith(
        "not installed: the kit is for another Python: 1 of its 2 wheels"
    )
    assert foreign.name in skip
    argv = ["--kit", str(wheels), "--out", str(tmp_path / "out"), "--site", str(tmp_path / "site")]
    err = _refusal(argv, capsys)
    assert f"--kit {wheels}: 1 of its 2 wheels ({foreign.name}, ...) are not for Python" in err
    # Nothing to install: the install folder gets only the check's own files, never a wheel's.
    plan = runner.install(wheels, tmp_path / "site", runner.Runner(tmp_path, {}, 10), 10, skip)
    assert verdicts.install_verdict(plan) == skip and plan["wheels"] == []
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["sitecustomize.py"]


def test_without_the_default_kit_the_check_warns_and_says_so_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `make gpu-kit` yet: not refused (the dry run uses the environment's packages), but warned before any work
    and never an `ok` install in the summary."""
    check, runner, summary = _tool("gpu_check"), _module("gpu_check_runner"), _module("gpu_check_summary")
    table = _module("gpu_check_table")
    missing = tmp_path / "build" / "gpu-kit" / "wheels"
    monkeypatch.setattr(check, "DEFAULT_KIT", missing)
    folders = {"out": tmp_path / "out", "site": tmp_path / "site", "scratch": tmp_path / "scratch"}
    args = check.parse_args(["--device", "cpu", *(f"--{k}={v}" for k, v in folders.items())])
    kit, skip = check.preflight(args)
    assert kit == missing and skip == f"no kit: {missing} is missing (`make gpu-kit`)"
    assert (
        capsys.readouterr().err == f"gpu_check: warning: {skip}; the steps use this environment's packages\n"
    )
    plan = runner.install(kit, args.site, runner.Runner(args.out, {}, 10), 10, skip)
    (install,) = [step for step in table.STEPS if step.name == "install"]  # its verdict as the table reads it
    plan["verdict"] = install.verdict(plan, args.device)
    environment = {
        "date": "2026-11-29 04:25 UTC",
        "device_name": "cpu",
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
    }
    result = {"mode": "dry run", "environment": environment, "records": [], "install": plan}
    text = summary.summary_markdown(result, table.STEPS)
    assert f"| install | {skip} | the steps use this environment's packages |" in text
    assert summary.outcome(result, table.STEPS) == ([], [f"install ({skip})"])


def test_the_install_folder_is_emptied_when_the_check_made_it(tmp_path: Path) -> None:
    """An earlier run's kit never shadows this run's packages: a folder with the check's sitecustomize is emptied;
    any other non-empty folder is refused (test_bad_arguments_...)."""
    check = _tool("gpu_check")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(check.SITECUSTOMIZE.format(probe_env="X", benchmarks="/b"))
    (site / "huggingface_hub").mkdir()
    (site / "huggingface_hub" / "__init__.py").write_text("import httpx\n")
    check.prepare_site(site)
    assert site.is_dir() and not list(site.iterdir()) and (tmp_path / "site-bin").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# The CPU dry run


DRY_RUN = next(c for c in COMMANDS if "--device cpu" in c.text)


def _fresh_shell(**extra: str) -> dict[str, str]:
    """A new shell's environment: no PYTHON, no venv active or on PATH."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    return {**env, "PATH": "/usr/local/bin:/usr/bin:/bin", **extra}


def _with_out(argv: list[str], out: Path) -> list[str]:
    i = argv.index("--out")
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]


@pytest.mark.slow  # real processes: `trl sft` launches, the parity trainer, pytest, the benchmarks, pip
def test_cpu_dry_run_runs_every_step_and_writes_the_summary(tmp_path: Path) -> None:
    """The documented dry run, as written, from a fresh shell (no PYTHON, no venv on PATH): it picks the repository's
    .venv, runs every step and the CPU's default runs, and exits 0. Its output folder is the test's; the install and
    scratch folders too (their defaults are shared /tmp folders), and its kit is one wheel whose `.pth` file proves
    that every step's processes import from the install folder. Then a kit pip refuses, and an interpreter
    without torch, in one line each."""
    kit, table, verdicts = _tool("gpu_kit"), _module("gpu_check_table"), _module("gpu_check_verdicts")
    wheels = tmp_path / "kit"
    marks = tmp_path / "marks"
    marks.mkdir()
    module = "import os, pathlib\np = os.environ.get('GPU_CHECK_TEST_MARKS')\nif p:\n    pathlib.Path(p, str(os.getpid())).touch()\n"
    files = {"gpu_check_probe.py": module, "gpu_check_probe.pth": "import gpu_check_probe\n"}
    kit.write_wheel(wheels, "gpu-check-probe", "1.0", files)
    out, site = tmp_path / "out", tmp_path / "site"
    isolated = ["--site", str(site), "--kit", str(wheels), "--scratch", str(tmp_path / "scratch")]
    assert DRY_RUN.program_argv[:3] == ["tools/gpu_check.sh", "--device", "cpu"], DRY_RUN.where
    done = subprocess.run(
        [*_with_out(DRY_RUN.program_argv, out), *isolated],
        cwd=REPO_ROOT,
        env=_fresh_shell(GPU_CHECK_TEST_MARKS=str(marks)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "summary.json").read_text())
    assert result["environment"]["executable"] == str(REPO_ROOT / ".venv" / "bin" / "python")
    steps = [r["step"] for r in result["records"]]
    runs = [run.name for run in table.RUNS.values() if run.cpu_default]
    assert runs == ["trl", "gem_ls", "gem_ls_lora"]
    # Axolotl runs in .venv-axolotl (Axolotl and TRL 1.16 share no venv here); without it the step is not run.
    axolotl = AXOLOTL_RUNS if (REPO_ROOT / ".venv-axolotl" / "bin" / "python").is_file() else []
    trained_steps = [*(f"train_{r}" for r in runs), *axolotl, "lm_eval_assets", "lm_eval"]
    assert steps == ["install", "memory", "build", *trained_steps, "triton", "parity", "bench"]
    assert result["install"]["wheels"] == ["gpu_check_probe-1.0-py3-none-any.whl"]
    assert result["install"]["verdict"] == "ok"
    assert (site / "gpu_check_probe.py").is_file() and (site / "sitecustomize.py").is_file()
    # Every step's processes imported from the target folder: its .pth ran in each (the steps, the launch's child).
    assert len(list(marks.iterdir())) >= len(steps) + 2
    triton = result["triton"]
    counts = triton["counts"]
    assert counts["tests"] > 0 and counts["passed"] + counts["skipped"] == counts["tests"]
    assert triton["verdict"] == verdicts.triton_verdict("ok", counts, triton["skips"], "cpu")
    if importlib.util.find_spec("triton") is None:  # .venv: the kernel tests skip, so the step is no pass
        assert triton["verdict"] == f"partial: {counts['passed']} passed, {counts['skipped']} skipped"
        assert any("Triton is not installed" in why for why in triton["skips"])
        assert f"triton ({triton['verdict']})" in done.stderr.splitlines()[-1]
    assert (
        result["bench"]["rows"] == 2 and result["bench"]["errors"] == 0 and result["bench"]["verdict"] == "ok"
    )
    assert result["memory"]["rows"] == 6 and result["memory"]["errors"] == 0  # 2 settings x ce, gem_ls, emo
    trained = result["train"]["runs"]
    assert (
        list(trained) == runs and result["train"]["verdict"] == "ok" and result["train"]["baseline"] == "ok"
    )
    assert trained["trl"]["trainer_class"] == "SFTTrainer" and trained["trl"]["speed_ratio"] == 1.0
    run = trained["gem_ls"]
    assert run["trainer_class"] == "DistMatchSFTTrainer" and run["tokens_per_s"] > 0 and run["peak_mib"] > 0
    assert run["speed_ratio"] == pytest.approx(run["tokens_per_s"] / trained["trl"]["tokens_per_s"])
    assert run["memory_ratio"] == pytest.approx(run["peak_mib"] / trained["trl"]["peak_mib"])
    assert run["timed_steps"] == 2  # 3 steps, the first untimed
    lora = trained["gem_ls_lora"]  # the same loss with the LoRA adapter (r 16): only the adapter trains
    assert lora["trainer_class"] == "DistMatchSFTTrainer" and lora["tokens_per_s"] > 0
    assert 0 < lora["trainable_params"] < run["trainable_params"] / 10
    # The goals (GPU goal 2) are against TRL+Liger, which needs a GPU: each reads not measured, never met.
    goals = {g["run"]: g["verdict"] for g in result["train"]["goals"]}
    assert goals == {
        "gem_ls": "not measured (no trl_liger run)",
        "gem_ls_lora": "not measured (no trl_liger_lora run)",
    }
    assert (
        run["finished"]
        and "partial" not in run
        and 0 < run["trainer_ready_after_s"] < run["first_step_after_s"]
    )
    assert result["parity"]["ok"] and result["parity"]["grad_rel_err_max"] < 1e-4
    # Axolotl (GPU goal 3): Axolotl's CE and our plugin's gem_ls through `axolotl train`, sample packing.
    if axolotl:
        part = result["axolotl"]
        assert list(part["runs"]) == AXOLOTL_RUNS and part["verdict"] == "ok" and part["baseline"] == "ok"
        assert part["runs"]["axolotl_ce"]["trainer_class"] == "AxolotlTrainer"
        assert part["runs"]["axolotl_gem_ls"]["trainer_class"] == "DistMatchTrainer"
        assert (
            part["runs"]["axolotl_gem_ls"]["tokens_per_s"] > 0
            and part["runs"]["axolotl_gem_ls"]["peak_mib"] > 0
        )
        (goal,) = part["goals"]
        assert goal["verdict"] == "not measured (no axolotl_liger run)"
    else:
        assert result["axolotl"]["verdict"].startswith("not run: ")
    # lm-eval (GPU goal 4): the three tasks on the gem_ls run's checkpoint, from the local data, batched.
    evaluated = result["lm_eval"]
    assert evaluated["verdict"] == "ok" and Path(evaluated["model"]).name == "gem_ls"
    assert {task: t["items"] for task, t in evaluated["tasks"].items()} == {
        "distmatch_sst2": 2,
        "distmatch_poem_diversity": 2,
        "distmatch_humaneval": 2,
    }
    assert "pass@1" in evaluated["tasks"]["distmatch_humaneval"]["metrics"]
    assert {"ngram_diversity", "sbert_diversity"} <= set(
        evaluated["tasks"]["distmatch_poem_diversity"]["metrics"]
    )
    assert evaluated["items"] == 6 and evaluated["s_per_item"] == pytest.approx(evaluated["seconds"] / 6)
    # The model and the runs' output folders stay in the scratch folder.
    assert not list(out.rglob("*.safetensors"))
    summary = (out / "summary.md").read_text()
    assert summary == done.stdout
    assert "| parity | pass |" in summary and "| gem_ls | DistMatchSFTTrainer |" in summary
    assert (
        "| gem_ls_lora | trl_liger_lora | n/a | n/a | >= 1x tokens/s | not measured (no trl_liger_lora run) |"
        in summary
    )
    assert "| bench | exit 0 |" in summary and "| bench | ok | 2 rows, 0 with an error |" in summary
    assert "## Results" in summary  # the loss benchmark's own table
    assert "| lm_eval | ok | 6 items, " in summary and "| distmatch_humaneval | 2 | pass@1 " in summary
    assert "| gem_ls | accum-weight (float32, weight, default) |" in summary  # the memory settings' table

    # A kit pip refuses (one wheel of it broken): pip's reason in one line, nothing unpacked (the earlier run's
    # install emptied, the good wheel not installed either), the steps run on the environment's packages, exit 1.
    kit.write_wheel(tmp_path / "bad-kit", "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    (tmp_path / "bad-kit" / "zz_broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    out2 = tmp_path / "out2"
    folders = ["--out", str(out2), "--site", str(site), "--kit", str(tmp_path / "bad-kit")]
    done = subprocess.run(
        [
            "tools/gpu_check.sh",
            "--device",
            "cpu",
            "--steps",
            "triton",
            *folders,
            "--scratch",
            str(tmp_path / "scratch"),
        ],
        cwd=REPO_ROOT,
        env=_fresh_shell(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    refused = [line for line in done.stderr.splitlines() if line.startswith("gpu_check: install:")]
    assert len(refused) == 1 and "ERROR: Wheel 'zz-broken' located at" in refused[0], done.stderr
    assert refused[0].startswith(
        f"gpu_check: install: pip refused the kit {tmp_path / 'bad-kit'} (ERROR: Wheel"
    )
    assert refused[0].endswith(
        "is invalid): nothing was installed, the steps use this environment's packages"
    )
    assert {p.name for p in site.iterdir()} - {"__pycache__"} == {"sitecustomize.py"}
    assert not list(site.rglob("*probe*"))
    result = json.loads((out2 / "summary.json").read_text())
    assert result["install"]["verdict"].startswith(
        "failed: pip refused the kit (ERROR: Wheel 'zz-broken' located"
    )
    assert result["triton"]["counts"]["tests"] == counts["tests"]  # the environment still imports
    assert done.stderr.splitlines()[-1].startswith(
        "gpu_check: failed: install (failed: pip refused the kit (ERROR"
    )
    assert "| install | exit 1 |" in done.stdout

    # An interpreter without torch (the system's python3 in a fresh shell): one line saying what to set.
    python3 = "/usr/bin/python3"
    has_no_torch = "import importlib.util as u; print(u.find_spec('torch') is None)"
    bare = subprocess.run([python3, "-c", has_no_torch], capture_output=True, text=True)
    if bare.stdout.strip() == "True":
        done = subprocess.run(
            ["tools/gpu_check.sh", "--device", "cpu", "--out", str(tmp_path / "out3")],
            cwd=REPO_ROOT,
            env=_fresh_shell(PYTHON=python3),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == (
            f"error: this Python ({python3}) has no torch: set PYTHON to an interpreter with torch "
            "(tools/gpu_check.sh uses the repository's .venv when PYTHON is unset, python3 without one)\n"
        )
        assert not (tmp_path / "out3").exists()
