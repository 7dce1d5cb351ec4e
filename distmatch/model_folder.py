"""The one reader of a model folder (as `save_pretrained` writes it), without torch: its `config.json` and
`tokenizer.json`, its weight files and their safetensors headers, the refusal of a damaged one, and the fingerprint
a run record keeps of it.

Every model folder an option names is read here and nowhere else: the anchored losses' reference
(`trl_ext.anchor`), EMO's cost embedding from another checkpoint (`trl_ext.cost_embedding.checkpoint`, which adds
only the hub download and the read of the one tensor's data) and the folders a run record fingerprints
(`trl_ext.resume`). So a damaged folder is refused in the same words whichever option names it, at configuration
time, before any model loads. Torch-free (json, hashlib) like the rest of `distmatch`: these checks run while the
options are parsed, before torch is imported.

* `open_model_folder(path, option)` -> `ModelFolder`: the folder and its parsed `config.json` (refused: no such
  folder, no `config.json`, one that is no JSON object); then `.vocab_size`, `.tokenizer_vocab()`,
  `.check_weights()` (refuses what `weights_problem` finds) and `.output_embedding()` (the tensor an LM head
  applies, its file and shape, from the safetensors headers: no tensor data is read). A hub model is a
  `ModelFolder` whose files come from a download function instead of a folder.
* `weights_problem(folder)`: what keeps the weights from loading, or None.
* `fingerprint(folder)`: what tells one model's weights from another's.
* `vocab_size(folder)`, `tokenizer_vocab(folder)`: the trained model's own folder, read leniently (None: unknown).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError

__all__ = [
    "BIN_INDEX",
    "INDEX",
    "SINGLE",
    "FolderOption",
    "ModelFolder",
    "fingerprint",
    "open_model_folder",
    "read_json",
    "tokenizer_vocab",
    "vocab_size",
    "vocab_size_of",
    "weight_files",
    "weights_problem",
]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: The index of sharded `.bin` weights: checked instead of `INDEX` when a folder has no safetensors file.
BIN_INDEX = "pytorch_model.bin.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
#: The weight an LM head applies, by the names architectures give it; a tied head without one reads the input
#: embedding (`_INPUT_NAMES`). Matched as a whole name or a dotted suffix (`model.lm_head.weight`).
_OUTPUT_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")
_INPUT_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


@dataclass(frozen=True)
class FolderOption:
    """The option that names a model folder, as its refusals say it: `setting` begins each one
    (`anchor_reference='ref'`), `instead` ends it with what else the option takes (`use 'initial' (the starting
    model)`), so that the user reads the option they wrote, not this module."""

    setting: str
    instead: str

    def refuse(self, problem: str, remedy: str) -> DistMatchConfigError:
        return DistMatchConfigError(f"{self.setting}: {problem}; {remedy}.")

    def refuse_folder(self, problem: str, complete: bool = False) -> DistMatchConfigError:
        folder = "a complete model folder" if complete else "a model folder"
        return self.refuse(problem, f"give {folder} (as saved by save_pretrained), or {self.instead}")


def _json_object(file: Path, what: str = "file") -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in `file`, or why there is none (it "is not a readable JSON `what` (reason)" or "is not a
    JSON object")."""
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        reason = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        return None, f"is not a readable JSON {what} ({reason})"
    if not isinstance(data, dict):
        return None, f"is not a JSON object (a {what} is one)"
    return data, None


def read_json(file: str | os.PathLike, option: FolderOption, what: str) -> dict[str, Any]:
    """The JSON object in `file` (a `what`: "model config", "safetensors index"); refused when it has none."""
    data, problem = _json_object(Path(file), what)
    if data is None:
        raise option.refuse(
            f"{file} {problem}", f"re-save the model with save_pretrained, or {option.instead}"
        )
    return data


def vocab_size_of(config: dict[str, Any]) -> int | None:
    """`vocab_size` of a `config.json` (also a multimodal model's `text_config`); None when it names none."""
    for section in (config, config.get("text_config")):
        size = section.get("vocab_size") if isinstance(section, dict) else None
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    return None


def vocab_size(folder: str | os.PathLike | None) -> int | None:
    """The vocabulary size in a local folder's `config.json`; None when unknown (no folder, no or no readable
    `config.json`, no `vocab_size`: a hub id, say). Reads no weights and refuses nothing."""
    if folder is None:
        return None
    config, _ = _json_object(Path(folder).expanduser() / "config.json")
    return None if config is None else vocab_size_of(config)


