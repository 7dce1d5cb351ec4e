"""eval_tasks.metrics.next_token against its contract, for what tests/eval/test_metrics.py leaves open. With a fake
causal LM whose next-token logits are a fixed table row of the previous token, every statistic has a float64 oracle
written from the docstrings (perplexity = exp(mean NLL), mean entropy in nats, mean top-1 probability, top-1
accuracy, over the scored tokens of all batches), and a fake tokenizer with a BOS token shows what the model is given:
a ``text`` with the tokenizer's special tokens (every token after the first scored); ``prompt`` + ``response`` /
``completion`` as the two turns of the chat template when there is one (the template's text without added special
tokens; only the response scored), else the prompt with special tokens, the response and EOS; batches padded on the
right with the pad token and an attention mask as Hugging Face defines it (1 = token, 0 = padding, integers);
``max_length`` (default 1024) and ``batch_size`` (default 8); the ``chat_template`` modes; a checkpoint path loaded
in float32 on the given device (else CUDA when available); the figure-6 distribution's fields; the refusals."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from eval_tasks.metrics.next_token import NextTokenStats, next_token_distribution, next_token_stats

PAD, BOS, EOS = 0, 1, 2
ALPHABET = "abcdefghijklmnopqrstuvwxyz<>|: \n"
CHAR = {c: i + 3 for i, c in enumerate(ALPHABET)}
V = 3 + len(ALPHABET)


def _table() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(V, V, generator=g) * 2
    for i in range(3, V - 1):
        table[i, i + 1] += 4.0  # "a" -> "b": the next letter is often the top-1 token
    table[BOS, CHAR["a"]] += 4.0
    return table


TABLE = _table()


def _ids(text: str) -> list[int]:
    return [CHAR[c] for c in text]


class _Tokenizer:
    """A character tokenizer with BOS / EOS / PAD and a chat template (Hugging Face's call conventions)."""

    def __init__(
        self, template: str | None = "fake", *, eos: int | None = EOS, pad: int | None = PAD
    ) -> None:
        if template != "absent":
            self.chat_template = template
        self.eos_token_id, self.pad_token_id = eos, pad
        self.gen_suffix = ""
        self.chats: list[tuple[list[dict[str, str]], bool]] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        if not isinstance(add_special_tokens, bool):  # as a fast tokenizer's Rust backend refuses it
            raise TypeError(f"{add_special_tokens!r} is not an instance of 'bool'")
        return {"input_ids": ([BOS] if add_special_tokens else []) + _ids(text)}

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        self.chats.append(([dict(m) for m in messages], add_generation_prompt))
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        if add_generation_prompt:
            text += "<assistant>" + self.gen_suffix
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def decode(self, ids: list[int]) -> str:
        return "".join(ALPHABET[i - 3] if i >= 3 else f"[{i}]" for i in ids)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"tok{i}" for i in ids]


