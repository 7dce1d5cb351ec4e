"""GEM's test-time scaling evaluations (section 5, Tables 4, 5, 7, 8): data, prompts, per-question scores, reward model.

* GSM8K (``openai/gsm8k`` ``main`` test, 1,319 questions) and MATH (``EleutherAI/hendrycks_math``, the 5,000 test
  problems of its seven subjects; rows as MetaMath reads them, ``instruction`` / ``output``, are accepted too):
  GEM's zero-shot instruction (:data:`GEM_MATH_PROMPT`, from the GEM repository's ``evaluation_gsm8k_voting.py``,
  typographic apostrophe included) as one user turn; answers read by :mod:`eval_tasks.math.math_answers`; per question
  MV@k and BON@k (coverage) over the first k samples (:func:`math_question_scores`).
* AlpacaEval (``tatsu-lab/alpaca_eval``, the 805 ``eval`` rows; the GPT-4 (1106-preview) reference outputs of config
  ``alpaca_eval_gpt4_baseline``, i.e. the alpaca_eval repository's ``results/gpt4_1106_preview/model_outputs.json``):
  samples and reference scored by a sequence-classification reward model (:class:`RewardScorer`), per question
  Reward BON@k and the Bradley-Terry win rate against the reference (:func:`reward_question_scores`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError
from distmatch.optional import require
from eval_tasks.math.math_answers import (
    canonical_math_answer,
    extract_gsm8k_answer,
    extract_math_answer,
    gsm8k_gold_answer,
    math_answer_correct,
    math_gold_answer,
)
from eval_tasks.metrics.voting import majority_vote, voting_accuracies
from eval_tasks.samples import InputError, check_unique_ids, read_jsonl

__all__ = [
    "ALPACAEVAL",
    "GEM_MATH_PROMPT",
    "GSM8K",
    "KS",
    "MATH",
    "MATH_SUBJECTS",
    "RewardScorer",
    "alpacaeval_documents",
    "check_reward_architecture",
    "check_reward_model_folder",
    "ks_for",
    "math_documents",
    "math_question_scores",
    "read_sampled",
    "reward_question_scores",
    "rows_by_prompt",
    "sample_count",
    "voting_curve",
]

#: GEM's instruction for GSM8K and MATH (GEM repository, evaluation_gsm8k_voting.py: TEMPLATE), one user turn.
GEM_MATH_PROMPT = (
    "\nYour task is to answer the question below. Give step by step reasoning before you answer, and when you\u2019re"
    ' ready to answer, please use the format "The answer is: ..."\nQuestion: {question}\n'
)
#: The depths of GEM's tables (and 1, the first sample, which its voting script also prints).
KS = (1, 4, 8, 16, 32)

GSM8K = {"key": "gsm8k", "path": "openai/gsm8k", "name": "main", "revision": None, "split": "test"}
MATH = {"key": "math", "path": "EleutherAI/hendrycks_math", "revision": None, "split": "test"}
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
ALPACAEVAL = {"key": "alpacaeval", "path": "tatsu-lab/alpaca_eval", "name": "alpaca_eval_gpt4_baseline"}
ALPACAEVAL_SPLIT = "eval"


def ks_for(n: int) -> tuple[int, ...]:
    """The reported depths for `n` samples per question: those of :data:`KS` up to `n` (and `n` itself)."""
    ks = [k for k in KS if k <= n]
    return tuple(ks if n in ks else [*ks, n])


def _load(key: str, path: str, name: str | None, split: str, data_dir: str | None) -> list[dict[str, Any]]:
    from eval_tasks.dataset_loading import load_split

    return [dict(row) for row in load_split(key, path, name, None, split, data_dir)]


def math_documents(kind: str, *, data_dir: str | None = None) -> list[dict[str, Any]]:
    """GSM8K (`kind` "gsm8k") or MATH ("math") test questions: ``id``, ``question``, ``prompt``, ``gold``."""
    if kind == "gsm8k":
        rows = _load(GSM8K["key"], GSM8K["path"], GSM8K["name"], GSM8K["split"], data_dir)
        docs = [{"question": r["question"], "gold": str(gsm8k_gold_answer(r["answer"]))} for r in rows]
    elif kind == "math":
        if data_dir:  # one local file with every subject (MetaMath's MATH_test.jsonl has the same 5,000 rows)
            rows = _load(MATH["key"], MATH["path"], None, MATH["split"], data_dir)
        else:
            rows = [
                r for s in MATH_SUBJECTS for r in _load(MATH["key"], MATH["path"], s, MATH["split"], None)
            ]
        docs = []
        for r in rows:
            question = r.get("problem", r.get("instruction"))
            solution = r.get("solution", r.get("output"))
            if question is None or solution is None:
                raise DistMatchConfigError(
                    "MATH rows need problem/solution (EleutherAI/hendrycks_math) or instruction/output (MetaMath's "
                    f"MATH_test.jsonl) columns; got {sorted(r)}."
                )
            docs.append({"question": question, "gold": math_gold_answer(solution) or ""})
    else:
        raise DistMatchConfigError(f"math task kind {kind!r} is not valid; valid: gsm8k, math.")
    for i, doc in enumerate(docs):
        doc["id"] = i
        doc["prompt"] = GEM_MATH_PROMPT.format(question=doc["question"])
    return docs


def alpacaeval_documents(*, data_dir: str | None = None) -> list[dict[str, Any]]:
    """The AlpacaEval instructions with the GPT-4 reference output: ``id``, ``prompt``, ``reference``, ``generator``."""
    rows = _load(ALPACAEVAL["key"], ALPACAEVAL["path"], ALPACAEVAL["name"], ALPACAEVAL_SPLIT, data_dir)
    return [
        {
            "id": i,
            "prompt": r["instruction"],
            "reference": r["output"],
            "generator": r.get("generator", ""),
            "dataset": r.get("dataset", ""),
        }
        for i, r in enumerate(rows)
    ]


def math_question_scores(
    kind: str, samples: Sequence[str], gold: str, ks: Sequence[int], *, checker: str = "hendrycks"
) -> dict[str, float]:
    """One question's ``mv@k`` / ``bon@k`` (100 or 0) over the first k of `samples` (GSM8K: integer answers;
    MATH: answers vote with their normalised string and are checked with `checker`), and ``no_answer`` (percent
    of the samples without an answer)."""
    if kind == "gsm8k":
        answers: list[Any] = [extract_gsm8k_answer(s) for s in samples]
        gold_value: Any = None if gold in ("", "None") else int(gold)

        def correct(answer: Any) -> bool:
            return answer == gold_value
    else:
        answers = [canonical_math_answer(extract_math_answer(s)) for s in samples]

        def correct(answer: Any) -> bool:
            return answer is not None and math_answer_correct(answer, gold, checker)

    out: dict[str, float] = {}
    for k in ks:
        first = answers[:k]
        out[f"mv@{k}"] = 100.0 * correct(majority_vote(first))
        out[f"bon@{k}"] = 100.0 * any(correct(a) for a in first)
    out["no_answer"] = 100.0 * sum(a is None for a in answers) / len(answers)
    return out


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def reward_question_scores(rewards: Sequence[float], reference: float, ks: Sequence[int]) -> dict[str, float]:
    """One question's ``reward_bon@k`` (best reward of the first k) and ``win_rate_bon@k`` (100 x sigmoid(best -
    reference)); averaged over questions they are GEM Table 4's columns."""
    out: dict[str, float] = {}
    for k in ks:
        best = max(rewards[:k])
        out[f"reward_bon@{k}"] = float(best)
        out[f"win_rate_bon@{k}"] = 100.0 * _sigmoid(best - reference)
    return out


