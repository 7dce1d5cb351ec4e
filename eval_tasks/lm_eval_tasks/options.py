"""The distmatch task options (lm-eval's ``--metadata '{...}'``): one table, checked before the model or data loads.

``TASK_OPTIONS`` is the only list of valid keys: a key added here is accepted everywhere. `check_task_options`
refuses unknown keys (naming the valid ones and the closest match) and out-of-range values; `check_options_apply`
an option none of the requested tasks reads and a protocol of another task family; `missing_data` lists
every local split the requested tasks need that is not in the data folder, all at once. All run from
`preflight`, which the lm-eval activation hook calls at the start of ``simple_evaluate`` (before the model is
built) when a ``distmatch_*`` task is requested; the task classes check their options again (Python-API users).

Pure Python: nothing here imports lm-eval, datasets or torch.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError

__all__ = [
    "TASK_OPTIONS",
    "TaskOption",
    "check_options_apply",
    "check_task_options",
    "missing_data",
    "preflight",
    "requested_splits",
]


def _int_at_least(low: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"an integer >= {low}"
        return None

    return check


def _non_empty_str(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _bool_like(value: Any) -> str | None:
    ok = isinstance(value, bool) or str(value).strip().lower() in ("0", "1", "true", "false", "yes", "no")
    return None if ok else "true or false"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else "one of " + ", ".join(repr(c) for c in choices)


def _existing_dir(value: Any) -> str | None:
    problem = _non_empty_str(value)
    if problem is None and not Path(str(value)).expanduser().is_dir():
        return "an existing folder"
    return problem


def _existing_file(value: Any) -> str | None:
    problem = _non_empty_str(value)
    if problem is None and not Path(str(value)).expanduser().is_file():
        return "an existing file"
    return problem


def _dir_or_off(value: Any) -> str | None:
    return None if isinstance(value, bool) or _non_empty_str(value) is None else "a folder or false"


@dataclass(frozen=True)
class TaskOption:
    name: str
    check: Callable[[Any], str | None]  # None when valid, else what is expected
    tasks: str  # which tasks read it (for the error messages and docs/evaluation.md)


TASK_OPTIONS: dict[str, TaskOption] = {
    o.name: o
    for o in (
        TaskOption("template", _one_of("paper", "emo_code"), "NLU retrieval tasks"),
        TaskOption("ice_num", _int_at_least(0), "NLU retrieval tasks"),
        TaskOption("retriever_model", _non_empty_str, "NLU retrieval tasks"),
        TaskOption("retriever_device", _non_empty_str, "NLU retrieval tasks"),
        TaskOption("retriever_batch_size", _int_at_least(1), "NLU retrieval tasks"),
        TaskOption("cache_dir", _dir_or_off, "NLU retrieval tasks"),
        TaskOption("data_dir", _existing_dir, "NLU, MMLU, IFEval"),
        TaskOption("num_samples", _int_at_least(2), "creative writing"),
        TaskOption("prompts_file", _existing_file, "creative writing"),
        TaskOption("sbert_model", _non_empty_str, "creative writing"),
        TaskOption("gem_compat", _bool_like, "creative writing"),
    )
}


#: The task families of `eval_tasks.protocols.FAMILIES` as the messages name them.
FAMILY_NAMES = {
    "icl": "NLU retrieval tasks",
    "mmlu": "MMLU",
    "ifeval": "IFEval",
    "creative": "creative writing",
}


def _from_protocol_table() -> None:
    """The options defined with the papers' protocols (`eval_tasks.protocols.TASK_OPTIONS`: `protocol`,
    `openicl_round_trip`, `ppl_norm`, `mmlu_average`, `scoring`, ...) join this table with their valid values."""
    from eval_tasks.protocols import TASK_OPTIONS as PROTOCOL_OPTIONS

    families = FAMILY_NAMES
    for option in PROTOCOL_OPTIONS.values():
        if option.name in TASK_OPTIONS:
            continue
        if option.kind is bool:
            check = _bool_like
        elif option.choices is not None:
            check = _one_of(*option.choices)
        else:
            check = _non_empty_str
        TASK_OPTIONS[option.name] = TaskOption(
            option.name, check, ", ".join(families[f] for f in option.families) + " tasks"
        )


_from_protocol_table()

#: Keys lm-eval itself puts in a task's metadata (the YAML's `metadata:` block).
LM_EVAL_KEYS = ("version",)
#: Model arguments the tasks read from the metadata (lm-eval merges `--model_args` into it).
MODEL_ARG_KEYS = ("pretrained", "tokenizer", "revision", "trust_remote_code")


def check_task_options(metadata: Mapping[str, Any], model_args: Iterable[str] | None = None) -> None:
    """Refuse unknown keys and out-of-range values in a distmatch task's metadata, all problems in one message.

    `model_args`: the names of the model arguments lm-eval merged into `metadata` (known at the start of
    ``simple_evaluate``). When they are unknown (None), a key is only refused when it is close to a valid one
    (a typo); others may be model arguments.
    """
    known = set(TASK_OPTIONS) | set(LM_EVAL_KEYS) | set(MODEL_ARG_KEYS)
    passed_through = set(model_args or ())
    problems = []
    for key, value in metadata.items():
        option = TASK_OPTIONS.get(key)
        if option is not None:
            if value is None:
                continue
            expected = option.check(value)
            if expected is not None:
                problems.append(f"{key}={value!r} is invalid for the {option.tasks}; expected {expected}")
            continue
        if key in known or key in passed_through:
            continue
        # Without the model arguments' names, only a near-certain typo is refused (`batch_size` may be one).
        close = difflib.get_close_matches(key, list(TASK_OPTIONS), n=1, cutoff=0.6 if model_args else 0.8)
        if model_args is None and not close:
            continue
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unknown task option {key!r}{hint}")
    if problems:
        raise DistMatchConfigError(
            "distmatch task metadata: "
            + "; ".join(problems)
            + ". Valid options: "
            + ", ".join(TASK_OPTIONS)
            + "."
        )


def _leaf_tasks(name: str) -> list[str]:
    """The distmatch tasks a requested name runs (a group or tag: its members)."""
    from eval_tasks import nlu
    from eval_tasks.lm_eval_tasks import CREATIVE_TASKS

    groups = {
        "distmatch_nlu": list(nlu.NLU_TASK_NAMES),
        "distmatch_icl": [f"distmatch_{key}" for key in nlu.ICL_TASKS],
        "distmatch_creative": list(CREATIVE_TASKS),
    }
    return groups.get(name, [name])


def check_options_apply(task_names: Iterable[str], metadata: Mapping[str, Any]) -> None:
    """Refuse an option that none of the requested distmatch tasks reads (it would be ignored: `num_samples` with
    ``distmatch_sst2``) and a protocol of another task family (``gem_official`` with an NLU task), in one message
    naming the option, the tasks and what they accept. Tasks lm-eval does not know are left to lm-eval."""
    from eval_tasks.protocols import PROTOCOLS, family_of_task
    from eval_tasks.protocols import TASK_OPTIONS as OPTIONS

    by_family: dict[str, list[str]] = {}  # family -> the requested names that run tasks of it
    for name in task_names:
        if not isinstance(name, str) or not name.startswith("distmatch_"):
            continue
        for leaf in _leaf_tasks(name):
            family = family_of_task(leaf)
            if family is not None and name not in by_family.setdefault(family, []):
                by_family[family].append(name)
    if not by_family:
        return
    requested = list(dict.fromkeys(n for names in by_family.values() for n in names))
    read_here = [o.name for o in OPTIONS.values() if set(o.families) & set(by_family)]
    problems = []
    for key, value in metadata.items():
        option = OPTIONS.get(key)
        if option is None or value is None or value == "":
            continue
        if key == "protocol":
            if not isinstance(value, str) or value not in PROTOCOLS:
                continue  # an unknown protocol: check_task_options names the valid ones
            wrong = [f for f in by_family if f not in PROTOCOLS[value]["families"]]
            if wrong:
                tasks = ", ".join(dict.fromkeys(n for f in wrong for n in by_family[f]))
                kinds = " and ".join(FAMILY_NAMES[f] for f in wrong)
                valid = [p for p, spec in PROTOCOLS.items() if set(by_family) <= set(spec["families"])]
                meant = " and ".join(FAMILY_NAMES[f] for f in PROTOCOLS[value]["families"])
                both = "creative" in by_family and bool({"icl", "mmlu"} & set(by_family))
                hint = (
                    " (run the EMO NLU and the GEM creative-writing tasks in separate lm_eval calls)"
                    if both
                    else ""
                )
                problems.append(
                    f"protocol={value!r} is for the {meant} tasks, not {tasks} ({kinds}); accepted for "
                    f"{', '.join(requested)}: {', '.join(valid)}{hint}"
                )
        elif not set(option.families) & set(by_family):
            meant = ", ".join(FAMILY_NAMES[f] for f in option.families)
            problems.append(
                f"{key}={value!r} is not read by {', '.join(requested)} (only by the {meant} tasks), so it would be "
                f"ignored; the options these tasks read: {', '.join(read_here)}"
            )
    if problems:
        raise DistMatchConfigError("distmatch task metadata: " + "; ".join(problems) + ".")


def _task_keys(task_names: Iterable[str]) -> list[str]:
    """The data keys (`eval_tasks.nlu` / `eval_tasks.dataset_loading`) of the requested distmatch tasks and groups."""
    from eval_tasks import nlu

    keys: list[str] = []
    for name in task_names:
        if not isinstance(name, str) or not name.startswith("distmatch_"):
            continue
        short = name.removeprefix("distmatch_")
        if name in ("distmatch_nlu", "distmatch_icl"):
            members = [*nlu.ICL_TASKS] + ([nlu.MMLU.key] if name == "distmatch_nlu" else [])
        else:
            members = [short]
        keys += [k for k in members if k not in keys]
    return keys


def requested_splits(task_names: Iterable[str]) -> list[tuple[str, str, str]]:
    """(data key, Hub dataset id, split) of every split the requested distmatch tasks load."""
    from eval_tasks import dataset_loading, nlu

    splits = []
    for key in _task_keys(task_names):
        if key in nlu.ICL_TASKS:
            spec = nlu.ICL_TASKS[key]
            splits += [(key, spec.path, spec.test_split), (key, spec.path, spec.pool_split)]
        elif key == nlu.MMLU.key:
            splits += [(key, nlu.MMLU.path, nlu.MMLU.test_split), (key, nlu.MMLU.path, nlu.MMLU.shot_split)]
        elif key == dataset_loading.IFEVAL["key"]:
            splits.append((key, dataset_loading.IFEVAL["path"], dataset_loading.IFEVAL["split"]))
    return list(dict.fromkeys(splits))


def missing_data(task_names: Iterable[str], data_dir: str | os.PathLike[str]) -> list[str]:
    """Every local file the requested tasks need under `data_dir` that is not there (one line each)."""
    from eval_tasks import dataset_loading

    missing = []
    for key, path, split in requested_splits(task_names):
        try:
            dataset_loading.load_arguments(key, path, None, None, split, data_dir)
        except dataset_loading.DataUnavailableError:
            base = split.split("[", 1)[0]
            missing.append(
                f"{Path(data_dir).expanduser() / key / (base + '.jsonl')} (Hub {path!r}, split {base!r})"
            )
    return missing


def preflight(
    task_names: Iterable[str], metadata: Mapping[str, Any] | None, model_args: Iterable[str] | None
) -> None:
    """The checks run before lm-eval builds the model: options, then the local data of every requested task."""
    names = [t for t in task_names if isinstance(t, str)]
    if not any(t.startswith("distmatch_") for t in names):
        return
    metadata = dict(metadata or {})
    check_task_options(metadata, model_args)
    check_options_apply(names, metadata)
    from eval_tasks import dataset_loading

    data_dir = dataset_loading.option(metadata, "data_dir", dataset_loading.DATA_DIR_ENV)
    if data_dir:
        missing = missing_data(names, data_dir)
        if missing:
            source = "data_dir option" if metadata.get("data_dir") else f"${dataset_loading.DATA_DIR_ENV}"
            raise DistMatchConfigError(
                f"the local data folder {data_dir} ({source}) lacks {len(missing)} split(s) the requested tasks "
                f"need: {'; '.join(missing)}. Export each split as JSON Lines with the Hub dataset's columns to "
                "those paths, or unset the data folder to load from the Hub."
            )
