"""k-fold cross-validation: one fit per fold, then each fold's best val/acc, their mean and std.

The ``cv`` command (``command.py``) and the callback that makes a fit one fold (``folds.py``), a top-level key
of its own: ``--kfold project.cv.folds.KFold --kfold.num_folds 5 --kfold.fold 2`` (tests: ``test_cv.py``).
"""

# The fold of a fit is a top-level callback key of its own (hooks.AddsCallbackKeys): `--kfold.fold 2`.
CALLBACK_KEYS = {"kfold": "project.cv.folds.KFold"}


def main(argv: list[str] | None = None) -> object:
    """Run the command: its heavy imports happen only now, once the command is known."""
    from project.cv.command import main as run

    return run(argv)
