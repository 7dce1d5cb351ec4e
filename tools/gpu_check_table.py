"""The GPU check's steps and training runs: one entry each (docs/benchmarks.md "The GPU check").

Adding a step is one `Step` in `STEPS` (its name, its seconds on the GPU and in the CPU dry run, what it runs, how
its verdict is read, its details and report in the summary); adding a training run is one `Run` in `RUNS` (its `trl
sft` arguments and settings). tools/gpu_check_plan.py says what each field means.
"""

from __future__ import annotations

from gpu_check_axolotl import axolotl_note, axolotl_report, run_axolotl
from gpu_check_lm_eval import lm_eval_note, lm_eval_report, lm_eval_verdict, run_lm_eval
from gpu_check_plan import Goal, Run, Step, by_name
from gpu_check_steps import (
    run_bench,
    run_build,
    run_install,
    run_memory,
    run_parity,
    run_train,
    run_triton,
)
from gpu_check_summary import (
    benchmark_report,
    install_note,
    parity_note,
    rows_note,
    train_note,
    train_report,
    triton_note,
)
from gpu_check_verdicts import (
    benchmark_verdict,
    install_verdict,
    parity_verdict,
    train_part_verdict,
    triton_verdict,
)

# In this order: the first command on a GPU answers the open questions first (the GPU goals: Liger's memory and time
# at Llama-3-8B's head against our settings and defaults, then end to end through `trl sft`, then Axolotl, then
# lm-eval), then the Triton tests, the packing parity and the loss benchmark (it takes what is left of the budget).
# Seconds per process, on the GPU (the whole run fits one 9-minute command; `--budget` caps the sum, and a step with
# no time left reads `skipped`) and on the CPU. Measured on an H200 (2026-11-27, benchmarks/results/gpu-2026-11-27):
# triton 28 s (before the bf16-chunk variants), build 25-29 s (cold imports; 769 M parameters), parity 26 s, a `trl
# sft` run 48-55 s at 4 layers (36-42 s of it before the first step: two interpreters' imports, data, model; 16 layers
# not yet measured), a benchmark case 10-30 s.
STEPS: tuple[Step, ...] = (
    Step(
        "install",
        gpu_s=40,
        cpu_s=60,
        run=run_install,
        verdict=lambda plan, device: install_verdict(plan),
        note=install_note,
        when="always",
    ),
    Step(
        "memory",
        gpu_s=150,
        cpu_s=90,
        run=run_memory,
        verdict=lambda part, device: benchmark_verdict(part["status"], part["rows"], part["errors"]),
        note=rows_note,
        report=benchmark_report("Memory settings (benchmarks/bench_fused_memory.py)"),
    ),
    Step("build", gpu_s=60, cpu_s=60, run=run_build, when="needed"),
    Step(
        "train",
        gpu_s=70,
        cpu_s=120,
        run=run_train,
        verdict=lambda part, device: train_part_verdict(part["runs"]),
        note=train_note,
        report=train_report,
        needs=("build",),
    ),
    Step(
        "axolotl",
        gpu_s=80,
        cpu_s=180,
        run=run_axolotl,
        verdict=lambda part, device: train_part_verdict(part["runs"]),
        note=axolotl_note,
        report=axolotl_report,
        needs=("build",),
    ),
    Step(
        "lm_eval",
        gpu_s=90,
        cpu_s=180,
        run=run_lm_eval,
        verdict=lambda part, device: lm_eval_verdict(part),
        note=lm_eval_note,
        report=lm_eval_report,
    ),
    Step(
        "triton",
        gpu_s=80,
        cpu_s=120,
        run=run_triton,
        verdict=lambda part, device: triton_verdict(part["status"], part["counts"], part["skips"], device),
        note=triton_note,
    ),
    Step(
        "parity",
        gpu_s=40,
        cpu_s=90,
        run=run_parity,
        verdict=lambda part, device: parity_verdict(part["status"], part),
        note=parity_note,
        needs=("build",),
    ),
    Step(
        "bench",
        gpu_s=150,
        cpu_s=120,
        run=run_bench,
        verdict=lambda part, device: benchmark_verdict(part["status"], part["rows"], part["errors"]),
        note=rows_note,
        report=benchmark_report("Loss benchmark (benchmarks/bench_losses.py)"),
    ),
)

