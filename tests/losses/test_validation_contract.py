"""trl_ext.losses.validation against its contract, for what tests/losses/test_validation.py leaves open: bad input is
refused with one line naming the setting (the functional parameter, or through `trl_ext.options.loss_params` the
user-facing option), the value or shape given and what is accepted (docs/losses.md: "Bad input ... raises
`ValueError` naming the valid values"; docs/refusals.md), each bound on both sides; the anchored losses' reference
model refused where it is not taken and required where it is; EMO's cost embedding (cosine cost: each row
L2-normalised in the compute dtype, an all-zero row kept zero, its inverse norm never narrowed); and the compute
dtype (docs/losses.md: "Math runs in float32 (float64 for float64 inputs) whatever the input dtype")."""

from __future__ import annotations

import pytest
import torch

from trl_ext.losses import fused_token_loss, token_loss
from trl_ext.losses import validation as V
from trl_ext.losses.reference import reference_token_loss
from trl_ext.options import loss_params

F32, F64 = torch.float32, torch.float64
N, VOCAB, D, D_COST, D_REF = 6, 8, 4, 3, 5
LABELS = torch.tensor([0, 1, 2, 3, -100, 7])
BETA = "a finite number > 0 (the GEM papers use 0.7; 1.0 gives the cross-entropy gradient)"
TENSOR = "a [vocab_size, d] floating-point tensor (e.g. a frozen copy of the model's output embedding)"
FLOATING = "floating-point tensor (float16, bfloat16, float32 or float64)"


def _inputs(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, VOCAB, generator=gen)
    hidden, weight = torch.randn(N, D, generator=gen), torch.randn(VOCAB, D, generator=gen)
    return logits, hidden, weight, torch.randn(VOCAB, D_COST, generator=gen)


def _refusal(function, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        function(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message  # one line
    return message


# --- the losses' parameters: the loss, the parameter, the value given, what is accepted ---------------------------


BAD_PARAMETERS = [
    ("gem_ls", {"beta": 0}, f"beta=0 is invalid; expected {BETA}."),
    ("gem_linear", {"beta": float("inf")}, f"beta=inf is invalid; expected {BETA}."),
    ("ce_entropy", {"entropy_coef": -0.1}, "entropy_coef=-0.1 is invalid; expected a finite number >= 0."),
    ("mixce", {"gamma": True}, "gamma=True is invalid; expected a number in [0, 1]."),
    ("mixce", {"gamma": "0.5"}, "gamma='0.5' is invalid; expected a number in [0, 1]."),
    ("tailr", {"gamma": 1.5}, "gamma=1.5 is invalid; expected a number in [0, 1]."),
    ("eaft", {"k": 0}, "k=0 is invalid; expected an integer >= 1."),
    ("eaft", {"k": True}, "k=True is invalid; expected an integer >= 1."),
    ("emo", {"cost_embedding": "frozen"}, f"cost_embedding='frozen' is invalid; expected {TENSOR}."),
    ("emo", {"ratio_clamp": 0}, "ratio_clamp=0 is invalid; expected a finite number > 0."),
    ("emo", {"ratio_clamp": -3.0}, "ratio_clamp=-3.0 is invalid; expected a finite number > 0."),
    ("emo", {"ratio_clamp": float("inf")}, "ratio_clamp=inf is invalid; expected a finite number > 0."),
    ("emo", {"ratio_clamp": float("nan")}, "ratio_clamp=nan is invalid; expected a finite number > 0."),
    ("emo", {"ratio_clamp": "3"}, "ratio_clamp='3' is invalid; expected a finite number > 0."),
    ("emo", {"ratio_clamp": True}, "ratio_clamp=True is invalid; expected a finite number > 0."),
]


@pytest.mark.parametrize(("name", "params", "expected"), BAD_PARAMETERS)
def test_a_bad_parameter_is_refused_naming_it_and_what_is_accepted(
    name: str, params: dict, expected: str
) -> None:
    logits, *_, cost = _inputs()
    if name == "emo":
        params = {"cost_embedding": cost, **params}
    assert _refusal(token_loss, name, logits, LABELS, **params) == f"Loss {name!r}: {expected}"


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("eaft", {"k": 1}),  # "an integer >= 1": 1 is in
        ("emo", {"ratio_clamp": 0.5}),  # "> 0": below 1 is in
        ("emo", {"ratio_clamp": 1e-9}),
        ("emo", {"ratio_clamp": 3}),  # an int is a number
        ("mixce", {"gamma": 0}),
        ("ce_entropy", {"entropy_coef": 0}),
    ],
)
def test_values_at_and_inside_the_bounds_are_accepted(name: str, params: dict) -> None:
    logits, *_, cost = _inputs()
    extra = {"cost_embedding": cost} if name == "emo" else {}
    assert torch.isfinite(token_loss(name, logits, LABELS, **extra, **params)).all()


