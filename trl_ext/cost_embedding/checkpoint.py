"""EMO's cost embedding from another model's checkpoint (`emo_cost_embedding: <path or hub id>`), checked and read
cheaply; and the one vocabulary check every caller uses (`check_vocabulary`).

* `check_cost_embedding_source(value, vocab_size)`: configuration time, no weights: 'frozen' / 'live' pass; a path
  must exist and hold a `config.json`; anything else must be a well-formed hub id whose `config.json` can be fetched
  (or is cached, offline); the vocabulary size read from that `config.json` must equal the training model's. A
  local folder is checked down to the safetensors header of the output embedding (index, shards, shape).
* `read_output_embedding(value, vocab_size)`: only the output-embedding tensor, read from the safetensors file that
  holds it (located through `model.safetensors.index.json` for sharded checkpoints), in the dtype it is stored in.
  Tied embeddings (no `lm_head.weight`) read the input embedding. Checkpoints without safetensors fall back to
  loading the model (in its stored dtype) and keeping its output layer.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError
from distmatch.weights import weights_problem

#: The sources that are not another model: a frozen copy of the pre-trained head, the live head (detached).
BUILTIN_SOURCES = ("frozen", "live")
#: `owner/name` or `name`: letters, digits, `-`, `_`, `.` (no `--` / `..`, no leading/trailing `-` / `.`), <= 96.
_HUB_PART = r"(?!.*(--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.-]{0,94}(?<![.-])"
HUB_ID = re.compile(rf"^({_HUB_PART}/)?{_HUB_PART}$")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_OUTPUT_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")
_INPUT_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


def _setting(value: str) -> str:
    return f"emo_cost_embedding={value!r}"


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or os.sep + os.sep in value or value.count("/") > 1


def _fetch(value: str, filename: str) -> str | None:
    """A file of hub repo `value` (cache first; None when the repo has no such file)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return hf_hub_download(value, filename)
    except (
        LocalEntryNotFoundError
    ):  # offline / not cached (a subclass of EntryNotFoundError in recent releases)
        if filename == "config.json":
            raise
        return None
    except EntryNotFoundError:  # the repository has no such file
        return None


def _config_file(value: str) -> str:
    path = Path(value).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise DistMatchConfigError(
                f"{_setting(value)}: {path} has no config.json; give a model folder (as saved by "
                "save_pretrained), 'frozen' or 'live'."
            )
        return str(path / "config.json")
    if _looks_like_path(value) or not HUB_ID.match(value):
        raise DistMatchConfigError(
            f"{_setting(value)}: no such folder, and not a hub id (owner/name); give an existing model folder, "
            "a hub id, 'frozen' (the paper's choice) or 'live'."
        )
    try:
        found = _fetch(value, "config.json")
    except Exception as err:
        raise DistMatchConfigError(
            f"{_setting(value)}: could not get config.json of the hub model {value!r} "
            f"({type(err).__name__}); check the id, your access, or download it first when offline "
            f"(huggingface-cli download {value})."
        ) from None
    if found is None:
        raise DistMatchConfigError(f"{_setting(value)}: the hub model {value!r} has no config.json.")
    return found


def check_vocabulary(value: str, theirs: int | None, ours: int | None, found: str | None = None) -> None:
    """The one vocabulary check: EMO's costs are indexed by token id, so the cost embedding's vocabulary (`theirs`:
    from its `config.json`, or `found` = the shape of its tensor) must be the trained model's (`ours`). Unknown on
    either side passes (the tensor's shape is checked again when it is read)."""
    if theirs is None or ours is None or theirs == ours:
        return
    if found is not None:
        raise DistMatchConfigError(
            f"{_setting(value)}: {found}; expected [{ours}, d] (the training model's vocabulary)."
        )
    raise DistMatchConfigError(
        f"{_setting(value)} has a vocabulary of {theirs} tokens but the model being trained has {ours}; "
        "EMO's cost embedding must come from a model with the same tokenizer."
    )


def vocab_size_of(config: dict[str, Any]) -> int | None:
    """`vocab_size` of a `config.json` (also a multimodal model's `text_config`)."""
    for section in (config, config.get("text_config") or {}):
        if isinstance(section.get("vocab_size"), int):
            return section["vocab_size"]
    return None


def model_vocab_size(model_path: str | os.PathLike[str] | None) -> int | None:
    """The vocabulary size in a local model folder's `config.json` (None when unknown); reads no weights."""
    if model_path is None:
        return None
    config = Path(model_path).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        return vocab_size_of(json.loads(config.read_text()))
    except (OSError, ValueError):
        return None


