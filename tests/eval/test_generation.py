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
        "model", "backend", "num_samples", "temperature", "top_k", "top_p", "max_new_tokens", "min_new_tokens",
        "seed",
        "chat_template_mode", "benchmark", "prompts_file", "num_prompts_in_file",
    ]  # fmt: skip
    assert meta["chat_template_mode"] == "auto"  # the --chat-template flag (the default)
    assert (meta["num_samples"], meta["seed"], meta["top_k"], meta["num_prompts_in_file"]) == (4, 7, 50, 9)


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
