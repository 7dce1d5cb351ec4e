"""Only what pyproject.toml cannot say: ship the activation hooks' `.pth` files at the root of site-packages.

Python runs each file's single line at interpreter start:
- `distmatch_trl_hook.pth`: `import distmatch_trl_hook`, inert unless the process is `trl sft` with a distmatch
  option (see docs/trl.md);
- `distmatch_lm_eval_hook.pth`: `import distmatch_lm_eval_hook`, which only adds the distmatch task folder to
  lm-eval's TaskManager when lm-eval's task manager is imported (see distmatch_lm_eval_hook.py);
- `distmatch_axolotl_hook.pth`: `import distmatch_axolotl_hook`, which makes a config with `loss:` load the
  distmatch Axolotl plugin (see distmatch_axolotl_hook.py).

Editable installs (the Makefile's venvs) get the same files from `python distmatch_import_hook.py install-pth`.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distmatch_import_hook import PTH_FILES  # noqa: E402  (one list for wheels and the project's own venvs)


class BuildPyWithHookPth(build_py):
    """`build_py` that also writes the hooks' `.pth` files at the top of the build tree (the wheel's root)."""

    def run(self) -> None:
        super().run()
        for name, line in PTH_FILES.items():
            target = Path(self.build_lib) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(line)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [
            *super().get_outputs(include_bytecode),
            *(str(Path(self.build_lib) / name) for name in PTH_FILES),
        ]


setup(cmdclass={"build_py": BuildPyWithHookPth})
