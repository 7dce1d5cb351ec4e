"""`distmatch-trl sft ...`: TRL's `trl sft` with the distmatch loss options, no activation hook needed.

Same flags, `--config file.yaml` and launch behaviour as `trl sft` (TRL 1.9 - 1.16): the arguments are parsed by
TRL's `TrlParser` over `(ScriptArguments, DistMatchSFTConfig, ModelConfig, DatasetMixtureConfig)`; whatever it does
not know (flags and YAML keys) goes to `accelerate launch`, which runs our training script
(`trl_ext/scripts/distmatch_sft.py`) in one process or several. That script parses again and trains through TRL's
own `trl.scripts.sft.main` with `DistMatchSFTTrainer` in place of `SFTTrainer`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What `distmatch-trl sft` imports: distmatch's own dependencies (pyproject.toml).
CORE_MODULES = ("torch", "transformers", "trl", "accelerate", "datasets")

#: The file `accelerate launch` runs (a file, not `-m`, so every accelerate launcher accepts it).
SFT_SCRIPT = Path(__file__).resolve().parent / "scripts" / "distmatch_sft.py"


def make_sft_parser(prog: str | None = None) -> Any:
    """TRL's SFT parser with `DistMatchSFTConfig` in place of `SFTConfig`."""
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

    from .config import DistMatchSFTConfig

    return TrlParser((ScriptArguments, DistMatchSFTConfig, ModelConfig, DatasetMixtureConfig), prog=prog)


def train_sft(script_args: Any, training_args: Any, model_args: Any, dataset_args: Any) -> None:
    """Run TRL's SFT script body (`trl.scripts.sft.main`) with `DistMatchSFTTrainer` as `trl.SFTTrainer`."""
    import trl
    from trl.scripts import sft as trl_sft

    from .trainer import DistMatchSFTTrainer

    previous = trl.SFTTrainer
    trl.SFTTrainer = DistMatchSFTTrainer  # `main` imports it from `trl` when called
    try:
        trl_sft.main(script_args, training_args, model_args, dataset_args)
    finally:
        trl.SFTTrainer = previous


def sft_worker(argv: Sequence[str] | None = None) -> None:
    """The training process (one per rank under `accelerate launch`).

    Unknown YAML keys are ignored here, as in TRL's script: they were `accelerate launch` options in the launcher.
    """
    parser = make_sft_parser()
    args = parser.parse_args_and_config(None if argv is None else list(argv), fail_with_unknown_args=False)
    train_sft(*args)


def check_parsed(parsed: Sequence[Any], *, hold: bool = False) -> None:
    """Checks that need TRL's parsed dataclasses, run right after parsing (before anything is launched or loaded):

    * no other run is writing the output folder (`trl_ext.output_lock`; only in the launcher or a single process;
      with `hold`, what the launchers ask for, the folder's lock is taken once the checks below pass and held for
      the training processes it starts);
    * `--resume_from_checkpoint DIR` is a checkpoint folder (not missing, not a model folder, not the output
      folder); a new run into an output folder holding another run's record is refused unless `--overwrite_run`
      (which removes that run's checkpoints);
    * resuming (`--resume_from_checkpoint DIR`) from a checkpoint whose run record (`DIR/distmatch.json`) names
      another loss or other options than asked for is refused (`trl_ext.resume`); without `--loss` the recorded loss
      is what the trainer will take, and what is checked below;
    * `--dataset_name` naming a local file is refused: TRL's `load_dataset(dataset_name)` takes a Hub id or a folder;
    * a cost-embedding model (EMO) must have the vocabulary of the model being trained (both read from
      `config.json`, no weights).
    """
    training = next((p for p in parsed if hasattr(p, "distmatch_loss")), None)
    if training is None:
        return
    from .options import DISTMATCH_LOSSES
    from .output_lock import check_output_dir_free, lock_output_dir

    # The launcher (or a single process; ranks would see rank 0's own lock) of a distmatch run or of a plain run
    # the hook caught: a live run's folder is refused first (its record is not another run's), and once every
    # check passed the lock is taken and held for the training processes it starts.
    locks = "RANK" not in os.environ and (training.loss is None or training.loss in DISTMATCH_LOSSES)
    if locks:
        check_output_dir_free(training.output_dir)
    _check_run(parsed, training)
    if hold and locks and training.output_dir is not None:
        lock_output_dir(training.output_dir, for_children=True)