class _Model(torch.nn.Module):
    """A causal LM whose logits at each position are TABLE[that position's token]; records its inputs."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, device=device))
        self.calls: list[dict[str, Any]] = []
        self.moved_to: list[Any] = []

    def to(self, *args: Any, **kwargs: Any) -> _Model:  # records where it was sent; stays on the CPU
        self.moved_to.append(args[0] if args else kwargs.get("device"))
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        self.calls.append({"input_ids": input_ids, "attention_mask": attention_mask})
        if input_ids.device.type == "meta":
            return SimpleNamespace(logits=TABLE[BOS].expand(*input_ids.shape, V).clone())
        return SimpleNamespace(logits=TABLE[input_ids])


def _oracle(rows: list[tuple[list[int], int]]) -> dict[str, float]:
    """The documented means over the scored tokens ids[start:] of each row, in float64."""
    nll, ent, top1, correct = [], [], [], []
    for ids, start in rows:
        for t in range(start, len(ids)):
            logp = torch.log_softmax(TABLE[ids[t - 1]].double(), dim=-1)
            p = logp.exp()
            nll.append(float(-logp[ids[t]]))
            ent.append(float(-(p * logp).sum()))
            top1.append(float(p.max()))
            correct.append(float(int(p.argmax()) == ids[t]))
    n = len(nll)
    mean_nll = sum(nll) / n
    return {
        "perplexity": math.exp(mean_nll),
        "mean_nll": mean_nll,
        "mean_entropy": sum(ent) / n,
        "mean_top1_prob": sum(top1) / n,
        "top1_accuracy": sum(correct) / n,
        "num_tokens": n,
    }


def _rows(model: _Model) -> list[list[int]]:
    """The unpadded rows the model was given."""
    rows = []
    for call in model.calls:
        for ids, mask in zip(call["input_ids"].tolist(), call["attention_mask"].tolist()):
            rows.append(ids[: sum(mask)])
    return rows


# ---------------------------------------------------------------------------------------------------------
# The statistics


def test_the_statistics_are_the_documented_means_over_all_batches() -> None:
    texts = ["abcd", "azby", "bcdefg"]
    model = _Model()
    stats = next_token_stats(model, _Tokenizer(), texts, batch_size=2)
    rows = [([BOS, *_ids(t)], 1) for t in texts]
    expected = _oracle(rows)
    assert 0 < expected["top1_accuracy"] < 1
    assert stats.to_dict() == {
        **{k: pytest.approx(v, rel=1e-6) for k, v in expected.items()},
        "num_sequences": 3,
    }
    assert stats.to_dict() == asdict(stats) and isinstance(stats, NextTokenStats)
    assert len(model.calls) == 2  # batch_size rows per forward pass
    assert _rows(model) == [ids for ids, _ in rows]  # a text keeps the tokenizer's special tokens


def test_batches_are_padded_on_the_right_with_the_hugging_face_attention_mask() -> None:
    model = _Model()
    next_token_stats(model, _Tokenizer(pad=7), ["abcd", "ab"], batch_size=2)
    (call,) = model.calls
    assert call["input_ids"].tolist() == [[BOS, *_ids("abcd")], [BOS, *_ids("ab"), 7, 7]]
    assert call["attention_mask"].dtype == torch.long
    assert call["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # without a pad token: padded all the same (masked), the same statistics
    stats = next_token_stats(_Model(), _Tokenizer(pad=None), ["abcd", "ab"], batch_size=2)
    expected = _oracle([([BOS, *_ids("abcd")], 1), ([BOS, *_ids("ab")], 1)])
    assert stats.mean_nll == pytest.approx(expected["mean_nll"], rel=1e-6)
    assert stats.num_tokens == 6


def test_the_batch_goes_to_the_models_device() -> None:
    model = _Model(device="meta")
    with pytest.raises(Exception):  # noqa: B017 - nothing can be computed after the forward pass on "meta"
        next_token_stats(model, _Tokenizer(), ["abcd", "ab"], batch_size=2)
    (call,) = model.calls  # but what the model was given is recorded
    assert call["input_ids"].device.type == "meta" and call["attention_mask"].device.type == "meta"


def test_the_default_batch_is_eight_sequences() -> None:
    model = _Model()
    next_token_stats(model, _Tokenizer(), ["ab"] * 9)
    assert [call["input_ids"].shape[0] for call in model.calls] == [8, 1]


def test_sequences_are_cut_to_max_length_default_1024() -> None:
    stats = next_token_stats(_Model(), _Tokenizer(), ["ab" * 600])
    assert stats.num_tokens == 1023  # BOS + 1,200 tokens cut to 1,024: every token after the first scored
    assert next_token_stats(_Model(), _Tokenizer(), ["ab" * 600], max_length=10).num_tokens == 9


def test_a_record_truncated_away_is_skipped() -> None:
    tok = _Tokenizer(template=None)
    long_prompt = {
        "prompt": "abcdefgh",
        "response": "ij",
    }  # [BOS] + 8 prompt tokens: nothing left of the response
    stats = next_token_stats(_Model(), tok, [long_prompt, "ab", long_prompt, "cd"], max_length=6)
    assert (stats.num_sequences, stats.num_tokens) == (2, 4)
    with pytest.raises(ValueError) as err:
        next_token_stats(_Model(), tok, [long_prompt], max_length=6)
    assert str(err.value) == "No scorable tokens: the dataset is empty or every response was truncated away."
    with pytest.raises(ValueError, match="^No scorable tokens: the dataset is empty"):
        next_token_stats(_Model(), tok, [])


# ---------------------------------------------------------------------------------------------------------
# What is scored: text, prompt + response, messages


def test_prompt_and_response_without_a_chat_template() -> None:
    for key in ("response", "completion"):
        model = _Model()
        stats = next_token_stats(model, _Tokenizer(template=None), [{"prompt": "ab", key: "cd"}])
        row = [BOS, *_ids("ab"), *_ids("cd"), EOS]  # the prompt with special tokens, the response, EOS
        assert _rows(model) == [row]
        assert stats.mean_nll == pytest.approx(_oracle([(row, 3)])["mean_nll"], rel=1e-6)
        assert stats.num_tokens == 3
    model = _Model()
    stats = next_token_stats(model, _Tokenizer(template=None, eos=None), [{"prompt": "ab", "response": "cd"}])
    assert _rows(model) == [[BOS, *_ids("abcd")]] and stats.num_tokens == 2  # no EOS token: none appended


def test_prompt_and_response_are_the_two_turns_of_the_chat_template() -> None:
    tok, model = _Tokenizer(), _Model()
    stats = next_token_stats(model, tok, [{"prompt": "ab", "response": "cd"}])
    user = {"role": "user", "content": "ab"}
    assert tok.chats == [([user], True), ([user, {"role": "assistant", "content": "cd"}], False)]
    full = "<user>ab|<assistant>cd|"  # the template's text, no special tokens added
    assert _rows(model) == [_ids(full)]
    assert stats.num_tokens == 3  # "cd|": the response as the template writes it
    assert stats.mean_nll == pytest.approx(_oracle([(_ids(full), len(full) - 3)])["mean_nll"], rel=1e-6)


def test_messages_score_the_last_assistant_turn_after_all_the_others() -> None:
    tok, model = _Tokenizer(), _Model()
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "cd"},
    ]
    stats = next_token_stats(model, tok, [{"messages": messages}])
    assert tok.chats[0] == (messages[:2], True)
    assert _rows(model) == [_ids("<system>s|<user>ab|<assistant>cd|")] and stats.num_tokens == 3
    # a template whose generation prompt is not how it writes the turn: the last turn's content is the response
    tok, model = _Tokenizer(), _Model()
    tok.gen_suffix = ":"
    stats = next_token_stats(model, tok, [{"messages": messages}])
    assert _rows(model) == [_ids("<system>s|<user>ab|<assistant>:cd")] and stats.num_tokens == 2


def test_the_record_refusals_name_the_record() -> None:
    tok = _Tokenizer()
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
    ]
    for records, message in cases:
        with pytest.raises(ValueError) as err:
            next_token_stats(_Model(), tok, records)
        assert str(err.value).startswith(message)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(ValueError) as err:
        next_token_stats(_Model(), _Tokenizer(template=None), ["ab", {"messages": messages}])
    assert str(err.value) == "record #1: 'messages' records need a tokenizer with a chat template."


# ---------------------------------------------------------------------------------------------------------
# chat_template: auto | always (True) | never (False)


def _chat_used(tok: _Tokenizer, mode: Any) -> bool:
    tok.chats.clear()
    next_token_stats(_Model(), tok, [{"prompt": "ab", "response": "cd"}], chat_template=mode)
    return bool(tok.chats)


def test_the_chat_template_modes() -> None:
    tok = _Tokenizer()
    assert [_chat_used(tok, mode) for mode in ("auto", "always", True, "never", False)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert not _chat_used(_Tokenizer(template=None), "auto")
    assert not _chat_used(_Tokenizer(template="absent"), "auto")
    for tok in (_Tokenizer(template=None), _Tokenizer(template="absent")):
        for mode in ("always", True):
            with pytest.raises(ValueError) as err:
                _chat_used(tok, mode)
            assert str(err.value) == "chat_template='always' but the tokenizer has no chat template."
    with pytest.raises(ValueError) as err:
        _chat_used(_Tokenizer(), "sometimes")
    assert str(err.value) == "chat_template must be 'auto', 'always' or 'never', got 'sometimes'."


# ---------------------------------------------------------------------------------------------------------
# Loading: a checkpoint path, a loaded model


@pytest.fixture
def checkpoint(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """transformers' Auto classes replaced: a path 'loads' the fake model and tokenizer (recorded)."""
    import transformers

    seen = SimpleNamespace(tokenizer=[], model=[], fake=_Model(), tok=_Tokenizer(), cuda=False)

    def tokenizer(path: Any, **kwargs: Any) -> _Tokenizer:
        seen.tokenizer.append(path)
        return seen.tok

    def model(path: Any, **kwargs: Any) -> _Model:
        seen.model.append((path, kwargs))
        return seen.fake

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: seen.cuda)
    return seen


