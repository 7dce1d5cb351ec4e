"""The per-task lm-eval YAMLs and OpenCompass configs of the in-context NLU suite, from ``eval_tasks/nlu/nlu.py``, and
the code tasks' lm-eval YAMLs from ``eval_tasks/code/code_tasks.py`` (``distmatch_<key>.yaml``, including
``_code_template_yaml``).

Written by ``python tools/generate.py`` (``make generate``; this module only renders the text, the tool compares and
writes). The task table (``eval_tasks.nlu.ICL_TASKS``, ``MMLU`` and ``NLU_TASK_NAMES``) is the one place the NLU
tasks are listed. From it, in the way lm-eval's ``_generate_configs.py`` scripts write per-subject YAMLs that
``include`` a hand-written template:

* ``eval_tasks/nlu/distmatch_<key>.yaml`` (one per retrieval task, including ``_icl_template_yaml``)
  and the group ``distmatch_nlu.yaml``; the code tasks' YAMLs in ``eval_tasks/code/``;
* ``eval_tasks/opencompass_configs/datasets/distmatch/distmatch_<key>_topk_ppl.py`` (one per retrieval task), the
  suites ``distmatch_nlu_topk_ppl.py`` and ``distmatch_nlu_emo_code_topk_ppl.py``;
* the summarizers ``eval_tasks/opencompass_configs/summarizers/distmatch_nlu{,_emo_code}.py``.

Every written file starts with a comment naming the command. The shared templates (``_icl_template_yaml``), MMLU
(``distmatch_mmlu.yaml``, ``distmatch_mmlu_ppl.py``: one task over 57 subjects, not of the per-task shape), IFEval
and the creative-writing files are written by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from string import Template

from eval_tasks.code import code_tasks
from eval_tasks.nlu import nlu
from eval_tasks.task_options import TASK_OPTIONS

COMMAND = "python tools/generate.py"
#: the lm-eval glue (``TASK_DIR`` is its parent, the ``eval_tasks`` package): checked for generated leftovers only
LM_EVAL_DIR = Path("eval_tasks/lm_eval_tasks")
#: the family packages that hold generated YAMLs (each beside the template its YAMLs `include`)
LM_EVAL_NLU_DIR = Path("eval_tasks/nlu")
LM_EVAL_CODE_DIR = Path("eval_tasks/code")
OC_DATASETS_DIR = Path("eval_tasks/opencompass_configs/datasets/distmatch")
OC_SUMMARIZERS_DIR = Path("eval_tasks/opencompass_configs/summarizers")

#: OpenCompass's TopK retriever as the EMO paper ran it (OpenICL defaults of the EMO code): the lm-eval tasks' defaults.
OC_ICE_NUM = TASK_OPTIONS["ice_num"].default
OC_RETRIEVER_MODEL = TASK_OPTIONS["retriever_model"].default
OC_RETRIEVER_TOKENIZER = "gpt2-xl"
LINE_LENGTH = 110  # pyproject.toml's ruff line length: generated code is wrapped as `ruff format` would

# The files' text with `${name}` placeholders (`$$` is a literal `$`).

LM_EVAL_TASK = Template("""\
# EMO paper in-context NLU task (section 4.2, appendix A.4); data, labels and templates: eval_tasks/nlu/nlu.py.
task: ${task}
tag: distmatch_icl
include: _icl_template_yaml
dataset_kwargs:
  distmatch_task: ${key}
""")

#: The group score is the unweighted mean of the task scores (`weight_by_size: false`).
LM_EVAL_GROUP = Template("""\
# The EMO paper's language-understanding suite (Table 3): the ${n_icl} retrieval tasks and MMLU. The group score is
# the unweighted mean of the ${n_tasks} task accuracies (the paper's "average over 8 datasets"), for `acc` (most likely
# prompt) and `acc_ppl` (lowest per-token perplexity, the paper's OpenICL rule). MMLU is a single task,
# so it counts once (a group of 57 subject tasks would dominate lm-eval's leaf-level average).
# --metadata '{"protocol": "emo_official"}' runs the protocol behind the paper's Table 3 (the EMO code's templates,
# OpenICL's text round trip and perplexity normalisation, MMLU averaged over its subjects): the paper's number is
# then this group's acc_ppl (eval_tasks/protocols.py).
group: distmatch_nlu
task:
${task_list}aggregate_metric_list:
  - metric: acc
    aggregation: mean
    weight_by_size: false
  - metric: acc_ppl
    aggregation: mean
    weight_by_size: false
metadata:
  version: 1.0
