"""Adding a loss and adding an NLU evaluation task take the files docs/development.md lists, and nothing else.

Each test does it once for real, in a scratch copy of the repository (the files `git ls-files --cached --others
--exclude-standard` lists; the working tree is never touched), following the steps of docs/development.md ("Adding a
loss", "Adding an evaluation task"): it writes the files the page names, runs `python tools/generate.py` there, and
then, in a subprocess of this venv with the copy as working directory and `PYTHONPATH`, checks that the new loss or
task is everywhere the generator and the specs promise: `--check` passes, the functional API computes the formula,
the TRL config takes and refuses the option, the activation hooks know its name, the docs' tables list it, the copy's
own oracle tests pass; the task's lm-eval YAML is found by lm-eval's `TaskManager` and its OpenCompass config exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers.env import OFFLINE_ENV, REPO_ROOT

pytestmark = pytest.mark.slow

# ---------------------------------------------------------------------------------------------------------
# The scratch copy


#: Not part of a checkout's files (when the repository is itself a scratch copy without .git, e.g. `make mutants`').
_NOT_SOURCES = ("__pycache__", ".pytest_cache", ".ruff_cache", ".git")


def _repository_files() -> list[str]:
    """The files `git ls-files --cached --others --exclude-standard` lists, or, outside a git checkout, every file
    but caches and venvs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    if listed.returncode == 0 and (REPO_ROOT / ".git").exists():
        return list(filter(None, listed.stdout.decode().split("\0")))
    return [
        str(path.relative_to(REPO_ROOT))
        for path in REPO_ROOT.rglob("*")
        if path.is_file()
        and not any(
            part in _NOT_SOURCES or part.startswith(".venv") or part.endswith(".egg-info")
            for part in path.relative_to(REPO_ROOT).parts
        )
    ]


def _copy_repository(root: Path) -> Path:
    for rel in _repository_files():
        source = REPO_ROOT / rel
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, root / rel, follow_symlinks=False)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    """Replace `old`, which must occur exactly once in `path`, by `new`."""
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new), encoding="utf-8")


