"""Loading the evaluation data: Hugging Face Hub datasets (pinned ids/revisions) or the same splits from local files.

Every split goes through :func:`load_split`, which calls ``datasets.load_dataset`` with the arguments of
:func:`load_arguments`:

* by default the Hub dataset of the task spec (id, config, revision, split - e.g. ``SetFit/sst2``, ``train``);
* with a local data folder (``data_dir`` task option or ``$DISTMATCH_EVAL_DATA_DIR``) the split is read from
  ``<data_dir>/<task key>/<split>.jsonl`` (or ``.json`` / ``.parquet``) with the same columns as the Hub dataset,
  keeping the split's row slice (AG News still uses ``train[:36000]``). That is how the tests run offline, and how
  a machine without Hub access evaluates on an exported copy.

Also here: the document builders shared by the lm-eval tasks and the OpenCompass dataset classes (NLU with
retrieval, MMLU, IFEval) and the offline NLTK ``punkt_tab`` workaround IFEval needs. The creative-writing
prompts are package data (:mod:`eval_tasks.creative`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from distmatch.optional import require
from eval_tasks.nlu import nlu, retrieval
from eval_tasks.task_options import TASK_OPTIONS

__all__ = [
    "DATA_DIR_ENV",
    "IFEVAL",
    "DataUnavailableError",
    "ensure_punkt_tab",
    "icl_documents",
    "ifeval_documents",
    "load_arguments",
    "load_split",
    "mmlu_documents",
]

DATA_DIR_ENV: str = TASK_OPTIONS["data_dir"].env  # type: ignore[assignment]
_LOCAL_FORMATS = (("jsonl", "json"), ("json", "json"), ("parquet", "parquet"))

#: IFEval (GEM section 5.1 / Table 1): the 541 prompts of google/IFEval.
IFEVAL = {"key": "ifeval", "path": "google/IFEval", "name": None, "revision": "main", "split": "train"}


class DataUnavailableError(RuntimeError):
    """An evaluation dataset cannot be loaded (offline and not cached, or a local file is missing)."""


def _split_base(split: str) -> str:
    return re.split(r"[\[+]", split, maxsplit=1)[0].strip()


def load_arguments(
    key: str,
    path: str,
    name: str | None,
    revision: str | None,
    split: str,
    data_dir: str | os.PathLike | None,
) -> dict[str, Any]:
    """The keyword arguments of ``datasets.load_dataset`` for one split (Hub, or local files under `data_dir`)."""
    if not data_dir:
        args: dict[str, Any] = {"path": path, "split": split}
        if name:
            args["name"] = name
        if revision:
            args["revision"] = revision
        return args
    base = _split_base(split)
    folder = Path(data_dir).expanduser() / key
    for ext, builder in _LOCAL_FORMATS:
        candidate = folder / f"{base}.{ext}"
        if candidate.is_file():
            return {"path": builder, "data_files": {base: str(candidate)}, "split": split}
    raise DataUnavailableError(
        f"Local data for {key!r} (Hub dataset {path!r}, split {split!r}) not found: expected "
        f"{folder / (base + '.jsonl')} (or .json/.parquet) with the Hub dataset's columns, because the data folder "
        f"is set to {data_dir} (data_dir option or ${DATA_DIR_ENV}). Unset it to load from the Hub."
    )


def load_split(
    key: str,
    path: str,
    name: str | None,
    revision: str | None,
    split: str,
    data_dir: str | os.PathLike | None = None,
) -> Any:
    """A ``datasets.Dataset`` for one split, or :class:`DataUnavailableError` saying how to get it."""
    args = load_arguments(key, path, name, revision, split, data_dir)
    datasets = require("datasets", extra="eval", feature="Loading the evaluation datasets")
    try:
        return datasets.load_dataset(**args)
    except Exception as err:  # Hub/offline/file errors come in many types
        if data_dir:
            raise DataUnavailableError(
                f"Could not read local data for {key!r} ({args['data_files']}): {type(err).__name__}: "
                f"{' '.join(str(err).split())}"
            ) from err
        offline = any(os.environ.get(v) == "1" for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        where = (
            f"{path!r}"
            + (f" (config {name!r})" if name else "")
            + (f" at revision {revision!r}" if revision else "")
        )
        raise DataUnavailableError(
            f"Cannot load the evaluation dataset {where}, split {split!r}."
            + (
                " The Hugging Face Hub is switched off (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE=1)."
                if offline
                else ""
            )
            + " To fix: run once with network access so the datasets cache holds it, or export the split as JSON "
            f"Lines with the same columns to <dir>/{key}/{_split_base(split)}.jsonl and set {DATA_DIR_ENV}=<dir> "
            '(or --metadata \'{"data_dir": "<dir>"}\'). '
            f"Cause: {type(err).__name__}: {' '.join(str(err).split())}"
        ) from err


# ---------------------------------------------------------------------------------------------------------
# Documents


def icl_documents(
    key: str,
    *,
    template: str = TASK_OPTIONS["template"].default,
    retriever_model: str | None = None,
    ice_num: int = TASK_OPTIONS["ice_num"].default,
    data_dir: str | None = None,
    cache_dir: str | bool | None = None,
    device: str | None = None,
    batch_size: int = TASK_OPTIONS["retriever_batch_size"].default,
    openicl_round_trip: bool = TASK_OPTIONS["openicl_round_trip"].default,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The evaluation documents of one classification task (:func:`eval_tasks.nlu.build_icl_rows`) + retrieval info.

    `openicl_round_trip`: the retriever embeds each text after OpenICL's GPT-2 decode round trip
    (:func:`eval_tasks.nlu.retrieval.openicl_round_trip`); the prompts keep the original texts, as in OpenICL.
    """
    spec = nlu.get_spec(key)
    if not isinstance(spec, nlu.ClassificationSpec):
        raise ValueError(f"{spec.task} is not a retrieval (in-context classification) task.")
    spec.template(template)  # fail early on an unknown variant
    test = load_split(spec.key, spec.path, spec.name, spec.revision, spec.test_split, data_dir)
    pool = load_split(spec.key, spec.path, spec.name, spec.revision, spec.pool_split, data_dir)
    test_rows, pool_rows = test.to_list(), pool.to_list()
    embedded = retrieval.openicl_round_trip if openicl_round_trip else (lambda text: text)
    indices, scores, info = retrieval.retrieve(
        spec.task,
        [embedded(row[spec.text_field]) for row in test_rows],
        [embedded(row[spec.text_field]) for row in pool_rows],
        int(ice_num),
        model=retriever_model,
        dataset={
            "path": spec.path,
            "name": spec.name,
            "revision": spec.revision,
            "test_split": spec.test_split,
            "pool_split": spec.pool_split,
            "local": bool(data_dir),
            **({"text": "openicl_round_trip"} if openicl_round_trip else {}),
        },
        cache=cache_dir,
        device=device,
        batch_size=batch_size,
    )
    docs = nlu.build_icl_rows(spec, test_rows, pool_rows, indices, scores, template)
    return docs, {**info, "template": template, "openicl_round_trip": bool(openicl_round_trip)}