""")

CODE_TASK = Template("""\
# GEM code evaluation (Tables 6 and 9): ${title}, ${note}.
# Run with --confirm_run_unsafe_code (the programs run in eval_tasks.sandbox).
task: ${task}
include: _code_template_yaml
dataset_kwargs:
  distmatch_task: ${key}
""")

OC_TASK = Template('''\
"""EMO in-context NLU: ${task} - TopK retriever (${ice_num} demonstrations, most similar first) + PPL per label.

Data: ${path}${config} at revision ${revision}, test split ${test_split}, demonstrations from ${pool_split}
(eval_tasks.opencompass_ext.DistMatchICLDataset; $$DISTMATCH_EVAL_DATA_DIR switches to local JSONL copies).
Templates: the EMO paper's Table 5 (eval_tasks.nlu, variant "paper"), keyed by the dataset's label ids.
"""

from opencompass.openicl.icl_evaluator import AccEvaluator
from opencompass.openicl.icl_inferencer import PPLInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import TopkRetriever

from eval_tasks.opencompass_ext import DistMatchICLDataset

${pool_comment}${var} = {
${template_entries}}

distmatch_${key}_datasets = [
    dict(
        abbr="${task}",
        type=DistMatchICLDataset,
        task="${key}",
        reader_cfg=dict(
            input_columns=["${text_field}"], output_column="${label_field}", train_split="train", test_split="test"
        ),
        infer_cfg=dict(
${ice_template}
            retriever=dict(
                type=TopkRetriever,
                ice_num=${ice_num},
                sentence_transformers_model_name="${retriever_model}",
                tokenizer_name="${retriever_tokenizer}",
            ),
            inferencer=dict(type=PPLInferencer),
        ),
        eval_cfg=dict(evaluator=dict(type=AccEvaluator)),
    )
]
''')

OC_SUITE = Template('''\
"""The EMO paper's language-understanding suite (Table 3) for OpenCompass: ${n_icl} retrieval tasks + MMLU (5-shot PPL).

``opencompass --datasets distmatch_nlu_topk_ppl --config-dir "$$(python -m eval_tasks.opencompass_configs)" ...``
or, in a config, ``from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_topk_ppl import
distmatch_nlu_datasets`` inside ``read_base()``. Use a base model (``--hf-type base``): the prompts are scored as
plain text. The summarizer ``eval_tasks.opencompass_configs.summarizers.distmatch_nlu`` adds the MMLU subject
average and the ${n_tasks}-task average.
"""

from mmengine.config import read_base

with read_base():
    # Aliases without the `_datasets` suffix: OpenCompass collects every `*_datasets` variable of this file.
${imports}
distmatch_nlu_datasets = [${members}]
''')

OC_EMO_CODE_SUITE = Template('''\
"""The EMO paper's Table 3 protocol: the ${n_icl} retrieval tasks with the EMO repository's templates (``icl.py``), plus MMLU.

