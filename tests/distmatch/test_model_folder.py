"""`distmatch.model_folder`, the one reader of a model folder, torch-free: folders written here byte by byte (the
safetensors layout: an 8-byte little-endian header length, the JSON header, the tensor bytes), so every expectation
comes from the bytes the test wrote, not from the reader. What the options make of it (the reference model, EMO's
cost embedding, the run records): tests/trl/test_records.py, test_cost_embedding.py, test_reference_tokenizers.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import (
    FolderOption,
    fingerprint,
    open_model_folder,
    tokenizer_vocab,
    vocab_size,
    weights_problem,
)
from tests.helpers.env import REPO_ROOT

OPTION = FolderOption("anchor_reference='ref'", "use 'initial' (the starting model)")
HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def _safetensors(path: Path, shapes: dict[str, tuple[int, ...]], fill: int = 1) -> Path:
    """F32 tensors of `shapes`, every byte `fill` (two calls with other fills: one architecture, other weights)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes([fill]) * offset)
    return path


def _folder(root: Path, sharded: bool = False, fill: int = 1, **config: object) -> Path:
    """A model folder: config.json (vocabulary 8, untied unless `config` says otherwise) and the embedding and head
    in one model.safetensors or, `sharded`, in two shards named by model.safetensors.index.json."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"vocab_size": 8, "tie_word_embeddings": False, **config}))
    if not sharded:
        _safetensors(root / "model.safetensors", {EMBED: (8, 4), HEAD: (8, 4)}, fill)
        return root
    shards = {EMBED: "model-00001-of-00002.safetensors", HEAD: "model-00002-of-00002.safetensors"}
    for name, shard in shards.items():
        _safetensors(root / shard, {name: (8, 4)}, fill)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    return root


def _refusal(folder: Path, every_shard: bool = True) -> str:
    with pytest.raises(DistMatchConfigError) as caught:
        open_model_folder(folder, OPTION).check_weights(every_shard)
    message = str(caught.value)
    assert message.startswith("anchor_reference='ref': ") and "\n" not in message, message
    return message


def test_the_hand_written_files_are_what_safetensors_reads(tmp_path):
    """The control: the layout written here is safetensors' own (so the refusals below are of real damage)."""
    safetensors = pytest.importorskip("safetensors")
    pytest.importorskip("numpy")
    folder = _folder(tmp_path / "m", fill=0)
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="numpy") as reader:
        assert reader.get_tensor(HEAD).shape == (8, 4) and not reader.get_tensor(HEAD).any()


@pytest.mark.parametrize("sharded", [False, True])
def test_a_complete_folder_gives_its_vocabulary_and_the_head_from_the_headers(tmp_path, sharded):
    folder = open_model_folder(_folder(tmp_path / "m", sharded), OPTION)
    folder.check_weights()
    assert weights_problem(folder.root) is None and folder.vocab_size == 8 == vocab_size(folder.root)
    name, file, shape = folder.output_embedding()
    expected = "model-00002-of-00002.safetensors" if sharded else "model.safetensors"
    assert (name, file.name, shape) == (HEAD, expected, (8, 4))


def test_a_tied_folder_without_a_head_gives_the_input_embedding(tmp_path):
    folder = _folder(tmp_path / "tied", tie_word_embeddings=True)
    _safetensors(folder / "model.safetensors", {EMBED: (8, 4)})
    assert open_model_folder(folder, OPTION).output_embedding()[0] == EMBED
    untied = _folder(tmp_path / "untied")
    _safetensors(untied / "model.safetensors", {EMBED: (8, 4)})
    assert (
        open_model_folder(untied, OPTION).output_embedding() is None
    )  # no head to read: the caller loads it


def _header_length(file: Path) -> int:
    return int.from_bytes(file.read_bytes()[:8], "little")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("header_not_json", "model.safetensors has no readable safetensors header"),
        ("header_without_shapes", "model.safetensors has no readable safetensors header"),
        ("header_longer_than_file", "model.safetensors is truncated (its header alone needs"),
        ("shorter_than_a_length", "model.safetensors is 5 bytes, too short for a safetensors header"),
        (
            "data_cut_short",
            "model.safetensors is truncated ({cut} bytes; its header lists tensors up to byte {full})",
        ),
    ],
)
def test_a_damaged_safetensors_file_is_refused_naming_it(tmp_path, damage, expected):
    folder = _folder(tmp_path / "m")
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    n = _header_length(file)
    full = 8 + n + 2 * 8 * 4 * 4  # the length, the header, two [8, 4] float32 tensors
    assert len(data) == full
    if damage == "header_not_json":
        data[8:12] = b"\x00" * 4
    elif damage == "header_without_shapes":
        header = json.loads(data[8 : 8 + n])
        del header[HEAD]["shape"]
        raw = json.dumps(header).encode().ljust(n)  # same length, so only the shape is missing
        data[8 : 8 + n] = raw
    elif damage == "header_longer_than_file":
        data[:8] = (len(data)).to_bytes(8, "little")
    elif damage == "shorter_than_a_length":
        data = data[:5]
    else:
        data = data[:-1]
    file.write_bytes(bytes(data))
    expected = expected.format(cut=full - 1, full=full)
    assert weights_problem(folder).startswith(f"{folder}: {expected}")
    message = _refusal(folder)
    assert expected in message and "give a complete model folder" in message and "'initial'" in message


def test_a_truncated_shard_of_a_sharded_folder_is_refused(tmp_path):
    folder = _folder(tmp_path / "m", sharded=True)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    assert "model-00002-of-00002.safetensors is truncated" in _refusal(folder)
    assert "is truncated" in _refusal(folder, every_shard=False)  # a present file is checked either way


