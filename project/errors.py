"""``UserError``: what the user can fix. It imports nothing of the package, so any module may raise it.

``python -m project`` prints a ``UserError`` as one line, ``error: <message>``, and exits 1; anything
else is a bug and keeps its traceback (``PROJECT_TRACEBACK=1`` shows the traceback of a ``UserError`` too).
"""


class UserError(Exception):
    """Something the user can fix, named with the remedy: the message names the file, key or value and what to do.

    Raise it, or a class that also derives from it (``DataError``, ``CheckpointError``), from any command.
    """


class DataError(UserError, RuntimeError):
    """Data a DataModule cannot use, named with the remedy: the console prints it as one line, no traceback.

    Raise it (or a subclass) from a DataModule of your own for the same treatment.
    """