def mmlu_documents(*, data_dir: str | None = None) -> list[dict[str, Any]]:
    spec = nlu.MMLU
    test = load_split(spec.key, spec.path, spec.name, spec.revision, spec.test_split, data_dir)
    shots = load_split(spec.key, spec.path, spec.name, spec.revision, spec.shot_split, data_dir)
    return nlu.build_mmlu_rows(test.to_list(), shots.to_list(), spec.num_shots)


def ifeval_documents(*, data_dir: str | None = None) -> Any:
    """The IFEval prompts (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) as a ``datasets.Dataset``."""
    return load_split(
        IFEVAL["key"], IFEVAL["path"], IFEVAL["name"], IFEVAL["revision"], IFEVAL["split"], data_dir
    )


# ---------------------------------------------------------------------------------------------------------
# NLTK punkt_tab (IFEval's word/sentence counting) without a download


PUNKT_STUB_ENV = "DISTMATCH_PUNKT_STUB"
_PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def ensure_punkt_tab(stub_root: str | os.PathLike | None = None) -> str:
    """Make ``nltk`` find an English ``punkt_tab``; returns ``"installed"``, ``"stub"`` or ``"missing"``.

    If NLTK has the real data, nothing changes. Otherwise (offline; no package ships the data) an *untrained*
    Punkt model is provided: the four empty files under ``<root>/tokenizers/punkt_tab/english/``, with ``<root>``
    = `stub_root`, else ``~/.cache/distmatch/nltk_data``, added to ``nltk.data.path``. Sentence splitting then
    knows no abbreviations ("Mr." ends a sentence), which can change a few IFEval sentence-count checks; install
    the real data with ``python -m nltk.downloader punkt_tab`` where there is network. ``$DISTMATCH_PUNKT_STUB=0``
    disables the stub (NLTK then raises its own LookupError).
    """
    nltk = require("nltk", extra="eval", feature="IFEval (NLTK tokenisation)")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return "installed"
    except LookupError:
        pass
    if os.environ.get(PUNKT_STUB_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return "missing"
    root = Path(stub_root) if stub_root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = root / "distmatch" / "nltk_data" if not stub_root else root
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True, exist_ok=True)
    for name in _PUNKT_FILES:
        (folder / name).touch()
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))
    print(
        f"distmatch: NLTK 'punkt_tab' is not installed; using an untrained Punkt model ({root}) for IFEval's "
        "sentence/word counts (install the real one with: python -m nltk.downloader punkt_tab).",
        file=sys.stderr,
    )
    return "stub"
