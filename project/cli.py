"""The command line: ``python -m project <command>``, one hop from the command to the code that runs it.

Every command has one entry contract: a function ``main(argv)`` that takes the command's own options and
returns its result. The core's are fit, validate, test and predict (``project/lightning_cli.py``), cv and
env. Every other command is a feature: a subpackage of ``project/`` with a ``main(argv)`` in its
``__init__.py``, named after the folder and described by its docstring's first line. Remove the folder and
the command is gone; add one and it is listed. Nothing heavy is imported before the command is known, so
``--help`` and a mistyped command answer at once instead of after seconds of torch and Lightning imports.

The user-error policy is here too: a command raises ``UserError`` (``errors.py``) or a subclass for what the user
can fix, with a message that names the file, key or value and the remedy; ``main`` prints it as one line and exits
1. Anything else is a bug and keeps its traceback.
"""

import argparse
import difflib
import gc
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from project.errors import UserError

# The core's commands: command -> (its entry, ``module.function`` in this package; one line for the overview).
CORE_COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("lightning_cli.fit", "Train (the default recipe, configs/default.yaml, unless --config says otherwise)"),
    "validate": ("lightning_cli.validate", "Run the validation split on a checkpoint"),
    "test": ("lightning_cli.test", "Run the test split on a checkpoint"),
    "predict": ("lightning_cli.predict", "Write predictions (CSV) for a split or a folder of your own images"),
    "cv": ("cv.main", "k-fold cross-validation: one fit per fold, then each fold's best val/acc, their mean and std"),
    "env": ("env.main", "Versions, devices, bf16/TF32 support and the precision picked on this machine"),
}


def feature_commands() -> dict[str, tuple[str, str]]:
    """The commands of the features present: each subpackage whose ``__init__.py`` has a ``main``."""
    found = {}
    for init in sorted(Path(__file__).parent.glob("*/__init__.py")):
        module = importlib.import_module(f"{__package__}.{init.parent.name}")  # the __init__ only: no heavy import
        if callable(getattr(module, "main", None)):
            summary = (module.__doc__ or "").strip().split("\n")[0].rstrip(".")
            found[init.parent.name] = (f"{init.parent.name}.main", summary)
    return found


def commands() -> dict[str, tuple[str, str]]:
    """Every command: the core's, then the features'."""
    return {**CORE_COMMANDS, **feature_commands()}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` of the template's own commands: the module docstring as written, and each option's default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, argparse.SUPPRESS) and not action.required and action.option_strings
        return f"{text} (default: %(default)s)" if shown and "%(default)" not in text else text


def overview(prog: str, listed: dict[str, tuple[str, str]]) -> str:
    """The list of commands that ``python -m project`` and ``--help`` print."""
    width = max(map(len, listed))
    lines = [f"usage: {prog} <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in listed.items()]
    lines += ["", f"`{prog} <command> --help` lists a command's options, e.g. `{prog} fit --help`."]
    return "\n".join(lines)


def prog_name() -> str:
    """How the user called us: ``python -m project`` or the console script's name."""
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "python -m " + (__package__ or "project") if script in ("__main__.py", "-c", "") else script


def cli_main(args: list[str] | None = None) -> Any:
    """Run the command in ``args`` (``sys.argv[1:]`` when ``None``), in this process.

    Returns:
        For fit/validate/test/predict the LightningCLI (``cli.trainer``, ``cli.model``, ``cli.datamodule``);
        for the other commands their report.
    """
    argv = sys.argv[1:] if args is None else list(args)
    prog = prog_name()
    listed = commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(overview(prog, listed))
        raise SystemExit(0 if argv else 2)
    command = argv[0]
    if command not in listed:
        close = difflib.get_close_matches(command, listed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"{overview(prog, listed)}\n\n{prog}: error: unknown command {command!r}.{hint}", file=sys.stderr)
        raise SystemExit(2)
    module, _, function = listed[command][0].rpartition(".")
    entry = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    return entry(argv[1:])


def skip_teardown() -> None:
    """Let the process exit without freeing every object of torch, Lightning and their imports one by one.

    Python's exit collects and frees the whole heap, a second on a 2-core CPU (docs/benchmarks.md). Call it once
    the command is done and has closed its files
    (loggers, checkpoints): one last collection runs the finalizers of what is garbage by then, the rest is
    frozen and left to the operating system, which takes the memory back at once. atexit handlers still run.
    """
    gc.collect()
    gc.freeze()


def main() -> None:
    """Entry point of ``python -m project`` and the console script: a known error is one line."""
    try:
        cli_main()
        skip_teardown()
    except UserError as exc:
        # Data, checkpoint, export and numerical errors name the file or key and the remedy: the traceback adds
        # nothing. PROJECT_TRACEBACK=1 shows it anyway.
        if os.environ.get("PROJECT_TRACEBACK"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
