"""What the 2-process sharding workers share: a tiny Llama built in code, per-rank batches, the loss cases and the
unsharded float64 / float32 reference (full logits + `reference_token_loss`, independent of `model_forward.py`).

Imported by `fsdp2_worker.py` and `zero3_worker.py` (run under `torchrun`) and by their pytest files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.helpers.cli import assert_every_rank_ended_cleanly
from tests.helpers.env import REPO_ROOT
from trl_ext.losses import LOSS_NAMES, LOSSES

WORLD = 2
VOCAB = 96
SEQ = 12
ROWS = 2

#: (case name, loss name, live cost embedding?) — every loss of the registry; a cost-embedding loss (EMO) also live.
#: Every loss but the anchored ones, which need a reference model (the FSDP2 worker's `run_anchored`).
LOSS_CASES: tuple[tuple[str, str, bool], ...] = tuple(
    case
    for name in LOSS_NAMES
    if not LOSSES[name].needs_reference
    for case in ((name, name, False),)
    + (((f"{name}_live", name, True),) if LOSSES[name].needs_cost_embedding else ())
)


def build_model(*, tie: bool, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    if not tie:  # a head unlike the input embedding, so a mixed-up weight would show
        with torch.no_grad():
            model.lm_head.weight.normal_(0, 0.5)
    return model.to(dtype)  # drawn in float32 first: every dtype holds the same values


def rank_batch(rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s micro-batch: different tokens per rank, ~25 % of the labels ignored."""
    gen = torch.Generator().manual_seed(1000 + rank)
    input_ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen)
    labels = input_ids.clone()
    labels[torch.rand(ROWS, SEQ, generator=gen) < 0.25] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def reference_loss(model: nn.Module, batch: dict[str, torch.Tensor], loss: str, live: bool, cost: Any) -> Any:
    """Mean per-token loss of `batch` from the model's own full logits (the readable ground truth)."""
    from trl_ext.losses import reference_token_loss

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:].reshape(-1)
    params: dict[str, Any] = {}
    if loss == "emo":
        params["cost_embedding"] = model.get_output_embeddings().weight.detach() if live else cost
    per_token = reference_token_loss(loss, logits[:, :-1].reshape(-1, logits.shape[-1]), targets, **params)
    return per_token.sum() / (targets != -100).sum()


def reference_results(
    model: nn.Module, world: int, loss: str, live: bool, cost: Any
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-rank loss values and the data-parallel gradient (mean over ranks) of the unsharded model."""
    model.zero_grad(set_to_none=True)
    values = []
    for rank in range(world):
        value = reference_loss(model, rank_batch(rank), loss, live, cost)
        (value / world).backward()
        values.append(float(value))
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return values, grads


def grad_errors(got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Worst relative (to the parameter's largest reference entry) and absolute gradient error over parameters."""
    worst_rel, worst_abs, worst_name, missing = 0.0, 0.0, None, []
    for name, ref in want.items():
        grad = got.get(name)
        if grad is None:
            missing.append(name)
            continue
        diff = float((grad.double() - ref.double()).abs().max())
        rel = diff / max(float(ref.abs().max()), 1e-30)
        if rel > worst_rel:
            worst_rel, worst_name = rel, name
        worst_abs = max(worst_abs, diff)
    extra = sorted(set(got) - set(want))
    return {
        "grad_max_rel": worst_rel,
        "grad_max_abs": worst_abs,
        "worst_param": worst_name,
        "missing_grads": missing,
        "unexpected_grads": extra,
        "n_params": len(want),
    }


class HeadCallCounter:
    """Counts calls of `nn.Linear.forward` on one module (the LM head computing full logits)."""

    def __init__(self) -> None:
        self.head: nn.Module | None = None
        self.calls = 0
        self._original = nn.Linear.forward
        counter = self

        def counting(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
            if module is counter.head:
                counter.calls += 1
            return counter._original(module, x)

        nn.Linear.forward = counting  # type: ignore[method-assign]


def case_result(
    case: str,
    path: str,
    output: Any,
    value: torch.Tensor,
    counter: HeadCallCounter,
    ref_value: float,
    grads: dict[str, torch.Tensor | None],
    ref_grads: dict[str, torch.Tensor],
    **extra: Any,
) -> dict[str, Any]:
    """One loss case on one path, as a worker reports it: the path taken, full-logit head calls, loss and gradient
    errors against the unsharded reference."""
    return {
        "case": case,
        "path": path,
        "reported_path": output.path,
        "head_logits_calls": counter.calls,
        "loss_value": float(value),
        "loss_abs_diff": abs(float(value) - ref_value),
        **extra,
        **grad_errors(grads, ref_grads),
    }


def _result_file(out: Path, script: str, rank: int) -> Path:
    return out / f"{Path(script).stem.removesuffix('_worker')}_rank{rank}.json"


def write_rank_result(out: Path, script: str, result: dict[str, Any]) -> None:
    """A worker's last step: write this rank's result where `torchrun` reads it; at exit the process groups and
    their threads end as in the trainers (`trl_ext.teardown`, once the worker's own references are gone)."""
    import torch.distributed as dist

    from trl_ext.teardown import release_process_groups_at_exit

    out.mkdir(parents=True, exist_ok=True)
    _result_file(out, script, result["rank"]).write_text(json.dumps(result, indent=1))
    dist.barrier()
    release_process_groups_at_exit()


def torchrun(script: str, out: Path, timeout: int = 900) -> list[dict]:
    """Run `script out` on WORLD CPU processes under torchrun; each rank's JSON result."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONFAULTHANDLER": "1",
        "DISTMATCH_DEBUG": "1",  # each rank reports the communication threads left at its end
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    proc = subprocess.run(
        [*cmd, str(Path(__file__).with_name(script)), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
    )
    # FSDP2's fully_shard keeps the default group referenced from C++ after it is destroyed (docs/distributed.md)
    assert_every_rank_ended_cleanly(proc, WORLD, threads_left=script.startswith("fsdp2"))
    return [json.loads(_result_file(out, script, rank).read_text()) for rank in range(WORLD)]