def _run(copy: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python *args` in the copy, with only the copy's packages importable (before the editable install's)."""
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(copy), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run(
        [sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
    )


def _pytest(copy: Path, *args: str, timeout: int) -> str:
    """The copy's own tests (`pytest -q *args` there): they must pass; their summary line."""
    tests = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, timeout=timeout)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    return tests.stdout.strip().splitlines()[-1]


def _generate(copy: Path) -> None:
    proc = _run(copy, "tools/generate.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = _run(copy, "tools/generate.py", "--check")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    return _copy_repository(tmp_path / "repo")


# ---------------------------------------------------------------------------------------------------------
# A loss: CE weighted by sg(p_y) ** power, power in (0, 1] (default 0.5), user option `toy_power`

TOY_MODULE = '''\
"""`toy`: CE weighted by sg(p_y) ** power (written by tests/project/test_extending.py in a scratch copy)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..spec import Param, option
from .ce_weighted import ce_weighted


def _power(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        return "a number in (0, 1]"
    return None


POWER = Param("power", 0.5, _power, "exponent of the detached weight sg(p_y) ** power")


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> Tensor:
    return torch.exp(-params["power"] * ce)  # p_y ** power


SPEC = ce_weighted(
    "toy",
    "sg(p_y) ** power * l (a toy loss)",
    weight,
    params=(POWER,),
    options=(option(POWER, "toy_power", "toy: the exponent of the weight sg(p_y) ** toy_power, in (0, 1]."),),
)
'''

TOY_ORACLE = """

@oracle_for("toy", {"power": 0.5})
def _toy(at: Point, cfg: Config) -> Formula:
    w = at.py ** float(cfg["power"])
    return Formula(w * at.ell, w[:, None] * (at.p - at.onehot))


@readable_for("toy")
def _toy_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return r.py.detach() ** cfg["power"] * r.ell


@surrogate_for("toy")
def _toy_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    power = float(cfg["power"])
    return -torch.exp(-power * s.ell) / power  # F'(l) = exp(-power l) = p_y ** power
"""

#: What the subprocess computes with the copy's packages (printed as JSON).
LOSS_PROBE = textwrap.dedent("""\
    import json, sys, tempfile
    import torch
    import distmatch_hooks._common as common
    from distmatch.errors import DistMatchConfigError
    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.losses import fused_token_loss, token_loss
    from trl_ext.options import loss_params

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 11, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, 11, (7,), generator=gen)
    labels[2] = -100
    hidden = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    head = torch.randn(11, 5, generator=gen, dtype=torch.float64)
    out = {
        "logits": logits.tolist(),
        "labels": labels.tolist(),
        "default": token_loss("toy", logits, labels, chunk_size=3).tolist(),
        "quarter": token_loss("toy", logits, labels, power=0.25).tolist(),
        "fused": fused_token_loss("toy", hidden, head, labels, power=0.25, chunk_size=4).tolist(),
        "fused_as_logits": token_loss("toy", hidden @ head.T, labels, power=0.25).tolist(),
        "hook_option_names": list(common.LOSS_OPTION_NAMES),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cpu = {"output_dir": tmp, "report_to": "none", "use_cpu": True, "bf16": False}
        config = DistMatchSFTConfig(loss="toy", toy_power=0.25, **cpu)
        out["config_options"] = config.loss_options()
        out["config_params"] = loss_params("toy", config.loss_options())
        for bad in (0.0, 1.5):
            try:
                DistMatchSFTConfig(loss="toy", toy_power=bad, **cpu)
                out[f"refused_{bad}"] = None
            except DistMatchConfigError as err:
                out[f"refused_{bad}"] = str(err)
    print(json.dumps(out, default=repr))
""")


def _toy_formula(logits: torch.Tensor, labels: torch.Tensor, power: float) -> torch.Tensor:
    """sg(p_y) ** power * (-log p_y), 0 at ignored rows, in float64."""
    valid = labels != -100
    log_p = torch.log_softmax(logits, dim=1)
    log_p_y = log_p.gather(1, torch.where(valid, labels, 0)[:, None]).squeeze(1)
    return torch.where(valid, torch.exp(power * log_p_y) * -log_p_y, 0.0)


def _add_toy_loss(copy: Path) -> None:
    """The steps of docs/development.md, "Adding a loss", one file each."""
    objectives = copy / "trl_ext" / "losses" / "objectives"
    (objectives / "toy.py").write_text(TOY_MODULE, encoding="utf-8")
    init = objectives / "__init__.py"
    _edit(init, "\n\nSPECS = (", "\nfrom . import toy\n\nSPECS = (")
    _edit(init, ",\n)\n", ",\n    toy.SPEC,\n)\n")
    oracles = copy / "tests" / "helpers" / "loss_oracles.py"
    oracles.write_text(oracles.read_text(encoding="utf-8") + TOY_ORACLE, encoding="utf-8")
    cases = copy / "tests" / "helpers" / "loss_cases.py"
    _edit(cases, "\nCONFIGS = [\n", '\nCONFIGS = [\n    ("toy", {}),\n    ("toy", {"power": 1.0}),\n')
    _edit(cases, "\nBASIC = [\n", '\nBASIC = [\n    ("toy", {}),\n')
    options = copy / "tests" / "helpers" / "option_cases.py"
    _edit(options, '    "ce": {},\n', '    "ce": {},\n    "toy": {"power": 0.5},\n')
    _edit(
        options,
        '    "gem_beta": ("gem_ls", "beta"),\n',
        '    "gem_beta": ("gem_ls", "beta"),\n    "toy_power": ("toy", "power"),\n',
    )
    _edit(
        options,
        "\nVALID: list[tuple[str, Any]] = [\n",
        '\nVALID: list[tuple[str, Any]] = [\n    ("toy_power", 1.0),\n',
    )
    _edit(
        options,
        "INVALID: list[tuple[str, Any]] = [\n",
        'INVALID: list[tuple[str, Any]] = [\n    ("toy_power", 0.0),\n    ("toy_power", 1.01),\n',
    )


def test_adding_a_loss_takes_the_documented_files(copy: Path) -> None:
    _add_toy_loss(copy)
    _generate(copy)

    proc = _run(copy, "-c", LOSS_PROBE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    logits = torch.tensor(out["logits"], dtype=torch.float64)
    labels = torch.tensor(out["labels"])
    assert (labels == -100).sum() == 1
    got = torch.tensor(out["default"], dtype=torch.float64)
    torch.testing.assert_close(got, _toy_formula(logits, labels, 0.5), rtol=1e-12, atol=1e-12)
    assert got[2] == 0.0
    quarter = torch.tensor(out["quarter"], dtype=torch.float64)
    torch.testing.assert_close(quarter, _toy_formula(logits, labels, 0.25), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(quarter, got)  # the option reaches the math
    torch.testing.assert_close(
        torch.tensor(out["fused"]), torch.tensor(out["fused_as_logits"]), rtol=1e-10, atol=1e-12
    )

    assert out["config_options"]["toy_power"] == 0.25
    assert out["config_params"] == {"power": 0.25}
    for bad in ("0.0", "1.5"):
        assert out[f"refused_{bad}"] is not None and "toy_power" in out[f"refused_{bad}"], out
    assert "toy_power" in out["hook_option_names"]

    page = (copy / "docs" / "losses.md").read_text(encoding="utf-8")
    for table in ("losses", "options"):
        block = page.split(f"<!-- {table}: generated by")[1].split(f"<!-- /{table} -->")[0]
        assert "`toy`" in block, table
    assert "`toy_power`" in page.split("<!-- options: generated by")[1]
    names = (copy / "distmatch" / "_loss_names.py").read_text(encoding="utf-8")
    assert '"toy"' in names and '"toy_power"' in names

    # The copy's own tests that demand a new loss's oracle, configs and option rows.
    summary = _pytest(
        copy,
        "tests/losses/test_oracle_registry.py",
        "tests/losses/test_oracle.py",
        "tests/losses/test_specs.py",
        "tests/hooks/test_hook_options.py",
        "-k",
        "oracle_registry or toy or configs_cover_every_loss or api_constants or share_the_closed_form "
        "or options_come_from_the_specs or option_table_covers",
        timeout=500,
    )
    passed = re.match(r"(\d+) passed", summary)
    assert passed and int(passed[1]) >= 30 and "failed" not in summary and "error" not in summary, summary


# ---------------------------------------------------------------------------------------------------------
# An NLU evaluation task: two-label topic classification

TOY_TASK = """\
        ClassificationSpec(
            key="toy_topic",
            path="example-org/toy_topic",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=("animals", "vehicles"),
            templates={
                "paper": _per_label('Text: "<X>" It is about {word}.', {"animals": "animals", "vehicles": "cars"}),
                "emo_code": _per_label("<X> It is about {word}.", {"animals": "animals", "vehicles": "cars"}),
            },
        ),
    )
}
"""

TASK_PROBE = textwrap.dedent("""\
    import json, tempfile
    from pathlib import Path
    from lm_eval.tasks import TaskManager
    from tests.helpers.eval_fixtures import write_eval_data

    manager = TaskManager(include_path="eval_tasks", include_defaults=False)
    with tempfile.TemporaryDirectory() as tmp:
        rows = (write_eval_data(Path(tmp)) / "toy_topic" / "test.jsonl").read_text().splitlines()
    print(json.dumps({
        "tasks": sorted(t for t in manager.all_tasks if t.startswith("distmatch")),
        "fixture_labels": sorted({json.loads(row)["label"] for row in rows}),
    }))
""")


def test_adding_an_evaluation_task_takes_the_documented_files(copy: Path) -> None:
    nlu = copy / "eval_tasks" / "nlu" / "nlu.py"
    _edit(nlu, "        ),\n    )\n}\n", "        ),\n" + TOY_TASK)
    labels = copy / "eval_tasks" / "report" / "labels.py"
    _edit(labels, '    "mmlu": "MMLU",\n}', '    "toy_topic": "Toy",\n    "mmlu": "MMLU",\n}')
    fixtures = copy / "tests" / "helpers" / "eval_fixtures.py"
    _edit(
        fixtures,
        "_TOPICS = {\n",
        '_TOPICS = {\n    "toy_topic": [("cat dog horse bird", "farm zoo"), ("car truck bus train", "road track")],\n',
    )
    _edit(fixtures, "extra fields)\n", 'extra fields)\n    "toy_topic": ("label", None),\n')
    verbalizers = copy / "tests" / "eval" / "test_label_names.py"
    _edit(
        verbalizers,
        "VERBALIZERS = {\n",
        'VERBALIZERS = {\n    "toy_topic": {"animals": ("animals",) * 2, "vehicles": ("cars",) * 2},\n',
    )
    rows = [{"label": 0, "label_text": "animals"}, {"label": 1, "label_text": "vehicles"}]
    (copy / "tests" / "eval" / "fixtures" / "dataset_labels" / "toy_topic.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
    )
    _generate(copy)

    task_yaml = copy / "eval_tasks" / "nlu" / "distmatch_toy_topic.yaml"
    assert "distmatch_task: toy_topic" in task_yaml.read_text(encoding="utf-8")
    group = (copy / "eval_tasks" / "nlu" / "distmatch_nlu.yaml").read_text(encoding="utf-8")
    assert "  - distmatch_toy_topic\n  - distmatch_mmlu\n" in group
    proc = _run(copy, "-c", TASK_PROBE)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert {"distmatch_toy_topic", "distmatch_sst2", "distmatch_nlu", "distmatch_icl"} <= set(
        found["tasks"]
    ), found
    assert found["fixture_labels"] == [0, 1]  # the offline data the harness tests run the whole suite on

    datasets = copy / "eval_tasks" / "opencompass_configs" / "datasets" / "distmatch"
    config = (datasets / "distmatch_toy_topic_topk_ppl.py").read_text(encoding="utf-8")
    assert 'task="toy_topic"' in config and "example-org/toy_topic" in config
    assert """'</E>Text: "{text}" It is about cars.',  # vehicles""" in config
    assert "_toy_topic" in (datasets / "distmatch_nlu_topk_ppl.py").read_text(encoding="utf-8")
    assert "distmatch_toy_topic" in (datasets / "distmatch_nlu_emo_code_topk_ppl.py").read_text(
        encoding="utf-8"
    )
    summarizer = copy / "eval_tasks" / "opencompass_configs" / "summarizers" / "distmatch_nlu.py"
    assert '"distmatch_toy_topic",' in summarizer.read_text(encoding="utf-8")

    # The copy's own tests that read the task table: the report's column titles, the label words, the fixture data.
    _pytest(
        copy,
        "tests/eval/test_report.py::test_nlu_columns_follow_the_task_table",
        "tests/eval/test_nlu.py::test_get_spec_by_short_or_task_name",
        "tests/eval/test_label_names.py",
        "-k",
        "toy_topic or fixtures_name or nlu_columns or get_spec",
        timeout=300,
    )
