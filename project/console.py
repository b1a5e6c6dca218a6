"""The console conventions of every command: the program's name and a fast exit.

Light on purpose (no torch, no Lightning): ``__main__.py`` imports it before the command is known.
"""

import gc
import sys
from pathlib import Path


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
