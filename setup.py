"""Only what pyproject.toml cannot say: ship the activation hooks' `.pth` files at the root of site-packages.

Python runs each file's single line at interpreter start (`distmatch_hooks.pth.PTH_FILES`):
- `distmatch_hooks.trl.pth`: `import distmatch_hooks.trl`, inert unless the process is `trl sft` with a distmatch
  option (see distmatch_hooks/trl.py and docs/trl.md);
- `distmatch_hooks.lm_eval.pth`: `import distmatch_hooks.lm_eval`, which only adds the distmatch task folder to
  lm-eval's TaskManager when lm-eval's task manager is imported (see distmatch_hooks/lm_eval.py);
- `distmatch_hooks.axolotl.pth`: `import distmatch_hooks.axolotl`, which makes a config with `loss:` load the
  distmatch Axolotl plugin (see distmatch_hooks/axolotl.py).

Editable installs (the Makefile's venvs) get the same files from `python -m distmatch_hooks install-pth`.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distmatch_hooks.pth import PTH_FILES  # noqa: E402  (one list for wheels and the project's own venvs)


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
