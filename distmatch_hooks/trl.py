"""Activation hook that makes the literal `trl sft --loss emo ...` train with distmatch.

The distmatch wheel installs `distmatch_hooks.trl.pth` at the root of site-packages; Python runs its single line,
`import distmatch_hooks.trl`, at every interpreter start. So this module is cheap and inert: it imports nothing
beyond `os`/`sys` (and the shared `distmatch_hooks._common`), looks only at `sys.argv` (and, for
`--config file.yaml`, at that file), and never raises at interpreter start.

It activates only when both hold:

1. the process is TRL's SFT command, either the `trl` console script with the subcommand `sft` (`trl sft ...`)
   or TRL's SFT script as started by `accelerate launch` (`python .../trl/scripts/sft.py ...`, the process that
   trains);
2. a distmatch option is used (or `-h` / `--help` is asked for, so that the help lists them): a flag `--loss`,
   `--gem_beta`, `--emo_...`, `--ce_entropy_coef`, `--tailr_gamma`, `--mixce_gamma`, `--eaft_alpha`, `--eaft_k`,
   `--allow_loss_change` (also spelled with dashes, or as `--flag=value`), or a top-level key of those names in the
   `--config` YAML; or `--resume_from_checkpoint DIR` (flag or key) names a folder holding a distmatch run record
   (`DIR/distmatch.json`), so that a resume without `--loss` continues with the recorded loss; or a new run's
   `--output_dir` holds a distmatch run (a record in it or in a `checkpoint-N`), which a plain run would overwrite
   while the records still name the distmatch loss: it is refused unless `--overwrite_run` (then the old
   checkpoints and record are removed first).

Then it puts a `sys.meta_path` finder first that waits for the `trl` package to be imported and, right after,
sets `trl.SFTConfig = trl_ext.config.DistMatchSFTConfig` and `trl.SFTTrainer = trl_ext.trainer.DistMatchSFTTrainer`
(both imported at that moment). TRL's CLI builds its parser from `trl.SFTConfig` and its SFT script trains with
`trl.SFTTrainer`, both looked up when used, so the distmatch options are parsed, validated and trained with.
It also runs the checks that need several of TRL's parsed dataclasses right after TRL's parser
(`trl_ext.cli.check_parsed`), and prints a refused setting as one `error: ...` line (no traceback, exit status
2). If distmatch
cannot be imported then, the run stops with one line saying so: TRL never trains its own loss instead.

`DISTMATCH_TRL_HOOK=0` (or false/no/off) disables it; `DISTMATCH_DEBUG=1` prints its decisions to stderr.
The hook-free route is the `distmatch-trl sft ...` console script.
"""

from __future__ import annotations

import sys

from distmatch.checkpoints import RECORD_FILE, has_record, run_records
from distmatch.errors import (
    CONFIG_ERROR_STATUS,
    DistMatchConfigError,
    print_config_errors_as_one_line,
    stderr_line,
)
from distmatch_hooks._common import (
    LOSS_OPTION_NAMES,
    LOSS_OPTION_PREFIXES,
    RUN_OPTION_NAMES,
    PatchAfterImport,
    debug,
    switched_on,
)

#: Our `SFTConfig` fields.
OPTION_NAMES = ("loss", *RUN_OPTION_NAMES, *LOSS_OPTION_NAMES)
RESUME_OPTION = "resume_from_checkpoint"
OPTION_PREFIXES = LOSS_OPTION_PREFIXES

ENV_SWITCH = "DISTMATCH_TRL_HOOK"
_TOP_LEVEL_KEY = r"""^(["']?)([A-Za-z_][\w-]*)\1\s*:(\s|$)"""  # a block mapping's unindented `key:`


def _debug(message: str) -> None:
    debug("distmatch_hooks.trl", message)


def _is_our_key(name: str) -> bool:
    name = name.replace("-", "_")
    return name in OPTION_NAMES or name.startswith(OPTION_PREFIXES)


def sft_arguments(argv: list[str]) -> list[str] | None:
    """The arguments of TRL's SFT command if `argv` (a `sys.argv`) is `trl sft ...` or TRL's SFT script."""
    if not argv:
        return None
    program = argv[0].replace("\\", "/")
    name = program.rsplit("/", 1)[-1].lower()
    for suffix in (".exe", "-script.py"):
        name = name.removesuffix(suffix)
    # The `trl` console script: its own parser has only -h, so the subcommand comes first.
    if name == "trl" and len(argv) > 1 and argv[1] == "sft":
        return argv[2:]
    if program.endswith("/trl/scripts/sft.py") or program == "trl/scripts/sft.py":  # under accelerate launch
        return argv[1:]
    return None


def _config_mapping(path: str) -> dict[str, object]:
    """The top-level keys of a YAML mapping (the keys TRL's `--config` turns into option defaults) and their values
    (without PyYAML: the text after the colon, for block-style mappings)."""
    with open(path, encoding="utf-8") as stream:
        text = stream.read()
    try:
        import yaml  # TRL needs PyYAML; it may sit in a site directory not on sys.path yet at interpreter start
    except ImportError:
        import re  # block-style mappings (what TRL configs are) without a YAML parser

        matches = [(m, line) for line in text.splitlines() if (m := re.compile(_TOP_LEVEL_KEY).match(line))]
        return {m.group(2): line[m.end() :].strip().strip("'\"") for m, line in matches}
    config = yaml.safe_load(text)
    return {str(key): value for key, value in config.items()} if isinstance(config, dict) else {}


def _config_keys(path: str) -> list[str]:
    return list(_config_mapping(path))