def test_a_checkpoint_loads_in_float32_on_the_default_device(checkpoint: SimpleNamespace, tmp_path) -> None:
    stats = next_token_stats(tmp_path / "ckpt", None, ["abcd"])
    path = str(tmp_path / "ckpt")
    assert checkpoint.tokenizer == [path] and checkpoint.model == [(path, {"dtype": torch.float32})]
    assert checkpoint.fake.moved_to == ["cpu"] and stats.num_tokens == 4
    checkpoint.cuda = True
    next_token_distribution(path, None, "ab", chat_template="never")
    assert checkpoint.fake.moved_to == ["cpu", "cuda"]


def test_a_checkpoint_goes_to_the_given_device_with_the_given_tokenizer(checkpoint: SimpleNamespace) -> None:
    mine = _Tokenizer()
    next_token_stats("ckpt", mine, ["abcd"], device="cpu:0")
    next_token_distribution("ckpt", mine, "ab", device="meta")
    assert checkpoint.tokenizer == [] and checkpoint.fake.moved_to == ["cpu:0", "meta"]


def test_a_checkpoint_that_cannot_load_says_why(checkpoint: SimpleNamespace, monkeypatch) -> None:
    import transformers

    def fail(path: Any, **kwargs: Any) -> Any:
        raise OSError("no config.json")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(ValueError) as err:
        next_token_stats("ckpt", None, ["ab"])
    assert str(err.value) == "Could not load checkpoint 'ckpt': OSError: no config.json"


