"""eval_tasks.metrics.next_token against its contract, for what tests/eval/test_metrics.py leaves open. Real parts
only: a tiny seeded LlamaForCausalLM and the project's byte-level BPE tokenizer (trl_ext.testing, with a BOS
post-processor and a chat template), built in code and saved with ``save_pretrained``. Every statistic has a float64
oracle written from the docstrings (perplexity = exp(mean NLL), mean entropy in nats, mean top-1 probability, top-1
accuracy, over the scored tokens of all batches), computed by running a float64 copy of the same model on each
unpadded sequence alone. What the model is given is recorded by forward pre-hooks (spies; the model still computes):
a ``text`` with the tokenizer's special tokens (every token after the first scored); ``prompt`` + ``response`` /
``completion`` as the two turns of the chat template when there is one (the template's text without added special
tokens; only the response scored), else the prompt with special tokens, the response and EOS; batches padded on the
right with the pad token and an attention mask as Hugging Face defines it (1 = token, 0 = padding, integers);
``max_length`` (default 1024) and ``batch_size`` (default 8); the ``chat_template`` modes; a checkpoint path loaded
in float32 on the given device (else CUDA when available); the figure-6 distribution's fields; the refusals; the
real tqdm bar."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from eval_tasks.metrics.next_token import NextTokenStats, next_token_distribution, next_token_stats
from tests.helpers.forked_tqdm import tqdm_for_forked_tests  # noqa: F401  (autouse)
from tests.helpers.next_token_parts import (
    TEMPLATE,
    checkpoint,
    enc,
    greedy_text,
    model_calls,
    oracle,
    oracle_distribution,
    tokenizer,
    use_model,
)

BOS, EOS, PAD, USER = 1, 2, 0, 3  # the tokenizer's <s>, </s>, <pad>, <|user|>


def _rows(calls: list[dict[str, Any]]) -> list[list[int]]:
    """The unpadded rows the model was given."""
    rows = []
    for call in calls:
        for ids, mask in zip(call["input_ids"].tolist(), call["attention_mask"].tolist()):
            rows.append(ids[: sum(mask)])
    return rows


def _approx(expected: dict[str, Any], rel: float = 1e-5) -> dict[str, Any]:
    return {k: v if isinstance(v, int) else pytest.approx(v, rel=rel) for k, v in expected.items()}


# ---------------------------------------------------------------------------------------------------------
# The statistics


def test_the_statistics_are_the_documented_means_over_all_batches() -> None:
    texts = ["the river is blue", greedy_text(), "write a poem about the sea"]
    tok = tokenizer()
    with use_model() as (model, calls):
        stats = next_token_stats(model, tok, texts, batch_size=2)
    rows = [enc(t, True) for t in texts]
    assert all(row[0] == BOS for row in rows)  # the tokenizer adds its BOS token
    expected = oracle([(row, 1) for row in rows])
    assert 0 < expected["top1_accuracy"] < 1
    assert stats.to_dict() == {**_approx(expected), "num_sequences": 3}
    assert stats.to_dict() == asdict(stats) and isinstance(stats, NextTokenStats)
    assert len(calls) == 2  # batch_size rows per forward pass
    assert _rows(calls) == rows  # a text keeps the tokenizer's special tokens


def test_batches_are_padded_on_the_right_with_the_hugging_face_attention_mask() -> None:
    tok = tokenizer(pad="<|user|>")
    a, b = enc("the sea", True), enc("a", True)
    with use_model() as (model, calls):
        next_token_stats(model, tok, ["the sea", "a"], batch_size=2)
    (call,) = calls
    width = len(a)
    assert call["input_ids"].tolist() == [a, b + [USER] * (width - len(b))]
    assert call["attention_mask"].dtype == torch.long
    assert call["attention_mask"].tolist() == [[1] * width, [1] * len(b) + [0] * (width - len(b))]
    # without a pad token: padded all the same (masked), the same statistics
    with use_model() as (model, calls):
        stats = next_token_stats(model, tokenizer(pad=None), ["the sea", "a"], batch_size=2)
    assert stats.to_dict() == {**_approx(oracle([(a, 1), (b, 1)])), "num_sequences": 2}
    assert stats.num_tokens == len(a) - 1 + len(b) - 1


def test_the_batch_goes_to_the_models_device() -> None:
    with use_model(device="meta") as (model, calls):
        with pytest.raises(Exception):  # noqa: B017 - nothing can be computed from a "meta" model's logits
            next_token_stats(model, tokenizer(), ["the sea", "a"], batch_size=2)
    (call,) = calls  # but what the model was given is recorded
    assert call["input_ids"].device.type == "meta" and call["attention_mask"].device.type == "meta"


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the only second device a CPU run lacks"
)
def test_on_cuda_the_numbers_are_the_oracles() -> None:
    """Everything the statistics are computed from (the batch, its labels, the mask) follows the model to its
    device: on CUDA the numbers are the float64 oracle's, as on the CPU."""
    texts = ["the river is blue", greedy_text(), "a"]
    rows = [enc(t, True) for t in texts]
    with use_model(device="cuda") as (model, calls):
        stats = next_token_stats(model, tokenizer(), texts, batch_size=2)
        d = next_token_distribution(model, tokenizer(), "the sea", top_k=3, chat_template="never")
    assert {call["input_ids"].device.type for call in calls} == {"cuda"}
    assert stats.to_dict() == {**_approx(oracle([(row, 1) for row in rows]), rel=1e-4), "num_sequences": 3}
    p, entropy = oracle_distribution(enc("the sea", True))
    assert d["entropy"] == pytest.approx(entropy, rel=1e-4)
    assert d["token_ids"] == [int(i) for i in torch.argsort(p, descending=True)[:3]]


