"""Everything `tools/generate.py` writes is up to date, and `--check` can fail.

From the task table `eval_tasks/nlu/nlu.py`: the per-task lm-eval YAMLs, the group `distmatch_nlu.yaml`, the OpenCompass
`*_topk_ppl.py` files, the two suites and the two summarizers (what the files *do* is tested by
tests/eval/lm_eval_tasks/ and tests/eval/opencompass/test_configs.py). From the loss specs: the torch-free
`distmatch/_loss_names.py` the activation hooks read, the two tables of docs/losses.md and the lists of all loss
names in the pages (`tools/loss_outputs.py`). `--check` compares the committed files with what the tool would write;
here it runs on the repository (the CI check) and on edited copies under `--root` (it must name what differs).
"""

from __future__ import annotations

import ast
import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval_tasks.code import code_tasks
from eval_tasks.nlu import nlu
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

REPO = REPO_ROOT
SCRIPT = REPO / "tools" / "generate.py"
HEADER = "by `python tools/generate.py`"
LM_EVAL = Path("eval_tasks/lm_eval_tasks")
NLU = Path("eval_tasks/nlu")  # the generated YAMLs sit in their family packages
CODE = Path("eval_tasks/code")
DATASETS = Path("eval_tasks/opencompass_configs/datasets/distmatch")
SUMMARIZERS = Path("eval_tasks/opencompass_configs/summarizers")
NAMES_MODULE = Path("distmatch/_loss_names.py")
LOSSES_PAGE = Path("docs/losses.md")
#: The hand-written files that hold generated blocks (the tool rewrites the blocks, never creates the files).
PAGES = {
    LOSSES_PAGE,
    Path("README.md"),
    Path("docs/trl.md"),
    Path("docs/axolotl.md"),
    Path("examples/axolotl/tiny-cpu.yaml"),
    Path("docs/evaluation.md"),
    Path("eval_tasks/lm_eval_tasks/README.md"),
}


def _generate(*args: str) -> subprocess.CompletedProcess:
    """`python tools/generate.py ARGS`: its main() in this process (the command line itself runs in
    test_committed_configs_equal_what_the_generator_writes), with its exit status and output."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = load_module("distmatch_tool_generate", SCRIPT).main(list(args))
    return subprocess.CompletedProcess([str(SCRIPT), *args], status, stdout.getvalue(), stderr.getvalue())


def _generated_names() -> set[Path]:
    icl = [spec.task for spec in nlu.ICL_TASKS.values()]
    return {
        *(NLU / f"{task}.yaml" for task in icl),
        NLU / "distmatch_nlu.yaml",
        *(CODE / f"{spec.task}.yaml" for spec in code_tasks.CODE_TASKS.values()),
        *(DATASETS / f"{task}_topk_ppl.py" for task in icl),
        DATASETS / "distmatch_nlu_topk_ppl.py",
        DATASETS / "distmatch_nlu_emo_code_topk_ppl.py",
        SUMMARIZERS / "distmatch_nlu.py",
        SUMMARIZERS / "distmatch_nlu_emo_code.py",
    }


def _family_folders() -> list[Path]:
    """The folders that hold lm-eval task YAMLs (the family packages; each may hold generated and hand-written
    YAMLs)."""
    return sorted({p.parent.relative_to(REPO) for p in (REPO / "eval_tasks").rglob("*.yaml")})


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        return f.readline()


def _copy_pages(root: Path) -> None:
    """The hand-written pages in a scratch root (the generator writes their blocks, not the pages)."""
    for rel in PAGES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)


@pytest.fixture(scope="module")
def generated_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch root with the pages and everything the tool writes into it."""
    root = tmp_path_factory.mktemp("generated")
    _copy_pages(root)
    proc = _generate("--root", str(root))
    assert proc.returncode == 0, proc.stderr
    return root