def _tokenizer_map(file: Path | None) -> dict[str, Any] | None:
    if file is None:
        return None
    data, _ = _json_object(file)
    if data is None:
        return None
    vocab = dict((data.get("model") or {}).get("vocab") or {})
    vocab.update(
        {t.get("content"): t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    )
    return vocab or None


def tokenizer_vocab(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The token -> id map of a folder's `tokenizer.json`: the model vocabulary and the added (special) tokens,
    whose ids a tokenizer may move while its vocabulary stays; None without a readable one."""
    file = Path(folder).expanduser() / "tokenizer.json"
    return _tokenizer_map(file if file.is_file() else None)


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The weight files of a model folder (safetensors first; `.bin` / `.pt` when it has none), sorted by name."""
    root = Path(folder)
    try:
        names = sorted(p for p in root.iterdir() if p.is_file())
    except OSError:
        return []
    safetensors = [p for p in names if p.suffix == ".safetensors"]
    return safetensors or [p for p in names if p.suffix in _WEIGHT_SUFFIXES]


def _read_header(path: Path) -> tuple[bytes, dict[str, tuple[int, ...]], str | None]:
    """A safetensors file's raw header, the shape of each tensor it lists ({} when it does not parse), and the
    problem with the file (None: its header parses and the file holds every byte of every tensor it lists)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return b"", {}, f"{path.name} is {size} bytes, too short for a safetensors header"
            length = int.from_bytes(head, "little")
            if length > size - 8:
                return (
                    b"",
                    {},
                    f"{path.name} is truncated (its header alone needs {length + 8} bytes, it has {size})",
                )
            raw = handle.read(length)
    except OSError as err:
        return b"", {}, f"{path.name} cannot be read ({err.strerror or err})"
    try:
        header = json.loads(raw)
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        ends = [int(v["data_offsets"][1]) for v in tensors.values()]
        shapes = {k: tuple(int(s) for s in v["shape"]) for k, v in tensors.items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return raw, {}, f"{path.name} has no readable safetensors header"
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        return (
            raw,
            shapes,
            f"{path.name} is truncated ({size} bytes; its header lists tensors up to byte {needed})",
        )
    return raw, shapes, None


def _index_problem(root: Path, index: Path) -> str | None:
    """What is wrong with a sharded folder's index: unreadable, no `weight_map`, or a shard it names is missing (an
    interrupted download: the shards present are complete, yet the model cannot load)."""
    data, problem = _json_object(index, "safetensors index")
    if data is None:
        return f"{index.name} {problem}"
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        return f"{index.name} has no `weight_map`"
    missing = sorted({str(shard) for shard in weight_map.values() if not (root / str(shard)).is_file()})
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"{missing[0]}{more} is missing (named by {index.name})"
    return None


def weights_problem(folder: str | os.PathLike, every_shard: bool = True) -> str | None:
    """What keeps `folder` from loading as a model (no weight file, a truncated or unreadable safetensors file, an
    empty `.bin`; with `every_shard`, an index that cannot be read or names a shard the folder lacks), or None.
    Without `every_shard` only the files present are checked: for a reader of one tensor, which needs one shard."""
    files = weight_files(folder)
    if not files:
        return f"{folder} has no weight file (*.safetensors or pytorch_model.bin)"
    for path in files:
        if path.suffix == ".safetensors":
            problem = _read_header(path)[2]
        else:
            problem = f"{path.name} is empty" if path.stat().st_size == 0 else None
        if problem is not None:
            return f"{folder}: {problem}"
    index = Path(folder) / (INDEX if files[0].suffix == ".safetensors" else BIN_INDEX)
    problem = _index_problem(Path(folder), index) if every_shard and index.is_file() else None
    return None if problem is None else f"{folder}: {problem}"


def _pick(names: Iterable[str], tied: bool) -> str | None:
    """The output embedding's name among a checkpoint's tensors (the shortest match: the top-level head)."""
    names = list(names)
    for suffixes in (_OUTPUT_NAMES, _INPUT_NAMES if tied else ()):
        for suffix in suffixes:
            hits = sorted((n for n in names if n == suffix or n.endswith("." + suffix)), key=len)
            if hits:
                return hits[0]
    return None


@dataclass(frozen=True)
class ModelFolder:
    """A model's files as one option reads them: its parsed `config.json`, and its other files by name, from the
    folder `root` or (a hub model: `root` None) through `fetch` (a file's downloaded path, None when it has none)."""

    option: FolderOption
    config: dict[str, Any]
    root: Path | None = None
    fetch: Callable[[str], str | None] | None = None

    def file(self, name: str) -> Path | None:
        """The local path of the model's file `name`; None when it has none."""
        if self.root is not None:
            path = self.root / name
            return path if path.is_file() else None
        found = None if self.fetch is None else self.fetch(name)
        return None if found is None else Path(found)

    @property
    def vocab_size(self) -> int | None:
        return vocab_size_of(self.config)

    def tokenizer_vocab(self) -> dict[str, Any] | None:
        """The token -> id map of its `tokenizer.json` (see `tokenizer_vocab`)."""
        return _tokenizer_map(self.file("tokenizer.json"))

    def check_weights(self, every_shard: bool = True) -> None:
        """Refuse a local folder whose weights would fail only after the trained model has loaded
        (`weights_problem`; `every_shard` False: a reader of one tensor, `output_embedding` refuses its shard
        missing). A hub model's shards are downloaded and checked one at a time, when read."""
        problem = None if self.root is None else weights_problem(self.root, every_shard)
        if problem is not None:
            raise self.option.refuse_folder(problem, complete=True)

    def _shapes(self, file: Path) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape from the header of `file`; refused when the file is damaged (a hub model's download:
        a local folder's files were checked by `check_weights`)."""
        _, shapes, problem = _read_header(file)
        if problem is not None:
            raise self.option.refuse(
                problem, f"{file} may be truncated or corrupt: download or save it again"
            )
        return shapes

    def output_embedding(self) -> tuple[str, Path, tuple[int, ...]] | None:
        """(name, file, shape) of the weight the LM head applies, from the safetensors index and headers (no tensor
        data is read); tied embeddings without an `lm_head.weight` give the input embedding; None without
        safetensors weights or without such a tensor (the caller then loads the whole model)."""
        tied = bool(self.config.get("tie_word_embeddings", True))
        index = self.file(INDEX)
        if index is not None:
            weight_map = read_json(index, self.option, "safetensors index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise self.option.refuse(f"{index} has no `weight_map`", "save the model again")
            name = _pick(weight_map, tied)
            if name is None:
                return None
            file = self.file(str(weight_map[name]))
            if file is None:
                raise self.option.refuse(
                    f"{weight_map[name]} is missing (named by {INDEX})", "download the whole checkpoint"
                )
        else:
            file = self.file(SINGLE)
            shapes = {} if file is None else self._shapes(file)
            name = _pick(shapes, tied)
            return None if file is None or name is None else (name, file, shapes[name])
        shapes = self._shapes(file)
        if name not in shapes:
            raise self.option.refuse(
                f"{file} has no tensor `{name}` although {INDEX} says it does",
                "the checkpoint is inconsistent: download or save it again",
            )
        return name, file, shapes[name]


def open_model_folder(path: str | os.PathLike, option: FolderOption) -> ModelFolder:
    """The local model folder `path` with its `config.json` read; refused (naming `option`) when it is no folder,
    has no `config.json` or one that is not a JSON object. Its weights are checked by `.check_weights()`, after the
    caller's checks of the config (a wrong vocabulary is the more useful refusal)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise option.refuse_folder("no such folder")
    config = root / "config.json"
    if not config.is_file():
        raise option.refuse_folder(f"{root} has no config.json")
    return ModelFolder(option, read_json(config, option, "model config"), root)


#: The fingerprint reads this many evenly spaced blocks of each weight file, of this size: two models of one
#: architecture have the same safetensors header and size, so their values must be sampled too.
SAMPLES, SAMPLE_BYTES = 16, 1 << 16


def _sample_sha256(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for i in range(SAMPLES):
            handle.seek(max(0, (size - SAMPLE_BYTES) * i // (SAMPLES - 1)))
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def fingerprint(folder: str | os.PathLike) -> dict[str, Any]:
    """`{"path": absolute folder, "weights": {file: {"size", "header_sha256", "sample_sha256"}}}`: what identifies
    a model folder's weights (the safetensors header, and a hash of 16 evenly spaced 64 KiB blocks of the file:
    cheap for any size, and different for two models of one architecture). Run records keep it, so its form must
    not change: a record written before would no longer match its own folder."""
    root = Path(folder).expanduser().resolve()
    weights: dict[str, Any] = {}
    for path in weight_files(root):
        raw = _read_header(path)[0] if path.suffix == ".safetensors" else b""
        weights[path.name] = {
            "size": path.stat().st_size,
            "header_sha256": hashlib.sha256(raw).hexdigest(),
            "sample_sha256": _sample_sha256(path),
        }
    return {"path": str(root), "weights": weights}