def test_the_default_batch_is_eight_sequences() -> None:
    with use_model() as (model, calls):
        next_token_stats(model, tokenizer(), ["the sea"] * 9)
    assert [call["input_ids"].shape[0] for call in calls] == [8, 1]


def test_sequences_are_cut_to_max_length_default_1024() -> None:
    text = "ab" * 600
    assert len(enc(text, True)) == 1201  # BOS + 1,200 tokens
    with use_model() as (model, _):
        stats = next_token_stats(model, tokenizer(), [text])
        assert stats.num_tokens == 1023  # cut to 1,024 tokens: every token after the first scored
        assert next_token_stats(model, tokenizer(), [text], max_length=10).num_tokens == 9


def test_a_record_truncated_away_is_skipped() -> None:
    tok = tokenizer(template=None)
    long_prompt = {"prompt": "the river", "response": "sea"}  # [BOS] + 6 prompt tokens: no response left
    assert len(enc("the river", True)) == 7
    with use_model() as (model, _):
        stats = next_token_stats(model, tok, [long_prompt, "ab", long_prompt, "cd"], max_length=6)
        assert (stats.num_sequences, stats.num_tokens) == (2, 4)
        with pytest.raises(ValueError) as err:
            next_token_stats(model, tok, [long_prompt], max_length=6)
        assert (
            str(err.value) == "No scorable tokens: the dataset is empty or every response was truncated away."
        )
        with pytest.raises(ValueError, match="^No scorable tokens: the dataset is empty"):
            next_token_stats(model, tok, [])


def test_a_sequence_with_a_single_scored_token_counts() -> None:
    row = enc("a", True)
    assert len(row) == 2
    with use_model() as (model, _):
        stats = next_token_stats(model, tokenizer(), ["a"])
    assert stats.to_dict() == {**_approx(oracle([(row, 1)])), "num_sequences": 1}


# ---------------------------------------------------------------------------------------------------------
# What is scored: text, prompt + response, messages


def test_prompt_and_response_without_a_chat_template() -> None:
    row = (
        enc("the sea", True) + enc(" is cold", False) + [EOS]
    )  # the prompt with special tokens, the response, EOS
    start = len(enc("the sea", True))
    for key in ("response", "completion"):
        with use_model() as (model, calls):
            stats = next_token_stats(
                model, tokenizer(template=None), [{"prompt": "the sea", key: " is cold"}]
            )
        assert _rows(calls) == [row]
        assert stats.to_dict() == {**_approx(oracle([(row, start)])), "num_sequences": 1}
    with use_model() as (model, calls):
        stats = next_token_stats(
            model, tokenizer(template=None, eos=None), [{"prompt": "ab", "response": "cd"}]
        )
    assert _rows(calls) == [enc("ab", True) + enc("cd", False)]  # no EOS token: none appended
    assert stats.num_tokens == len(enc("cd", False))


