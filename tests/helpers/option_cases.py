"""Every loss option at 0 (where valid), at its bounds and unset, as a table shared by the integrations' tests
(TRL config and CLI: tests/trl/test_option_values.py; Axolotl: tests/axolotl/test_option_values.py; hooks:
tests/hooks/test_hook_options.py).

The expected values are written here from the documentation (docs/losses.md), not read from the loss specs: a
default or a bound that changes in the code makes these tests fail until the table (and the docs) follow.
"""

from __future__ import annotations

from typing import Any

#: The functional parameters every loss trains with when no option is set (docs/losses.md), without EMO's cost
#: embedding (a tensor the trainer resolves from `emo_cost_embedding`, default 'frozen').
DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "ce": {},
    "dft": {},
    "emo": {"weighting": "emo1", "ratio_clamp": None, "target_mass": "excluded"},
    "gem_linear": {"beta": 0.7},
    "gem_ls": {"beta": 0.7},
    "ce_entropy": {"entropy_coef": 0.1},
    "tailr": {"gamma": 0.5, "min_weight": 0.2, "variant": "tailr"},
    "mixce": {"gamma": 0.5},
    "eaft": {"alpha": 1.0, "k": 20},
    "prob": {"q": 1.0, "min_p": 0.0, "max_p": 1.0},
    "asft": {"kl_weight": 0.1},
    "sft_kl": {"kl_weight": 0.1},
}

#: option -> (a loss that uses it, the functional parameter it sets).
OPTION_PARAMS: dict[str, tuple[str, str]] = {
    "gem_beta": ("gem_ls", "beta"),
    "emo_weighting": ("emo", "weighting"),
    "emo_ratio_clamp": ("emo", "ratio_clamp"),
    "emo_target_mass": ("emo", "target_mass"),
    "ce_entropy_coef": ("ce_entropy", "entropy_coef"),
    "tailr_gamma": ("tailr", "gamma"),
    "tailr_min_weight": ("tailr", "min_weight"),
    "tailr_variant": ("tailr", "variant"),
    "mixce_gamma": ("mixce", "gamma"),
    "eaft_alpha": ("eaft", "alpha"),
    "eaft_k": ("eaft", "k"),
    "prob_q": ("prob", "q"),
    "prob_min_p": ("prob", "min_p"),
    "prob_max_p": ("prob", "max_p"),
    "anchor_kl_weight": ("asft", "kl_weight"),
}

#: Accepted values: 0 wherever it is valid, and every bound's valid edge.
VALID: list[tuple[str, Any]] = [
    ("gem_beta", 1e-6),  # > 0
    ("gem_beta", 1.0),
    ("emo_weighting", "emo2"),
    ("emo_ratio_clamp", 1e-6),  # > 0 (emo1)
    ("emo_target_mass", "included"),
    ("emo_target_mass", "excluded"),
    ("ce_entropy_coef", 0.0),  # >= 0
    ("tailr_gamma", 0.0),  # [0, 1]
    ("tailr_gamma", 1.0),
    ("tailr_min_weight", 0.0),  # [0, 1]
    ("tailr_min_weight", 1.0),
    ("tailr_variant", "emo_code"),
    ("mixce_gamma", 0.0),  # [0, 1]
    ("mixce_gamma", 1.0),
    ("eaft_alpha", 0.0),  # >= 0
    ("eaft_k", 1),  # integer >= 1
    ("prob_q", 0.0),  # >= 0 (0 is CE)
    ("prob_q", 10.0),  # <= 10 (larger: p_y ** q leaves no gradient)
    ("prob_min_p", 0.0),  # [0, 1)
    ("prob_min_p", 0.999),
    ("prob_max_p", 1e-6),  # (0, 1]
    ("prob_max_p", 1.0),
    ("anchor_kl_weight", 0.0),  # >= 0 (0: DFT / CE)
    ("anchor_kl_weight", 1000.0),  # <= 1000 (1e30: an infinite gradient norm)
]

#: Refused values just outside each bound (or outside the choices), with the start of the one-line error.
INVALID: list[tuple[str, Any]] = [
    ("gem_beta", 0.0),
    ("gem_beta", -1e-6),
    ("emo_ratio_clamp", 0.0),
    ("ce_entropy_coef", -1e-6),
    ("tailr_gamma", -0.01),
    ("tailr_gamma", 1.01),
    ("tailr_min_weight", -0.01),
    ("tailr_min_weight", 1.01),
    ("mixce_gamma", -0.01),
    ("mixce_gamma", 1.01),
    ("eaft_alpha", -1e-6),
    ("eaft_k", 0),
    ("prob_q", -1e-6),
    ("prob_q", 10.01),
    ("prob_q", 1e300),
    ("prob_min_p", -0.01),
    ("prob_min_p", 1.0),
    ("prob_max_p", 0.0),
    ("prob_max_p", 1.01),
    ("anchor_kl_weight", -1e-6),
    ("anchor_kl_weight", 1000.01),
    ("anchor_kl_weight", 1e30),
    ("emo_weighting", "emo3"),
    ("emo_target_mass", "kept"),
    ("tailr_variant", "tvd"),
]