def test_a_missing_shard_of_an_index_is_refused(tmp_path):
    folder = _folder(tmp_path / "m", sharded=True)
    (folder / "model-00001-of-00002.safetensors").unlink()
    expected = "model-00001-of-00002.safetensors is missing (named by model.safetensors.index.json)"
    assert expected in _refusal(folder)
    # A reader of the head alone needs its shard only: the embedding's shard may be missing, the head's may not.
    open_model_folder(folder, OPTION).check_weights(every_shard=False)
    assert open_model_folder(folder, OPTION).output_embedding()[0] == HEAD
    (folder / "model-00002-of-00002.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    with pytest.raises(DistMatchConfigError, match="model-00002-of-00002.safetensors is missing"):
        open_model_folder(folder, OPTION).output_embedding()


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ('{"weight_map": ', "model.safetensors.index.json is not a readable JSON safetensors index"),
        ('{"metadata": {}}', "model.safetensors.index.json has no `weight_map`"),
    ],
)
def test_an_unreadable_index_is_refused(tmp_path, index, expected):
    folder = _folder(tmp_path / "m", sharded=True)
    (folder / "model.safetensors.index.json").write_text(index)
    assert expected in _refusal(folder)


def test_a_folder_without_weights_or_with_an_empty_bin_is_refused(tmp_path):
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    assert f"{folder} has no weight file" in _refusal(folder)
    (folder / "pytorch_model.bin").write_bytes(b"")
    assert "pytorch_model.bin is empty" in _refusal(folder)
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    (folder / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {HEAD: "pytorch_model-00002-of-00002.bin"}})
    )
    assert "pytorch_model-00002-of-00002.bin is missing (named by pytorch_model.bin.index.json)" in _refusal(
        folder
    )


def test_the_vocabulary_of_a_config_without_vocab_size_is_unknown(tmp_path):
    folder = _folder(tmp_path / "m")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert vocab_size(folder) is None and open_model_folder(folder, OPTION).vocab_size is None
    (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 12}, "vocab_size": True}))
    assert vocab_size(folder) == 12  # a multimodal model's text model; a boolean is no size
    assert vocab_size(tmp_path / "missing") is None and vocab_size(None) is None
    (folder / "config.json").write_text("{")
    assert vocab_size(folder) is None  # the trained model's folder: read leniently, never refused here


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, "no such folder"),
        ("", "has no config.json; give a model folder (as saved by save_pretrained), or use 'initial'"),
        ('{"vocab_size": 8,', "config.json is not a readable JSON model config (Expecting"),
        ("[8]", "config.json is not a JSON object"),
    ],
)
def test_a_folder_without_a_readable_config_is_refused(tmp_path, config, expected):
    folder = tmp_path / "m"
    if config is not None:
        folder.mkdir()
        if config:
            (folder / "config.json").write_text(config)
    with pytest.raises(DistMatchConfigError) as caught:
        open_model_folder(folder, OPTION)
    message = str(caught.value)
    assert message.startswith("anchor_reference='ref': ") and expected in message and "\n" not in message


def test_the_tokenizer_map_holds_the_added_tokens(tmp_path):
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"content": "</s>", "id": 2}]})
    )
    assert tokenizer_vocab(tmp_path) == {"a": 0, "b": 1, "</s>": 2}
    assert tokenizer_vocab(tmp_path / "none") is None


def test_the_fingerprint_is_the_same_under_another_path_to_the_same_files(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "m", sharded=True)
    recorded = fingerprint(folder)
    assert recorded["path"] == str(folder.resolve())
    linked = tmp_path / "link"
    linked.symlink_to(folder, target_is_directory=True)
    files = tmp_path / "links"  # another folder whose files are links to the same files
    files.mkdir()
    for file in folder.iterdir():
        (files / file.name).symlink_to(file)
    monkeypatch.chdir(tmp_path)
    for other in (linked, Path("m"), Path("link"), files):
        assert fingerprint(other)["weights"] == recorded["weights"], other
    assert fingerprint("link")["path"] == recorded["path"] == os.path.realpath("m")


def test_the_fingerprint_is_each_files_size_and_hashes(tmp_path):
    """Run records keep it: its form is checked against hashes of the bytes written here, so that a record written
    by an earlier version still matches its own folder."""
    folder = _folder(tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    n = _header_length(folder / "model.safetensors")
    assert fingerprint(folder)["weights"] == {
        "model.safetensors": {
            "size": len(data),
            "header_sha256": hashlib.sha256(data[8 : 8 + n]).hexdigest(),
            "sample_sha256": hashlib.sha256(data * 16).hexdigest(),  # a small file: 16 reads of all of it
        }
    }


def test_the_fingerprint_differs_for_other_weights_of_one_architecture(tmp_path):
    one, other = _folder(tmp_path / "one", fill=1), _folder(tmp_path / "other", fill=2)
    a, b = (
        fingerprint(one)["weights"]["model.safetensors"],
        fingerprint(other)["weights"]["model.safetensors"],
    )
    assert (a["size"], a["header_sha256"]) == (b["size"], b["header_sha256"])  # the same architecture
    assert a["sample_sha256"] != b["sample_sha256"]
    _safetensors(other / "model.safetensors", {EMBED: (8, 4), HEAD: (9, 4)})  # another shape, the same bytes
    assert fingerprint(other)["weights"] != fingerprint(one)["weights"]


@pytest.mark.launches
def test_the_reader_imports_without_torch():
    """The configuration-time checks run while the options are parsed; `distmatch` is torch-free (the hooks)."""
    code = "import sys, distmatch.model_folder; print(sorted(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr
    loaded = {name.split(".")[0] for name in eval(out.stdout)}  # noqa: S307 - our own subprocess's list
    assert not loaded & {"torch", "numpy", "safetensors", "transformers", "trl_ext"}