def _check_run(parsed: Sequence[Any], training: Any) -> None:
    from .options import DISTMATCH_LOSSES
    from .resume import check_checkpoint_folder, check_new_run, checkpoint_folder, resolve_resume

    model = next((p for p in parsed if hasattr(p, "model_name_or_path")), None)
    loss, options = training.distmatch_loss, training.loss_options()
    check_checkpoint_folder(training.resume_from_checkpoint, training.output_dir)
    checkpoint = checkpoint_folder(training.resume_from_checkpoint, training.output_dir)
    check_new_run(training.output_dir, checkpoint, bool(getattr(training, "overwrite_run", False)))
    resume = resolve_resume(
        checkpoint,
        training.loss,
        options,
        allow_change=bool(training.allow_loss_change),
    )
    if resume is not None:
        loss, options = resume.loss, resume.options
    if loss not in DISTMATCH_LOSSES:
        return
    _check_dataset_name(parsed)
    if model is None:
        return
    from .cost_embedding import check_configured

    check_configured(loss, options, model.model_name_or_path)


def _check_dataset_name(parsed: Sequence[Any]) -> None:
    script = next((p for p in parsed if hasattr(p, "dataset_name")), None)
    mixture = next((p for p in parsed if hasattr(p, "datasets")), None)
    name = getattr(script, "dataset_name", None)
    if not name or getattr(mixture, "datasets", None) or not os.path.isfile(name):
        return
    from distmatch.errors import DistMatchConfigError

    raise DistMatchConfigError(
        f"dataset_name={name!r} is a file: TRL loads it with datasets.load_dataset, which takes a Hub id or a folder "
        f"of data files. Give the folder holding it ({os.path.dirname(name) or '.'}, with no other JSON/CSV files "
        "such as a model's), or list the file under `datasets:` with `data_files:` in a --config YAML."
    )


def _remove_in_order(items: Sequence[str], removed: Sequence[str]) -> list[str]:
    """`items` without `removed`, an ordered subsequence of it (each element matched once, left to right)."""
    kept, position = [], 0
    for item in items:
        if position < len(removed) and item == removed[position]:
            position += 1
        else:
            kept.append(item)
    return kept


def launch_sft(argv: Sequence[str], prog: str = "distmatch-trl sft") -> int:
    """Parse like `trl sft`, then start the training script under `accelerate launch` with the rest."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    argv = list(argv)
    parser = make_sft_parser(prog=prog)
    # Exits on -h / --help and on invalid values (e.g. `--loss bogus` lists the valid losses).
    *dataclasses, config_unknown, cli_unknown = parser.parse_args_and_config(
        argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    check_parsed(dataclasses, hold=True)  # before anything is launched or loaded
    launch_args = resolve_accelerate_config_argument(config_unknown + cli_unknown)
    script_args = _remove_in_order(argv, cli_unknown)
    launch_command(launch_command_parser().parse_args([*launch_args, str(SFT_SCRIPT), *script_args]))
    return 0


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distmatch-trl",
        allow_abbrev=False,
        description="TRL's command line with the distmatch losses (EMO, GEM, baselines), without the `trl sft` "
        "activation hook. `distmatch-trl sft --help` lists every option.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{sft}")
    commands.add_parser(
        "sft",
        add_help=False,
        help="like `trl sft`, plus --loss {emo,gem_linear,gem_ls,...}, --gem_beta, --emo_cost_embedding, ...",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _top_parser()
    args, _ = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from distmatch.errors import DistMatchConfigError
    from distmatch.optional import require

    try:  # one line naming a missing dependency (e.g. after pip install --no-deps), not a traceback
        for module in CORE_MODULES:
            require(module, extra=None, feature="distmatch-trl")
    except ImportError as err:
        print(f"distmatch-trl: error: {err}", file=sys.stderr)
        return 2
    try:
        return launch_sft(argv[argv.index(args.command) + 1 :])
    except DistMatchConfigError as err:  # a refused setting: one line naming it, no traceback
        print(f"distmatch-trl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