class RewardScorer:
    """A sequence-classification reward model scoring (prompt, response) pairs, as GEM's evaluation_reward.py does.

    The conversation [user: prompt, assistant: response] goes through the reward model's chat template with
    ``add_generation_prompt=True`` (GEM's call, which appends an empty assistant header); a model without a chat
    template gets "prompt\\n\\nresponse". Right padding; the reward is the first logit at the last non-padding token
    (what ``AutoModelForSequenceClassification`` returns for right-padded batches with a pad token).
    """

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 8,
        device: str | None = None,
        dtype: str = "auto",
        setting: str | None = None,
    ) -> None:
        """`setting`: how refusals name the model (default ``reward_model='<model>'``, the task option)."""
        torch = require("torch", extra="eval", feature="Reward-model scoring")
        require("transformers", extra="eval", feature="Reward-model scoring")
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        self.batch_size = batch_size
        setting = setting or f"reward_model={model!r}"
        try:
            config = AutoConfig.from_pretrained(model)
            check_reward_architecture(setting, getattr(config, "architectures", None))
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            kwargs: dict[str, Any] = {}
            if dtype != "auto":
                kwargs["dtype"] = getattr(torch, dtype)
            # Its report of missing weights would repeat the one-line refusal below.
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                self.model, info = AutoModelForSequenceClassification.from_pretrained(
                    model, output_loading_info=True, **kwargs
                )
            finally:
                hf_logging.set_verbosity(verbosity)
        except OSError as err:
            raise DistMatchConfigError(
                f"{setting} cannot be loaded (a Hub id of a sequence-classification model, or a "
                f"local folder): {' '.join(str(err).split())[:300]}"
            ) from None
        missing = sorted(info.get("missing_keys") or ())
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise DistMatchConfigError(
                f"{setting}: its checkpoint has no weights for {', '.join(missing[:3])}{more}, which "
                "would be initialised at random and score at random; give a reward model whose score head was "
                "trained and saved with it."
            )
        if self.model.config.num_labels < 1:
            raise DistMatchConfigError(f"{setting} has no score head (num_labels 0).")
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()

    def text(self, prompt: str, response: str) -> str:
        """The text the reward model reads for one pair."""
        if getattr(self.tokenizer, "chat_template", None):
            chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            return str(self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
        return f"{prompt}\n\n{response}"

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """The reward of each (prompt, response) pair."""
        import torch

        texts = [self.text(p, r) for p, r in zip(prompts, responses, strict=True)]
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=not getattr(self.tokenizer, "chat_template", None),
            ).to(self.device)
            with torch.no_grad():
                logits = self.model(**batch).logits
            out.extend(float(v) for v in logits[:, 0].float().cpu())
        return out


