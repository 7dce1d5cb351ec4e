"""Was an lm-eval run on its paper's published protocol? (``distmatch-eval report`` on lm-eval results files.)

The protocols themselves (presets of task options) and the options are in :mod:`eval_tasks.task_options`; this
module compares what a results file recorded with the paper's settings.

Pure Python, no heavy imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks.task_options import PROTOCOLS, TASK_OPTIONS, family_of_task, parse_bool

__all__ = ["paper_protocol_check"]

#: The papers' settings (the tasks' defaults are in the option table; a run without an option ran its default).
_RETRIEVER = "all-mpnet-base-v2"
_GEM_SBERT = "bert-large-nli-stsb-mean-tokens"


def paper_protocol_check(
    task: str,
    metadata: Mapping[str, Any] | None,
    *,
    n_samples: Mapping[str, Any] | None = None,
    chat_template: bool | None = None,
) -> dict[str, Any] | None:
    """Whether an lm-eval run of `task` followed its paper's published protocol, from the results file.

    `metadata` is the task's recorded metadata (``configs[task]["metadata"]``), `n_samples` its ``n-samples``
    entry (``original`` / ``effective``: a ``--limit``), `chat_template` whether a chat template was applied.
    Returns ``{"protocol", "paper_protocol", "comparable", "differences", "metric"}`` (``metric``: the metric the
    paper reports), or None for tasks without a published protocol here (IFEval, other tasks).
    """
    family = family_of_task(task)
    if family not in ("icl", "mmlu", "creative"):
        return None
    meta = dict(metadata or {})
    target = "gem_official" if family == "creative" else "emo_official"
    differences: list[str] = []
    for name, value in PROTOCOLS[target]["settings"].items():
        option = TASK_OPTIONS[name]
        if family not in option.families:
            continue
        got = meta.get(name, option.default)
        if option.kind is bool:
            got = parse_bool(got, name) if got is not None else False
        if name == "sbert_model":
            if not str(got or "").rstrip("/").endswith(_GEM_SBERT):
                differences.append(f"Sentence-BERT model {got or 'default'} (paper: {_GEM_SBERT})")
        elif got != value:
            differences.append(f"{name}={got} (paper: {value})")
    if family == "icl":
        retriever = str(meta.get("retriever_model") or TASK_OPTIONS["retriever_model"].default)
        if retriever.rstrip("/").split("/")[-1].lower() != _RETRIEVER:
            differences.append(f"retriever {retriever} (paper: {_RETRIEVER})")
        ice_num = int(meta.get("ice_num") or TASK_OPTIONS["ice_num"].default)  # not given: the tasks' default
        if ice_num != 8:
            differences.append(f"{ice_num} demonstrations (paper: 8)")
    if family == "creative":
        if int(meta.get("num_samples", TASK_OPTIONS["num_samples"].default)) != 16:
            differences.append(f"{meta.get('num_samples')} samples per prompt (paper: 16)")
        if meta.get("prompts_file"):
            differences.append(f"prompts from {meta['prompts_file']} (paper: the packaged GEM prompts)")
        if chat_template is False:
            differences.append("no chat template (GEM applied the model's chat template)")
    elif chat_template:
        differences.append("chat template applied (the EMO protocol scores the plain prompt)")
    if n_samples and n_samples.get("effective") is not None and n_samples.get("original") is not None:
        if int(n_samples["effective"]) < int(n_samples["original"]):
            differences.append(f"{n_samples['effective']} of {n_samples['original']} documents (--limit)")
    protocol = str(meta.get("protocol") or "default")
    metric = "acc_ppl" if family == "icl" and meta.get("ppl_norm") == "openicl" else "acc"
    return {
        "protocol": protocol,
        "paper_protocol": target,
        "comparable": not differences,
        "differences": differences,
        "metric": metric if family != "creative" else None,
    }
