"""Sampling K responses per prompt from a checkpoint: Hugging Face ``generate`` or vLLM.

Used by ``distmatch-eval generate``; the demo uses its prompt encoding (the tokenizer's chat template when it has
one) and samples-file records, and draws with its own machine-independent sampler (examples/demo/demo_sampling.py). The defaults are GEM's creative-writing settings
(:data:`GEM_GENERATION`). torch / transformers / vLLM are imported when a function needs them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from distmatch.optional import require
from eval_tasks.samples import InputError, prompt_text
from eval_tasks.task_options import TASK_OPTIONS

__all__ = [
    "GEM_GENERATION",
    "LM_EVAL_DEFAULT_CONTEXT",
    "Encoded",
    "PromptLimit",
    "Sampling",
    "choose_backend",
    "context_length",
    "encode_prompt",
    "encode_prompts",
    "generate_batches",
    "generation_meta",
    "hf_generate",
    "left_pad",
    "load_checkpoint",
    "vllm_engine",
]

#: GEM's creative-writing sampling (GEM section 5.1): 16 samples, temperature 1.0, top-k 50, top-p 0.9, 512 tokens.
GEM_GENERATION = {
    "num_samples": TASK_OPTIONS["num_samples"].default,  # the creative-writing tasks' sample count
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 0.9,
    "max_new_tokens": 512,
}
_FEATURE = "distmatch-eval (loading a checkpoint)"


@dataclass(frozen=True)
class Sampling:
    """How the K samples of a prompt are drawn (temperature 0 = greedy: one continuation repeated K times)."""

    num_samples: int = GEM_GENERATION["num_samples"]
    temperature: float = GEM_GENERATION["temperature"]
    top_k: int = GEM_GENERATION["top_k"]  #: 0 = off
    top_p: float = GEM_GENERATION["top_p"]
    max_new_tokens: int = GEM_GENERATION["max_new_tokens"]
    seed: int = 42
    #: the end-of-sequence token is blocked until this many new tokens (EMO's open-ended protocol forces the length:
    #: ``min_new_tokens = L``, ``max_new_tokens = L + 1``); 0 = off
    min_new_tokens: int = 0

    def check(self) -> None:
        """Raise :class:`InputError` for values no backend accepts."""
        if self.num_samples < 1:
            raise InputError("--num-samples must be >= 1 (diversity needs >= 2).")
        if self.max_new_tokens < 1:
            raise InputError("--max-new-tokens and --batch-size must be >= 1.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InputError(
                f"--min-new-tokens {self.min_new_tokens}: must be >= 0 and <= --max-new-tokens "
                f"({self.max_new_tokens})."
            )
        if not 0 <= self.temperature < math.inf or not 0 < self.top_p <= 1 or self.top_k < 0:  # NaN fails too
            raise InputError("need a finite --temperature >= 0, 0 < --top-p <= 1 and --top-k >= 0 (0 = off).")


@dataclass(frozen=True)
class Encoded:
    """A prompt record ready for generation."""

    record: Mapping[str, Any]
    text: str  #: the input text (chat template applied when `chat`; truncated: the kept tokens, decoded)
    ids: list[int]
    chat: bool
    truncated: bool = False  #: only the prompt's last tokens are kept (:class:`PromptLimit`)


#: lm-eval's context length when neither the model's config nor its tokenizer gives one (lm_eval.models.utils).
LM_EVAL_DEFAULT_CONTEXT = 2048
#: A tokenizer's ``model_max_length`` at or above this means "not set" (transformers' VERY_LARGE_INTEGER is 1e30).
_UNSET_MAX_LENGTH = 10**18


def context_length(config: Any, tokenizer: Any) -> tuple[int, str]:
    """(the model's context length in tokens, where it comes from), found as lm-eval's HF backend finds it
    (``resolve_max_length``): the config's (a composite config's ``text_config``) ``n_positions``,
    ``max_position_embeddings`` or ``n_ctx``, else the tokenizer's ``model_max_length``, else lm-eval's default."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value, f"{attr} in its config"
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < _UNSET_MAX_LENGTH:
        return value, "model_max_length of its tokenizer"
    return LM_EVAL_DEFAULT_CONTEXT, "lm-eval's default: neither its config nor its tokenizer gives one"


#: Characters per token of the first tail of a long prompt that is tokenized (natural text has about 4).
_FIRST_CHARS_PER_TOKEN = 8
#: Tokens tokenized beyond those kept: the first tokens of a text cut in the middle may differ from the whole text's.
_MARGIN_TOKENS = 16


