"""The command line: ``python -m project {fit,validate,test,predict}``, one hop to LightningCLI."""

from typing import Literal

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

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


def cli_main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI on ``args`` (``sys.argv`` when ``None``) and return it, e.g. to reach ``cli.trainer``."""
    return MNISTCLI(MNISTClassifier, MNISTDataModule, args=args)


def main() -> None:
    """Entry point of the ``project`` console script (which would treat a returned object as an exit code)."""
    cli_main()
