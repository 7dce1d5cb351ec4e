"""The distmatch section of a trained model's card (`README.md` in the output folder, the Hub page it becomes).

TRL and Axolotl write the card through the trainer's `create_model_card`; `DistMatchLossMixin.create_model_card`
adds the tags (`distmatch`, `distmatch-loss-<loss>`) and then :func:`add_section` writes what trained the model: the
loss, the options it used, the distmatch version and the paper. The section sits between two HTML comments, so a
card written again (TRL writes it at every checkpoint) has it once, with the latest values.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import distmatch

FRAMEWORKS = {"trl": "TRL", "axolotl": "Axolotl"}
BEGIN = "<!-- distmatch: begin -->"
END = "<!-- distmatch: end -->"

EMO = (
    "EMO: Earth Mover Distance Optimization for Auto-Regressive Language Modeling (Ren et al., ICLR 2024)",
    "https://arxiv.org/abs/2310.04691",
)
GEM = (
    "Entropic Distribution Matching in Supervised Fine-tuning of LLMs: Less Overfitting and Better Diversity (GEM)",
    "https://arxiv.org/abs/2408.16673",
)
ASFT = (
    "Anchored Supervised Fine-Tuning (ASFT, Zhu et al., ICLR 2026; official code)",
    "https://github.com/zhuchichi56/ASFT",
)
#: The paper of each loss: (title, link; "" where none is recorded). `ce_entropy` is the GEM paper's baseline.
PAPERS: dict[str, tuple[str, str]] = {
    "ce": ("cross-entropy (maximum likelihood), the baseline", ""),
    "emo": EMO,
    "gem_linear": GEM,
    "gem_ls": GEM,
    "ce_entropy": GEM,
    "tailr": (
        "Tailoring Language Generation Models under Total Variation Distance (TaiLr, Ji et al., ICLR 2023)",
        "https://arxiv.org/abs/2302.13344",
    ),
    "mixce": (
        "MixCE: Training Autoregressive Language Models by Mixing Forward and Reverse Cross-Entropies (Zhang et al., "
        "ACL 2023)",
        "https://aclanthology.org/2023.acl-long.502",
    ),
    "dft": (
        "On the Generalization of SFT: A Reinforcement Learning Perspective with Reward Rectification (DFT, Wu et "
        "al., 2025)",
        "https://arxiv.org/abs/2508.05629",
    ),
    "eaft": ("Entropy-Adaptive Fine-Tuning (EAFT, Diao et al., 2026)", ""),
    "prob": (
        "Beyond Log Likelihood: probability-based objectives for SFT (Li et al., 2025; official code)",
        "https://github.com/GaotangLi/Beyond-Log-Likelihood",
    ),
    "asft": ASFT,
    "sft_kl": ASFT,
}


def _value(value: Any) -> str:
    return f"`{json.dumps(value)}`"  # JSON: a string, a number, true/false and null read back unambiguously


def _history(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The losses a resumed run trained, in order (only when there were several)."""
    if len(history) < 2:
        return []
    lines = ["", "Trained in turn with (`allow_loss_change`):", ""]
    for item in history:
        options = ", ".join(f"`{k}`={_value(v)}" for k, v in sorted((item.get("options") or {}).items()))
        lines.append(
            f"- steps {item.get('from_step')}-{item.get('to_step')}: `{item.get('loss')}`"
            + (f" ({options})" if options else "")
        )
    return lines


def section(
    loss: str, options: Mapping[str, Any], framework: str, history: Sequence[Mapping[str, Any]] = ()
) -> str:
    """The card's distmatch section (Markdown) for a model trained with `loss` and `options` through `framework`."""
    lines = [
        BEGIN,
        "## Training objective (distmatch)",
        "",
        f"Fine-tuned with the distmatch loss `{loss}` through {FRAMEWORKS.get(framework, framework)}, distmatch {distmatch.__version__}.",
        "",
    ]
    if options:
        lines += [
            "| option | value |",
            "|---|---|",
            *(f"| `{k}` | {_value(v)} |" for k, v in sorted(options.items())),
        ]
    else:
        lines.append("Options: the loss's defaults.")
    lines += _history(history)
    title, link = PAPERS[loss]
    lines += ["", f"Paper: [{title}]({link})" if link else f"Paper: {title}", END]
    return "\n".join(lines) + "\n"


def add_section(
    card_path: str,
    loss: str,
    options: Mapping[str, Any],
    framework: str,
    history: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """Put the section at the end of the card at `card_path` (replacing an earlier one); False if there is no card."""
    if not os.path.isfile(card_path):
        return False
    with open(card_path, encoding="utf-8") as stream:
        text = stream.read()
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)].rstrip("\n") + "\n" + text[text.index(END) + len(END) :].lstrip("\n")
    text = text.rstrip("\n") + "\n\n" + section(loss, options, framework, history)
    with open(card_path, "w", encoding="utf-8") as stream:
        stream.write(text)
    return True