def _fresh_copy(generated_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(generated_root, root)
    return root


def test_committed_configs_equal_what_the_generator_writes() -> None:
    """The CI check, as a command line."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == proc.stderr == ""


def test_generated_files_carry_the_header_and_the_rest_is_hand_written() -> None:
    """Exactly the files of the table carry the "generated" header; MMLU, IFEval and creative writing do not."""
    marked = {
        path.relative_to(REPO)
        for folder in (LM_EVAL, *_family_folders(), DATASETS, SUMMARIZERS)
        for path in (REPO / folder).iterdir()
        if path.is_file() and HEADER in _first_line(path)
    }
    assert marked == _generated_names()
    assert len(marked) == 2 * len(nlu.ICL_TASKS) + 5 + len(code_tasks.CODE_TASKS)
    assert HEADER in _first_line(REPO / NAMES_MODULE)


def test_check_names_the_file_that_differs(generated_root: Path, tmp_path: Path) -> None:
    tmp_path = _fresh_copy(generated_root, tmp_path)
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == _generated_names() | {NAMES_MODULE} | PAGES
    assert _generate("--check", "--root", str(tmp_path)).returncode == 0
    for rel in written:  # the generated copy equals the committed files
        assert (tmp_path / rel).read_text(encoding="utf-8") == (REPO / rel).read_text(encoding="utf-8"), rel

    edited = tmp_path / DATASETS / "distmatch_sst2_topk_ppl.py"
    edited.write_text(edited.read_text(encoding="utf-8").replace("It is positive.", "It is great."))
    (tmp_path / NLU / "distmatch_trec.yaml").unlink()
    proc = _generate("--check", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert f"{DATASETS / 'distmatch_sst2_topk_ppl.py'}: differs from what the generator writes" in proc.stderr
    assert f"{NLU / 'distmatch_trec.yaml'}: missing" in proc.stderr
    assert proc.stderr.count("\n  ") == 2  # those two, nothing else
    assert edited.read_text(encoding="utf-8").count("It is great.") == 1  # --check writes nothing


def test_check_reports_a_generated_file_whose_task_left_the_table(
    generated_root: Path, tmp_path: Path
) -> None:
    tmp_path = _fresh_copy(generated_root, tmp_path)
    shutil.copy(tmp_path / NLU / "distmatch_cr.yaml", tmp_path / NLU / "distmatch_gone.yaml")
    (tmp_path / NLU / "_icl_template_yaml").write_text("# hand-written\n")  # not generated: ignored
    proc = _generate("--check", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert f"{NLU / 'distmatch_gone.yaml'}: generated, but its task is not in the table" in proc.stderr
    assert "_icl_template_yaml" not in proc.stderr
    proc = _generate("--root", str(tmp_path))  # writing removes it
    assert proc.returncode == 0 and not (tmp_path / NLU / "distmatch_gone.yaml").exists()
    assert (tmp_path / NLU / "_icl_template_yaml").exists()
    assert _generate("--check", "--root", str(tmp_path)).returncode == 0


def test_task_lists_come_from_the_table() -> None:
    from eval_tasks.lm_eval_tasks import NLU_TASKS

    assert NLU_TASKS == nlu.NLU_TASK_NAMES == (*(f"distmatch_{k}" for k in nlu.ICL_TASKS), "distmatch_mmlu")


# ---------------------------------------------------------------------------------------------------------
# What is derived from the loss specs


def test_stale_docs_table_and_names_module_are_reported_and_rewritten(
    generated_root: Path, tmp_path: Path
) -> None:
    """A hand edit of a generated table, of the names module or of a loss list is named by --check and undone."""
    root = _fresh_copy(generated_root, tmp_path)
    page = root / LOSSES_PAGE
    page.write_text(page.read_text(encoding="utf-8").replace("| `eaft_k` | 20 |", "| `eaft_k` | 10 |"))
    names = root / NAMES_MODULE
    names.write_text(names.read_text(encoding="utf-8").replace('    "eaft_k",\n', ""))
    trl = root / "docs" / "trl.md"
    trl.write_text(trl.read_text(encoding="utf-8").replace("`dft`, `eaft`", "`dft`"))
    proc = _generate("--check", "--root", str(root))
    assert proc.returncode == 1
    for rel in (LOSSES_PAGE, NAMES_MODULE, Path("docs/trl.md")):
        assert f"{rel}: differs from what the generator writes" in proc.stderr
    assert proc.stderr.count("\n  ") == 3
    assert "| `eaft_k` | 10 |" in page.read_text(encoding="utf-8")  # --check writes nothing
    assert _generate("--root", str(root)).returncode == 0
    for rel in (LOSSES_PAGE, NAMES_MODULE, Path("docs/trl.md")):
        assert (root / rel).read_text(encoding="utf-8") == (REPO / rel).read_text(encoding="utf-8"), rel


def test_a_page_that_lost_its_block_is_an_error_not_skipped(generated_root: Path, tmp_path: Path) -> None:
    root = _fresh_copy(generated_root, tmp_path)
    page = root / LOSSES_PAGE
    page.write_text(page.read_text(encoding="utf-8").replace("<!-- /options -->", "<!-- end -->"))
    (root / "README.md").unlink()
    example = root / "examples" / "axolotl" / "tiny-cpu.yaml"
    example.write_text(example.read_text(encoding="utf-8").replace("# others: ", "# or: "))
    for args in (("--check",), ()):  # writing cannot repair them either
        proc = _generate(*args, "--root", str(root))
        assert proc.returncode == 1
        assert f"{LOSSES_PAGE}: no generated `options` block" in proc.stderr
        assert "README.md: missing (a hand-written page" in proc.stderr
        assert "examples/axolotl/tiny-cpu.yaml: no list of the losses" in proc.stderr
        assert proc.stderr.count("\n  ") == 3
    assert not (root / "README.md").exists()


def test_the_retrieval_task_lists_follow_the_table(generated_root: Path, tmp_path: Path) -> None:
    """The evaluation page's list of the retrieval tasks and the lm-eval README's count come from the task table: a
    task dropped from the list, or a wrong count, is named by --check and rewritten."""
    icl = [spec.task for spec in nlu.ICL_TASKS.values()]
    listed = ", ".join(f"`{task}`" for task in icl) + " (tag `distmatch_icl`)"
    assert f"| {listed} |" in (REPO / "docs/evaluation.md").read_text(encoding="utf-8")
    readme = (REPO / LM_EVAL / "README.md").read_text(encoding="utf-8")
    assert f"* `distmatch_icl`: the {len(icl)} retrieval tasks.\n" in readme
    assert f"* `distmatch_nlu`: the EMO suite, the {len(icl)} retrieval tasks and `distmatch_mmlu`" in readme
    assert (
        f"| group `distmatch_nlu` | the {len(icl) + 1} tasks above |"
        in (REPO / "docs/evaluation.md").read_text()
    )
    root = _fresh_copy(generated_root, tmp_path)
    page = root / "docs" / "evaluation.md"
    page.write_text(page.read_text(encoding="utf-8").replace("`distmatch_rt`, ", ""))
    folder = root / LM_EVAL / "README.md"
    folder.write_text(
        folder.read_text(encoding="utf-8").replace(f"the {len(icl)} retrieval", "the 6 retrieval")
    )
    proc = _generate("--check", "--root", str(root))
    assert proc.returncode == 1 and proc.stderr.count("\n  ") == 2
    assert _generate("--root", str(root)).returncode == 0
    for rel in (Path("docs/evaluation.md"), LM_EVAL / "README.md"):
        assert (root / rel).read_text(encoding="utf-8") == (REPO / rel).read_text(encoding="utf-8"), rel


def test_names_module_is_the_registry_and_imports_nothing() -> None:
    """The hooks' option names are the specs' (the module is torch-free: it imports nothing at all)."""
    import distmatch._loss_names as names
    import distmatch_hooks._common as common
    from trl_ext.losses import LOSS_NAMES
    from trl_ext.options import LOSS_OPTIONS
    from trl_ext.resume import ALLOW_CHANGE, OVERWRITE

    assert names.LOSS_NAMES == tuple(LOSS_NAMES)
    assert names.LOSS_OPTION_NAMES == tuple(o.name for o in LOSS_OPTIONS)
    assert names.RUN_OPTION_NAMES == (ALLOW_CHANGE, OVERWRITE)
    assert common.LOSS_OPTION_NAMES is names.LOSS_OPTION_NAMES
    assert common.RUN_OPTION_NAMES is names.RUN_OPTION_NAMES
    tree = ast.parse((REPO / NAMES_MODULE).read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_pages_list_every_loss() -> None:
    """Each generated list names all the losses, in the registry's order."""
    from trl_ext.losses import LOSS_NAMES

    plain = ", ".join(LOSS_NAMES)
    for rel in ("README.md", "docs/axolotl.md"):
        assert f"# {plain}\n" in (REPO / rel).read_text(encoding="utf-8"), rel
    assert f"# others: {plain}.\n" in (REPO / "examples/axolotl/tiny-cpu.yaml").read_text(encoding="utf-8")
    code = ", ".join(f"`{name}`" for name in LOSS_NAMES)
    assert f"a distmatch loss ({code}) or" in (REPO / "docs/trl.md").read_text(encoding="utf-8")


def test_the_readme_table_of_the_losses_names_each_once() -> None:
    """The README's hand-written table (a line of prose per family) names every registered loss, each once."""
    from trl_ext.losses import LOSS_NAMES

    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text.split("## The losses\n", 1)[1].strip().split("\n\n", 1)[0]
    names = [
        cell.strip().strip("`") for line in table.splitlines()[2:] for cell in line.split("|")[1].split(",")
    ]
    assert sorted(names) == sorted(LOSS_NAMES)