def test_one_of_accepts_exactly_its_choices_and_names_them_all() -> None:
    check = V.one_of("emo1", 2, None)
    assert [check(value) for value in ("emo1", 2, None)] == [None, None, None]
    for value in ("emo3", "EMO1", "", 3, "2"):
        assert check(value) == "one of 'emo1', 2, None"


# --- the user-facing options (trl_ext.options.loss_params: the check the TRL config and Axolotl share) -------------


@pytest.mark.parametrize(
    ("loss", "options", "expected"),
    [
        (
            "emo",
            {"emo_cost_embedding": ""},
            "emo_cost_embedding='' is invalid; expected 'frozen', 'live' or a model path / hub id.",
        ),
        (
            "emo",
            {"emo_cost_embedding": 5},
            "emo_cost_embedding=5 is invalid; expected 'frozen', 'live' or a model path / hub id.",
        ),
        (
            "emo",
            {"emo_cost_embedding": None},
            "emo_cost_embedding=None is invalid; expected 'frozen', 'live' or a model path / hub id.",
        ),
        (
            "asft",
            {"anchor_reference": ""},
            "anchor_reference='' is invalid; expected 'initial' or the folder of a model with the same vocabulary.",
        ),
        (
            "sft_kl",
            {"anchor_reference": 1},
            "anchor_reference=1 is invalid; expected 'initial' or the folder of a model with the same vocabulary.",
        ),
        ("gem_ls", {"gem_beta": -1.0}, f"Loss 'gem_ls': gem_beta=-1.0 is invalid; expected {BETA}."),
        (
            "emo",
            {"emo_ratio_clamp": 0.0},
            "Loss 'emo': emo_ratio_clamp=0.0 is invalid; expected a finite number > 0.",
        ),
        ("eaft", {"eaft_k": 0}, "Loss 'eaft': eaft_k=0 is invalid; expected an integer >= 1."),
    ],
)
def test_a_bad_option_is_refused_naming_the_option(loss: str, options: dict, expected: str) -> None:
    assert _refusal(loss_params, loss, options) == expected


@pytest.mark.parametrize(
    ("loss", "options"),
    [
        ("emo", {"emo_cost_embedding": "frozen"}),
        ("emo", {"emo_cost_embedding": "live"}),
        ("emo", {"emo_cost_embedding": "HuggingFaceTB/SmolLM2-135M"}),  # checked for existence elsewhere
        ("asft", {"anchor_reference": "initial"}),
        ("sft_kl", {"anchor_reference": "/a/model/folder"}),
        ("eaft", {"eaft_k": 1}),
        ("emo", {"emo_ratio_clamp": 0.5}),
    ],
)
def test_a_good_option_is_accepted(loss: str, options: dict) -> None:
    assert isinstance(loss_params(loss, options), dict)


# --- the input tensors: which input, what it must be, what it is --------------------------------------------------