Same data and scoring as ``distmatch_nlu_topk_ppl``; dataset abbreviations end in ``_emo_code``. The strings are
eval_tasks.nlu's ``emo_code`` variant. The retriever is ``DistMatchTopkRetriever``:
OpenCompass's TopkRetriever with OpenICL's clean-up of tokenization spaces in its GPT-2 round trip (see
eval_tasks.opencompass_ext). With the summarizer ``distmatch_nlu_emo_code`` this is the counterpart of the lm-eval
``--metadata '{"protocol": "emo_official"}'``.
"""

from mmengine.config import read_base

from eval_tasks.opencompass_ext import DistMatchTopkRetriever

with read_base():
    from .distmatch_nlu_topk_ppl import distmatch_nlu_datasets as _paper

_emo_code_templates = {
${template_blocks}}

# (No `import copy`: mmengine turns imports in a read_base() config into lazy placeholders; plain dicts only.)
distmatch_nlu_emo_code_datasets = []
for _dataset in _paper:
    if _dataset["abbr"] in _emo_code_templates:
        _infer = _dataset["infer_cfg"]
        _dataset = dict(
            _dataset,
            abbr=_dataset["abbr"] + "_emo_code",
            infer_cfg=dict(
                _infer,
                ice_template=dict(_infer["ice_template"], template=_emo_code_templates[_dataset["abbr"]]),
                retriever=dict(_infer["retriever"], type=DistMatchTopkRetriever),
            ),
        )
    distmatch_nlu_emo_code_datasets.append(_dataset)

del _dataset
''')

OC_SUMMARIZER_DOC = Template('''\
"""Summarizer for ``distmatch_nlu_topk_ppl``: per-task accuracy, MMLU (mean of its 57 subjects, OpenCompass's usual
MMLU number) and ``distmatch_nlu`` = the unweighted mean of the ${n_tasks} task accuracies (the EMO paper's average)."""
''')

OC_EMO_CODE_SUMMARIZER_DOC = Template('''\
"""Summarizer for ``distmatch_nlu_emo_code_topk_ppl`` (the EMO paper's Table 3 protocol in OpenCompass).

OpenCompass's ``TopkRetriever`` (OpenICL's, with its GPT-2 text round trip before embedding) and ``PPLInferencer``
(OpenICL's mean over the prompt's tokens counted with the tokenizer's special tokens) already are the EMO
protocol; with the EMO repository's templates (the ``_emo_code`` datasets) this summary is the counterpart of the
lm-eval group ``distmatch_nlu`` run with ``--metadata '{"protocol": "emo_official"}'``: per-task accuracy, MMLU as
the mean of its 57 subjects, and ``distmatch_nlu_emo_code`` = the unweighted mean of the ${n_tasks} task accuracies.
"""
''')

OC_SUMMARIZER = Template("""\
${docstring}
from mmengine.config import read_base

with read_base():
    from ..datasets.distmatch.distmatch_mmlu_ppl import distmatch_mmlu_subjects as _subjects

_icl = [
${icl_list}]

summarizer = dict(
    dataset_abbrs=["${name}", *_icl, "${mmlu}"],
    summary_groups=[
        dict(name="${mmlu}", subsets=[f"${mmlu}_{s}" for s in _subjects]),
        dict(name="${name}", subsets=[*_icl, "${mmlu}"]),
    ],
)
""")


def _header(comment: str) -> str:
    return (
        f"{comment} Generated from eval_tasks/nlu/nlu.py by `{COMMAND}`; do not edit (`--check` compares).\n"
    )


def _py_str(text: str) -> str:
    """A Python string literal as ruff format writes it (double quotes unless the text holds more of them)."""
    if '"' in text and "'" not in text:
        return "'" + text.replace("\\", "\\\\").replace("\n", "\\n") + "'"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _oc_template(spec: nlu.ClassificationSpec, variant: str) -> dict[int, str]:
    """The spec's templates in OpenCompass's form: label id -> ``"</E>"`` + template with ``{<text field>}``."""
    template = spec.template(variant)
    return {
        i: "</E>" + template[name].replace(nlu.PLACEHOLDER, "{" + spec.text_field + "}")
        for i, name in enumerate(spec.labels)
    }


def _counts() -> dict[str, int]:
    return {"n_icl": len(nlu.ICL_TASKS), "n_tasks": len(nlu.NLU_TASK_NAMES)}


# ---------------------------------------------------------------------------------------------------------
# lm-eval


def lm_eval_task_yaml(spec: nlu.ClassificationSpec) -> str:
    return _header("#") + LM_EVAL_TASK.substitute(task=spec.task, key=spec.key)


def lm_eval_group_yaml() -> str:
    task_list = "".join(f"  - {name}\n" for name in nlu.NLU_TASK_NAMES)
    return _header("#") + LM_EVAL_GROUP.substitute(task_list=task_list, **_counts())


def lm_eval_code_task_yaml(spec: code_tasks.CodeTaskSpec) -> str:
    header = (
        f"# Generated from eval_tasks/code/code_tasks.py by `{COMMAND}`; do not edit (`--check` compares).\n"
    )
    return header + CODE_TASK.substitute(task=spec.task, key=spec.key, title=spec.title, note=spec.note)


# ---------------------------------------------------------------------------------------------------------
# OpenCompass


def oc_task_config(spec: nlu.ClassificationSpec) -> str:
    var = f"distmatch_{spec.key}_template"
    entries = "".join(
        f"    {i}: {_py_str(template)},  # {spec.labels[i]}\n"
        for i, template in _oc_template(spec, "paper").items()
    )
    ice_template = f'            ice_template=dict(type=PromptTemplate, ice_token="</E>", template={var}),'
    if len(ice_template) > LINE_LENGTH:
        ice_template = (
            "            ice_template=dict(\n"
            f'                type=PromptTemplate, ice_token="</E>", template={var}\n'
            "            ),"
        )
    pool_comment = ""
    if spec.pool_split != "train":
        pool_comment = (
            f"# Demonstration pool: {spec.pool_split!r} (a slice of the training split, eval_tasks/nlu/nlu.py), "
            "applied by the loader.\n"
        )
    return _header("#") + OC_TASK.substitute(
        task=spec.task,
        key=spec.key,
        path=spec.path,
        config=f" (config {spec.name!r})" if spec.name else "",
        revision=repr(spec.revision),
        test_split=repr(spec.test_split),
        pool_split=repr(spec.pool_split),
        pool_comment=pool_comment,
        var=var,
        template_entries=entries,
        text_field=spec.text_field,
        label_field=spec.label_field,
        ice_template=ice_template,
        ice_num=OC_ICE_NUM,
        retriever_model=OC_RETRIEVER_MODEL,
        retriever_tokenizer=OC_RETRIEVER_TOKENIZER,
    )


def _suite_members() -> list[tuple[str, str]]:
    """(module, alias) of each suite member, in the table's order (MMLU last)."""
    members = [(f"distmatch_{key}_topk_ppl", f"_{key}") for key in nlu.ICL_TASKS]
    return [*members, ("distmatch_mmlu_ppl", "_mmlu")]


def oc_suite_config() -> str:
    imports = "".join(
        f"    from .{module} import {module.removesuffix('_ppl').removesuffix('_topk')}_datasets as {alias}\n"
        for module, alias in sorted(_suite_members())  # isort's order
    )
    members = ", ".join(f"*{alias}" for _, alias in _suite_members())
    return _header("#") + OC_SUITE.substitute(imports=imports, members=members, **_counts())


def oc_emo_code_suite_config() -> str:
    blocks = []
    for spec in nlu.ICL_TASKS.values():
        items = [f"{i}: {_py_str(t)}" for i, t in _oc_template(spec, "emo_code").items()]
        one_line = f'    "{spec.task}": {{{", ".join(items)}}},'
        if len(one_line) <= LINE_LENGTH:
            blocks.append(one_line + "\n")
        else:
            blocks.append(
                f'    "{spec.task}": {{\n' + "".join(f"        {item},\n" for item in items) + "    },\n"
            )
    return _header("#") + OC_EMO_CODE_SUITE.substitute(template_blocks="".join(blocks), **_counts())


def _summarizer(name: str, suffix: str, docstring: Template) -> str:
    icl_list = "".join(f'    "{spec.task}{suffix}",\n' for spec in nlu.ICL_TASKS.values())
    return _header("#") + OC_SUMMARIZER.substitute(
        docstring=docstring.substitute(**_counts()), icl_list=icl_list, name=name, mmlu=nlu.MMLU.task
    )


def oc_summarizer() -> str:
    return _summarizer("distmatch_nlu", "", OC_SUMMARIZER_DOC)


def oc_emo_code_summarizer() -> str:
    return _summarizer("distmatch_nlu_emo_code", "_emo_code", OC_EMO_CODE_SUMMARIZER_DOC)


# ---------------------------------------------------------------------------------------------------------


def generated_files() -> dict[Path, Callable[[], str]]:
    """Every generated file (relative to the repository root) and the function that writes its text."""
    files: dict[Path, Callable[[], str]] = {}
    for spec in nlu.ICL_TASKS.values():
        files[LM_EVAL_NLU_DIR / f"{spec.task}.yaml"] = lambda spec=spec: lm_eval_task_yaml(spec)
    files[LM_EVAL_NLU_DIR / "distmatch_nlu.yaml"] = lm_eval_group_yaml
    for code_spec in code_tasks.CODE_TASKS.values():
        code_yaml = LM_EVAL_CODE_DIR / f"{code_spec.task}.yaml"
        files[code_yaml] = lambda spec=code_spec: lm_eval_code_task_yaml(spec)
    for spec in nlu.ICL_TASKS.values():
        files[OC_DATASETS_DIR / f"{spec.task}_topk_ppl.py"] = lambda spec=spec: oc_task_config(spec)
    files[OC_DATASETS_DIR / "distmatch_nlu_topk_ppl.py"] = oc_suite_config
    files[OC_DATASETS_DIR / "distmatch_nlu_emo_code_topk_ppl.py"] = oc_emo_code_suite_config
    files[OC_SUMMARIZERS_DIR / "distmatch_nlu.py"] = oc_summarizer
    files[OC_SUMMARIZERS_DIR / "distmatch_nlu_emo_code.py"] = oc_emo_code_summarizer
    return files


def leftovers(root: Path, keep: set[Path]) -> list[Path]:
    """Files under `root` that carry this script's header but are no longer generated (a task left the table)."""
    found = []
    # LM_EVAL_DIR and its old family folders too: a generated YAML left there from before the family packages
    for folder in (
        LM_EVAL_DIR,
        LM_EVAL_DIR / "nlu",
        LM_EVAL_DIR / "code",
        LM_EVAL_NLU_DIR,
        LM_EVAL_CODE_DIR,
        OC_DATASETS_DIR,
        OC_SUMMARIZERS_DIR,
    ):
        for path in sorted((root / folder).glob("*")):
            rel = path.relative_to(root)
            if path.is_file() and rel not in keep and _is_generated(path):
                found.append(rel)
    return found


def _is_generated(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as f:
        return f"by `{COMMAND}`" in f.readline()