def check_reward_model_folder(model: str) -> None:
    """:func:`check_reward_architecture` from a local folder's ``config.json`` alone (nothing for a Hub id): the
    lm-eval pre-flight runs it before the evaluated model loads and generates."""
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return
    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures")
    except (ValueError, AttributeError):
        return  # transformers says what is wrong with it when the scorer loads it
    check_reward_architecture(f"reward_model={model!r}", architectures)


def check_reward_architecture(setting: str, architectures: Any) -> None:
    """Refuse a checkpoint that config.json says is another kind of model (a causal LM): its score head would be
    random. Checked before any weight is read; one without ``architectures`` is checked by its loaded weights.
    `setting` names the model as the user gave it (``reward_model='...'``, ``--reward-model ...``)."""
    kinds = [str(a) for a in (architectures or [])] if isinstance(architectures, list) else []
    if kinds and not any(a.endswith("ForSequenceClassification") for a in kinds):
        raise DistMatchConfigError(
            f"{setting} is a {', '.join(kinds)} checkpoint (config.json 'architectures'), not a "
            "sequence-classification reward model: it has no trained score head, so every reward would come from a "
            "randomly initialised one. Give a reward model (e.g. sfairXC/FsfairX-LLaMA3-RM-v0.1, GEM's)."
        )


