"""Two CPU processes through the real command lines: DeepSpeed ZeRO-2 / ZeRO-3 and plain DDP (gloo).

Every multi-process run is compared with one process at the doubled batch (2 x 4 rows vs 1 x 8 rows, the same
rows in the same order), in fp32 (`--bf16 false`), with plain SGD, a constant learning rate and no effective
clipping, so that a wrong gradient scale shows in the loss of step 2, in the logged grad norm and in the weights:

* `distmatch-trl sft --use_deepspeed --loss emo` with ZeRO-3 (`stage3_param_persistence_threshold: 0`: the LM head
  stays partitioned) and `trl sft --loss gem_ls` (the activation hook) with ZeRO-2: per-step loss and grad norm equal
  the single process; EMO's frozen cost embedding is the whole pre-trained head on every rank. Each DeepSpeed stage
  runs one command line and one loss: the trainer's path is the same for every loss, and every loss's gradients
  under ZeRO-3 with the head partitioned are checked in tests/distributed/test_zero3_fused.py;
* `asft` under ZeRO-3 anchored to another checkpoint: the reference is partitioned like the policy on every rank,
  and loss, grad norm and KL equal the single process;
* `emo_cost_embedding: live` under ZeRO-3 is refused before training;
* `trl sft --multi_gpu` (DDP): loss, grad norm and the trained weights equal the single process (the reduction's
  `x num_processes` factor under `average_tokens_across_devices`).

Every rank must end normally: exit status 0 (the launcher's is 0 only if all ranks' are), no abort on stderr, and
every rank reports no communication thread left at its exit (`trl_ext.teardown`). The command line's process is forked
from a warm interpreter (tests/helpers/warm_cli.py); the ranks `accelerate launch` starts are fresh interpreters.

DeepSpeed's first run compiles a small shared-memory op (~30 s; cached per venv under ~/.cache/distmatch-tests).
Marked `multiprocess`: `make test SKIP_MULTIPROCESS=1` (or `pytest -m 'not multiprocess'`) skips them locally.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers.cli import assert_every_rank_ended_cleanly, free_port, run_cli, tail
from tests.helpers.env import extensions_dir
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl
from tests.helpers.warm_cli import WarmCli

pytestmark = pytest.mark.slow  # multiprocess: tests/placement.py

STEPS = 2
LOCAL_BATCH = 4
TIMEOUT = 600


def _ds_config(path: Path, stage: int) -> Path:
    zero: dict = {"stage": stage}
    if stage == 3:  # a tiny model's parameters are all below the default threshold: keep them partitioned
        zero["stage3_param_persistence_threshold"] = 0
    # No `train_batch_size`: DeepSpeed derives it from the micro-batch, accumulation and world size.
    config = {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("distributed")
    (base / "data").mkdir()
    write_sft_jsonl(base / "data" / "train.jsonl", n=48)
    return {
        "root": base,
        "model": build_tiny_llama(base / "model"),
        "data": base / "data",
        "zero2": _ds_config(base / "ds_zero2.json", 2),
        "zero3": _ds_config(base / "ds_zero3.json", 3),
    }


def _args(assets: dict[str, Path], out: Path, batch: int) -> list[str]:
    return [
        "--model_name_or_path",
        str(assets["model"]),
        "--dataset_name",
        str(assets["data"]),
        "--output_dir",
        str(out),
        "--max_steps",
        str(STEPS),
        "--per_device_train_batch_size",
        str(batch),
        "--max_length",
        "64",
        "--optim",
        "sgd",
        "--learning_rate",
        "0.5",
        "--lr_scheduler_type",
        "constant",
        "--max_grad_norm",
        "1e9",  # never clips, but the grad norm is computed and logged
        "--bf16",
        "false",
        "--logging_steps",
        "1",
        "--save_strategy",
        "steps",
        "--save_steps",
        str(STEPS),
        "--save_only_model",
        "--report_to",
        "none",
        "--use_cpu",
        "--seed",
        "0",
        "--disable_tqdm",
        "true",
    ]


def _logs(out: Path) -> list[dict]:
    (state,) = out.glob("checkpoint-*/trainer_state.json")
    logs = [entry for entry in json.loads(state.read_text())["log_history"] if "loss" in entry]
    assert len(logs) == STEPS, logs
    return logs


def _train(
    cli: WarmCli,
    command: list,
    assets: dict[str, Path],
    name: str,
    loss: str,
    batch: int,
    ranks: int = 2,
    **env: str,
) -> dict:
    """The launch's first process (the command line, which starts `accelerate launch`) is forked from the warm
    interpreter (tests/helpers/warm_cli.py); the ranks it starts are fresh interpreters, as always."""
    out = assets["root"] / name
    debug = assets["root"] / f"{name}-cost"
    result = cli.run(
        [*command, "--loss", loss, *_args(assets, out, batch)],
        assets["root"],
        timeout=TIMEOUT,
        DISTMATCH_DEBUG_COST_EMBEDDING=str(debug),
        TORCH_EXTENSIONS_DIR=extensions_dir(),
        **env,
    )
    assert_every_rank_ended_cleanly(result, ranks)
    return {"out": out, "logs": _logs(out), "cost": debug, "stderr": result.stderr}


@pytest.fixture(scope="module")
def single(assets, wheel_venv, warm_cli):
    """One process, 8 rows a step: the reference of every multi-process run (one per loss, shared)."""
    runs = {}

    def get(loss: str) -> dict:
        if loss not in runs:
            runs[loss] = _train(
                warm_cli,
                [wheel_venv.distmatch_trl, "sft"],
                assets,
                f"single-{loss}",
                loss,
                2 * LOCAL_BATCH,
                ranks=1,
            )
        return runs[loss]

    return get


def _deepspeed_launch(assets: dict[str, Path], stage: int, processes: int = 2) -> list[str]:
    # Not skipped when missing: DeepSpeed is in the dev extra, and a silently skipped test would test nothing.
    assert importlib.util.find_spec("deepspeed") is not None, "pip install 'distmatch[dev]' (deepspeed)"
    return [
        "--num_processes",
        str(processes),
        "--use_deepspeed",
        "--deepspeed_config_file",
        str(assets[f"zero{stage}"]),
        "--main_process_port",
        str(free_port()),
    ]


def _assert_same_steps(run: dict, reference: dict) -> None:
    for got, want in zip(run["logs"], reference["logs"]):
        assert got["step"] == want["step"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6), (got, want)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4), (got, want)
    # SGD at lr 0.5 moves the loss: step 2 checks the update of step 1, not only the forward
    assert reference["logs"][0]["loss"] != pytest.approx(reference["logs"][1]["loss"], rel=1e-4)


def _assert_cost_embedding_is_the_pretrained_head(run: dict, assets: dict[str, Path]) -> None:
    import torch
    from safetensors.torch import load_file

    head = load_file(assets["model"] / "model.safetensors")["lm_head.weight"]
    saved = sorted(run["cost"].glob("rank*.pt"))
    assert [p.name for p in saved] == ["rank0.pt", "rank1.pt"]
    for path in saved:
        cost = torch.load(path)
        assert cost.shape == head.shape  # whole, not a ZeRO-3 partition
        torch.testing.assert_close(cost, head.float(), rtol=0, atol=0)


def test_deepspeed_zero3_distmatch_trl(assets, single, wheel_venv, warm_cli):
    """`distmatch-trl sft --loss emo` under ZeRO-3 with the head partitioned: the same steps as one process, and the
    cost embedding is the whole pre-trained head on every rank (every loss's gradients under ZeRO-3:
    tests/distributed/test_zero3_fused.py)."""
    run = _train(
        warm_cli,
        [wheel_venv.distmatch_trl, "sft", *_deepspeed_launch(assets, 3)],
        assets,
        "zero3-emo",
        "emo",
        LOCAL_BATCH,
    )
    _assert_same_steps(run, single("emo"))
    _assert_cost_embedding_is_the_pretrained_head(run, assets)
    assert all("demd" in entry for entry in run["logs"])


def test_deepspeed_zero2_trl_sft_hook(assets, single, wheel_venv, warm_cli):
    """`trl sft --loss gem_ls` (the activation hook) under ZeRO-2: the same steps as one process."""
    command = [wheel_venv.trl, "sft", *_deepspeed_launch(assets, 2)]
    run = _train(warm_cli, command, assets, "zero2-gem_ls", "gem_ls", LOCAL_BATCH)
    _assert_same_steps(run, single("gem_ls"))


def test_deepspeed_zero3_refuses_a_live_cost_embedding(assets, wheel_venv):
    """The live head is read outside its forward, where ZeRO-3 keeps it partitioned: one clear error, no training."""
    out = assets["root"] / "zero3-live"
    command = [wheel_venv.distmatch_trl, "sft", *_deepspeed_launch(assets, 3, processes=1)]
    result = run_cli(
        [*command, "--loss", "emo", "--emo_cost_embedding", "live", *_args(assets, out, LOCAL_BATCH)],
        assets["root"],
        timeout=TIMEOUT,
        TORCH_EXTENSIONS_DIR=extensions_dir(),
    )
    assert result.returncode != 0
    assert "emo_cost_embedding='live' reads the LM head outside its forward" in result.stderr, tail(result)
    assert "use emo_cost_embedding='frozen'" in result.stderr
    assert not list(out.glob("checkpoint-*"))


def test_ddp_trl_sft_matches_one_process(assets, single, wheel_venv, warm_cli):
    """`trl sft --multi_gpu` (DDP over gloo): loss, grad norm and trained weights equal one process at 2 x batch."""
    import torch
    from safetensors.torch import load_file

    launch = ["--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port())]
    run = _train(warm_cli, [wheel_venv.trl, "sft", *launch], assets, "ddp-gem_ls", "gem_ls", LOCAL_BATCH)
    reference = single("gem_ls")
    _assert_same_steps(run, reference)
    trained = load_file(next(run["out"].glob("checkpoint-*/model.safetensors")))
    expected = load_file(next(reference["out"].glob("checkpoint-*/model.safetensors")))
    start = load_file(assets["model"] / "model.safetensors")
    assert trained.keys() == expected.keys()
    moved = 0.0
    for name, weight in expected.items():
        torch.testing.assert_close(trained[name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, (weight - start[name]).abs().max().item())
    assert moved > 1e-3  # the weights did move


def test_deepspeed_zero3_anchored_loss_matches_one_process(assets, wheel_venv, warm_cli):
    """`asft` under ZeRO-3 with the head partitioned, anchored to another checkpoint (so the KL is far from 0 from
    step 1): the reference is loaded partitioned like the policy and gathered in its forward (a partition alone
    would fail or differ); loss, grad norm and KL equal one process."""
    other = build_tiny_llama(assets["root"] / "other-reference", seed=1)
    flags = ["--anchor_reference", str(other), "--anchor_kl_weight", "1.0"]
    run = _train(
        warm_cli,
        [wheel_venv.distmatch_trl, "sft", *_deepspeed_launch(assets, 3), *flags],
        assets,
        "zero3-asft",
        "asft",
        LOCAL_BATCH,
        DISTMATCH_DEBUG_REFERENCE=str(assets["root"] / "zero3-asft-reference"),
    )
    one = _train(
        warm_cli,
        [wheel_venv.distmatch_trl, "sft", *flags],
        assets,
        "single-asft",
        "asft",
        2 * LOCAL_BATCH,
        ranks=1,
    )
    _assert_same_steps(run, one)
    for got, want in zip(run["logs"], one["logs"]):
        assert want["kl"] > 1e-3 and got["kl"] == pytest.approx(want["kl"], rel=1e-5), (got, want)
    held = [
        json.loads((assets["root"] / "zero3-asft-reference" / f"rank{r}.json").read_text()) for r in (0, 1)
    ]
    from safetensors.torch import load_file

    whole = sum(p.numel() for p in load_file(other / "model.safetensors").values())
    for record in held:  # an engine on each rank, every parameter partitioned: about half of the weights each
        assert record["engine"] and record["partitioned"] == record["parameters"] > 0, record
        assert record["local_elements"] < 0.6 * whole, (record, whole)