def test_prompt_and_response_are_the_two_turns_of_the_chat_template() -> None:
    tok = tokenizer()
    with use_model() as (model, calls):
        stats = next_token_stats(model, tok, [{"prompt": "ab", "response": "the sea"}])
    full = "<|user|>ab</s><|assistant|>the sea</s>"  # the template's text, no special tokens added
    assert (
        tok.apply_chat_template(
            [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "the sea"}], tokenize=False
        )
        == full
    )
    row = enc(full, False)
    assert _rows(calls) == [row]
    scored = len(enc("the sea</s>", False))  # the response as the template writes it
    assert stats.to_dict() == {**_approx(oracle([(row, len(row) - scored)])), "num_sequences": 1}


def test_messages_score_the_last_assistant_turn_after_all_the_others() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "the sea"},
    ]
    with use_model() as (model, calls):
        stats = next_token_stats(model, tokenizer(), [{"messages": messages}])
    row = enc("<|system|>s</s><|user|>ab</s><|assistant|>the sea</s>", False)
    assert _rows(calls) == [row] and stats.num_tokens == len(enc("the sea</s>", False))
    # a template whose generation prompt is not how it writes the turn: the last turn's content is the response
    tok = tokenizer(
        template=TEMPLATE.replace(
            "{% if add_generation_prompt %}<|assistant|>", "{% if add_generation_prompt %}<|assistant|>:"
        )
    )
    with use_model() as (model, calls):
        stats = next_token_stats(model, tok, [{"messages": messages}])
    prompt = enc("<|system|>s</s><|user|>ab</s><|assistant|>:", False)
    assert _rows(calls) == [prompt + enc("the sea", False)]
    assert stats.to_dict() == {
        **_approx(oracle([(prompt + enc("the sea", False), len(prompt))])),
        "num_sequences": 1,
    }


def test_the_record_refusals_name_the_record() -> None:
    tok = tokenizer()
    cases = [
        (["ab", 3], "record #1: expected a JSON object, got int."),
        (
            ["ab", {"prompt": "x"}],
            "record #1: needs 'text', 'messages', or 'prompt' with 'response'/'completion' (keys: ['prompt']).",
        ),
        (
            [{"response": "x"}],
            "record #0: needs 'text', 'messages', or 'prompt' with 'response'/'completion' (keys: ['response']).",
        ),
        ([{"prompt": "x", "response": None}], "record #0: needs 'text', 'messages', or 'prompt' with"),
        (
            [{"messages": [{"role": "user", "content": "a"}]}],
            "record #0: 'messages' must end with an assistant",
        ),
        ([{"messages": []}], "record #0: 'messages' must end with an assistant turn (the scored response)."),
    ]
    with use_model() as (model, _):
        for records, message in cases:
            with pytest.raises(ValueError) as err:
                next_token_stats(model, tok, records)
            assert str(err.value).startswith(message)
        messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        with pytest.raises(ValueError) as err:
            next_token_stats(model, tokenizer(template=None), ["ab", {"messages": messages}])
    assert str(err.value) == "record #1: 'messages' records need a tokenizer with a chat template."


# ---------------------------------------------------------------------------------------------------------
# chat_template: auto | always (True) | never (False)


def _chat_used(tok: Any, mode: Any) -> bool:
    """Whether the row the model was given is the chat template's (it starts with <|user|>, else with BOS)."""
    with use_model() as (model, calls):
        next_token_stats(model, tok, [{"prompt": "ab", "response": "cd"}], chat_template=mode)
    (row,) = _rows(calls)
    assert row[0] in (USER, BOS)
    return row[0] == USER