def option_value(args: list[str], option: str) -> object:
    """The value of TRL option `option` in `args` (a flag wins over the `--config` YAML key), or None."""
    from_flag: object = None
    from_config: object = None
    flags = ("--" + option, "--" + option.replace("_", "-"))
    for i, arg in enumerate(args):
        if arg == "--":
            break
        name, equals, inline = arg.partition("=")
        if arg == "--config" and i + 1 < len(args):
            try:
                from_config = _config_mapping(args[i + 1]).get(option)
            except Exception as err:  # TRL reports an unreadable config itself
                _debug(f"could not read --config {args[i + 1]!r}: {err!r}")
        elif name in flags:
            from_flag = inline if equals else (args[i + 1] if i + 1 < len(args) else None)
    return from_flag if from_flag is not None else from_config


def resume_checkpoint(args: list[str]) -> object:
    """The `--resume_from_checkpoint` value in `args` (a flag wins over the `--config` YAML key), or None."""
    return option_value(args, RESUME_OPTION)


def distmatch_options(args: list[str]) -> list[str]:
    """The distmatch options used in `args` (flags, and top-level keys of a `--config` YAML, as TRL reads it)."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith("--") and _is_our_key(arg[2:].split("=", 1)[0]):
            found.append(arg.split("=", 1)[0])
        elif arg == "--config" and i + 1 < len(args):  # TRL reads exactly `--config PATH`
            try:
                found += [
                    f"{key} (in {args[i + 1]})" for key in _config_keys(args[i + 1]) if _is_our_key(key)
                ]
            except Exception as err:  # TRL reports an unreadable config itself
                _debug(f"could not read --config {args[i + 1]!r}: {err!r}")
    return found


def enabled() -> bool:
    return switched_on(ENV_SWITCH)


def should_activate(argv: list[str]) -> list[str]:
    """Why the hook should act for this `sys.argv` (the options found), or an empty list."""
    args = sft_arguments(argv)
    if args is None:
        return []
    found = distmatch_options(args)
    checkpoint = resume_checkpoint(args)
    # resuming a distmatch run: its loss is checked (or continued) even without --loss
    if has_record(checkpoint):
        found.append(f"--{RESUME_OPTION} (a distmatch checkpoint: {checkpoint}/{RECORD_FILE})")
    elif (
        not found
        and checkpoint in (None, "", False)
        and (records := run_records(option_value(args, "output_dir")))
    ):
        # a plain run into a distmatch run's folder would write over its checkpoints while their records still
        # name the distmatch loss: refused like a distmatch run's (`trl_ext.resume.check_new_run`)
        found.append(f"--output_dir (holds a distmatch run: {records[0]})")
    if not found and any(
        arg in ("-h", "--help") for arg in args[: args.index("--") if "--" in args else None]
    ):
        found = ["--help"]  # `trl sft --help` lists the distmatch options too
    return found


def patch_trl() -> None:
    """Point `trl.SFTConfig` / `trl.SFTTrainer` at the distmatch classes (called once `trl` is imported)."""
    trl = sys.modules["trl"]
    # Imported first: these modules subclass the original `trl.SFTConfig` / `trl.SFTTrainer`.
    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.trainer import DistMatchSFTTrainer

    trl.SFTConfig = DistMatchSFTConfig
    trl.SFTTrainer = DistMatchSFTTrainer
    _check_after_parsing(trl.TrlParser)
    print_config_errors_as_one_line()  # a refused setting: one line naming it, exit status 2, no traceback
    _debug("trl.SFTConfig -> DistMatchSFTConfig, trl.SFTTrainer -> DistMatchSFTTrainer")


def _check_after_parsing(parser_class: type) -> None:
    """Run `trl_ext.cli.check_parsed` on what TRL's parser returns (checks across its dataclasses: a resume's
    recorded loss, EMO's cost-embedding vocabulary against the model's), in the `trl sft` process, before anything is
    launched. A refused setting ends the process as a command-line error: one `error: ...` line, exit status 2."""
    original = parser_class.parse_args_and_config
    if getattr(original, "_distmatch_wrapped", False):
        return
    import functools

    from trl_ext.cli import check_parsed

    @functools.wraps(original)
    def parse_args_and_config(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            result = original(self, *args, **kwargs)
            check_parsed(result if isinstance(result, (tuple, list)) else [result], hold=True)
        except DistMatchConfigError as err:
            stderr_line(f"error: {err}")
            raise SystemExit(CONFIG_ERROR_STATUS) from None
        return result

    parse_args_and_config._distmatch_wrapped = True  # type: ignore[attr-defined]
    parser_class.parse_args_and_config = parse_args_and_config


def _patch_loudly(module: object = None) -> None:
    try:
        patch_trl()
    except Exception as err:  # the user asked for a distmatch option: never let TRL train without it
        raise SystemExit(
            f"error: {', '.join(should_activate(sys.argv)) or 'a distmatch option'} asks for a distmatch loss, but "
            f"the distmatch TRL integration failed to import ({type(err).__name__}: {err}). Reinstall distmatch "
            "(pip install -U distmatch) or remove the distmatch options."
        ) from None


finder = PatchAfterImport("trl", _patch_loudly, source="distmatch_hooks.trl")


def _activate() -> None:
    if not enabled():
        return
    reasons = should_activate(sys.argv)
    if not reasons:
        return
    if "trl" in sys.modules:  # too late for the finder (not the case at interpreter start)
        _patch_loudly()
        return
    _debug(f"active in {sys.argv[0]} (options: {', '.join(reasons)})")
    finder.install()


try:
    _activate()
except Exception as _err:  # never break interpreter start
    _debug(f"disabled by an error: {_err!r}")