def test_bad_logits_and_labels_are_named_with_what_they_must_be() -> None:
    logits, *_ = _inputs()
    cases = {
        f"logits must be a {FLOATING}, got torch.int64.": (logits.long(), LABELS),
        "logits must be a torch.Tensor, got list.": (logits.tolist(), LABELS),
        "logits must be 2-D, got shape (1, 6, 8).": (logits[None], LABELS),
        "labels must be an integer tensor of token ids (with -100 for ignored positions).": (
            logits,
            LABELS.float(),
        ),
        "labels must be 1-D with one entry per row (6), got shape (5,); flatten [B, T] inputs and shift them before "
        "calling.": (logits, LABELS[:5]),
        "labels must be 1-D with one entry per row (6), got shape (1, 6); flatten [B, T] inputs and shift them before "
        "calling.": (logits, LABELS[None]),
        "labels are on meta but the inputs are on cpu.": (logits, LABELS.to("meta")),
        "label 8 is out of range: valid labels are 0..7 or -100.": (
            logits,
            torch.tensor([0, 8, 2, 3, -100, 9]),
        ),
        "label -1 is out of range: valid labels are 0..7 or -100.": (
            logits,
            torch.tensor([0, 1, -1, 3, 8, 7]),
        ),
        "label -101 is out of range: valid labels are 0..7 or -100.": (
            logits,
            torch.tensor([-101, 1, 2, 3, 4, 5]),
        ),
    }
    for expected, (lg, lb) in cases.items():
        assert _refusal(token_loss, "ce", lg, lb) == expected
        assert _refusal(reference_token_loss, "ce", lg, lb) == expected


def test_bad_fused_inputs_are_named_with_what_they_must_be() -> None:
    _, hidden, weight, _ = _inputs()
    cases = {
        f"hidden must be a {FLOATING}, got torch.int32.": (hidden.int(), weight),
        "weight must be a torch.Tensor, got list.": (hidden, weight.tolist()),
        "weight must be 2-D, got shape (8,).": (hidden, weight[:, 0]),
    }
    for expected, (h, w) in cases.items():
        assert _refusal(fused_token_loss, "ce", h, w, LABELS) == expected


@pytest.mark.parametrize("bad", [0, -2, 1.0, True, "4"])
def test_a_bad_chunk_size_is_named_with_what_is_accepted(bad: object) -> None:
    logits, hidden, weight, _ = _inputs()
    expected = f"chunk_size must be a positive int or None (automatic), got {bad!r}."
    assert _refusal(token_loss, "ce", logits, LABELS, chunk_size=bad) == expected
    assert _refusal(fused_token_loss, "ce", hidden, weight, LABELS, chunk_size=bad) == expected


def test_a_chunk_of_one_row_is_accepted() -> None:
    logits, hidden, weight, _ = _inputs()
    torch.testing.assert_close(
        token_loss("ce", logits, LABELS, chunk_size=1), token_loss("ce", logits, LABELS)
    )
    torch.testing.assert_close(
        fused_token_loss("ce", hidden, weight, LABELS, chunk_size=1),
        fused_token_loss("ce", hidden, weight, LABELS),
    )


# --- EMO's cost embedding: [vocab_size, d], floating, on the inputs' device ---------------------------------------


@pytest.mark.parametrize("path", ["token", "fused", "reference"])
def test_a_bad_cost_embedding_is_named_with_what_it_must_be(path: str) -> None:
    logits, hidden, weight, cost = _inputs()
    cases = {
        "cost_embedding must be 2-D, got shape (8,).": cost[:, 0],
        f"cost_embedding must be a {FLOATING}, got torch.int64.": cost.long(),
        "cost_embedding has 7 rows but the vocabulary has 8 entries; it must be a [vocab_size, d] output embedding "
        "of a model with the same tokenizer.": cost[:7],
        "cost_embedding has 9 rows but the vocabulary has 8 entries; it must be a [vocab_size, d] output embedding "
        "of a model with the same tokenizer.": torch.cat([cost, cost[:1]]),
        "cost_embedding is on meta but the inputs are on cpu.": cost.to("meta"),
    }
    for expected, bad in cases.items():
        if path == "token":
            message = _refusal(token_loss, "emo", logits, LABELS, cost_embedding=bad)
        elif path == "fused":
            message = _refusal(fused_token_loss, "emo", hidden, weight, LABELS, cost_embedding=bad)
        else:
            message = _refusal(reference_token_loss, "emo", logits, LABELS, cost_embedding=bad)
        assert message == expected


