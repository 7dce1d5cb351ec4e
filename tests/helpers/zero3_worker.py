"""DeepSpeed ZeRO-3 worker: `torchrun --nproc_per_node 2 tests/helpers/zero3_worker.py OUT_DIR` (CPU, gloo, float32).

A tiny Llama (untied and tied embeddings) under `deepspeed.initialize` with ZeRO stage 3 and
`stage3_param_persistence_threshold: 0` (so the LM head really stays partitioned between uses). For every loss
case on both paths: one forward through the patched forward (`engine(..., distmatch_loss=...)`), `engine.backward`,
then every parameter's full gradient (`deepspeed.utils.safe_get_full_grad`) against the unsharded float64 model
(full logits, data-parallel mean over the ranks' batches), the path reported and how often the head computed full
logits; also EMO's frozen cost embedding gathered from the partitioned head and the refusal of a live one.
Each rank writes `OUT_DIR/zero3_rank{rank}.json`; `tests/distributed/test_zero3_fused.py` checks them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root: `tests.helpers`, `trl_ext`

from tests.helpers.dist_common import (  # noqa: E402
    LOSS_CASES,
    HeadCallCounter,
    build_model,
    case_result,
    rank_batch,
    reference_results,
    write_rank_result,
)
from trl_ext.cost_embedding import frozen_head_copy, resolve_cost_embedding  # noqa: E402
from trl_ext.model_forward import LossRequest, install_loss_forward  # noqa: E402

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": False},
    "bf16": {"enabled": False},
    "steps_per_print": 10**9,
}


def run_model(tied: bool, rank: int, world: int, counter: HeadCallCounter) -> dict[str, Any]:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    reference = build_model(tie=tied, dtype=torch.float64)
    head_before = reference.get_output_embeddings().weight.detach().float().clone()
    model = build_model(tie=tied, dtype=torch.float32)
    # lr 0: `engine.step()` only clears the partitioned gradients between cases, the weights stay the same.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=DS_CONFIG)
    module = engine.module
    head = module.get_output_embeddings()
    out: dict[str, Any] = {
        "tied": tied,
        "head_ds_status": str(head.weight.ds_status),
        "head_local_numel": int(head.weight.numel()),
        "head_partition_numel": int(head.weight.ds_tensor.numel()),
        "head_full_numel": int(head.weight.ds_numel),
    }
    frozen = frozen_head_copy(module)
    out["frozen_cost_max_diff"] = float((frozen - head_before).abs().max())
    out["frozen_cost_shape"] = list(frozen.shape)
    try:
        resolve_cost_embedding(module, "live")
        out["live_cost_refused"] = None
    except ValueError as err:
        out["live_cost_refused"] = str(err)
    install_loss_forward(module)
    counter.head = head
    batch = rank_batch(rank)
    names = [n for n, _ in module.named_parameters()]
    cases = []
    for case, loss, live in LOSS_CASES:
        if live:  # refused under ZeRO-3 (checked above)
            continue
        ref_values, ref_grads = reference_results(reference, world, loss, live, head_before.double())
        for path in ("fused", "logits"):
            request = LossRequest(
                name=loss,
                params={},
                cost_embedding=frozen if loss == "emo" else None,
                force_logits_path=path == "logits",
            )
            counter.calls = 0
            output = engine(**batch, distmatch_loss=request)
            value = output.per_token_loss.sum() / output.label_mask.sum()
            engine.backward(value)
            params = dict(module.named_parameters())
            grads = {n: safe_get_full_grad(params[n]) for n in names}
            grads = {n: None if g is None else g.detach().clone().double() for n, g in grads.items()}
            engine.step()
            cases.append(
                case_result(
                    case,
                    path,
                    output,
                    value,
                    counter,
                    ref_values[rank],
                    grads,
                    ref_grads,
                    head_numel_after_step=int(head.weight.numel()),
                )
            )
    out["cases"] = cases
    weights_after = frozen_head_copy(module)
    out["head_unchanged_after_lr0_steps"] = float((weights_after - head_before).abs().max())
    engine.destroy()
    return out


def main() -> None:
    import deepspeed

    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    counter = HeadCallCounter()
    start = time.perf_counter()
    result: dict[str, Any] = {"rank": rank, "world": world, "deepspeed": deepspeed.__version__, "models": {}}
    for name, tied in (("untied", False), ("tied", True)):
        result["models"][name] = run_model(tied, rank, world, counter)
    result["seconds"] = time.perf_counter() - start
    write_rank_result(out_dir, __file__, result)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
