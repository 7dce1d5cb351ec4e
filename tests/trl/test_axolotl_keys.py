"""The Axolotl plugin's config keys (`axolotl_distmatch.args`, pure: pydantic and trl_ext, no Axolotl) refuse what
Axolotl would silently ignore (docs/refusals.md): a key one edit away from a distmatch option, naming the option,
and `loss_type: <a distmatch loss>` without `loss:`, naming `loss:`. Each condition alone, with its accepted
neighbours."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from axolotl_distmatch.args import DistMatchArgs  # noqa: E402


def _refusal(raw: dict) -> str:
    with pytest.raises(ValueError) as caught:  # pydantic's ValidationError around the DistMatchConfigError
        DistMatchArgs.model_validate(raw)
    return str(caught.value)


@pytest.mark.parametrize(
    ("typo", "option"),
    [
        ("gem_betta", "gem_beta"),  # one added
        ("gem_bet", "gem_beta"),  # one removed
        ("prob_min_q", "prob_min_p"),  # one changed
        ("anchor_kl_weigth", None),  # two edits (a swap): not one edit away
        ("los", "loss"),
        ("allow_loss_changes", "allow_loss_change"),
    ],
)
def test_a_key_one_edit_from_a_distmatch_setting_is_refused_naming_it(typo, option):
    raw = {"loss": "gem_ls", typo: 0.5} if typo != "los" else {typo: "gem_ls"}
    if option is None:
        DistMatchArgs.model_validate(raw)
        return
    message = _refusal(raw)
    assert f"did you mean `{option}`?" in message and f"{typo}: " in message


def test_keys_far_from_every_option_are_left_to_axolotl():
    DistMatchArgs.model_validate(
        {"loss": "gem_ls", "learning_rate": 1e-5, "gem_beta": 0.5, "base_model": "x"}
    )


@pytest.mark.parametrize("loss", ["gem_ls", "emo", "prob"])
def test_loss_type_naming_a_distmatch_loss_without_loss_is_refused_naming_loss(loss):
    message = _refusal({"loss_type": loss})
    assert f"write `loss: {loss}`" in message and "cross-entropy" in message


def test_loss_type_with_loss_or_naming_no_distmatch_loss_is_not_this_refusal():
    DistMatchArgs.model_validate({"loss_type": "for_causal_lm"})
    assert DistMatchArgs.model_validate({"loss": "gem_ls", "loss_type": "gem_ls"}).loss == "gem_ls"
