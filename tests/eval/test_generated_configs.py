"""The generated task configs (`tools/generate_task_configs.py`) are up to date, and `--check` can fail.

The per-task lm-eval YAMLs, the group `distmatch_nlu.yaml`, the OpenCompass `*_topk_ppl.py` files, the two suites
and the two summarizers are written from `eval_tasks/nlu.py`'s task table; `--check` compares the committed files
with what the script would write. What the files *do* is tested by tests/eval/lm_eval_tasks/ and
tests/eval/opencompass/test_configs.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from eval_tasks import nlu

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "generate_task_configs.py"
LM_EVAL = Path("eval_tasks/lm_eval_tasks")
DATASETS = Path("eval_tasks/opencompass_configs/datasets/distmatch")
SUMMARIZERS = Path("eval_tasks/opencompass_configs/summarizers")


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _generated_names() -> set[Path]:
    icl = [spec.task for spec in nlu.ICL_TASKS.values()]
    return {
        *(LM_EVAL / f"{task}.yaml" for task in icl),
        LM_EVAL / "distmatch_nlu.yaml",
        *(DATASETS / f"{task}_topk_ppl.py" for task in icl),
        DATASETS / "distmatch_nlu_topk_ppl.py",
        DATASETS / "distmatch_nlu_emo_code_topk_ppl.py",
        SUMMARIZERS / "distmatch_nlu.py",
        SUMMARIZERS / "distmatch_nlu_emo_code.py",
    }


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        return f.readline()


def test_committed_configs_equal_what_the_generator_writes() -> None:
    proc = _generate("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == proc.stderr == ""


def test_generated_files_carry_the_header_and_the_rest_is_hand_written() -> None:
    """Exactly the files of the table carry the "generated" header; MMLU, IFEval and creative writing do not."""
    marked = {
        path.relative_to(REPO)
        for folder in (LM_EVAL, DATASETS, SUMMARIZERS)
        for path in (REPO / folder).iterdir()
        if path.is_file() and "by `python tools/generate_task_configs.py`" in _first_line(path)
    }
    assert marked == _generated_names()
    assert len(marked) == 2 * len(nlu.ICL_TASKS) + 5


def test_check_names_the_file_that_differs(tmp_path: Path) -> None:
    proc = _generate("--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == _generated_names()
    assert _generate("--check", "--root", str(tmp_path)).returncode == 0
    for rel in written:  # the generated copy equals the committed files
        assert (tmp_path / rel).read_text(encoding="utf-8") == (REPO / rel).read_text(encoding="utf-8"), rel

    edited = tmp_path / DATASETS / "distmatch_sst2_topk_ppl.py"
    edited.write_text(edited.read_text(encoding="utf-8").replace("It is positive.", "It is great."))
    (tmp_path / LM_EVAL / "distmatch_trec.yaml").unlink()
    proc = _generate("--check", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert f"{DATASETS / 'distmatch_sst2_topk_ppl.py'}: differs from what the generator writes" in proc.stderr
    assert f"{LM_EVAL / 'distmatch_trec.yaml'}: missing" in proc.stderr
    assert proc.stderr.count("\n  ") == 2  # those two, nothing else
    assert edited.read_text(encoding="utf-8").count("It is great.") == 1  # --check writes nothing


def test_check_reports_a_generated_file_whose_task_left_the_table(tmp_path: Path) -> None:
    assert _generate("--root", str(tmp_path)).returncode == 0
    shutil.copy(tmp_path / LM_EVAL / "distmatch_cr.yaml", tmp_path / LM_EVAL / "distmatch_gone.yaml")
    (tmp_path / LM_EVAL / "_icl_template_yaml").write_text("# hand-written\n")  # not generated: ignored
    proc = _generate("--check", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert f"{LM_EVAL / 'distmatch_gone.yaml'}: generated, but its task is not in the table" in proc.stderr
    assert "_icl_template_yaml" not in proc.stderr
    proc = _generate("--root", str(tmp_path))  # writing removes it
    assert proc.returncode == 0 and not (tmp_path / LM_EVAL / "distmatch_gone.yaml").exists()
    assert (tmp_path / LM_EVAL / "_icl_template_yaml").exists()
    assert _generate("--check", "--root", str(tmp_path)).returncode == 0


def test_task_lists_come_from_the_table() -> None:
    from eval_tasks.lm_eval_tasks import NLU_TASKS

    assert NLU_TASKS == nlu.NLU_TASK_NAMES == (*(f"distmatch_{k}" for k in nlu.ICL_TASKS), "distmatch_mmlu")
