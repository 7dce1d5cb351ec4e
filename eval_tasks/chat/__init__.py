"""Chat models: GEM's IFEval (Table 1; the lm-eval task class :mod:`eval_tasks.chat.harness`, which needs lm-eval,
so it is not imported here, and its YAML) and EMO's AlpacaEval (Tables 9-10; :mod:`eval_tasks.chat.alpacaeval`:
the prompts, the ``model_outputs.json`` export and the judge's win rate behind ``distmatch-eval alpacaeval``), and
README.md. GEM's AlpacaEval reward best-of-n is :mod:`eval_tasks.best_of_n`'s.
"""

from eval_tasks.chat.alpacaeval import (
    ALPACA_PROMPT,
    BENCHMARK,
    WIN_RATE_KIND,
    export_outputs,
    prompt_records,
    win_rate,
)

__all__ = ["ALPACA_PROMPT", "BENCHMARK", "WIN_RATE_KIND", "export_outputs", "prompt_records", "win_rate"]
