"""FSDP2 worker: `torchrun --nproc_per_node 2 tests/helpers/fsdp2_worker.py OUT_DIR` (CPU, gloo, float64).

For each sharding layout and each loss case, on both paths (fused and logits), one forward + backward of a tiny
Llama through the patched forward (`trl_ext.model_forward`), sharded with `torch.distributed.fsdp.fully_shard`;
records the loss, every parameter's gradient error against the unsharded model (full logits, data-parallel mean
over the ranks' batches), the path reported, how often the head computed full logits, and the lazily taken EMO
cost embedding against the unsharded head. Each rank writes `OUT_DIR/fsdp2_rank{rank}.json`;
`tests/distributed/test_fsdp2.py` checks them.

Layouts:
* ``accelerate``: accelerate's FSDP2 layout (`fsdp2_prepare_model`): each decoder layer, the input embedding
  alone, `[final norm, lm_head]` as one unit with `reshard_after_forward=False`, then the root.
* ``accelerate_tied``: tied embeddings in accelerate's layout: `[final norm, embed_tokens, lm_head]`.
* ``separate_head``: each decoder layer, the head alone (`reshard_after_forward=True`), then the root.
* ``head_embed_tied``: tied embeddings, `[embed_tokens, lm_head]` as one unit that reshards after forward.
* ``root_only``: one unit for the whole model (the head is a plain `nn.Linear` inside it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root: `tests.helpers`, `trl_ext`

from tests.helpers.dist_common import (  # noqa: E402
    LOSS_CASES,
    HeadCallCounter,
    build_model,
    case_result,
    grad_errors,
    rank_batch,
    reference_results,
    write_rank_result,
)
from trl_ext.cost_embedding import frozen_head_copy, resolve_cost_embedding  # noqa: E402
from trl_ext.model_forward import LossRequest, install_loss_forward  # noqa: E402

DTYPE = torch.float64
LAYOUTS: dict[str, bool] = {  # layout -> tied embeddings
    "accelerate": False,
    "accelerate_tied": True,
    "separate_head": False,
    "head_embed_tied": True,
    "root_only": False,
}


def shard(model: nn.Module, layout: str) -> None:
    from torch.distributed.fsdp import fully_shard

    inner = model.model
    if layout != "root_only":
        for layer in inner.layers:
            fully_shard(layer)
    if layout == "accelerate":
        fully_shard(inner.embed_tokens)
        fully_shard([inner.norm, model.lm_head], reshard_after_forward=False)
    elif layout == "accelerate_tied":
        fully_shard([inner.norm, inner.embed_tokens, model.lm_head], reshard_after_forward=False)
    elif layout == "separate_head":
        fully_shard(model.lm_head, reshard_after_forward=True)
    elif layout == "head_embed_tied":
        fully_shard([inner.embed_tokens, model.lm_head], reshard_after_forward=True)
    fully_shard(model)


def full(tensor: torch.Tensor | None) -> torch.Tensor | None:
    from torch.distributed.tensor import DTensor

    if tensor is None:
        return None
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def run_layout(layout: str, tied: bool, rank: int, world: int, counter: HeadCallCounter) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    reference = build_model(tie=tied, dtype=DTYPE)
    head_before = reference.get_output_embeddings().weight.detach().clone()
    model = build_model(tie=tied, dtype=DTYPE)
    shard(model, layout)
    head = model.get_output_embeddings()
    weight = head.weight
    out: dict[str, Any] = {
        "tied": tied,
        "head_class": type(head).__name__,
        "head_weight_is_dtensor": isinstance(weight, DTensor),
        "head_local_rows": int(weight.to_local().shape[0]) if isinstance(weight, DTensor) else None,
        "vocab": int(head_before.shape[0]),
    }
    # EMO's frozen cost embedding taken lazily from the sharded model (as Axolotl does under FSDP), every rank.
    frozen = frozen_head_copy(model)
    resolved, live = resolve_cost_embedding(model, "frozen")
    out["frozen_cost_max_diff"] = float((frozen - head_before).abs().max())
    out["frozen_cost_is_plain_tensor"] = type(frozen) is torch.Tensor and type(resolved) is torch.Tensor
    out["resolved_cost_max_diff"] = float((resolved - head_before).abs().max())
    install_loss_forward(model)
    counter.head = head
    batch = rank_batch(rank)
    cases = []
    for case, loss, live in LOSS_CASES:
        ref_values, ref_grads = reference_results(reference, world, loss, live, head_before)
        for path in ("fused", "logits"):
            request = LossRequest(
                name=loss,
                params={},
                cost_embedding=frozen if loss == "emo" and not live else None,
                live_cost=live,
                force_logits_path=path == "logits",
            )
            model.zero_grad(set_to_none=True)
            counter.calls = 0
            if os.environ.get("DISTMATCH_WORKER_TRACE"):
                print(f"rank {rank} {layout} {case} {path}", flush=True)
            output = model(**batch, distmatch_loss=request)
            value = output.per_token_loss.sum() / output.label_mask.sum()
            value.backward()
            grads = {n: full(p.grad) for n, p in model.named_parameters()}
            cases.append(case_result(case, path, output, value, counter, ref_values[rank], grads, ref_grads))
    out["cases"] = cases
    # control: the head gathered with full_tensor() and no Partial gradient placement
    if layout == "separate_head":
        out["control_full_tensor_without_partial"] = control_without_partial(model, reference, world, rank)
    return out


def control_without_partial(model: nn.Module, reference: nn.Module, world: int, rank: int) -> dict[str, Any]:
    """What a fused loss reading `lm_head.weight.full_tensor()` outside the head's hooks gives (docs/distributed.md)."""
    from trl_ext.losses import fused_token_loss

    ref_values, ref_grads = reference_results(reference, world, "ce", False, None)
    model.zero_grad(set_to_none=True)
    batch = rank_batch(rank)
    patched = model.forward

    def forward(**kwargs: Any) -> torch.Tensor:  # run as the root's forward, so the root unit's hooks run
        hidden = model.model(input_ids=kwargs["input_ids"], attention_mask=kwargs["attention_mask"])
        weight = model.lm_head.weight.full_tensor()
        flat = hidden.last_hidden_state[:, :-1].reshape(-1, weight.shape[1])
        return fused_token_loss("ce", flat, weight, kwargs["labels"][:, 1:].reshape(-1))

    model.forward = forward
    try:
        per_token = model(**batch)
    finally:
        model.forward = patched
    value = per_token.sum() / (batch["labels"][:, 1:] != -100).sum()
    value.backward()
    grads = {n: full(p.grad) for n, p in model.named_parameters()}
    errors = grad_errors(grads, ref_grads)
    head_name = "lm_head.weight"
    head_ref = ref_grads[head_name]
    head_rel = float((grads[head_name] - head_ref).abs().max() / head_ref.abs().max())
    model.zero_grad(set_to_none=True)
    return {"loss_abs_diff": abs(float(value) - ref_values[rank]), "head_grad_max_rel": head_rel, **errors}


