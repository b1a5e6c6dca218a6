"""Hyperparameter search on Optuna: pruning, resumable studies, one machine or many.

The ``tune`` command (``search.py``) with its search space ``configs/search.yaml``. Its extra is ``tune``, its tests
``tests/test_tune.py``.
"""


def main(argv: list[str] | None = None) -> object:
    """Run the command: its heavy imports happen only now, once the command is known."""
    from project.tune.search import main as run

    return run(argv)