CHOICE_OPTIONS = ("emo_weighting", "emo_target_mass", "tailr_variant")


def expected_params(option: str, value: Any) -> tuple[str, dict[str, Any]]:
    """(loss, the parameters it must train with) when only `option` is set to `value`."""
    loss, param = OPTION_PARAMS[option]
    return loss, {**DEFAULT_PARAMS[loss], param: value}


def refusal(option: str, value: Any) -> str:
    """The part of the one-line error every integration prints for a refused value."""
    return f"{option}={value!r} is invalid"


def case_id(option: str, value: Any) -> str:
    return f"{option}={value}"


# ---- the memory-efficient paths' settings: options of every loss, a `FusedSettings` field each (docs/losses.md) --

#: option -> the `FusedSettings` field it sets.
PATH_FIELDS: dict[str, str] = {
    "loss_chunk_memory_mb": "chunk_memory_mb",
    "loss_chunk_logits": "chunk_logits",
    "loss_grad_weight_accum": "grad_weight_accum",
    "loss_kernels": "kernels",
}
#: The option -> environment variable each falls back to when unset.
PATH_ENV: dict[str, str] = {
    "loss_chunk_memory_mb": "DISTMATCH_CHUNK_MEMORY_MB",
    "loss_chunk_logits": "DISTMATCH_CHUNK_LOGITS",
    "loss_grad_weight_accum": "DISTMATCH_GRAD_WEIGHT_ACCUM",
    "loss_kernels": "DISTMATCH_KERNELS",
}
#: The settings of a run that sets none (unset budget: 128 MiB on a CPU, 512 on CUDA).
DEFAULT_SETTINGS: dict[str, Any] = {
    "chunk_memory_mb": None,
    "chunk_logits": "float32",
    "grad_weight_accum": "float32",
    "kernels": "auto",
}
#: Accepted on a machine without CUDA: the budget's bounds (above 0, at most 1 TiB = 1048576 MiB) and the values that
#: need no Triton kernel.
PATH_ACCEPTED: list[tuple[str, Any]] = [
    ("loss_chunk_memory_mb", 1e-3),
    ("loss_chunk_memory_mb", 1048576.0),
    ("loss_chunk_logits", "float32"),
    ("loss_grad_weight_accum", "weight"),
    ("loss_kernels", "torch"),
]
#: Refused everywhere.
PATH_REFUSED_VALUES: list[tuple[str, Any]] = [
    ("loss_chunk_memory_mb", 0.0),
    ("loss_chunk_memory_mb", -5.0),
    ("loss_chunk_memory_mb", 1048577.0),
    ("loss_chunk_logits", "bf16"),
    ("loss_grad_weight_accum", "fp8"),
    ("loss_kernels", "tritn"),
]
#: Valid values that need the Triton row kernel: refused before the model loads where it cannot run (no CUDA).
PATH_NEEDS_KERNEL: list[tuple[str, Any]] = [
    ("loss_chunk_logits", "input"),
    ("loss_grad_weight_accum", "tiles"),
    ("loss_kernels", "triton"),
]
#: Environment values refused in one line naming the variable: misspelt, padded, not a number, out of range.
ENV_INVALID: list[tuple[str, str]] = [
    ("DISTMATCH_CHUNK_MEMORY_MB", "abc"),
    ("DISTMATCH_CHUNK_MEMORY_MB", "nan"),
    ("DISTMATCH_CHUNK_MEMORY_MB", "0"),
    ("DISTMATCH_CHUNK_MEMORY_MB", "-5"),
    ("DISTMATCH_CHUNK_LOGITS", "inputs"),
    ("DISTMATCH_GRAD_WEIGHT_ACCUM", " Weight "),
    ("DISTMATCH_GRAD_WEIGHT_ACCUM", "wieght"),
    ("DISTMATCH_KERNELS", "tritn"),
]


def expected_settings(option: str, value: Any) -> dict[str, Any]:
    """The `FusedSettings` fields a run gets when only path option `option` is set to `value`."""
    return {**DEFAULT_SETTINGS, PATH_FIELDS[option]: value}


def kernel_refusal(option: str, value: Any) -> str:
    """The part of the one-line error every integration prints for a setting the kernel must run, without CUDA."""
    return f"{option}={value!r}"
