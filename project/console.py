"""The console conventions of every command: ``--help`` with defaults, the program's name, a fast exit.

Light on purpose (no torch, no Lightning): ``__main__.py`` and each feature's ``--help`` answer at once.
"""

import argparse
import gc
import sys
from pathlib import Path


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` of the template's own commands: the module docstring as written, and each option's default.

    argparse's ``ArgumentDefaultsHelpFormatter`` also writes "(default: None)" on every required or unset option; no
    public hook leaves those out, so this overrides the private ``_get_help_string`` (fenced in test_private_api).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, argparse.SUPPRESS) and not action.required and action.option_strings
        return f"{text} (default: %(default)s)" if shown and "%(default)" not in text else text


def prog_name() -> str:
    """How the user called us: ``python -m project`` or the console script's name."""
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "python -m " + (__package__ or "project") if script in ("__main__.py", "-c", "") else script


def skip_teardown() -> None:
    """Let the process exit without freeing every object of torch, Lightning and their imports one by one.

    Python's exit collects and frees the whole heap, a second on a 2-core CPU (docs/benchmarks.md). Call it once
    the command is done and has closed its files (loggers, checkpoints): one last collection runs the finalizers of
    what is garbage by then, the rest is frozen and left to the operating system. atexit handlers still run.
    """
    gc.collect()
    gc.freeze()
