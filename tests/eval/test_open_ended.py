"""eval_tasks.open_ended: EMO's corpora (Table 4), the script's line filter and the word-level prefix / reference
split, against hand-made rows and the fixture files in each corpus's own format."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_tasks.open_ended import open_ended as O
from eval_tasks.samples import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "open_ended"
FILES = {
    "wikitext2": "wikitext2_test-00000-of-00001.parquet",
    "wikitext103": "wikitext103_wiki.test.raw",
    "webtext": "webtext.test.jsonl",
    "ptb": "ptb.test.txt",
    "writingprompts": "writingprompts.test.jsonl",
    "ag_news": "ag_news_test-00000-of-00001.parquet",
}


def test_table4_lengths_and_script_eval_num() -> None:
    got = {k: (c.prefix_words, c.continuation_words, c.new_tokens, c.eval_num) for k, c in O.CORPORA.items()}
    assert got == {
        "wikitext2": (20, 80, 80, 4000),
        "wikitext103": (20, 80, 80, 4000),
        "webtext": (20, 80, 80, 5000),
        "ptb": (5, 25, 25, 4000),
        "writingprompts": (35, 80, 80, 5000),
        "ag_news": (10, 30, 30, 4000),
        "gpt2_large": (20, 80, 80, 5000),  # Table 2's oracle data: the script's train-file branch
    }
    assert O.CORPORA["ptb"].column == "sentence"


def test_rows_scanned_rounds_up_to_the_scripts_64_row_slices() -> None:
    wiki = O.CORPORA["wikitext2"]
    assert O.rows_scanned(wiki, 4358) == 4032  # range(0, 4000, 64) ends at 3968; its slice reads to 4032
    assert O.rows_scanned(O.CORPORA["webtext"], 5000) == 5000  # 5000 rows: the slice past 5000 is empty
    assert O.rows_scanned(O.CORPORA["webtext"], 6000) == 5056
    assert O.rows_scanned(wiki, 10) == 10


def test_filter_and_split_on_hand_made_rows() -> None:
    ptb = O.CORPORA["ptb"]  # 5 + 25 + 10 = 40 words needed
    words = [f"w{i}" for i in range(40)]
    row = " ".join(words) + " " + "x" * 10  # 41 words, > 100 characters
    assert O.keep_row(row, ptb)
    assert O.split_row(row, ptb) == ("w0 w1 w2 w3 w4", "w0 w1 w2 w3 w4 " + " ".join(words[5:30]))
    assert O.keep_row(" ".join(words[:39]) + " " + "y" * 60, ptb)  # exactly 40 words
    short = " ".join(words[:38]) + " " + "y" * 60  # 39 words
    assert not O.keep_row(short, ptb)
    assert not O.keep_row(" ".join("a" * 50), ptb)  # 50 words but 99 characters
    assert O.keep_row(" ".join("a" * 51), ptb)  # 101 characters
    assert not O.keep_row(row + " == Notes ==", ptb)
    assert O.keep_row(row + " = = Notes = =", ptb)  # WikiText sub-headings have spaces: the script keeps them


def test_leading_space_is_an_empty_first_word_as_in_the_script() -> None:
    ag = O.CORPORA["ag_news"]
    row = " " + " ".join(f"t{i}" for i in range(60))
    prefix, reference = O.split_row(row, ag)
    assert prefix == " " + " ".join(f"t{i}" for i in range(9))  # "" + 9 words = 10 "words"
    assert reference == prefix + " " + " ".join(f"t{i}" for i in range(9, 39))
    assert O.model_text(prefix, " next words") == prefix + "  next words"  # the script's two spaces


@pytest.mark.parametrize("key", list(FILES))
def test_fixture_corpora_load_filter_and_split(key: str) -> None:
    spec = O.CORPORA[key]
    rows = O.read_corpus(key, FIXTURES / FILES[key])
    examples = O.build_examples(rows, spec)
    assert examples, key
    expected_rows = [i for i, t in enumerate(rows) if O.keep_row(t, spec)]
    assert [e.row for e in examples] == expected_rows
    assert len(expected_rows) < len(rows) or key == "ag_news"
    for e in examples:
        text = rows[e.row]
        assert text.startswith(e.prefix) and text.startswith(e.reference)
        assert len(e.reference.split(" ")) == spec.prefix_words + spec.continuation_words
        assert "==" not in text and len(text) >= 100
    records = O.prompt_records(examples, spec)
    assert records[0] == {
        "id": f"{key}-{examples[0].row}",
        "text": examples[0].prefix,
        "reference": examples[0].reference,
        "corpus": key,
    }


def test_fixture_rows_known_by_hand() -> None:
    wiki = O.read_corpus("wikitext2", FIXTURES / FILES["wikitext2"])
    kept = [e.row for e in O.build_examples(wiki, O.CORPORA["wikitext2"])]
    assert wiki[0] == " = Valley Road = \n" and 0 not in kept  # heading: too short
    assert 6 not in kept  # a 61-word paragraph
    assert "==" in wiki[12] and 12 not in kept
    assert 4 in kept
    ag = O.read_corpus("ag_news", FIXTURES / FILES["ag_news"])
    ag_kept = [e.row for e in O.build_examples(ag, O.CORPORA["ag_news"])]
    assert ag_kept == [0, 1, 2, 4, 5, 6, 8, 9]  # row 3: 30 words, row 7: 49 words, row 8: exactly 50
    raw = O.read_corpus("wikitext103", FIXTURES / FILES["wikitext103"])
    assert raw[:2] == [" = Valley Road = ", ""]  # the raw release, line ends removed


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--corpus 'wiki': unknown; accepted: wikitext2, wikitext103"):
        O.read_corpus("wiki", tmp_path / "x.txt")
    with pytest.raises(InputError, match="no Hub copy"):
        O.read_corpus("webtext")
    with pytest.raises(InputError, match="no such file"):
        O.read_corpus("ptb", tmp_path / "missing.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(InputError, match="record #0 has no 'text' field"):
        O.read_corpus("webtext", bad)