def test_the_chat_template_modes() -> None:
    tok = tokenizer()
    modes = ("auto", "always", True, "never", False)
    assert [_chat_used(tok, mode) for mode in modes] == [True, True, True, False, False]
    assert not _chat_used(tokenizer(template=None), "auto")
    # a tokenizer class without the attribute at all (not a Hugging Face one): no chat template either
    absent = tokenizer()
    del absent.chat_template
    assert not _chat_used(absent, "auto")
    for tok in (tokenizer(template=None), absent):
        for mode in ("always", True):
            with pytest.raises(ValueError) as err:
                _chat_used(tok, mode)
            assert str(err.value) == "chat_template='always' but the tokenizer has no chat template."
    with pytest.raises(ValueError) as err:
        _chat_used(tokenizer(), "sometimes")
    assert str(err.value) == "chat_template must be 'auto', 'always' or 'never', got 'sometimes'."


# ---------------------------------------------------------------------------------------------------------
# Loading: a checkpoint path (saved in bfloat16), a loaded model


def test_a_checkpoint_loads_in_float32_on_the_default_device() -> None:
    path = checkpoint()
    with model_calls() as calls:
        stats = next_token_stats(path, None, ["the sea"])
    (call,) = calls
    expected_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert (call["dtype"], call["device"].type) == (torch.float32, expected_device)
    # the tokenizer saved with it (BOS added), and the float32 model's numbers
    assert call["input_ids"].tolist() == [enc("the sea", True)]
    assert stats.to_dict() == {**_approx(oracle([(enc("the sea", True), 1)])), "num_sequences": 1}


def test_without_a_device_a_checkpoint_goes_to_cuda_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoint()
    if torch.cuda.is_available():  # a machine with CUDA: the real choice
        with model_calls() as calls:
            next_token_distribution(path, None, "ab", chat_template="never")
        assert calls[0]["device"].type == "cuda"
        return
    # CUDA cannot run here (a CPU-only torch): torch.cuda.is_available is told True, the only substituted part, so
    # the choice shows in torch's own refusal to move the model to CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for run in (next_token_stats, next_token_distribution):
        with pytest.raises(AssertionError, match="^Torch not compiled with CUDA enabled$"):
            run(str(path), None, "ab" if run is next_token_distribution else ["ab"])
    # a device given is used as it is
    with model_calls() as calls:
        next_token_stats(path, None, ["ab"], device="cpu:0")
    assert calls[0]["device"].type == "cpu"


def test_a_checkpoint_goes_to_the_given_device_with_the_given_tokenizer() -> None:
    path = checkpoint()
    mine = tokenizer(template=None)  # the saved tokenizer has a chat template; this one does not
    with model_calls() as calls:
        with pytest.raises(Exception):  # noqa: B017 - nothing can be computed from a "meta" model's logits
            next_token_distribution(path, mine, "ab", device="meta")
    assert calls[0]["device"].type == "meta" and calls[0]["input_ids"].device.type == "meta"
    assert calls[0]["input_ids"].shape == (1, len(enc("ab", True)))  # not the saved tokenizer's template
    with model_calls() as calls:
        next_token_stats(path, mine, [{"prompt": "ab", "response": "cd"}], device="cpu:0")
    assert calls[0]["device"].type == "cpu"
    assert calls[0]["input_ids"].tolist() == [enc("ab", True) + enc("cd", False) + [EOS]]  # no chat template


def test_a_checkpoint_that_cannot_load_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "no-config"
    tokenizer().save_pretrained(folder)  # a tokenizer, but no config.json: no model
    with pytest.raises(ValueError) as err:
        next_token_stats(folder, None, ["ab"])
    cause = err.value.__cause__  # transformers' own refusal
    assert isinstance(cause, Exception) and "config.json" in str(cause)
    assert str(err.value) == f"Could not load checkpoint {str(folder)!r}: {type(cause).__name__}: {cause}"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"^Could not load checkpoint {str(empty)!r}: "):
        next_token_distribution(str(empty), None, "ab")


def test_a_loaded_model_needs_its_tokenizer() -> None:
    with use_model() as (model, _):
        with pytest.raises(ValueError) as err:
            next_token_stats(model, None, ["ab"])
    assert str(err.value) == "Pass the tokenizer together with a loaded model (or give a checkpoint path)."