def test_the_normalised_cost_embedding_has_unit_rows_in_the_compute_dtype() -> None:
    """Cosine cost: each row divided by its norm (rows of very different norms), an all-zero row kept zero (it
    costs 1 to every token instead of NaN), in the dtype asked for, detached."""
    raw = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1e-3, 0.0], [2e4, 0.0, -2e4]], dtype=F64)
    expected = torch.tensor(
        [[0.6, 0.8, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5**0.5, 0.0, -(0.5**0.5)]], dtype=F32
    )
    given = raw.clone().requires_grad_(True)
    for dtype in (F32, F64):
        unit = V.normalized_cost_embedding(given, 4, torch.device("cpu"), dtype)
        assert unit.dtype == dtype and not unit.requires_grad
        torch.testing.assert_close(unit, expected.to(dtype))


def test_the_inverse_norms_are_computed_in_the_dtype_asked_for_without_narrowing() -> None:
    """1 / max(||e_i||, eps), in `dtype`; a bfloat16 embedding's norm is taken in float32 (never rounded to bfloat16
    on the way), a float64 one's in float64 and then given in the dtype asked for."""
    gen = torch.Generator().manual_seed(11)
    emb = (torch.randn(64, 48, generator=gen) * 3).to(torch.bfloat16)
    emb[5] = 0.0
    exact = 1.0 / emb.double().norm(dim=1).clamp_min(1e-12)
    got = V.cost_inverse_norms(emb, F32)
    assert got.dtype == F32
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=0.0)
    assert got[5].item() == pytest.approx(1e12)  # an all-zero row: norm clamped at eps
    wide = V.cost_inverse_norms(emb.double(), F32)
    assert wide.dtype == F32
    torch.testing.assert_close(wide.double(), exact, rtol=1e-6, atol=0.0)
    assert V.cost_inverse_norms(emb.double(), F64).dtype == F64


@pytest.mark.parametrize(
    ("dtype", "compute"),
    [(torch.bfloat16, F32), (torch.float16, F32), (F32, F32), (F64, F64)],
)
def test_the_math_runs_in_float32_or_float64_for_float64_inputs(
    dtype: torch.dtype, compute: torch.dtype
) -> None:
    logits, hidden, weight, cost = _inputs()
    assert V.compute_dtype(dtype) == compute
    assert token_loss("ce", logits.to(dtype), LABELS).dtype == compute
    assert reference_token_loss("ce", logits.to(dtype), LABELS).dtype == compute
    assert fused_token_loss("ce", hidden.to(dtype), weight.to(dtype), LABELS).dtype == compute
    assert token_loss("emo", logits.to(dtype), LABELS, cost_embedding=cost).dtype == compute


# --- the anchored losses' reference model: refused where it is not taken, required and checked where it is --------


def test_a_reference_model_passed_to_another_loss_is_refused() -> None:
    logits, hidden, weight, _ = _inputs()
    ref_h, ref_w = torch.randn(N, D_REF), torch.randn(VOCAB, D_REF)
    tail = "is only for the anchored losses (asft, sft_kl); loss 'gem_ls' takes no reference model."
    assert (
        _refusal(token_loss, "gem_ls", logits, LABELS, reference_logits=logits) == f"reference_logits= {tail}"
    )
    assert (
        _refusal(
            fused_token_loss, "gem_ls", hidden, weight, LABELS, reference_hidden=ref_h, reference_weight=ref_w
        )
        == f"reference_hidden=, reference_weight= {tail}"
    )
    assert (
        _refusal(fused_token_loss, "gem_ls", hidden, weight, LABELS, reference_weight=ref_w)
        == f"reference_weight= {tail}"
    )


