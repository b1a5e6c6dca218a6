"""The command line: ``python -m project {fit,validate,test,predict}``, one hop to LightningCLI."""

import sys
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from project import env, export
from project.data import MNISTDataModule
from project.hardware import recommended_precision
from project.module import MNISTClassifier


class MNISTCLI(LightningCLI):
    """LightningCLI with the class count linked from the data to the model, and a measured default precision."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="highest",
            help="torch.set_float32_matmul_precision: 'high' enables TF32 matmuls on Ampere-or-newer GPUs.",
        )
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        # `trainer.precision` left unset (null) means "the fastest that is safe here", decided per machine.
        config = self.config[self.subcommand] if self.subcommand else self.config
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if config.trainer.precision is None:
            config.trainer.precision = recommended_precision(str(config.trainer.accelerator))
            rank_zero_info(f"trainer.precision not set: using {config.trainer.precision!r} for this machine.")


# Commands beside LightningCLI's fit/validate/test/predict: each takes its own arguments and returns its report.
EXTRA_COMMANDS: dict[str, Callable[[list[str]], dict[str, Any]]] = {"export": export.main, "env": env.main}


def cli_main(args: list[str] | None = None) -> LightningCLI | dict[str, Any]:
    """Run the CLI on ``args`` (``sys.argv`` when ``None``).

    Returns:
        For fit/validate/test/predict the LightningCLI (``cli.trainer``, ``cli.model``, ``cli.datamodule``);
        for ``export`` and ``env`` their report.
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in EXTRA_COMMANDS:
        return EXTRA_COMMANDS[argv[0]](argv[1:])
    return MNISTCLI(MNISTClassifier, MNISTDataModule, args=args)


def main() -> None:
    """Entry point of the ``project`` console script (which would treat a returned object as an exit code)."""
    cli_main()
