"""The command line: ``python -m project {fit,validate,test,predict}``, one hop to LightningCLI."""

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project.data import MNISTDataModule
from project.module import MNISTClassifier


class MNISTCLI(LightningCLI):
    """LightningCLI with the class count linked from the data to the model and its network."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")


def cli_main(args: list[str] | None = None) -> LightningCLI:
    """Run the CLI on ``args`` (``sys.argv`` when ``None``) and return it, e.g. to reach ``cli.trainer``."""
    return MNISTCLI(MNISTClassifier, MNISTDataModule, args=args)


def main() -> None:
    """Entry point of the ``project`` console script (which would treat a returned object as an exit code)."""
    cli_main()