# The fused path's memory settings (docs/losses.md "Chunk logits" and "Weight-gradient accumulator"), as the `trl
# sft` options every loss takes ...
LOW_MEMORY = {"loss_chunk_logits": "input", "loss_grad_weight_accum": "weight", "loss_chunk_memory_mb": 64}
# ... and with d weight by vocabulary tile in the backward (docs/losses.md "Liger's memory at our speed"), in 60 MiB:
# at Llama-3-8B's head below the 63 MiB Liger's fused linear CE takes beside the gradients.
TILES = {**LOW_MEMORY, "loss_grad_weight_accum": "tiles", "loss_chunk_memory_mb": 60}

# LoRA, r 16 (alpha 32, no dropout) on every linear layer of the decoder, the same adapter for ours and TRL's runs.
LORA = (
    "--use_peft", "true", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.0",
    "--lora_target_modules", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)  # fmt: skip
LIGER = ("--use_liger_kernel", "true")
NEEDS_LIGER = ("liger_kernel", "liger-kernel")
# GPU goal 2 (docs/benchmarks.md), against TRL with `--use_liger_kernel` (the bar users who care about speed train
# with): `ce` at least 1.05x its tokens/s at no more peak memory, `gem_ls` at least 1.0x, `emo` at least 0.85x; the
# LoRA runs against TRL+Liger with the same adapter, the same ratios; `asft` measured and reported.
VS_LIGER, VS_LIGER_LORA = "trl_liger", "trl_liger_lora"

# On the GPU the default runs answer goal 2, TRL+Liger first (the ratios' baseline), then the goals in order of
# the open questions; TRL's default loss (`trl`, the `x TRL default` columns) is on request. The dry run's default
# runs are TRL's trainer (the ratios' baseline), ours through the `trl sft --loss` hook, and the same with the LoRA
# adapter: the other losses take the same path at these shapes; Liger's kernels need a GPU, and so do the
# low-memory and tiles settings (the Triton kernel's: refused on a CPU before the model loads).
RUNS: dict[str, Run] = by_name(
    [
        Run("trl", trainer="SFTTrainer", cpu_default=True),
        Run("trl_liger", LIGER, trainer="SFTTrainer", needs=NEEDS_LIGER, gpu_default=True),
        Run("ce", ("--loss", "ce"), gpu_default=True, goal=Goal(VS_LIGER, speed=1.05, memory=1.0)),
        Run(
            "gem_ls", ("--loss", "gem_ls"), gpu_default=True, cpu_default=True, goal=Goal(VS_LIGER, speed=1.0)
        ),
        Run("emo", ("--loss", "emo"), gpu_default=True, goal=Goal(VS_LIGER, speed=0.85)),
        Run("trl_liger_lora", (*LIGER, *LORA), trainer="SFTTrainer", needs=NEEDS_LIGER, gpu_default=True),
        Run("ce_lora", ("--loss", "ce", *LORA), gpu_default=True, goal=Goal(VS_LIGER_LORA, 1.05, 1.0)),
        Run(
            "gem_ls_lora",
            ("--loss", "gem_ls", *LORA),
            gpu_default=True,
            cpu_default=True,
            goal=Goal(VS_LIGER_LORA, speed=1.0),
        ),
        Run("asft", ("--loss", "asft"), gpu_default=True, goal=Goal(VS_LIGER)),
        Run("gem_ls_lowmem", ("--loss", "gem_ls"), LOW_MEMORY),
        Run("emo_lowmem", ("--loss", "emo"), LOW_MEMORY),
        Run("gem_ls_tiles", ("--loss", "gem_ls"), TILES),
        Run("emo_tiles", ("--loss", "emo"), TILES),
    ]
)