def _read_json(file: str | os.PathLike[str], value: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise DistMatchConfigError(
            f"{_setting(value)}: {file} is not a readable JSON {what} ({reason}); re-save the model with "
            "save_pretrained, or use 'frozen' / 'live'."
        ) from None
    if not isinstance(data, dict):
        raise DistMatchConfigError(f"{_setting(value)}: {file} is not a JSON object; expected a {what}.")
    return data


def check_cost_embedding_source(value: Any, vocab_size: int | None = None) -> dict[str, Any] | None:
    """Validate `emo_cost_embedding` without loading weights; returns the other model's config (None if builtin).

    A local folder is checked down to the tensor EMO will read: `config.json` parses, the safetensors index (if
    any) parses and names existing shards, and the header of the file holding the output embedding is intact and
    gives it the shape [V, d] (a truncated or corrupt file fails here, before any model is loaded)."""
    if not isinstance(value, str) or not value:
        raise DistMatchConfigError(
            f"emo_cost_embedding={value!r} is invalid; expected 'frozen', 'live' or a model path / hub id."
        )
    if value in BUILTIN_SOURCES:
        return None
    config = _read_json(_config_file(value), value, "model config")
    theirs = vocab_size_of(config)
    check_vocabulary(value, theirs, vocab_size)
    if Path(value).expanduser().is_dir():
        problem = weights_problem(Path(value).expanduser())
        if problem is not None:  # no weight file, or one cut short: it would fail after the model loads
            raise DistMatchConfigError(
                f"{_setting(value)}: {problem}; give a complete model folder (as saved by save_pretrained)."
            )
    if Path(value).expanduser().exists():
        located = _locate_output_embedding(value, config)
        if located is not None:
            _check_tensor_shape(value, *located, vocab_size or theirs)
    return config


def _open_safetensors(value: str, file: str) -> Any:
    from safetensors import safe_open

    if not Path(file).is_file():
        raise DistMatchConfigError(
            f"{_setting(value)}: {file} is missing (named by {INDEX}); download the whole checkpoint."
        )
    try:
        return safe_open(file, framework="pt")
    except Exception as err:  # safetensors raises its own SafetensorError for a bad header
        raise DistMatchConfigError(
            f"{_setting(value)}: {file} is not a readable safetensors file ({str(err).splitlines()[0][:120]}); "
            "it may be truncated or corrupt: download or save it again."
        ) from None


def _check_tensor_shape(value: str, name: str, file: str, vocab_size: int | None) -> None:
    """The output embedding's shape from the file header (no tensor data is read)."""
    with _open_safetensors(value, file) as reader:
        if name not in reader.keys():
            raise DistMatchConfigError(
                f"{_setting(value)}: {file} has no tensor `{name}` although {INDEX} says it does; the "
                "checkpoint is inconsistent: download or save it again."
            )
        shape = tuple(reader.get_slice(name).get_shape())
    found = f"its output embedding `{name}` in {file} has shape {shape}"
    if len(shape) != 2:
        raise DistMatchConfigError(
            f"{_setting(value)}: {found}; expected [{vocab_size or 'V'}, d] (the training model's vocabulary)."
        )
    check_vocabulary(value, shape[0], vocab_size, found)


def _locate_output_embedding(value: str, config: dict[str, Any]) -> tuple[str, str] | None:
    """(tensor name, file) of the output embedding in a local or hub checkpoint; None without safetensors (the
    whole model is then loaded). Tied embeddings (no `lm_head.weight`) use the input embedding."""
    tied = bool(config.get("tie_word_embeddings", True))
    weight_map, single = _checkpoint_files(value)
    if weight_map is not None:
        name = _pick(list(weight_map), tied)
        file = weight_map.get(name) if name else None
        if file is not None and file.startswith("hub:"):
            file = _fetch(value, file[4:])
    elif single is not None:
        with _open_safetensors(value, single) as reader:
            name = _pick(list(reader.keys()), tied)
        file = single
    else:
        return None
    return None if name is None or file is None else (name, file)


def _checkpoint_files(value: str) -> tuple[dict[str, str] | None, str | None]:
    """(tensor name -> file for a sharded checkpoint, or None; the single safetensors file, or None)."""
    path = Path(value).expanduser()
    if path.exists():
        index, single = path / INDEX, path / SINGLE
        if index.is_file():
            weight_map = _read_json(index, value, "safetensors index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise DistMatchConfigError(
                    f"{_setting(value)}: {index} has no `weight_map`; save the model again."
                )
            return {name: str(path / shard) for name, shard in weight_map.items()}, None
        return None, str(single) if single.is_file() else None
    index_file = _fetch(value, INDEX)
    if index_file is not None:
        weight_map = _read_json(index_file, value, "safetensors index").get("weight_map") or {}
        return {name: f"hub:{shard}" for name, shard in weight_map.items()}, None
    return None, _fetch(value, SINGLE)


def _pick(names: list[str], tied: bool) -> str | None:
    for suffixes in (_OUTPUT_NAMES, _INPUT_NAMES if tied else ()):
        for suffix in suffixes:
            hits = sorted((n for n in names if n == suffix or n.endswith("." + suffix)), key=len)
            if hits:
                return hits[0]
    return None


def read_output_embedding(value: str, vocab_size: int | None = None) -> Any:
    """The output-embedding tensor of model `value` ([V, d], stored dtype), reading only that tensor."""
    import torch

    config = check_cost_embedding_source(value, vocab_size) or {}
    located = _locate_output_embedding(value, config)
    if located is None:
        return _load_whole_model_head(value)
    name, file = located
    _check_tensor_shape(value, name, file, vocab_size)
    with _open_safetensors(value, file) as reader:
        try:
            tensor = reader.get_tensor(name)
        except Exception as err:  # the header was intact but the data is not
            raise DistMatchConfigError(
                f"{_setting(value)}: could not read `{name}` from {file} ({type(err).__name__}); the file is "
                "corrupt: download or save it again."
            ) from None
    return tensor.detach().to(torch.device("cpu"))


def _load_whole_model_head(value: str) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        other = AutoModelForCausalLM.from_pretrained(value, dtype="auto", low_cpu_mem_usage=True)
    except (OSError, ValueError) as err:
        raise DistMatchConfigError(f"{_setting(value)}: could not load the model ({err}).") from None
    return other.get_output_embeddings().weight.detach().clone()


__all__ = [
    "BUILTIN_SOURCES",
    "HUB_ID",
    "check_cost_embedding_source",
    "check_vocabulary",
    "model_vocab_size",
    "read_output_embedding",
    "vocab_size_of",
]