def test_a_loaded_model_needs_its_tokenizer() -> None:
    with pytest.raises(ValueError) as err:
        next_token_stats(_Model(), None, ["ab"])
    assert str(err.value) == "Pass the tokenizer together with a loaded model (or give a checkpoint path)."


def test_without_torch_or_transformers_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    how = "Install it with: pip install 'distmatch[eval]'"
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError) as err:
        next_token_stats("ckpt", None, ["ab"])
    assert str(err.value) == f"Next-token statistics needs transformers, which is not installed. {how}"
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError) as err:
        next_token_stats(_Model(), _Tokenizer(), ["ab"])
    assert str(err.value) == f"Next-token statistics needs torch, which is not installed. {how}"
    with pytest.raises(ImportError) as err:
        next_token_distribution(_Model(), _Tokenizer(), "ab")
    assert str(err.value) == f"Next-token distributions needs torch, which is not installed. {how}"


# ---------------------------------------------------------------------------------------------------------
# The progress bar


def test_the_progress_bar_counts_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def bar(
        iterable: Any, **kwargs: Any
    ) -> Any:  # tqdm.auto.tqdm, recorded (no monitor thread in a forked test)
        items = list(iterable)
        calls.append((items, kwargs))
        return iter(items)

    monkeypatch.setattr("tqdm.auto.tqdm", bar)
    quiet = next_token_stats(_Model(), _Tokenizer(), ["abcd", "ab", "a"], batch_size=2)
    assert calls == []
    shown = next_token_stats(_Model(), _Tokenizer(), ["abcd", "ab", "a"], batch_size=2, progress=True)
    assert shown == quiet
    assert calls == [
        ([0, 2], {"desc": "next-token stats", "unit": "batch"})
    ]  # the first sequence of each batch


# ---------------------------------------------------------------------------------------------------------
# GEM figure 6: the first response token's distribution


def test_the_distribution_after_a_prompt() -> None:
    tok, model = _Tokenizer(), _Model()
    d = next_token_distribution(model, tok, "ab", top_k=3, chat_template="never")
    assert model.calls[0]["input_ids"].tolist() == [[BOS, *_ids("ab")]]  # the prompt with special tokens
    logp = torch.log_softmax(TABLE[CHAR["b"]].double(), -1)
    p = logp.exp()
    top = [int(i) for i in torch.argsort(p, descending=True)[:3]]
    assert d == {
        "prompt": "ab",
        "tokens": [tok.decode([i]) for i in top],
        "token_pieces": [f"tok{i}" for i in top],
        "token_ids": top,
        "probs": pytest.approx([float(p[i]) for i in top], rel=1e-5),
        "entropy": pytest.approx(float(-(p * logp).sum()), rel=1e-5),
        "top1_prob": pytest.approx(float(p[top[0]]), rel=1e-5),
        "other": pytest.approx(1 - sum(float(p[i]) for i in top), rel=1e-4),
    }


def test_the_distribution_uses_the_chat_template_and_ten_tokens_by_default() -> None:
    tok, model = _Tokenizer(), _Model()
    d = next_token_distribution(model, tok, "ab")
    assert tok.chats == [([{"role": "user", "content": "ab"}], True)]
    assert model.calls[0]["input_ids"].tolist() == [_ids("<user>ab|<assistant>")]  # no special tokens added
    assert len(d["tokens"]) == len(d["probs"]) == len(d["token_ids"]) == 10


def test_the_distribution_runs_on_the_models_device() -> None:
    model = _Model(device="meta")
    d = next_token_distribution(model, _Tokenizer(), "ab", chat_template="never")
    assert model.calls[0]["input_ids"].device.type == "meta"
    assert d["top1_prob"] == pytest.approx(float(torch.softmax(TABLE[BOS].double(), -1).max()), rel=1e-5)


def test_the_distribution_needs_a_prompt() -> None:
    for prompt in (None, "", "  \n"):
        with pytest.raises(ValueError) as err:
            next_token_distribution(_Model(), _Tokenizer(), prompt)
        assert str(err.value) == "prompt must be a non-empty string."
