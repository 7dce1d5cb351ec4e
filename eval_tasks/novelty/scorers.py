"""The models behind NoveltyBench's numbers: the pairwise equivalence classifier and the reward model.

* :class:`PairClassifier`: a 2-label ``AutoModelForSequenceClassification`` read as partition.py's
  ``classifier_score`` reads it: the input is ``[CLS] a [SEP] b [SEP]`` with each response cut to its first 128
  tokens (no special tokens of their own), token types 0 up to and including the first ``[SEP]`` and 1 after, and the
  score is the softmax probability of label 1 ("equivalent"). The published classifier uses the tokenizer of
  ``microsoft/deberta-v3-large``; another classifier uses its own. Batched, right-padded with an attention mask
  (NoveltyBench scores one unpadded pair at a time).
* :class:`NoveltyRewardScorer`: best-of-n's reward scorer with NoveltyBench's conversation: [user: prompt,
  assistant: response] through the reward model's chat template without a generation prompt (score.py's
  ``apply_chat_template`` call), the first logit.
* :class:`NoveltyScorer`: both, per prompt: the partition, the bins of each class's first member (the only rewards
  utility uses; NoveltyBench also scores the later members and multiplies them by 0), ``distinct`` and ``utility``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distmatch.errors import DistMatchConfigError
from eval_tasks.best_of_n.best_of_n import RewardScorer
from eval_tasks.novelty.noveltybench import (
    CLASSIFIER_THRESHOLD,
    MAX_TOKENS,
    PATIENCE,
    PUBLISHED_CLASSIFIER,
    PUBLISHED_CLASSIFIER_TOKENIZER,
    PUBLISHED_REWARD_MODEL,
    partition,
    prompt_scores,
    reward_bin,
)

__all__ = ["NoveltyRewardScorer", "NoveltyScorer", "PairClassifier", "load_scorer"]


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


class PairClassifier:
    """P(equivalent) of (first member, candidate) pairs from a sequence-classification model with 2 labels."""

    def __init__(
        self, model: str, *, tokenizer: str | None = None, device: str | None = None, batch_size: int = 8
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        setting = f"classifier={model!r}"
        name = tokenizer or (PUBLISHED_CLASSIFIER_TOKENIZER if model == PUBLISHED_CLASSIFIER else model)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name)
            self.model = AutoModelForSequenceClassification.from_pretrained(model)
        except OSError as err:
            raise DistMatchConfigError(
                f"{setting} cannot be loaded (a Hub id or local folder of a 2-label sequence-classification "
                f"model and its tokenizer {name!r}): {' '.join(str(err).split())[:300]}"
            ) from None
        if self.model.config.num_labels != 2:
            raise DistMatchConfigError(
                f"{setting} has {self.model.config.num_labels} labels; NoveltyBench's classifier has 2 "
                "(label 1 = equivalent)."
            )
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        if cls is None or sep is None:
            raise DistMatchConfigError(f"{setting}: its tokenizer has no [CLS] / [SEP] token to join a pair.")
        self.cls, self.sep = cls, sep
        pad = self.tokenizer.pad_token_id
        self.pad = pad if pad is not None else sep
        self.batch_size = batch_size
        self.device = _device(device)
        self.model.to(self.device).eval()

    def encode(self, a: str, b: str) -> tuple[list[int], list[int]]:
        """The input ids and token types of one pair (partition.py's ``classifier_score``)."""
        ids = [self.cls]
        for text in (a, b):
            ids += self.tokenizer.encode(
                text, truncation=True, max_length=MAX_TOKENS, add_special_tokens=False
            )
            ids.append(self.sep)
        first = ids.index(self.sep) + 1
        return ids, [0] * first + [1] * (len(ids) - first)

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        out: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            encoded = [self.encode(a, b) for a, b in pairs[start : start + self.batch_size]]
            width = max(len(ids) for ids, _ in encoded)
            ids = torch.tensor([i + [self.pad] * (width - len(i)) for i, _ in encoded], device=self.device)
            types = torch.tensor([t + [0] * (width - len(t)) for _, t in encoded], device=self.device)
            mask = torch.tensor(
                [[1] * len(i) + [0] * (width - len(i)) for i, _ in encoded], device=self.device
            )
            with torch.inference_mode():
                kwargs = {"token_type_ids": types} if getattr(self.model.config, "type_vocab_size", 0) else {}
                logits = self.model(input_ids=ids, attention_mask=mask, **kwargs).logits
            out.extend(float(p) for p in logits.float().softmax(-1)[:, 1].cpu())
        return out


class NoveltyRewardScorer(RewardScorer):
    """The reward of (prompt, response) as score.py computes it: the chat template without a generation prompt."""

    def text(self, prompt: str, response: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            return str(self.tokenizer.apply_chat_template(chat, tokenize=False))
        return f"{prompt}\n\n{response}"


class NoveltyScorer:
    """The classifier and the reward model together: :meth:`score` gives one prompt's numbers."""

    def __init__(self, classifier: Any, reward: Any, *, threshold: float = CLASSIFIER_THRESHOLD) -> None:
        self.classifier, self.reward, self.threshold = classifier, reward, threshold

    def score(self, prompt: str, responses: Sequence[str], patience: float = PATIENCE) -> dict[str, Any]:
        responses = [str(r) for r in responses]
        classes = partition(responses, self.classifier, self.threshold)
        firsts = [classes.index(c) for c in range(max(classes) + 1)]
        rewards = self.reward.score([prompt] * len(firsts), [responses[i] for i in firsts])
        bins = [0] * len(responses)
        for i, raw in zip(firsts, rewards):
            bins[i] = reward_bin(raw)
        return {**prompt_scores(classes, bins, patience), "partition": classes, "first_rewards": rewards}


_LOADED: dict[tuple[Any, ...], NoveltyScorer] = {}


def load_scorer(
    classifier: str | None = None,
    reward_model: str | None = None,
    *,
    device: str | None = None,
    batch_size: int = 8,
) -> NoveltyScorer:
    """The scorer of these models (loaded once per process; defaults: the published models)."""
    key = (classifier or PUBLISHED_CLASSIFIER, reward_model or PUBLISHED_REWARD_MODEL, device, batch_size)
    if key not in _LOADED:
        pair = PairClassifier(key[0], device=device, batch_size=batch_size)
        reward = NoveltyRewardScorer(  # bf16, as score.py loads it
            key[1], batch_size=batch_size, device=device, dtype="bfloat16", setting=f"reward_model={key[1]!r}"
        )
        _LOADED[key] = NoveltyScorer(pair, reward)
    return _LOADED[key]
