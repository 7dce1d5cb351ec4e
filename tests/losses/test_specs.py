"""The loss specs are the one definition of each loss: everything else is built from them or checked against them.

Also: the CE-weighted family's new members against independent definitions (EAFT as its authors and as Axolotl
compute it; Axolotl's own function in `tests/axolotl/test_plugin.py`, TRL's DFT in `tests/trl/test_trainer.py`), the module
structure (no import cycles, the reference independent of the paths it checks), and no
integration comparing a loss name.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import torch

import tests.helpers.loss_oracles as O
from tests.helpers.env import REPO_ROOT
from trl_ext.losses import LOSS_NAMES, LOSSES, fused_token_loss, reference_token_loss, token_loss
from trl_ext.losses.kernel_contract import LOSS_IDS
from trl_ext.losses.registry import OPTION_LOSSES, OPTIONS, TRITON_LOSSES, _check_spec
from trl_ext.losses.settings import OPTIONS as PATH_OPTIONS
from trl_ext.losses.spec import LossSpec, Option, Param
from trl_ext.options import LOSS_OPTIONS, losses_table, options_table

F64 = torch.float64


def _logits(n: int = 11, v: int = 37, seed: int = 0, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=gen, dtype=F64) * scale
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::4] = -100
    return logits, labels


# ---------------------------------------------------------------------------------------------------------
# New losses against independent definitions


@pytest.mark.parametrize(("alpha", "k"), [(1.0, 20), (0.5, 20), (2.0, 7), (1.0, 1), (1.0, 100)])
@pytest.mark.parametrize("path", ["token", "fused", "reference"])
def test_eaft_is_the_authors_weight_and_3_pow_alpha_below_axolotls(path, alpha, k):
    """Ours: (H_k / 3) ** alpha * CE (the authors' code, LLaMA-Factory `use_eaft_loss`); Axolotl's `use_eaft`:
    H_k ** alpha * CE, i.e. 3 ** alpha times ours (up to its log(q + 1e-10))."""
    hidden = torch.randn(11, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    weight = torch.randn(37, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    logits = hidden @ weight.T
    _, labels = _logits()
    params = {"alpha": alpha, "k": k}
    if path == "token":
        got = token_loss("eaft", logits, labels, chunk_size=4, **params)
    elif path == "fused":
        got = fused_token_loss("eaft", hidden, weight, labels, chunk_size=4, **params)
    else:
        got = reference_token_loss("eaft", logits, labels, **params)
    valid = labels != -100
    ce = torch.nn.functional.cross_entropy(logits, torch.where(valid, labels, 0), reduction="none")
    authors = O.eaft_weight(logits, alpha, k) * ce * valid
    axolotl = O.eaft_axolotl_weight(logits, alpha, k) * ce * valid
    torch.testing.assert_close(got, authors, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got * 3.0**alpha, axolotl, rtol=1e-8, atol=1e-8)
    if k == 1:
        assert torch.all(got == 0)  # one token: zero entropy, zero weight


def test_dft_is_p_y_times_ce_with_the_ce_gradient_scaled_by_p_y():
    logits, labels = _logits(seed=7)
    z = logits.clone().requires_grad_()
    got = token_loss("dft", z, labels, chunk_size=3)
    got.sum().backward()
    oracle = O.oracle("dft", logits, labels)
    torch.testing.assert_close(got, oracle.value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(z.grad, oracle.grad, rtol=1e-12, atol=1e-12)


def test_ce_weighted_losses_share_the_closed_form():
    """ce, mixce, tailr, dft, eaft are sg(w) * CE: only a weight, the one closed form (`ce_weighted.py`)."""
    weighted = {name for name, spec in LOSSES.items() if spec.weight is not None}
    assert {"ce", "mixce", "tailr", "dft", "eaft"} <= weighted  # and any new one written with `ce_weighted`
    rows = {LOSSES[name].rows.func for name in weighted}  # functools.partial over the shared closed form
    assert len(rows) == 1


# ---------------------------------------------------------------------------------------------------------
# One definition: the integrations are built from the specs


def test_options_come_from_the_specs():
    assert [o.name for o in LOSS_OPTIONS if not o.path] == list(OPTIONS)
    # the paths' settings: options of every loss, defined once beside `FusedSettings`
    assert [(o.name, o.param, o.losses) for o in LOSS_OPTIONS if o.path] == [
        (o.name, o.param, LOSS_NAMES) for o in PATH_OPTIONS
    ]
    for option in (o for o in LOSS_OPTIONS if not o.path):
        spec_option = OPTIONS[option.name]
        assert (option.default, option.help, option.param) == (
            spec_option.default,
            spec_option.help,
            spec_option.param,
        )
        assert option.losses == OPTION_LOSSES[option.name]
        for loss in option.losses:
            assert spec_option in LOSSES[loss].options
            if option.from_model and option.param not in LOSSES[loss].param_names:
                # where the integration gets a model from (the anchored losses' reference): no loss parameter
                assert LOSSES[loss].needs_reference and option.name == "anchor_reference"
                continue
            param = next(p for p in LOSSES[loss].params if p.name == option.param)
            if not option.from_model:  # the option's default and check are its parameter's
                assert (option.default, option.check, option.choices) == (
                    param.default,
                    param.check,
                    param.choices,
                )
    assert {"eaft_alpha", "eaft_k"} <= set(OPTIONS) and OPTIONS["eaft_alpha"].default == 1.0
    assert OPTIONS["eaft_k"].default == 20


# The TRL config's fields: `tests/trl/test_config.py` (importing TRL here would import Triton before the interpreter tests
# of `test_triton.py` can switch it on).


def test_axolotl_args_are_built_from_the_specs():
    pytest.importorskip("pydantic")
    from axolotl_distmatch.args import DistMatchArgs
    from distmatch_hooks._common import RUN_OPTION_NAMES

    fields = DistMatchArgs.model_fields
    assert set(fields) == {"loss", *RUN_OPTION_NAMES, *(o.name for o in LOSS_OPTIONS)}  # trl_ext/resume.py
    for option in LOSS_OPTIONS:
        assert fields[option.name].json_schema_extra["description"].startswith(option.help)


def test_hook_names_every_option():
    import distmatch_hooks.trl as hook
    from distmatch_hooks._common import RUN_OPTION_NAMES

    assert set(hook.OPTION_NAMES) == {"loss", *RUN_OPTION_NAMES, *(o.name for o in LOSS_OPTIONS)}


def _readme_block(name: str) -> str:
    text = (REPO_ROOT / "docs" / "losses.md").read_text()
    match = re.search(
        rf"<!-- {name}: generated by `python tools/generate.py` -->\n(.*?)\n<!-- /{name} -->", text, re.S
    )
    assert match, f"docs/losses.md has no generated {name} block"
    return match.group(1).strip()


def test_readme_tables_are_the_generated_ones():
    """The loss and option tables of docs/losses.md are the specs' (`python tools/generate.py` writes them)."""
    assert _readme_block("losses") == losses_table()
    assert _readme_block("options") == options_table()


# ---------------------------------------------------------------------------------------------------------
# A spec that contradicts itself is refused at import


def _spec(**changes) -> LossSpec:
    base = LOSSES["mixce"]
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stats": ("nonsense",)}, "not a TokenStats field"),
        ({"options": (Option("x_gamma", "gamma2", 0.5, "help", lambda v: None),)}, "unknown parameter"),
        ({"needs_cost_embedding": True}, "needs_cost_embedding"),
    ],
)
def test_inconsistent_spec_is_refused(changes, message):
    with pytest.raises(TypeError, match=message):
        _check_spec(_spec(**changes))
    _check_spec(_spec(params=(*LOSSES["mixce"].params, Param("extra", 1.0, lambda v: None, "doc"))))