@dataclass(frozen=True)
class PromptLimit:
    """The most prompt tokens generation can take: the context less the new tokens, as lm-eval's HF and vLLM
    backends reserve them (``max_length - max_gen_toks``); a longer prompt keeps its last `tokens` tokens, as lm-eval
    left-truncates it. `max_token_chars`: the longest vocabulary entry, so that a prompt's tail of
    ``max_token_chars x tokens`` characters surely holds more than `tokens` tokens."""

    tokens: int
    context: int
    source: str  #: where `context` comes from
    max_token_chars: int

    @classmethod
    def of(cls, model: str, config: Any, tokenizer: Any, max_new_tokens: int) -> PromptLimit:
        """The limit of `model` (its config and tokenizer) for `max_new_tokens`; refused when no prompt token fits."""
        context, source = context_length(config, tokenizer)
        if max_new_tokens >= context:
            raise InputError(
                f"--max-new-tokens {max_new_tokens}: {model} has a context of {context} tokens ({source}), which "
                f"leaves no room for the prompt; give at most {context - 1} (lm-eval refuses it the same way)."
            )
        try:
            longest = max((len(piece) for piece in tokenizer.get_vocab()), default=1)
        except (AttributeError, NotImplementedError, TypeError):
            longest = 64
        return cls(context - max_new_tokens, context, source, max(longest, 1))

    def fit(self, tokenizer: Any, text: str, add_special_tokens: bool, where: str) -> tuple[list[int], bool]:
        """(the token ids of `text`, or its last `tokens` ids, whether it was cut). A text too long to fit is
        tokenized only from a tail long enough to hold more than `tokens` tokens (8 characters a token first, then 4
        times longer, up to `max_token_chars` a token), so that a huge prompt costs what its kept tokens cost."""
        want = self.tokens + _MARGIN_TOKENS
        longest = self.max_token_chars * want
        chars = _FIRST_CHARS_PER_TOKEN * want
        while chars < len(text):
            ids = _ids(tokenizer, text[-chars:], False)
            if len(ids) > want:
                return ids[-self.tokens :], True
            # Each token covers at most `max_token_chars` characters: only a normaliser that drops characters, or
            # an unknown-token piece, makes fewer tokens of this tail.
            if chars >= longest:
                raise InputError(
                    f"{where}: its last {chars:,} characters (of {len(text):,}) make only {len(ids)} tokens, so "
                    f"which of its tokens fit the {self.tokens} the context leaves cannot be told without "
                    "tokenizing all of it; shorten the prompt."
                )
            chars = min(4 * chars, longest)
        ids = _ids(tokenizer, text, add_special_tokens)
        return (ids[-self.tokens :], True) if len(ids) > self.tokens else (ids, False)


def _ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def generation_meta(
    model: str,
    backend: str,
    sampling: Sampling,
    *,
    benchmark: str | None,
    prompts_file: str,
    num_prompts_in_file: int,
    chat_template_mode: str = "auto",
) -> dict[str, Any]:
    """The ``meta`` of every samples-file record (``chat_template``, whether it was applied, is added per record;
    `chat_template_mode` is the ``--chat-template`` flag)."""
    settings = asdict(sampling)
    seed = settings.pop("seed")
    return {
        "model": model,
        "backend": backend,
        **settings,
        "seed": seed,
        "chat_template_mode": chat_template_mode,
        "benchmark": benchmark,
        "prompts_file": prompts_file,
        "num_prompts_in_file": num_prompts_in_file,
    }


def _torch_setup(device: str, dtype: str) -> tuple[Any, str, Any]:
    torch = require("torch", extra="eval", feature=_FEATURE)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        torch_dtype = (
            torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
        )
    else:
        torch_dtype = dtypes[dtype]
    return torch, device, torch_dtype


def load_checkpoint(path: str, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any, str]:
    """(model, tokenizer, device) of a transformers causal-LM checkpoint, with a clear error if it won't load."""
    torch, device, torch_dtype = _torch_setup(device, dtype)
    transformers = require("transformers", extra="eval", feature="distmatch-eval")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except Exception as err:
        raise InputError(
            f"could not load checkpoint {path!r} ({type(err).__name__}: {err}). Give a local model folder (or a "
            "Hub name when online)."
        ) from err
    model.to(device).eval()
    return model, tokenizer, device


def encode_prompt(
    tokenizer: Any, record: Mapping[str, Any], chat_mode: str = "auto", limit: PromptLimit | None = None
) -> Encoded:
    """A prompt record's input text and token ids; `chat_mode`: ``auto`` (template if the tokenizer has one),
    ``always`` or ``never``. ``text`` records are continued as they are. `limit`: a longer input (chat template
    included) keeps its last ``limit.tokens`` tokens (``truncated``; ``text`` is then those tokens decoded)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if "text" in record:
        use_chat = False
    elif chat_mode == "always" and not has_template:
        raise InputError("--chat-template always: the tokenizer has no chat template.")
    else:
        use_chat = has_template and chat_mode != "never"
    if use_chat:
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        special = False
    else:
        if "messages" in record:
            raise InputError(
                f"prompt id={record['id']!r}: 'messages' need a chat template (the tokenizer has none, or "
                "--chat-template never)."
            )
        text = record.get("text", record.get("prompt"))
        special = True
    if limit is None:
        return Encoded(record, text, _ids(tokenizer, text, special), use_chat)
    ids, cut = limit.fit(tokenizer, text, special, f"prompt id={record['id']!r}")
    if cut:
        text = tokenizer.decode(ids, skip_special_tokens=False)
    return Encoded(record, text, ids, use_chat, cut)


def encode_prompts(
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    chat_mode: str = "auto",
    limit: PromptLimit | None = None,
) -> list[Encoded]:
    """Every record encoded before any generation, so a bad prompt fails before work is done."""
    return [encode_prompt(tokenizer, record, chat_mode, limit) for record in records]


def left_pad(tokenizer: Any, batch: Sequence[Sequence[int]]) -> tuple[Any, Any, int]:
    """`batch` (token ids) left-padded to its longest prompt: (input_ids, attention_mask, the pad id used: the
    tokenizer's pad, else its EOS, else 0)."""
    import torch

    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids))
        attention[row, width - len(ids) :] = 1
    return input_ids, attention, pad


