"""The in-context NLU suite of the EMO paper (section 4.2, appendix A.4): datasets, templates, prompt builders.

Pure Python (no lm-eval, no OpenCompass import): both harnesses build their prompts from the data here, so the
lm-eval tasks (``eval_tasks/lm_eval_tasks``) and the OpenCompass configs (``eval_tasks/opencompass_configs``)
evaluate the same datasets with the same strings.

Seven classification tasks use 8 demonstrations retrieved from the training split (most similar first, see
:mod:`eval_tasks.nlu.retrieval`), each demonstration being the task's template filled with the demonstration's own
label, joined by ``"\\n"`` with a trailing ``"\\n"`` (OpenICL's separators); the prompt for candidate label k is
``demonstrations + template_k(test input)`` and the prediction is the label whose whole prompt the model finds most
likely. MMLU uses a fixed 5-shot prompt from each subject's dev split in OpenCompass's MMLU PPL format.

Templates: ``"paper"`` (Table 5 of the EMO paper, the default) or ``"emo_code"`` (the strings of the EMO
repository's ``icl.py``, which differ in quotes, prefixes and one final period). Templates are keyed by label
*name*, and each dataset spec maps its label ids to names, so datasets whose ids differ (SST-2 is 0 = positive in
``gpt3mix/sst2`` but 0 = negative in ``SetFit/sst2``) get the right verbalizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ICL_TASKS",
    "MMLU",
    "MMLU_SUBJECTS",
    "NLU_TASK_NAMES",
    "TEMPLATE_VARIANTS",
    "ClassificationSpec",
    "MMLUSpec",
    "build_icl_rows",
    "build_mmlu_rows",
    "demonstrations",
    "fill",
    "get_spec",
    "mmlu_context",
    "mmlu_question",
]

#: Placeholder of the input text in the templates (as in the paper's Table 5).
PLACEHOLDER = "<X>"
#: OpenICL / OpenCompass defaults: demonstrations joined by this, and this after the last one.
ICE_SEPARATOR = "\n"
ICE_EOS = "\n"
TEMPLATE_VARIANTS = ("paper", "emo_code")


@dataclass(frozen=True)
class ClassificationSpec:
    """One in-context classification task: where its data is and how its prompts read."""

    key: str  #: short name, also the folder name for local data (``<data_dir>/<key>/<split>.jsonl``)
    path: str  #: Hugging Face dataset id
    name: str | None  #: dataset config name
    revision: str | None  #: dataset revision (branch, tag or commit)
    test_split: str
    pool_split: (
        str  #: demonstrations are retrieved from this split (a slice such as ``train[:36000]`` allowed)
    )
    text_field: str
    label_field: str
    labels: tuple[str, ...]  #: label name of each label id, in id order
    templates: Mapping[str, Mapping[str, str]] = field(repr=False)  #: variant -> label name -> template

    @property
    def task(self) -> str:
        return f"distmatch_{self.key}"

    def template(self, variant: str = "paper") -> dict[str, str]:
        if variant not in self.templates:
            raise ValueError(
                f"Unknown template variant {variant!r} for {self.task}; valid: {', '.join(self.templates)}."
            )
        return dict(self.templates[variant])


def _per_label(pattern: str, words: Mapping[str, str]) -> dict[str, str]:
    """Templates for several labels that differ only in the label word (``{word}`` in `pattern`)."""
    return {label: pattern.replace("{word}", word) for label, word in words.items()}


_SENTIMENT = {"negative": "negative", "positive": "positive"}
_EMOTION = {"anger": "anger", "joy": "joy", "optimism": "optimism", "sadness": "sadness"}
_TREC_PAPER = {
    "abbreviation": "abbreviation",
    "entity": "entity",
    "description": "description and abstract concept",
    "human": "human being",
    "location": "location",
    "numeric": "numerical value",
}
_TREC_CODE = dict(_TREC_PAPER, numeric="numeric value")
_AG = {"world": "world", "sports": "sports", "business": "business", "sci_tech": "science and technology"}

ICL_TASKS: dict[str, ClassificationSpec] = {
    spec.key: spec
    for spec in (
        ClassificationSpec(
            key="tweet_emotion",
            path="cardiffnlp/tweet_eval",
            name="emotion",
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=("anger", "joy", "optimism", "sadness"),
            templates={
                "paper": _per_label('Tweet: "<X>" It is {word}.', _EMOTION),
                "emo_code": _per_label("<X> It is {word}.", _EMOTION),
            },
        ),
        ClassificationSpec(
            key="sst2",
            path="SetFit/sst2",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=(
                "negative",
                "positive",
            ),  # SetFit ids (gpt3mix/sst2, the EMO code's copy, has them inverted)
            templates={
                "paper": _per_label('Review: "<X>" It is {word}.', _SENTIMENT),
                "emo_code": _per_label('Review: "<X>" It is {word}.', _SENTIMENT),
            },
        ),
        ClassificationSpec(
            key="trec",
            path="CogComp/trec",
            name=None,
            revision="refs/convert/parquet",  # `main` holds only a loading script (unsupported by datasets >= 4)
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="coarse_label",
            labels=("abbreviation", "entity", "description", "human", "location", "numeric"),
            templates={
                "paper": _per_label('Question: "<X>" It is about {word}.', _TREC_PAPER),
                "emo_code": _per_label('"<X>" It is about {word}.', _TREC_CODE),
            },
        ),
        ClassificationSpec(
            key="subj",
            path="SetFit/subj",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=("objective", "subjective"),
            templates={
                "paper": _per_label(
                    '"<X>" It is {word}.', {"objective": "objective", "subjective": "subjective"}
                ),
                "emo_code": _per_label(
                    "<X> It is {word}.", {"objective": "objective", "subjective": "subjective"}
                ),
            },
        ),
        ClassificationSpec(
            key="cr",
            path="SetFit/CR",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=("negative", "positive"),
            templates={
                "paper": _per_label('Review: "<X>" It is {word}.', _SENTIMENT),
                "emo_code": _per_label("Review: <X> It is {word}.", _SENTIMENT),
            },
        ),
        ClassificationSpec(
            key="rt",
            path="cornell-movie-review-data/rotten_tomatoes",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train",
            text_field="text",
            label_field="label",
            labels=("negative", "positive"),
            templates={
                "paper": _per_label('Review: "<X>" It is {word}.', _SENTIMENT),
                "emo_code": _per_label("Review: <X> It is {word}", _SENTIMENT),  # no final period in the code
            },
        ),
        ClassificationSpec(
            key="ag_news",
            path="fancyzhx/ag_news",
            name=None,
            revision="main",
            test_split="test",
            pool_split="train[:36000]",  # the EMO code's train[:30%] = the first 36,000 of 120,000 rows
            text_field="text",
            label_field="label",
            labels=("world", "sports", "business", "sci_tech"),
            templates={
                "paper": _per_label('"<X>" It is about {word}.', _AG),
                "emo_code": _per_label('"<X>" It is about {word}.', _AG),
            },
        ),
    )
}

#: The 57 MMLU subjects (``cais/mmlu`` config names; the ``subject`` column of its ``all`` config).
MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality international_law jurisprudence "
    "logical_fallacies machine_learning management marketing medical_genetics miscellaneous moral_disputes "
    "moral_scenarios nutrition philosophy prehistory professional_accounting professional_law "
    "professional_medicine professional_psychology public_relations security_studies sociology us_foreign_policy "
    "virology world_religions"
).split()


@dataclass(frozen=True)
class MMLUSpec:
    key: str = "mmlu"
    path: str = "cais/mmlu"
    name: str | None = "all"
    revision: str | None = "main"
    test_split: str = "test"
    shot_split: str = "dev"
    num_shots: int = 5
    letters: tuple[str, ...] = ("A", "B", "C", "D")

    @property
    def task(self) -> str:
        return f"distmatch_{self.key}"


MMLU = MMLUSpec()

#: The eight tasks of the group ``distmatch_nlu`` (the paper's "average over 8 datasets"), in Table 3's order:
#: the table above, then MMLU. The lm-eval YAMLs and OpenCompass configs of these tasks are generated from here
#: (``python tools/generate.py``).
NLU_TASK_NAMES = (*(spec.task for spec in ICL_TASKS.values()), MMLU.task)


def get_spec(key: str) -> ClassificationSpec | MMLUSpec:
    """The spec of a task by short name (``sst2``) or task name (``distmatch_sst2``)."""
    short = key.removeprefix("distmatch_")
    if short == MMLU.key:
        return MMLU
    try:
        return ICL_TASKS[short]
    except KeyError:
        valid = ", ".join([*ICL_TASKS, MMLU.key])
        raise ValueError(f"Unknown distmatch NLU task {key!r}; valid: {valid}.") from None


# ---------------------------------------------------------------------------------------------------------
# Classification prompts


def fill(template: str, text: str) -> str:
    """The template with its ``<X>`` replaced by `text` (verbatim, as OpenICL does)."""
    return template.replace(PLACEHOLDER, text)


def demonstrations(
    spec: ClassificationSpec, texts: Sequence[str], labels: Sequence[int], variant: str = "paper"
) -> str:
    """The in-context part of a prompt: each demonstration filled with its own label, joined by the separators."""
    template = spec.template(variant)
    items = [fill(template[spec.labels[int(label)]], text) for text, label in zip(texts, labels, strict=True)]
    return ICE_SEPARATOR.join(items) + ICE_EOS if items else ""


def build_icl_rows(
    spec: ClassificationSpec,
    test_rows: Sequence[Mapping[str, Any]],
    pool_rows: Sequence[Mapping[str, Any]],
    neighbours: Sequence[Sequence[int]],
    scores: Sequence[Sequence[float]] | None = None,
    variant: str = "paper",
) -> list[dict[str, Any]]:
    """One evaluation document per test row, with the full prompt of every candidate label.

    `neighbours[i]` are the pool indices of test row i's demonstrations, most similar first (they are used in
    that order). Each document holds ``text``, ``label`` (gold id), ``label_name``, ``full_prompts`` (one per
    label id, demonstrations included), ``ice_indices`` and ``ice_scores`` (cosine similarities).
    """
    if len(neighbours) != len(test_rows):
        raise ValueError(f"{spec.task}: {len(neighbours)} neighbour lists for {len(test_rows)} test rows.")
    template = spec.template(variant)
    pool_texts = [row[spec.text_field] for row in pool_rows]
    pool_labels = [_label_id(spec, row) for row in pool_rows]
    docs = []
    for i, row in enumerate(test_rows):
        ids = [int(j) for j in neighbours[i]]
        ice = demonstrations(spec, [pool_texts[j] for j in ids], [pool_labels[j] for j in ids], variant)
        gold = _label_id(spec, row)
        text = row[spec.text_field]
        docs.append(
            {
                "text": text,
                "label": gold,
                "label_name": spec.labels[gold],
                "full_prompts": [ice + fill(template[name], text) for name in spec.labels],
                "ice_indices": ids,
                "ice_scores": [float(s) for s in scores[i]] if scores is not None else [],
            }
        )
    return docs


def _label_id(spec: ClassificationSpec, row: Mapping[str, Any]) -> int:
    label = row[spec.label_field]
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(spec.labels):
        raise ValueError(
            f"{spec.task}: label {label!r} in field {spec.label_field!r} is not a label id 0..{len(spec.labels) - 1} "
            f"({', '.join(spec.labels)})."
        )
    return label


# ---------------------------------------------------------------------------------------------------------
# MMLU prompts (OpenCompass `mmlu_ppl_ac766d`: fixed first-5 dev examples of the subject, "Answer: <letter>")


def mmlu_question(row: Mapping[str, Any], letters: Sequence[str] = MMLU.letters) -> str:
    choices = list(row["choices"])
    if len(choices) != len(letters):
        raise ValueError(f"distmatch_mmlu: expected {len(letters)} choices, got {len(choices)}: {choices!r}")
    options = "".join(f"\n{letter}. {choice}" for letter, choice in zip(letters, choices))
    return f"{row['question']}{options}"


def mmlu_context(subject: str, shots: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> str:
    """The prompt up to ``"Answer:"``; the candidate continuations are ``" A"`` ... ``" D"``.

    The hint keeps OpenCompass's two spaces after "about". Each shot is ``question + "\\nAnswer: X\\n"``, joined
    by ``"\\n"`` plus a trailing ``"\\n"``, so context + ``" A"`` is exactly OpenCompass's PPL prompt for "A".
    """
    hint = (
        f"The following are multiple choice questions (with answers) about  {subject.replace('_', ' ')}.\n\n"
    )
    items = [f"{mmlu_question(shot)}\nAnswer: {MMLU.letters[int(shot['answer'])]}\n" for shot in shots]
    ice = ICE_SEPARATOR.join(items) + ICE_EOS if items else ""
    return f"{hint}{ice}{mmlu_question(row)}\nAnswer:"


def build_mmlu_rows(
    test_rows: Sequence[Mapping[str, Any]],
    shot_rows: Sequence[Mapping[str, Any]],
    num_shots: int = MMLU.num_shots,
) -> list[dict[str, Any]]:
    """One document per test question: ``context`` (5-shot prompt of its subject), ``letters`` (the candidates),
    ``answer`` (gold index), plus ``subject``, ``question`` and ``choices`` (the answer texts)."""
    shots: dict[str, list[Mapping[str, Any]]] = {}
    for row in shot_rows:
        shots.setdefault(row["subject"], []).append(row)
    missing = sorted({row["subject"] for row in test_rows if len(shots.get(row["subject"], [])) < num_shots})
    if missing:
        raise ValueError(
            f"distmatch_mmlu: the {MMLU.shot_split!r} split has fewer than {num_shots} examples for subject(s) "
            f"{', '.join(missing)}."
        )
    return [
        {
            "subject": row["subject"],
            "question": row["question"],
            "choices": list(row["choices"]),
            "context": mmlu_context(row["subject"], shots[row["subject"]][:num_shots], row),
            "letters": list(MMLU.letters),
            "answer": int(row["answer"]),
        }
        for row in test_rows
    ]