def test_a_missing_reference_model_is_refused_naming_what_the_path_needs() -> None:
    logits, hidden, weight, _ = _inputs()
    ref_h, ref_w = torch.randn(N, D_REF), torch.randn(VOCAB, D_REF)
    logits_needs = "Loss 'asft' needs the frozen reference model's reference_logits= on this path (its KL anchor), got none."
    assert _refusal(token_loss, "asft", logits, LABELS) == logits_needs
    assert _refusal(reference_token_loss, "asft", logits, LABELS) == logits_needs
    fused_needs = (
        "Loss 'sft_kl' needs the frozen reference model's reference_hidden= + reference_weight= on this path (its KL "
        "anchor), got "
    )
    assert _refusal(fused_token_loss, "sft_kl", hidden, weight, LABELS) == fused_needs + "none."
    assert (
        _refusal(fused_token_loss, "sft_kl", hidden, weight, LABELS, reference_hidden=ref_h)
        == fused_needs + "reference_hidden=."
    )
    assert (
        _refusal(fused_token_loss, "sft_kl", hidden, weight, LABELS, reference_weight=ref_w)
        == fused_needs + "reference_weight=."
    )


def test_reference_logits_of_another_shape_dtype_or_device_are_refused() -> None:
    logits, *_ = _inputs()
    like = "like the logits (the reference model's logits of the same rows, same vocabulary), got"
    cases = {
        f"reference_logits must be [6, 8] {like} (6, 7).": logits[:, :7],
        f"reference_logits must be [6, 8] {like} (5, 8).": logits[:5],
        f"reference_logits must be [6, 8] {like} (8, 6).": logits.T.contiguous(),
        "reference_logits must be 2-D, got shape (6,).": logits[:, 0],
        f"reference_logits must be a {FLOATING}, got torch.int64.": logits.long(),
        "reference_logits is on meta but the inputs are on cpu.": logits.to("meta"),
    }
    for expected, bad in cases.items():
        assert _refusal(token_loss, "asft", logits, LABELS, reference_logits=bad) == expected
        assert _refusal(reference_token_loss, "asft", logits, LABELS, reference_logits=bad) == expected


def test_a_reference_head_or_hidden_states_of_another_shape_are_refused() -> None:
    """Each of the three conditions alone: the rows, the vocabulary, the reference model's own width d_ref."""
    _, hidden, weight, _ = _inputs()
    head = (
        "reference_hidden must be [6, d_ref] and reference_weight [8, d_ref] (the reference model's hidden states "
        "of the same rows and its LM head, same vocabulary), got "
    )
    cases = {
        head + "(5, 5) and (8, 5).": (torch.randn(5, D_REF), torch.randn(VOCAB, D_REF)),
        head + "(6, 5) and (7, 5).": (torch.randn(N, D_REF), torch.randn(7, D_REF)),
        head + "(6, 5) and (8, 4).": (torch.randn(N, D_REF), torch.randn(VOCAB, 4)),
        "reference_weight is on meta but the inputs are on cpu.": (
            torch.randn(N, D_REF),
            torch.randn(VOCAB, D_REF, device="meta"),
        ),
        "reference_hidden must be 2-D, got shape (6,).": (torch.randn(N), torch.randn(VOCAB, D_REF)),
    }
    for expected, (ref_h, ref_w) in cases.items():
        call = (fused_token_loss, "asft", hidden, weight, LABELS)
        assert _refusal(*call, reference_hidden=ref_h, reference_weight=ref_w) == expected
    good = fused_token_loss(
        "asft",
        hidden,
        weight,
        LABELS,
        reference_hidden=torch.randn(N, D_REF),
        reference_weight=torch.randn(VOCAB, D_REF),
    )
    assert torch.isfinite(good).all()
