"""``python -m project <command>``: the table of commands, and the rule for errors.

Nothing else imports this file. A command is a function ``main(argv)`` that takes the command's own options and
returns its result. The core's are in ``COMMANDS``; each feature (a subpackage with a ``main`` in its
``__init__.py``) adds one named after its folder, described by its docstring's first line: remove the folder
and the command is gone. Nothing heavy is imported before the command is known, so ``--help`` and a mistyped
command answer at once.

Errors: a command raises ``UserError`` (``errors.py``) for what the user can fix, with a message naming the file,
key or value and the remedy; it is printed as one line (exit 1). Anything else is a bug and keeps its traceback.
"""

import difflib
import importlib
import os
import sys
from typing import Any

from project.console import prog_name, skip_teardown
from project.errors import UserError
from project.hooks import HasCommand, features

# command: (module of this package, its function, one line for the overview)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fit": ("cli", "fit", "Train (the default recipe, configs/default.yaml, unless --config says otherwise)"),
    "validate": ("cli", "validate", "Run the validation split on a checkpoint"),
    "test": ("cli", "test", "Run the test split on a checkpoint"),
    "predict": ("cli", "predict", "Write predictions (CSV) for a split or a folder of your own images"),
}
PACKAGE = __package__ or "project"  # the package_name of a copy


def commands() -> dict[str, tuple[str, str, str]]:
    """The core's commands, then those of the features present (``hooks.HasCommand``)."""
    found = dict(COMMANDS)
    for feature in features():
        if isinstance(feature, HasCommand):
            name = feature.__name__.rpartition(".")[2]
            found[name] = (name, "main", (feature.__doc__ or "").strip().split("\n")[0].rstrip("."))
    return found


def overview(prog: str, listed: dict[str, tuple[str, str, str]]) -> str:
    """The list of commands that ``python -m project`` and ``--help`` print."""
    width = max(map(len, listed))
    lines = [f"usage: {prog} <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, _, summary) in listed.items()]
    lines += ["", f"`{prog} <command> --help` lists a command's options, e.g. `{prog} fit --help`."]
    return "\n".join(lines)


def cli_main(args: list[str] | None = None) -> Any:
    """Run the command in ``args`` (``sys.argv[1:]`` when ``None``) in this process and return its result (for
    fit/validate/test/predict the LightningCLI: ``cli.trainer``, ``cli.model``, ``cli.datamodule``)."""
    argv = sys.argv[1:] if args is None else list(args)
    prog, listed = prog_name(), commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(overview(prog, listed))
        raise SystemExit(0 if argv else 2)
    if argv[0] not in listed:
        close = difflib.get_close_matches(argv[0], listed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"{overview(prog, listed)}\n\n{prog}: error: unknown command {argv[0]!r}.{hint}", file=sys.stderr)
        raise SystemExit(2)
    module, function, _ = listed[argv[0]]
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), function)(argv[1:])


def main() -> None:
    """Entry point of ``python -m project`` and the console script: a known error is one line."""
    try:
        cli_main()
        skip_teardown()
    except UserError as exc:
        if os.environ.get("PROJECT_TRACEBACK"):  # the traceback adds nothing for the user, but may for a bug report
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