def run_anchored(rank: int, world: int) -> list[dict[str, Any]]:
    """`asft` with a reference model (another seed) sharded like the policy (its decoder layers, its head a unit
    that reshards after forward; the policy in accelerate's layout), both paths:
    loss and every gradient against the unsharded pair (the reference's full logits, `reference_token_loss`)."""
    from trl_ext.anchor import Reference
    from trl_ext.losses import reference_token_loss

    policy, frozen = build_model(tie=False, dtype=DTYPE), build_model(tie=False, dtype=DTYPE, seed=1)
    frozen.requires_grad_(False)
    values, want = [], {}
    for r in range(world):  # the unsharded truth: data-parallel mean over the ranks' batches
        batch = rank_batch(r)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        logits, ref_logits = policy(**inputs).logits[:, :-1], frozen(**inputs).logits[:, :-1]
        targets = batch["labels"][:, 1:].reshape(-1)
        per_token = reference_token_loss(
            "asft",
            logits.reshape(-1, logits.shape[-1]),
            targets,
            reference_logits=ref_logits.reshape(-1, ref_logits.shape[-1]),
            kl_weight=0.5,
        )
        value = per_token.sum() / (targets != -100).sum()
        (value / world).backward()
        values.append(float(value))
    want = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    shard(policy, "accelerate")
    # The reference resharding after its forward (no backward would reshard a unit with reshard_after_forward=False).
    shard(frozen, "separate_head")
    install_loss_forward(policy)
    counter = HeadCallCounter()
    counter.head = policy.get_output_embeddings()
    cases = []
    for path in ("fused", "logits"):
        request = LossRequest(
            name="asft",
            params={"kl_weight": 0.5},
            reference=Reference(model=frozen),
            force_logits_path=path == "logits",
        )
        policy.zero_grad(set_to_none=True)
        counter.calls = 0
        output = policy(**rank_batch(rank), distmatch_loss=request)
        value = output.per_token_loss.sum() / output.label_mask.sum()
        value.backward()
        grads = {n: full(p.grad) for n, p in policy.named_parameters()}
        kl = float(output.stats.kl[output.label_mask].mean())
        result = case_result("asft", path, output, value, counter, values[rank], grads, want, kl=kl)
        weight = frozen.lm_head.weight  # after the step: sharded again
        result["reference_local_rows"] = (
            int(weight.to_local().shape[0]) if hasattr(weight, "to_local") else None
        )
        cases.append(result)
    return cases


def main() -> None:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    counter = HeadCallCounter()
    start = time.perf_counter()
    result: dict[str, Any] = {"rank": rank, "world": world, "torch": torch.__version__, "layouts": {}}
    for layout, tied in LAYOUTS.items():
        result["layouts"][layout] = run_layout(layout, tied, rank, world, counter)
    result["anchored"] = run_anchored(rank, world)
    result["seconds"] = time.perf_counter() - start
    write_rank_result(out_dir, __file__, result)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