def hf_generate(
    model: Any, tokenizer: Any, batch: list[list[int]], sampling: Sampling, seed: int
) -> list[list[str]]:
    """K sampled continuations of each prompt of `batch` (token ids) with ``model.generate``, left-padded."""
    import torch

    input_ids, attention, pad = left_pad(tokenizer, batch)
    width = input_ids.shape[1]
    device = next(model.parameters()).device
    greedy = sampling.temperature == 0
    kwargs: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens}
    if sampling.min_new_tokens:
        kwargs["min_new_tokens"] = sampling.min_new_tokens
    if greedy:  # one greedy continuation, repeated K times (all K would be identical)
        kwargs.update(do_sample=False, num_return_sequences=1)
    else:
        kwargs.update(
            do_sample=True,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            num_return_sequences=sampling.num_samples,
        )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), pad_token_id=pad, **kwargs
        )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    if greedy:
        return [[text] * sampling.num_samples for text in texts]
    k = sampling.num_samples
    return [texts[i * k : (i + 1) * k] for i in range(len(batch))]


def vllm_engine(model: str, sampling: Sampling, dtype: str = "auto") -> tuple[Any, Any]:
    """A ``vllm.LLM`` for `model` and the ``SamplingParams`` of `sampling`."""
    vllm = require("vllm", extra="vllm", feature="distmatch-eval --backend vllm")
    engine = vllm.LLM(model=model, seed=sampling.seed, dtype=dtype)
    params = vllm.SamplingParams(
        n=1
        if sampling.temperature == 0
        else sampling.num_samples,  # greedy: one continuation, repeated K times
        temperature=sampling.temperature,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        top_p=sampling.top_p,
        max_tokens=sampling.max_new_tokens,
        min_tokens=sampling.min_new_tokens,
        seed=sampling.seed,
    )
    return engine, params


def choose_backend(requested: str) -> str:
    """``hf`` or ``vllm``; ``auto`` = vLLM when it is installed and a GPU is present."""
    from distmatch.optional import is_available

    if requested != "auto":
        if requested == "vllm" and not is_available("vllm"):
            raise InputError(
                "--backend vllm: vLLM is not installed (pip install 'distmatch[vllm]', GPU only); use --backend hf."
            )
        return requested
    if is_available("vllm"):
        import torch

        if torch.cuda.is_available():
            return "vllm"
    return "hf"


def generate_batches(
    encoded: Sequence[Encoded],
    sampling: Sampling,
    meta: Mapping[str, Any],
    *,
    model: Any = None,
    tokenizer: Any = None,
    vllm: tuple[Any, Any] | None = None,
    batch_size: int = 4,
    positions: Sequence[int] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The samples-file records of `encoded`, one list per batch of `batch_size` prompts.

    HF backend (`model`, `tokenizer`): each batch is seeded with ``sampling.seed`` + the position of its first
    prompt in the prompt file (`positions`, default 0, 1, ...), so a resumed run draws what an uninterrupted one
    with the same batch size would have drawn. vLLM backend: `vllm` = :func:`vllm_engine`'s (engine, params).
    """
    if batch_size < 1:
        raise InputError("--max-new-tokens and --batch-size must be >= 1.")
    positions = list(range(len(encoded))) if positions is None else list(positions)
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        if vllm is not None:
            engine, params = vllm
            results = engine.generate([{"prompt_token_ids": e.ids} for e in chunk], params)
            samples = [[c.text for c in r.outputs] for r in results]
            if sampling.temperature == 0:
                samples = [outs[:1] * sampling.num_samples for outs in samples]
        else:
            seed = sampling.seed + positions[start]
            samples = hf_generate(model, tokenizer, [e.ids for e in chunk], sampling, seed)
        rows = []
        for e, outs in zip(chunk, samples):
            row = {
                "id": e.record["id"],
                "prompt": prompt_text(e.record),
                "input_text": e.text,
                "samples": outs,
                "meta": {**meta, "chat_template": e.chat},
            }
            if "reference" in e.record:
                row["reference"] = e.record["reference"]
            if e.truncated:  # input_text holds the kept tokens
                row["input_truncated"] = True
            rows.append(row)
        yield rows
