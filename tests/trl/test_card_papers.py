"""The model card's distmatch section (`trl_ext.model_card`) against the papers' own records: titles, first
authors, venues and links transcribed from the papers (the EMO and GEM texts the project works from, the ASFT
authors' repository named in the reference notes, the arXiv listings), not from the code under test."""

from __future__ import annotations

import re

import pytest

import distmatch
from trl_ext.losses import LOSS_NAMES
from trl_ext.model_card import add_section, section

# EMO: title page of the ICLR 2024 paper (Siyu Ren, Zhiyong Wu, Kenny Q. Zhu), arXiv 2310.04691.
EMO = (
    "EMO: Earth Mover Distance Optimization for Auto-Regressive Language Modeling",
    "Ren",
    "ICLR 2024",
    "2310.04691",
)
# GEM: the paper's title (Li et al.), arXiv 2408.16673.
GEM = (
    "Entropic Distribution Matching in Supervised Fine-tuning of LLMs: Less Overfitting and Better Diversity",
    "",
    "",
    "2408.16673",
)
#: loss -> (title words, first author, venue, arXiv id / link part) as the papers give them.
PAPERS = {
    "emo": EMO,
    "gem_linear": GEM,
    "gem_ls": GEM,
    "ce_entropy": GEM,  # GEM's baseline: CE with an entropy term
    "tailr": (
        "Tailoring Language Generation Models under Total Variation Distance",
        "Ji",
        "ICLR 2023",
        "2302.13344",
    ),
    "dft": (
        "On the Generalization of SFT: A Reinforcement Learning Perspective with Reward Rectification",
        "Wu",
        "2025",
        "2508.05629",
    ),
    "asft": ("Anchored Supervised Fine-Tuning", "Zhu", "ICLR 2026", "github.com/zhuchichi56/ASFT"),
    "sft_kl": ("Anchored Supervised Fine-Tuning", "Zhu", "ICLR 2026", "github.com/zhuchichi56/ASFT"),
}


def _paper_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Paper: "))


@pytest.mark.parametrize("loss", sorted(PAPERS))
def test_the_card_cites_each_losss_paper_as_the_paper_records_it(loss):
    title, author, venue, link = PAPERS[loss]
    line = _paper_line(section(loss, {}, "trl"))
    assert title in line
    assert f"{author} et al." in line if author else True
    assert venue in line
    url = re.search(r"\]\((https://[^)]+)\)", line)
    assert url and link in url.group(1), line
    if "arxiv.org" in url.group(1):
        assert url.group(1) == f"https://arxiv.org/abs/{link}"


def test_every_loss_has_a_paper_line_and_only_ce_has_no_link():
    linked = {loss for loss in LOSS_NAMES if "](https://" in _paper_line(section(loss, {}, "trl"))}
    assert set(PAPERS) <= linked
    assert "ce" not in linked


def test_the_section_names_loss_framework_version_and_options_as_json(tmp_path):
    text = section("prob", {"prob_q": 0.5, "prob_min_p": 0}, "axolotl")
    assert f"`prob` through Axolotl, distmatch {distmatch.__version__}." in text
    assert "| `prob_min_p` | `0` |" in text and "| `prob_q` | `0.5` |" in text
    assert section("prob", {}, "trl").count("Options: the loss's defaults.") == 1
    history = [
        {"loss": "ce", "options": {}, "from_step": 0, "to_step": 4},
        {"loss": "gem_ls", "options": {"gem_beta": 0.3}, "from_step": 4, "to_step": 7},
    ]
    text = section("gem_ls", {"gem_beta": 0.3}, "trl", history)
    assert "- steps 0-4: `ce`" in text and "- steps 4-7: `gem_ls` (`gem_beta`=`0.3`)" in text
    assert "Trained in turn" not in section("gem_ls", {}, "trl", history[1:])
    card = tmp_path / "README.md"
    assert not add_section(str(card), "emo", {}, "trl")
    card.write_text("# model\n")
    for _ in range(2):
        assert add_section(str(card), "emo", {}, "trl")
    assert card.read_text().count("## Training objective (distmatch)") == 1
    assert card.read_text().startswith("# model\n")
