"""A model folder's weight files, read without torch: whether they are complete (each safetensors header parses and
the file holds every tensor it lists) and a fingerprint that tells one model's weights from another's (each file's
size, the SHA-256 of its safetensors header and of sampled blocks of its values), recorded in a run record so that a resume can refuse a reference
folder that now holds another model."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["fingerprint", "weight_files", "weights_problem"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The weight files of a model folder (safetensors first; `.bin` / `.pt` when it has none), sorted by name."""
    root = Path(folder)
    try:
        names = sorted(p for p in root.iterdir() if p.is_file())
    except OSError:
        return []
    safetensors = [p for p in names if p.suffix == ".safetensors"]
    return safetensors or [p for p in names if p.suffix in _WEIGHT_SUFFIXES]


def _safetensors_header(path: Path) -> tuple[bytes, str | None]:
    """The raw header of a safetensors file and the problem with the file (None: complete)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return b"", f"{path.name} is {size} bytes, too short for a safetensors header"
            length = int.from_bytes(head, "little")
            if length > size - 8:
                return (
                    b"",
                    f"{path.name} is truncated (its header alone needs {length + 8} bytes, it has {size})",
                )
            raw = handle.read(length)
    except OSError as err:
        return b"", f"{path.name} cannot be read ({err.strerror or err})"
    try:
        header = json.loads(raw)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return raw, f"{path.name} has no readable safetensors header"
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        return raw, f"{path.name} is truncated ({size} bytes; its header lists tensors up to byte {needed})"
    return raw, None


def weights_problem(folder: str | os.PathLike) -> str | None:
    """What keeps `folder` from loading as a model (no weight file, a truncated or unreadable safetensors file, an
    empty `.bin`), or None."""
    files = weight_files(folder)
    if not files:
        return f"{folder} has no weight file (*.safetensors or pytorch_model.bin)"
    for path in files:
        if path.suffix == ".safetensors":
            problem = _safetensors_header(path)[1]
        else:
            problem = f"{path.name} is empty" if path.stat().st_size == 0 else None
        if problem is not None:
            return f"{folder}: {problem}"
    return None


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
    cheap for any size, and different for two models of one architecture)."""
    root = Path(folder).expanduser().resolve()
    weights: dict[str, Any] = {}
    for path in weight_files(root):
        raw = _safetensors_header(path)[0] if path.suffix == ".safetensors" else b""
        weights[path.name] = {
            "size": path.stat().st_size,
            "header_sha256": hashlib.sha256(raw).hexdigest(),
            "sample_sha256": _sample_sha256(path),
        }
    return {"path": str(root), "weights": weights}
