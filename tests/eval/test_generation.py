"""eval_tasks.generation: sampling settings, prompt encoding, batched HF generation (seeding, resume, greedy) and the
vLLM path with a stand-in engine, on a tiny Llama built in code."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest

from eval_tasks import generation as G
from eval_tasks.samples import InputError

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPTS = [{"id": f"p{i}", "prompt": f"Write a line about the number {i}"} for i in range(3)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[object, object]:
    from trl_ext.testing import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("generation") / "model")
    model, tokenizer, device = G.load_checkpoint(str(path), "cpu", "float32")
    assert device == "cpu"
    return model, tokenizer


def test_sampling_defaults_are_gem_and_bad_values_fail() -> None:
    s = G.Sampling()
    assert (s.num_samples, s.temperature, s.top_k, s.top_p, s.max_new_tokens) == tuple(
        G.GEM_GENERATION.values()
    )
    s.check()
    for bad, message in (
        ({"num_samples": 0}, "num-samples must be >= 1"),
        ({"max_new_tokens": 0}, "max-new-tokens"),
        ({"temperature": -0.1}, "temperature >= 0"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_k": -1}, "top-k >= 0"),
    ):
        with pytest.raises(InputError, match=message):
            G.Sampling(**bad).check()


def test_generation_meta() -> None:
    meta = G.generation_meta(
        "m",
        "hf",
        G.Sampling(num_samples=4, seed=7),
        benchmark="gem_poem",
        prompts_file="p.jsonl",
        num_prompts_in_file=9,
    )
    assert list(meta) == [
        "model",
        "backend",
        "num_samples",
        "temperature",
        "top_k",
        "top_p",
        "max_new_tokens",
        "min_new_tokens",
        "seed",
        "chat_template_mode",
        "benchmark",
        "prompts_file",
        "num_prompts_in_file",
    ]
    assert meta["chat_template_mode"] == "auto"  # the --chat-template flag (the default)
    assert (meta["num_samples"], meta["seed"], meta["top_k"], meta["num_prompts_in_file"]) == (4, 7, 50, 9)


def test_a_long_prompt_keeps_the_last_tokens_of_its_whole_encoding(tiny) -> None:
    """lm-eval's truncation (HFLM.tok_batch_encode with left_truncate_len): the whole context encoded, then its last
    `max_length - max_gen_toks` tokens. Only a tail of a long prompt is tokenized here: the kept tokens must be those
    of the whole encoding anyway, for prompts of every length around the limit, with and without spaces (a text
    without spaces is one word to the byte-level BPE, cut anywhere), with and without the chat template."""
    import random

    _, tokenizer = tiny
    limit = G.PromptLimit(tokens=40, context=52, source="test", max_token_chars=16)
    rng = random.Random(0)
    words = "the river runs past old mill stone night sea a of blue, quiet! 12 345 über".split()
    # the vocabulary's longest pieces, repeated: about 13 characters a token, so the first tail tried (8 a token)
    # holds too few tokens and a longer one is tokenized
    pieces = sorted(tokenizer.get_vocab(), key=len)[-3:]
    longest = "".join(tokenizer.convert_tokens_to_string([p]) for p in pieces)
    checked = truncated = 0
    for n in [*range(1, 80, 3), *rng.sample(range(80, 2000), 40)]:
        text = " ".join(rng.choice(words) for _ in range(n))
        for prompt in (text, text.replace(" ", ""), longest * (n // 10 + 1)):
            for record in ({"id": n, "prompt": prompt}, {"id": n, "text": prompt}):
                whole = G.encode_prompt(tokenizer, record)
                fitted = G.encode_prompt(tokenizer, record, limit=limit)
                assert fitted.ids == whole.ids[-limit.tokens :], (n, record)
                assert fitted.truncated == (len(whole.ids) > limit.tokens), (n, record)
                if fitted.truncated:
                    assert fitted.text == tokenizer.decode(fitted.ids, skip_special_tokens=False)
                else:
                    assert fitted.text == whole.text
                checked, truncated = checked + 1, truncated + fitted.truncated
    assert truncated > checked // 2 and truncated < checked


def test_prompt_limit_is_the_context_less_the_new_tokens(tiny) -> None:
    model, tokenizer = tiny
    limit = G.PromptLimit.of("m", model.config, tokenizer, 6)
    assert (limit.tokens, limit.context, limit.source) == (250, 256, "max_position_embeddings in its config")
    assert limit.max_token_chars == max(len(piece) for piece in tokenizer.get_vocab())
    with pytest.raises(InputError, match="--max-new-tokens 256: m has a context of 256 tokens"):
        G.PromptLimit.of("m", model.config, tokenizer, 256)
    # lm-eval's order: the config's n_positions / max_position_embeddings / n_ctx (a composite config's text_config),
    # the tokenizer's model_max_length unless unset (about 1e30), else lm-eval's 2,048
    text = types.SimpleNamespace(n_positions=None, max_position_embeddings=None, n_ctx=1024)
    assert G.context_length(types.SimpleNamespace(text_config=text, n_positions=77), tokenizer)[0] == 1024
    bare = types.SimpleNamespace()
    assert G.context_length(bare, types.SimpleNamespace(model_max_length=4096)) == (
        4096,
        "model_max_length of its tokenizer",
    )
    assert (
        G.context_length(bare, types.SimpleNamespace(model_max_length=int(1e30)))[0]
        == G.LM_EVAL_DEFAULT_CONTEXT
    )


def test_load_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="could not load checkpoint"):
        G.load_checkpoint(str(tmp_path / "nothing"), "cpu", "float32")


def test_encode_prompt_chat_plain_and_errors(tiny) -> None:
    _, tokenizer = tiny
    chat = G.encode_prompt(tokenizer, PROMPTS[0])
    assert chat.chat and chat.text.startswith("<|user|>") and chat.text.endswith("<|assistant|>")
    assert chat.ids == list(tokenizer(chat.text, add_special_tokens=False)["input_ids"])
    plain = G.encode_prompt(tokenizer, PROMPTS[0], "never")
    assert not plain.chat and plain.text == PROMPTS[0]["prompt"]
    assert plain.ids == list(tokenizer(plain.text, add_special_tokens=True)["input_ids"])
    raw = G.encode_prompt(tokenizer, {"id": 0, "text": "once upon"}, "always")
    assert not raw.chat and raw.text == "once upon"
    with pytest.raises(InputError, match="'messages' need a chat template"):
        G.encode_prompt(tokenizer, {"id": 1, "messages": [{"role": "user", "content": "x"}]}, "never")
    no_template = copy.copy(tokenizer)
    no_template.chat_template = None
    with pytest.raises(InputError, match="has no chat template"):
        G.encode_prompt(no_template, PROMPTS[0], "always")


def _generate(tiny, records, sampling, positions=None, batch_size=2) -> list[list[dict]]:
    model, tokenizer = tiny
    encoded = G.encode_prompts(tokenizer, records)
    meta = {"model": "tiny"}
    return list(
        G.generate_batches(
            encoded,
            sampling,
            meta,
            model=model,
            tokenizer=tokenizer,
            batch_size=batch_size,
            positions=positions,
        )
    )


def test_hf_batches_rows_seeding_and_resume(tiny) -> None:
    sampling = G.Sampling(num_samples=3, max_new_tokens=5, seed=11)
    records = [*PROMPTS[:2], {**PROMPTS[2], "reference": "a human line"}]
    batches = _generate(tiny, records, sampling)
    assert [len(b) for b in batches] == [2, 1]
    rows = [r for b in batches for r in b]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"]
    assert all(len(r["samples"]) == 3 and all(isinstance(s, str) for s in r["samples"]) for r in rows)
    assert rows[0]["meta"] == {"model": "tiny", "chat_template": True}
    assert "reference" not in rows[0] and rows[2]["reference"] == "a human line"
    assert rows[0]["input_text"].startswith("<|user|>") and rows[0]["prompt"] == PROMPTS[0]["prompt"]
    # same seed and positions: the same samples; the third prompt alone at its position: what the full run drew
    assert [r["samples"] for b in _generate(tiny, records, sampling) for r in b] == [
        r["samples"] for r in rows
    ]
    (resumed,) = _generate(tiny, records[2:], sampling, positions=[2])
    assert resumed[0]["samples"] == rows[2]["samples"]
    other_seed = _generate(tiny, records, G.Sampling(num_samples=3, max_new_tokens=5, seed=12))
    assert [r["samples"] for b in other_seed for r in b] != [r["samples"] for r in rows]


def test_min_new_tokens_forces_the_length(tiny) -> None:
    """A model that wants to stop at once (EOS logit +50): without --min-new-tokens every sample is empty after one
    step; with min 6 / max 7 (EMO's forced length, ancestral top-k 0 / top-p 1) it runs 6 steps, then stops."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    steps = []

    def boost_eos(module, inputs, output):
        steps.append(1)
        output[..., tokenizer.eos_token_id] += 50.0
        return output

    model.lm_head.register_forward_hook(boost_eos)
    record = [{"id": "t", "text": "the river"}]
    free = G.Sampling(num_samples=2, top_k=0, top_p=1.0, max_new_tokens=7)
    (batch,) = _generate((model, tokenizer), record, free)
    assert batch[0]["samples"] == ["", ""] and len(steps) == 1
    steps.clear()
    forced = G.Sampling(num_samples=2, top_k=0, top_p=1.0, max_new_tokens=7, min_new_tokens=6)
    (batch,) = _generate((model, tokenizer), record, forced)
    assert len(steps) == 7  # 6 forced tokens, then EOS at the 7th step
    for text in batch[0]["samples"]:
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= 1


def test_min_new_tokens_above_max_is_refused() -> None:
    with pytest.raises(InputError, match=r"--min-new-tokens 9: must be >= 0 and <= --max-new-tokens \(8\)"):
        G.Sampling(max_new_tokens=8, min_new_tokens=9).check()


def test_hf_greedy_repeats_one_continuation(tiny) -> None:
    (batch,) = _generate(tiny, PROMPTS[:2], G.Sampling(num_samples=4, temperature=0.0, max_new_tokens=4))
    for row in batch:
        assert len(row["samples"]) == 4 and len(set(row["samples"])) == 1


def test_vllm_path_with_a_stand_in_engine(tiny) -> None:
    _, tokenizer = tiny
    calls = []

    class Engine:
        def generate(self, prompts, params):
            calls.append((prompts, params))
            return [
                types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(text=f"out {i} {j}") for j in range(params)]
                )
                for i, _ in enumerate(prompts)
            ]

    encoded = G.encode_prompts(tokenizer, PROMPTS[:2])
    (batch,) = G.generate_batches(encoded, G.Sampling(num_samples=2), {}, vllm=(Engine(), 2), batch_size=4)
    assert [r["samples"] for r in batch] == [["out 0 0", "out 0 1"], ["out 1 0", "out 1 1"]]
    assert calls[0][0] == [{"prompt_token_ids": e.ids} for e in encoded]
    (greedy,) = G.generate_batches(
        encoded, G.Sampling(num_samples=3, temperature=0.0), {}, vllm=(Engine(), 1), batch_size=4
    )
    assert greedy[0]["samples"] == ["out 0 0"] * 3


def test_backend_choice() -> None:
    from distmatch.optional import is_available

    assert G.choose_backend("hf") == "hf"
    if not is_available("vllm"):
        assert G.choose_backend("auto") == "hf"
        with pytest.raises(InputError, match=r"vLLM is not installed \(pip install 'distmatch\[vllm\]'"):
            G.choose_backend("vllm")
        with pytest.raises(ImportError, match=r"pip install 'distmatch\[vllm\]'"):
            G.vllm_engine("tiny", G.Sampling())
