"""The GPU check's processes (tools/gpu_check.py): each step's commands under `timeout` within one overall budget,
the kit's install into the folder every step imports from, and the environment line of the summary."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the training measurement, shared with benchmarks/bench_trl_training.py
    sys.path.append(str(BENCHMARKS))
import _training_probe as training_probe  # noqa: E402

# The install folder's first line says the check made it (`prepare_site` empties only such a folder). Its
# sitecustomize processes the folder's .pth files (the distmatch `trl sft` hook) and, in a training run, installs the
# training measurement (benchmarks/_training_probe.py; its folder leaves sys.path again once it is imported).
SITECUSTOMIZE = """\
# Written by tools/gpu_check.py: the kit folder's .pth files (the distmatch `trl sft` hook) and the training probe.
import os, site, sys
site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
if os.environ.get({probe_env!r}):
    sys.path.insert(0, {benchmarks!r})
    import _training_probe
    sys.path.remove({benchmarks!r})
    _training_probe.install_probe()
"""
TRL_LAUNCHER = "import sys\nfrom trl.cli import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n"


class Runner:
    """Runs the steps' commands under `timeout` within one overall deadline; records each one."""

    def __init__(self, out: Path, env: dict[str, str], budget_s: float) -> None:
        self.out, self.env, self.deadline = out, env, time.monotonic() + budget_s
        self.records: list[dict[str, Any]] = []

    def run(
        self, name: str, cmd: list[str], limit_s: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run `cmd` under `timeout` for at most `limit_s` (less when the budget has less left; not started when
        under 5 s are left: `skipped`); its output into logs/NAME.log. The record: status `ok` / `failed` /
        `timeout` / `skipped`, the exit status, seconds, the limit, and the log's tail when not ok."""
        left = self.deadline - time.monotonic() - 2
        record: dict[str, Any] = {"step": name, "command": " ".join(cmd)}
        if left < 5:
            record.update(status="skipped", note="no time left in the budget", seconds=0.0)
            self.records.append(record)
            return record
        limit = int(min(limit_s, left))
        log_path = self.out / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                ["timeout", "-k", "5", str(limit), *cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or self.env,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
            rc = proc.wait()
        try:  # what the step left behind (an accelerate launch's child after a timeout), by its process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "failed"
        seconds = round(time.monotonic() - start, 1)
        log = str(log_path.relative_to(self.out))
        record.update(status=status, rc=rc, seconds=seconds, limit_s=limit, log=log)
        if status != "ok":
            record["tail"] = log_path.read_text(errors="replace")[-1500:]
        self.records.append(record)
        return record


def launcher(site_dir: Path) -> Path:
    """The `trl` console script as TRL's wheel installs it; beside the target folder, not in it (a script's folder
    comes first on sys.path, and the working tree's distmatch must win over the kit's wheel)."""
    return site_dir.parent / f"{site_dir.name}-bin" / "trl"


def wheels_not_for_this_python(wheels: list[Path]) -> list[str]:
    """The wheels whose tags this interpreter does not accept (what pip would refuse as `not a supported wheel on
    this platform`): `make gpu-kit` builds for the GPU image's Python 3.12 / x86-64."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:
        try:
            from pip._vendor.packaging.tags import sys_tags
            from pip._vendor.packaging.utils import parse_wheel_filename
        except ImportError:  # no way to tell here: pip decides
            return []
    accepted = set(sys_tags())
    refused = []
    for wheel in wheels:
        try:
            tags = parse_wheel_filename(wheel.name)[3]
        except Exception:  # a name pip cannot read either: pip refuses it, in one line
            continue
        if not tags & accepted:
            refused.append(wheel.name)
    return refused


def pip_error(log: str) -> str:
    """pip's own reason, in one line: its first `ERROR:` line (else the last line it wrote)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR:")), lines[-1] if lines else "no output")


def install(
    kit: Path, site_dir: Path, runner: Runner, limit: float, skip: str | None = None
) -> dict[str, Any]:
    """The install plan: every kit wheel, --no-deps, into `site_dir`; the sitecustomize and the `trl` launcher.
    Only pip installs: wheels pip refuses are reported (one line) and never unpacked (a half-installed kit would
    shadow the environment's packages). `skip`: why nothing is installed (no kit, or a kit for another Python)."""
    site_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(kit.glob("*.whl")) if kit.is_dir() and not skip else []
    plan: dict[str, Any] = {"site": str(site_dir), "kit": str(kit), "wheels": [w.name for w in wheels]}
    if wheels:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        target = ["--disable-pip-version-check", "--upgrade", "--target", str(site_dir)]
        record = plan["record"] = runner.run("install", [*pip, *target, *map(str, wheels)], limit)
        if record["status"] == "failed":
            reason = pip_error(record.get("tail", "")).rstrip(".")
            record["note"] = f"pip refused the kit ({reason}): nothing installed"
            print(
                f"gpu_check: install: pip refused the kit {kit} ({reason}): nothing was installed, the steps use "
                "this environment's packages",
                file=sys.stderr,
                flush=True,
            )
    else:
        plan["skip"] = skip or f"no kit: no wheels in {kit}"
    sitecustomize = SITECUSTOMIZE.format(probe_env=training_probe.PROBE_ENV, benchmarks=str(BENCHMARKS))
    (site_dir / "sitecustomize.py").write_text(sitecustomize)
    launcher(site_dir).parent.mkdir(parents=True, exist_ok=True)
    launcher(site_dir).write_text(TRL_LAUNCHER)
    return plan


def environment(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The summary's environment line: the date, Python, the packages' versions and the device, as the steps'
    processes see them (`env`: their environment, the install folder on PYTHONPATH)."""
    # The dry run reads versions only (importing torch costs seconds); the GPU run asks torch for the card.
    probe = (
        "import json, importlib.metadata as m\n"
        f"torch = __import__('torch') if {not args.tiny} else None\n"
        "names = ['triton', 'transformers', 'trl', 'liger_kernel', 'cut_cross_entropy', 'datasets', 'distmatch', "
        "'peft', 'axolotl', 'lm_eval']\n"
        "def v(n):\n    try:\n        return m.version(n)\n    except Exception:\n        return None\n"
        "cuda = torch is not None and torch.cuda.is_available()\n"
        "print(json.dumps({'torch': torch.__version__ if torch else v('torch'), 'cuda': torch.version.cuda if torch "
        "else None, 'device_name': torch.cuda.get_device_name() if cuda else 'cpu', **{n: v(n) for n in names}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"torch": None}
    found.setdefault("device_name", args.device)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "executable": sys.executable,
        "host": platform.node(),
        **found,
    }
