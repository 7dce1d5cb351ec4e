"""EMO's cost embedding from another model's checkpoint (`emo_cost_embedding: <path or hub id>`), checked and read
cheaply; and the one vocabulary check every caller uses (`check_vocabulary`).

The folder itself (its `config.json`, weight files, safetensors headers and their damage) is read by
`distmatch.model_folder`, the one reader of model folders, which the anchored losses' reference shares; this module
adds what is EMO's own: the hub id, the vocabulary check, the [V, d] shape, and the read of the tensor's data.

* `check_cost_embedding_source(value, vocab_size)`: configuration time, no tensor data: 'frozen' / 'live' pass; a
  path must exist and hold a `config.json`; anything else must be a well-formed hub id whose `config.json` can be
  fetched (or is cached, offline); the vocabulary size read from that `config.json` must equal the training
  model's. A local folder is checked down to the safetensors header of the output embedding (weights complete,
  index, shards, shape).
* `read_output_embedding(value, vocab_size)`: the same checks (one read of the files), then only the
  output-embedding tensor, read from the safetensors file that holds it (located through
  `model.safetensors.index.json` for sharded checkpoints), in the dtype it is stored in. Tied embeddings (no
  `lm_head.weight`) read the input embedding. Checkpoints without safetensors fall back to loading the model (in its
  stored dtype) and keeping its output layer.
"""

from __future__ import annotations

import os
import re
from functools import partial
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import FolderOption, ModelFolder, open_model_folder, read_json

#: The sources that are not another model: a frozen copy of the pre-trained head, the live head (detached).
BUILTIN_SOURCES = ("frozen", "live")
#: `owner/name` or `name`: letters, digits, `-`, `_`, `.` (no `--` / `..`, no leading/trailing `-` / `.`), <= 96.
_HUB_PART = r"(?!.*(--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.-]{0,94}(?<![.-])"
HUB_ID = re.compile(rf"^({_HUB_PART}/)?{_HUB_PART}$")


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
    # offline / not cached (a subclass of EntryNotFoundError in recent releases)
    except LocalEntryNotFoundError:
        if filename == "config.json":
            raise
        return None
    except EntryNotFoundError:  # the repository has no such file
        return None


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


def _other_model(value: str) -> ModelFolder:
    """Model `value`'s files: a local folder (refused: no `config.json`, one that is not JSON) or a hub model whose
    `config.json` is fetched here and its other files when they are read."""
    option = FolderOption(_setting(value), "use 'frozen' (the paper's choice) or 'live'")
    if Path(value).expanduser().exists():
        return open_model_folder(value, option)
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
    return ModelFolder(option, read_json(found, option, "model config"), fetch=partial(_fetch, value))


def _read_source(value: str, vocab_size: int | None) -> tuple[ModelFolder, tuple[str, Path] | None]:
    """The one read of model `value`'s files for EMO, shared by the configuration-time check and the read of the
    tensor: its config's vocabulary against `vocab_size` (the trained model's; None: unknown), its weights complete,
    and (name, file) of its output embedding whose header shape is [V, d] with our V (None without safetensors:
    the whole model is loaded instead)."""
    folder = _other_model(value)
    check_vocabulary(value, folder.vocab_size, vocab_size)
    # No weight file, or one cut short: it would fail after the model loads. Only the shard holding the output
    # embedding must be there (a folder of that shard alone serves): `output_embedding` refuses it missing.
    folder.check_weights(every_shard=False)
    located = folder.output_embedding()
    if located is None:
        return folder, None
    name, file, shape = located
    found = f"its output embedding `{name}` in {file} has shape {shape}"
    if len(shape) != 2:
        raise DistMatchConfigError(
            f"{_setting(value)}: {found}; expected [{vocab_size or folder.vocab_size or 'V'}, d] (the training "
            "model's vocabulary)."
        )
    check_vocabulary(value, shape[0], vocab_size or folder.vocab_size, found)
    return folder, (name, file)


def check_cost_embedding_source(value: Any, vocab_size: int | None = None) -> dict[str, Any] | None:
    """Validate `emo_cost_embedding` without loading weights; returns the other model's config (None if builtin).

    A local folder is checked down to the tensor EMO will read (`distmatch.model_folder`): `config.json` parses,
    every weight file is complete and the safetensors index (if any) names existing shards, and the header of the
    file holding the output embedding gives it the shape [V, d] (a truncated or corrupt file fails here, before any
    model is loaded)."""
    if not isinstance(value, str) or not value:
        raise DistMatchConfigError(
            f"emo_cost_embedding={value!r} is invalid; expected 'frozen', 'live' or a model path / hub id."
        )
    if value in BUILTIN_SOURCES:
        return None
    return _read_source(value, vocab_size)[0].config


def read_output_embedding(value: str, vocab_size: int | None = None) -> Any:
    """The output-embedding tensor of model `value` ([V, d], stored dtype), reading only that tensor."""
    import torch
    from safetensors import safe_open

    _, located = _read_source(value, vocab_size)
    if located is None:
        return _load_whole_model_head(value)
    name, file = located
    try:
        with safe_open(str(file), framework="pt") as reader:
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
    "read_output_embedding",
]