def rows_by_prompt(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Index saved records by their prompt (the reference file is matched to the samples by instruction)."""
    return {str(r.get("instruction", r.get("prompt"))): r for r in records}


# First-k curves over a run's saved samples (distmatch-eval voting / reward): lm-eval reports one number per
# metric and k, these give every k from 1 to the sample count.


def read_sampled(path: str) -> list[dict[str, Any]]:
    """Records ``{"prompt", "samples", "gold", "reference"}`` of an lm-eval samples file or a generate JSONL."""
    out = []
    records = read_jsonl(path)
    check_unique_ids(
        records, path, "doc_id" if any("doc_id" in r for r in records if isinstance(r, dict)) else "id"
    )
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise InputError(f"{path}: record {i} is a {type(record).__name__}, expected an object.")
        doc = record.get("doc") if isinstance(record.get("doc"), Mapping) else record
        if "filtered_resps" in record:
            filtered = record["filtered_resps"]  # lm-eval: [[the n responses]]
            responses = filtered[0] if isinstance(filtered, list) and filtered else None
        elif "samples" in record:
            responses = record["samples"]
        else:
            raise InputError(
                f"{path}: record {i} has neither filtered_resps (lm-eval) nor samples (generate)."
            )
        if not isinstance(responses, list) or not responses:
            raise InputError(f"{path}: record {i} holds no list of sampled responses.")
        out.append(
            {
                "prompt": doc.get("prompt", doc.get("instruction", doc.get("question"))),
                "samples": [str(s) for s in responses],
                "gold": doc.get("gold"),
                "answer": doc.get("answer"),
                "solution": doc.get("solution", doc.get("output")),
                "reference": doc.get("reference"),
            }
        )
    if not out:
        raise InputError(f"{path}: no records.")
    return out


def _gold(record: Mapping[str, Any], task: str, where: str) -> str:
    if record["gold"] is not None:
        return str(record["gold"])
    if task == "gsm8k" and record["answer"] is not None:
        return str(gsm8k_gold_answer(str(record["answer"])))
    if task == "math" and record["solution"] is not None:
        gold = math_gold_answer(str(record["solution"]))
        if gold is None:  # else the string "None" would be the gold answer
            raise InputError(
                f"{where}: no gold answer: its solution has no readable \\boxed{{...}} or \\fbox{{...}}; give the "
                "record a gold field."
            )
        return gold
    need = "answer (with '#### n')" if task == "gsm8k" else "solution (with \\boxed{})"
    raise InputError(f"{where}: no gold answer: give each record a gold or {need} field.")


def _gsm8k_gold(gold: str, where: str) -> int | None:
    """A GSM8K gold answer as an integer ("1,200" and "18.0" read as the extractor reads answers)."""
    if gold == "None":  # the dataset row's answer has no number
        return None
    try:
        return int(gold)
    except ValueError:
        value = extract_gsm8k_answer(f"The answer is {gold}")
    if value is None:
        raise InputError(f"{where}: gold {gold!r} is not a number (GSM8K answers are integers).")
    return value


def sample_count(records: Sequence[Mapping[str, Any]], path: str) -> int:
    counts = {len(r["samples"]) for r in records}
    if len(counts) != 1:
        raise InputError(
            f"{path}: the records hold different sample counts ({sorted(counts)}); first-k needs one."
        )
    return counts.pop()


def voting_curve(
    records: Sequence[Mapping[str, Any]], task: str, checker: str = "hendrycks", where: str = "samples"
) -> dict[str, float]:
    """MV@k and BON@k for k = 1..n over the records (x100)."""
    n = sample_count(records, where)
    golds = [_gold(r, task, f"{where}: record {i}") for i, r in enumerate(records)]
    if task == "gsm8k":
        answers = [[extract_gsm8k_answer(s) for s in r["samples"]] for r in records]
        gold_values: list[Any] = [_gsm8k_gold(g, f"{where}: record {i}") for i, g in enumerate(golds)]
        return voting_accuracies(answers, gold_values, ks=range(1, n + 1))
    answers = [[canonical_math_answer(extract_math_answer(s)) for s in r["samples"]] for r in records]
    return voting_accuracies(
        answers,
        golds,
        ks=range(1, n + 1),
        equal=lambda a, g: a is not None and math_answer_correct(a, g, checker),
    )