def test_triton_flag_matches_the_kernel():
    assert TRITON_LOSSES == ("ce", "emo", "gem_linear", "gem_ls")
    assert set(LOSS_IDS) == set(TRITON_LOSSES)  # the kernel's ids, named in its Triton-free contract


# ---------------------------------------------------------------------------------------------------------
# Structure


def _imports(path: Path) -> set[str]:
    """The sibling modules of trl_ext.losses that `path` imports (relative imports only)."""
    found = set()
    package = path.parent.relative_to(REPO_ROOT / "trl_ext" / "losses").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1]) if node.level > 1 else list(package)
            target = [*base, *(node.module.split(".") if node.module else [])]
            if node.module is None:
                found |= {"/".join([*target, alias.name]) for alias in node.names}
            else:
                found.add("/".join(target))
    return found


def _module_graph() -> dict[str, set[str]]:
    root = REPO_ROOT / "trl_ext" / "losses"
    graph = {}
    for path in root.rglob("*.py"):
        name = "/".join(path.relative_to(root).with_suffix("").parts)
        graph[name.removesuffix("/__init__") if name != "__init__" else ""] = {
            t for t in _imports(path) if t and not t.startswith("..")
        }
    return {k: {t for t in v if t in graph or t.rsplit("/", 1)[0] in graph} for k, v in graph.items()}


def test_loss_modules_have_no_import_cycle():
    graph = _module_graph()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*trail, node]))
        if state.get(node) == 2:
            return
        state[node] = 1
        for target in graph.get(node, ()):
            if target != "" and target in graph:
                visit(target, [*trail, node])
        state[node] = 2

    for module in graph:
        visit(module, [])


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target in graph and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_reference_depends_on_the_registry_only():
    graph = _module_graph()
    assert graph["reference"] == {"registry", "spec"}
    paths = {
        "chunked",
        "plan",
        "logits_path",
        "fused_path",
        "grad_weight",
        "rows",
        "row_backends",
        "triton_rows",
    }
    assert not paths & _closure(graph, "reference")


def test_no_integration_compares_a_loss_name():
    names = "|".join(map(re.escape, LOSSES))
    pattern = re.compile(rf"""(==|!=|\bin\b)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    files = [
        *sorted((REPO_ROOT / "trl_ext").glob("*.py")),
        *sorted((REPO_ROOT / "axolotl_distmatch").glob("*.py")),
        REPO_ROOT / "trl_ext" / "losses" / "chunked.py",
        REPO_ROOT / "trl_ext" / "losses" / "plan.py",
        REPO_ROOT / "trl_ext" / "losses" / "logits_path.py",
        REPO_ROOT / "trl_ext" / "losses" / "fused_path.py",
        REPO_ROOT / "trl_ext" / "losses" / "grad_weight.py",
        REPO_ROOT / "trl_ext" / "losses" / "settings.py",
        REPO_ROOT / "trl_ext" / "losses" / "rows.py",
        REPO_ROOT / "trl_ext" / "losses" / "reference.py",
        REPO_ROOT / "trl_ext" / "losses" / "row_backends.py",
    ]
    hits = [
        f"{p.name}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_trainer_mixin_imports_no_framework():
    source = (REPO_ROOT / "trl_ext" / "loss_mixin.py").read_text()
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and not node.level
    } | {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not {"trl", "axolotl"} & imported, imported
