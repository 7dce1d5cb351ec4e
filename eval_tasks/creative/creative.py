"""The GEM creative-writing diversity evaluation (GEM section 5.1, Table 2): prompts and per-prompt scores.

Prompts: the paper's exact sets, shipped as package data (``eval_tasks/data``), in the GEM repository's order -
573 poem prompts (titles of ``merve/poetry``) and the first 500 story prompts (ROCStories winter 2017 titles),
each ``Write a <poem|story> titled '<title>' with no more than 200 words.``

Scores: per prompt, the three metrics of :mod:`eval_tasks.metrics` over its K samples (n-gram, Self-BLEU and
Sentence-BERT diversity, 0-100, higher = more diverse), then the harness averages over prompts. Only the
responses are scored (GEM's script also scored the chat-templated prompt; ``gem_compat`` reproduces its Self-BLEU
single-reference quirk). Pure Python; shared by the lm-eval tasks and the OpenCompass evaluator.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eval_tasks.metrics.names import DIVERSITY_METRICS

__all__ = ["CREATIVE_TASKS", "DIVERSITY_METRICS", "PACKAGE_DATA", "creative_documents", "diversity_scores"]

log = logging.getLogger(__name__)

PACKAGE_DATA = Path(__file__).resolve().parent.parent / "data"  # eval_tasks/data/

CREATIVE_TASKS = {
    "poem": {"file": "gem_poem_prompts.jsonl", "rows": 573, "source": "titles of merve/poetry (all 573)"},
    "story": {
        "file": "gem_story_prompts.jsonl",
        "rows": 500,
        "source": "first 500 ROCStories winter 2017 titles",
    },
}
_TITLE = re.compile(r"titled '(.*)' with no more than", re.S)


def creative_documents(kind: str, prompts_file: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The prompts (``id``, ``prompt``, ``title``) of ``kind`` = ``poem`` / ``story``, or of a JSONL file."""
    if kind not in CREATIVE_TASKS:
        raise ValueError(f"Unknown creative-writing task {kind!r}; valid: {', '.join(CREATIVE_TASKS)}.")
    path = Path(prompts_file).expanduser() if prompts_file else PACKAGE_DATA / CREATIVE_TASKS[kind]["file"]
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file {path} for the {kind} diversity task does not exist.")
    from eval_tasks.samples import read_jsonl

    docs = []
    for i, row in enumerate(read_jsonl(path)):  # not UTF-8 / not JSON: refused naming the line
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}: record #{i}: each line needs a string field 'prompt'.")
        match = _TITLE.search(row["prompt"])
        docs.append(
            {
                "id": int(row.get("id", len(docs))),
                "prompt": row["prompt"],
                "title": match.group(1) if match else "",
            }
        )
    return docs


def diversity_scores(
    samples: Sequence[str], *, prefix: str = "", sbert_model: Any = None, gem_compat: bool = False
) -> dict[str, float]:
    """The three diversity metrics of one prompt's samples, each scored after `prefix` (``scoring: prompt+response``:
    the prompt as the model saw it).

    Empty responses are scored as they are; a prompt whose responses are all empty scores 0 on every metric (no
    diversity; Self-BLEU would call K empty strings, or K copies of a short prompt, maximally diverse), whatever the
    prefix, and a metric that is undefined for the samples (no sample has a single token) counts as 0 with a
    warning, so one degenerate prompt cannot abort a run.
    """
    from eval_tasks.metrics import DiversityInputError, ngram_diversity, sbert_diversity, self_bleu_diversity
    from eval_tasks.metrics.inputs import no_text

    samples = [str(s) for s in samples]
    if no_text(samples):
        log.warning("all %d samples are empty; every diversity metric scored 0.", len(samples))
        return dict.fromkeys(DIVERSITY_METRICS, 0.0)
    samples = [prefix + s for s in samples]

    def safe(name: str, fn: Callable[[], float]) -> float:
        try:
            return float(fn())
        except DiversityInputError as err:
            log.warning("%s: %s; scored 0.", name, err)
            return 0.0

    return {
        "ngram_diversity": safe("ngram_diversity", lambda: ngram_diversity(samples, allow_empty=True)),
        "self_bleu_diversity": safe(
            "self_bleu_diversity", lambda: self_bleu_diversity(samples, gem_compat, allow_empty=True)
        ),
        "sbert_diversity": safe(
            "sbert_diversity", lambda: sbert_diversity(samples, model=sbert_model, allow_empty=True)
        ),
    }