def test_without_torch_or_transformers_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    how = "Install it with: pip install 'distmatch[eval]'"
    tok = tokenizer()
    with use_model() as (model, _):
        monkeypatch.setitem(sys.modules, "transformers", None)
        with pytest.raises(ImportError) as err:
            next_token_stats("ckpt", None, ["ab"])
        assert str(err.value) == f"Next-token statistics needs transformers, which is not installed. {how}"
        monkeypatch.setitem(sys.modules, "torch", None)
        with pytest.raises(ImportError) as err:
            next_token_stats(model, tok, ["ab"])
        assert str(err.value) == f"Next-token statistics needs torch, which is not installed. {how}"
        with pytest.raises(ImportError) as err:
            next_token_distribution(model, tok, "ab")
        assert str(err.value) == f"Next-token distributions needs torch, which is not installed. {how}"


# ---------------------------------------------------------------------------------------------------------
# The progress bar: the real tqdm


def test_the_progress_bar_counts_batches(capsys: pytest.CaptureFixture) -> None:
    texts = ["the sea", "ab", "a"]
    with use_model() as (model, _):
        quiet = next_token_stats(model, tokenizer(), texts, batch_size=2)
        assert capsys.readouterr().err == ""
        shown = next_token_stats(model, tokenizer(), texts, batch_size=2, progress=True)
    assert shown == quiet
    bar = capsys.readouterr().err.strip().split("\r")[-1]
    assert bar.startswith("next-token stats: 100%|") and "| 2/2 [" in bar  # two batches
    assert bar.endswith("batch/s]") or bar.endswith("s/batch]")


# ---------------------------------------------------------------------------------------------------------
# GEM figure 6: the first response token's distribution


def test_the_distribution_after_a_prompt() -> None:
    tok = tokenizer()
    with use_model() as (model, calls):
        d = next_token_distribution(model, tok, "the sea", top_k=3, chat_template="never")
    row = enc("the sea", True)
    assert calls[0]["input_ids"].tolist() == [row]  # the prompt with special tokens
    p, entropy = oracle_distribution(row)
    top = [int(i) for i in torch.argsort(p, descending=True)[:3]]
    assert d == {
        "prompt": "the sea",
        "tokens": [tok.decode([i]) for i in top],
        "token_pieces": tok.convert_ids_to_tokens(top),
        "token_ids": top,
        "probs": pytest.approx([float(p[i]) for i in top], rel=1e-5),
        "entropy": pytest.approx(entropy, rel=1e-5),
        "top1_prob": pytest.approx(float(p[top[0]]), rel=1e-5),
        "other": pytest.approx(1 - sum(float(p[i]) for i in top), rel=1e-5),
    }


def test_the_distribution_uses_the_chat_template_and_ten_tokens_by_default() -> None:
    tok = tokenizer()
    with use_model() as (model, calls):
        d = next_token_distribution(model, tok, "ab")
    row = enc("<|user|>ab</s><|assistant|>", False)  # no special tokens added
    assert calls[0]["input_ids"].tolist() == [row]
    p, _ = oracle_distribution(row)
    top = [int(i) for i in torch.argsort(p, descending=True)[:10]]
    assert d["token_ids"] == top and len(d["tokens"]) == len(d["probs"]) == 10
    assert d["tokens"] != d["token_pieces"]  # decoded text ("Ġ" is a space) and the vocabulary's pieces


def test_the_distribution_runs_on_the_models_device() -> None:
    with use_model(device="meta") as (model, calls):
        with pytest.raises(Exception):  # noqa: B017 - nothing can be computed from a "meta" model's logits
            next_token_distribution(model, tokenizer(), "ab", chat_template="never")
    assert calls[0]["input_ids"].device.type == "meta"


def test_the_distribution_needs_a_prompt() -> None:
    with use_model() as (model, _):
        for prompt in (None, "", "  \n"):
            with pytest.raises(ValueError) as err:
                next_token_distribution(model, tokenizer(), prompt)
            assert str(err.value) == "prompt must be a non-empty string."
