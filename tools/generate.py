"""Write every file, or block of a file, derived from the loss specs and the NLU task table; `--check` compares.

The one generator of the project (`make generate`); CI runs `--check` (a test in tests/project/test_generated.py,
and `make lint`). It writes:

* from the task table ``eval_tasks/nlu/nlu.py`` (``tools/task_configs.py``): the per-task lm-eval YAMLs and the group
  ``distmatch_nlu.yaml``, the OpenCompass task configs, suites and summarizers; the list of the retrieval tasks in
  docs/evaluation.md and the task counts there and in eval_tasks/lm_eval_tasks/README.md (``tools/loss_outputs.py``);
* from the loss specs ``trl_ext/losses/`` (``tools/loss_outputs.py``): ``distmatch/_loss_names.py`` (the names the
  torch-free activation hooks need), the loss and option tables of ``docs/losses.md`` and the lists of all loss
  names in README.md, docs/trl.md, docs/axolotl.md and examples/axolotl/tiny-cpu.yaml.

Every generated file starts with a comment naming this command; a page that holds generated blocks is otherwise
hand-written and only its blocks are rewritten.

    python tools/generate.py            rewrite what is stale
    python tools/generate.py --check    write nothing; exit 1, naming each stale file, if a committed one differs
    python tools/generate.py --root D   write / check under D instead of the repository
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
for _path in (REPO, TOOLS):  # run as a script from anywhere: this checkout's packages and the tools' modules
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import loss_outputs  # noqa: E402
import task_configs  # noqa: E402

COMMAND = "python tools/generate.py"


def run(root: Path, check: bool) -> list[str]:
    """Write (or, with `check`, compare) every generated file under `root`; the problems, one line each."""
    problems = []
    files = dict(task_configs.generated_files())
    files[loss_outputs.NAMES_MODULE] = loss_outputs.names_module
    renders = {rel: (lambda current, render=render: render()) for rel, render in files.items()}
    renders.update(loss_outputs.page_renderers())
    for rel, render in renders.items():
        path = root / rel
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current is None and rel not in files:
            problems.append(f"{rel}: missing (a hand-written page with generated blocks: restore it)")
            continue
        try:
            text = render(current)
        except loss_outputs.Missing as err:
            problems.append(f"{rel}: {err}")
            continue
        if current == text:
            continue
        if check:
            why = "missing" if current is None else "differs from what the generator writes"
            problems.append(f"{rel}: {why}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    for rel in task_configs.leftovers(root, set(files)):
        if check:
            problems.append(f"{rel}: generated, but its task is not in the table any more (remove it)")
        else:
            (root / rel).unlink()
            print(f"removed {rel}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming each file that differs"
    )
    parser.add_argument("--root", type=Path, default=REPO, help="repository root to write or check under")
    args = parser.parse_args(argv)
    problems = run(args.root, args.check)
    if problems:
        print(
            "stale generated files (run `" + COMMAND + "` and commit):\n  " + "\n  ".join(problems),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
