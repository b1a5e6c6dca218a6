"""Versions, devices, bf16/TF32 support and the precision picked on this machine.

The ``env`` command (``report.py``): ``python -m project env`` prints what ``trainer.precision: null``
picks here and why, ``--json`` the same as data (tests: ``test_env.py``; page: ``docs/env.md``).
"""


def main(argv: list[str] | None = None) -> object:
    """Run the command: its heavy imports happen only now, once the command is known."""
    from project.env.report import main as run

    return run(argv)
