"""AlpacaEval (EMO Tables 9-10): prompts for ``distmatch-eval generate``, the model's outputs in AlpacaEval's
``model_outputs.json`` format, and the judge's annotations read back into a win rate.

The judging itself (AlpacaEval 1: ``alpaca_eval --model_outputs ... --annotators_config alpaca_eval_gpt4`` against
the ``text_davinci_003`` reference outputs) runs outside, with the user's judge and API key.

The ``distmatch-eval alpacaeval`` commands (:mod:`eval_tasks.cli.alpacaeval`) map onto these functions:

* ``alpacaeval prompts``: the evaluation set (AlpacaEval's JSON list of ``instruction`` / ``output`` /
  ``generator`` / ``dataset`` records) -> prompt records in the Stanford-Alpaca format the EMO models were trained
  with (``text``), keeping the instruction (``instruction``) and its subset (``dataset``);
* ``alpacaeval export``: a generate output -> ``[{"instruction", "output", "generator", "dataset"}]`` (sample 0);
* ``alpacaeval winrate``: an ``annotations.json`` -> win rate of a generator: preference 1 = the reference wins,
  2 = the model wins, 1.5 (or 0) = a draw; win rate = 100 x mean(preference - 1) over the judged pairs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from eval_tasks.samples import InputError

__all__ = [
    "ALPACA_PROMPT",
    "BENCHMARK",
    "WIN_RATE_KIND",
    "export_outputs",
    "prompt_records",
    "win_rate",
]

#: the published benchmark (EMO Tables 9-10) and the ``kind`` of ``winrate``'s output (``distmatch-eval report``
#: reads it)
BENCHMARK = "alpacaeval"
WIN_RATE_KIND = "distmatch.win_rate"
#: The Stanford-Alpaca prompt without an input (the format the EMO instruction-tuned models were trained in).
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    "\n\n### Instruction:\n{instruction}\n\n### Response:"
)


def prompt_records(eval_set: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Generate prompt records of AlpacaEval's evaluation set (one per instruction, in its order)."""
    out = []
    for i, row in enumerate(eval_set):
        if not isinstance(row, Mapping) or not isinstance(row.get("instruction"), str):
            raise InputError(f"evaluation set: record #{i} has no 'instruction' string.")
        out.append(
            {
                "id": f"alpacaeval-{i}",
                "instruction": row["instruction"],
                "text": ALPACA_PROMPT.format(instruction=row["instruction"]),
                "dataset": row.get("dataset", "alpaca_eval"),
            }
        )
    return out


def export_outputs(
    rows: Sequence[Mapping[str, Any]], generator: str, prompts: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """AlpacaEval ``model_outputs`` of a generate output (the first sample of each prompt, stripped); `prompts`:
    the prompt records (:func:`prompt_records`), which hold each id's instruction and subset."""
    by_id = {str(p.get("id")): p for p in prompts}
    out = []
    for i, row in enumerate(rows):
        outs, prompt = row.get("samples"), by_id.get(str(row.get("id")))
        if prompt is None or "instruction" not in prompt:
            raise InputError(
                f"samples: record #{i} (id {row.get('id')!r}) is not in the alpacaeval prompts file."
            )
        if not isinstance(outs, list) or not outs:
            raise InputError(f"samples: record #{i} needs a non-empty 'samples' list.")
        out.append(
            {
                "instruction": prompt["instruction"],
                "output": str(outs[0]).strip(),
                "generator": generator,
                "dataset": prompt.get("dataset", "alpaca_eval"),
            }
        )
    return out


def win_rate(annotations: Sequence[Mapping[str, Any]], generator: str | None = None) -> dict[str, Any]:
    """Win rate (x100) of `generator` (default: the only ``generator_2``) over the reference in `annotations`."""
    names = {str(a.get("generator_2")) for a in annotations if isinstance(a, Mapping)}
    if generator is None:
        if len(names) != 1:
            raise InputError(
                f"annotations: several generators ({', '.join(sorted(names))}); pass --generator."
            )
        generator = names.pop()
    prefs, unjudged = [], 0
    for a in annotations:
        if str(a.get("generator_2")) != generator:
            continue
        p = a.get("preference")
        if p is None:
            unjudged += 1
            continue
        p = 1.5 if float(p) == 0 else float(p)
        if not 1 <= p <= 2:
            raise InputError(
                f"annotations: preference {p!r} outside 1..2 (1 = reference wins, 2 = model wins)."
            )
        prefs.append(p)
    if not prefs:
        raise InputError(f"annotations: no judged pair for generator {generator!r}.")
    return {
        "kind": WIN_RATE_KIND,
        "benchmark": BENCHMARK,
        "generator": generator,
        "reference": sorted(
            {str(a.get("generator_1")) for a in annotations if a.get("generator_2") == generator}
        ),
        "annotator": sorted(
            {str(a.get("annotator")) for a in annotations if a.get("generator_2") == generator}
        ),
        "win_rate": 100.0 * statistics.fmean(p - 1 for p in prefs),
        "n_wins": sum(p > 1.5 for p in prefs),
        "n_wins_base": sum(p < 1.5 for p in prefs),
        "n_draws": sum(p == 1.5 for p in prefs),
        "n_total": len(prefs),
        "n_unjudged": unjudged,
    }
