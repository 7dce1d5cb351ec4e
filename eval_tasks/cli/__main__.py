"""``python -m eval_tasks.cli``: the ``distmatch-eval`` console script without its launcher (tests, and a venv whose
scripts folder is not on ``PATH``)."""

import sys

from eval_tasks.cli import main

sys.exit(main())
