"""The demo's data and training: the bundled prompt/answer pairs as TRL's conversational prompt-completion dataset,
and one LoRA (or full) fine-tune per loss through `trl_ext.trainer.DistMatchSFTTrainer`, with the same seed, data
order, steps and hyper-parameters for every loss."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from demo_config import DemoConfig, DemoError, Log, progress_bar

from eval_tasks.samples import InputError, read_jsonl

# ---------------------------------------------------------------------------------------------------------
# Data


def read_records(path: Path) -> list[dict[str, Any]]:
    """The (prompt, completion) records of a JSONL file (`distmatch-eval`'s reader); errors name the line / record."""
    try:
        records = read_jsonl(path)
    except InputError as err:
        raise DemoError(str(err)) from None
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) and record[k].strip() for k in ("prompt", "completion")
        ):
            raise DemoError(
                f"{path}: record #{number}: expected an object with non-empty 'prompt' and 'completion'."
            )
    if not records:
        raise DemoError(f"{path}: no examples.")
    return records


def sft_dataset(records: Sequence[Mapping[str, Any]]) -> Any:
    """TRL's conversational prompt-completion format: the loss is on the completion (the answer) only."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "completion": [{"role": "assistant", "content": r["completion"]}],
            }
            for r in records
        ]
    )


# ---------------------------------------------------------------------------------------------------------
# 3. Training


def resolve_device(cfg: DemoConfig) -> str:
    import torch

    if cfg.device != "auto":
        return cfg.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_supports_bf16() -> bool:
    """AVX512-BF16 or AMX: bfloat16 matmuls are fast (oneDNN); without them bfloat16 is slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(cfg: DemoConfig, device: str) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_supports_bf16() else "float32"


def _lora_config(model: Any, cfg: DemoConfig) -> Any:
    import peft
    import torch

    names = set()
    layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in module_name:
            names.add(module_name.rsplit(".", 1)[-1])
    if not names:
        raise DemoError("LoRA: found no linear layers inside the model's decoder layers; use DEMO_LORA_R=0.")
    num_layers = len(layers) if layers is not None else model.config.num_hidden_layers
    top = cfg.lora_layers
    return peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=2 * cfg.lora_r,
        lora_dropout=0.0,
        target_modules=sorted(names),
        layers_to_transform=list(range(num_layers - top, num_layers)) if 0 < top < num_layers else None,
        task_type="CAUSAL_LM",
    )


def _trainer_progress(total: int, desc: str, enabled: bool) -> Any:
    from transformers import TrainerCallback

    class DemoProgress(TrainerCallback):
        """One bar per fine-tune, with the last logged loss / CE / entropy (instead of TRL's log lines)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar = progress_bar(total, desc, enabled, unit="step")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            shown = {k: logs[k] for k in ("loss", "ce", "entropy") if logs and isinstance(logs.get(k), float)}
            if shown:
                self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=False)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.close()

    return DemoProgress()


def no_checkpointing(config_class: type) -> dict[str, bool]:
    """Activation checkpointing off (TRL turns it on by default; it costs a recomputation and memory is no issue
    here). transformers >= 5.2x renamed `gradient_checkpointing` to `activation_checkpointing`."""
    names = {f.name for f in dataclasses.fields(config_class)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: False}


def train_one(
    loss: str, cfg: DemoConfig, model_dir: Path, records: Sequence[Mapping[str, Any]], run_dir: Path, log: Log
) -> tuple[Any, Any, dict[str, Any]]:
    """Fine-tune `model_dir` with `loss`; return (merged model in eval mode, tokenizer, training summary)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.trainer import DistMatchSFTTrainer

    device = resolve_device(cfg)
    dtype = compute_dtype(cfg, device)
    set_seed(cfg.seed)  # the same LoRA initialisation for every loss
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_config = _lora_config(model, cfg) if cfg.lora_r > 0 else None
    args = DistMatchSFTConfig(
        output_dir=str(run_dir / "trainer"),
        loss=loss,
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, round(0.1 * cfg.steps)),
        weight_decay=0.0,
        max_length=cfg.max_length,
        bf16=dtype == "bfloat16",
        use_cpu=device == "cpu",
        **no_checkpointing(DistMatchSFTConfig),
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = DistMatchSFTTrainer(
        model, args, train_dataset=sft_dataset(records), processing_class=tokenizer, peft_config=peft_config
    )
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_trainer_progress(cfg.steps, f"train {loss}", cfg.progress))
    started = time.time()
    trainer.train()
    seconds = time.time() - started
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer.state.save_to_json(str(run_dir / "trainer_state.json"))
    history = [h for h in trainer.state.log_history if "loss" in h]
    trained = trainer.model
    trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
    if peft_config is not None:
        trained.save_pretrained(run_dir / "adapter")
        trained = trained.merge_and_unload()
    shutil.rmtree(run_dir / "trainer", ignore_errors=True)
    trained.to(device).eval()
    first, last = (history[0], history[-1]) if history else ({}, {})
    summary = {
        "loss": loss,
        "train_seconds": seconds,
        "seconds_per_step": seconds / max(1, cfg.steps),
        "trainable_parameters": trainable,
        "parameters": sum(p.numel() for p in trained.parameters()),
        "first": {k: first.get(k) for k in ("loss", "ce", "entropy", "mean_token_accuracy")},
        "last": {k: last.get(k) for k in ("loss", "ce", "entropy", "mean_token_accuracy")},
        "train_tokens": last.get("num_tokens"),
    }
    log(
        f"train {loss}: {cfg.steps} steps in {seconds:.0f} s ({summary['seconds_per_step']:.1f} s/step); "
        f"last step CE {last.get('ce', float('nan')):.3f}, entropy {last.get('entropy', float('nan')):.3f}"
    )
    return trained, tokenizer, summary
