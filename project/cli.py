"""fit, validate, test and predict: Lightning's ``LightningCLI`` with ``configs/default.yaml`` as its default.

``python -m project fit`` -> ``__main__.py`` (the command table) -> ``fit`` below -> ``CLI``. The recipe
is loaded before any ``--config``: an overlay holds only the keys it changes; ``--help`` shows the defaults.
"""

from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities import rank_zero_info

from project.hardware import recommended_precision
from project.inputs import check_net_takes_the_data
from project.module import MNISTClassifier
from project.runs import RunFolderCLI, hparams_summary

DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


class CLI(RunFolderCLI):
    """LightningCLI with the recipe's keys: the named callbacks, ``test_after_fit``, ``trainer.precision: null``
    as the measured default for this machine, and the network checked against the data before any run folder is
    made. ``RunFolderCLI`` (``runs.py``) keeps the run folders and says what went wrong."""

    # Top-level keys (`--early_stopping null`): `--trainer.callbacks.patience` would change the list's last callback.
    # `checkpoint` saves before `last_checkpoint` (this order), so last.ckpt records the best it has just saved.
    NAMED_CALLBACKS: ClassVar[dict[str, type]] = {
        "checkpoint": ModelCheckpoint,
        "last_checkpoint": ModelCheckpoint,
        "early_stopping": EarlyStopping,
        "averaging": WeightAveraging,
    }

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        matmul = Literal["highest", "high", "medium"]
        tf32 = "torch.set_float32_matmul_precision: 'high' enables TF32 matmuls on Ampere-or-newer GPUs."
        parser.add_argument("--float32_matmul_precision", type=matmul, default="highest", help=tf32)
        test = "After fit, test the best checkpoint in the same run (its test/acc goes into TensorBoard's HParams)."
        parser.add_argument("--test_after_fit", type=bool, default=False, help=test)
        super().add_arguments_to_parser(parser)  # the named callbacks' keys
        # The data names the classes of a model it trains. A checkpoint's model keeps its own (they are among the
        # hyperparameters LightningCLI rebuilds it from): another folder, or none, cannot rename or resize it.
        if not self.evaluating_a_checkpoint():
            parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
            parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
            parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        config = self.config[self.subcommand] if self.subcommand else self.config
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        # `trainer.precision` left unset (null) means "the fastest that is safe here", decided per machine.
        if config.trainer.precision is None:
            config.trainer.precision = recommended_precision(str(config.trainer.accelerator))
            rank_zero_info(f"trainer.precision not set: using {config.trainer.precision!r} for this machine.")

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if self.subcommand == "fit":
            check_net_takes_the_data(self.model.net, self.datamodule, int(self.model.hparams["num_classes"]))

    def after_fit(self) -> None:
        """Optionally test the best checkpoint, then give TensorBoard's HParams tab the run's real results."""
        metrics = {}
        if "val/acc_best" in self.trainer.callback_metrics:
            metrics["val/acc_best"] = float(self.trainer.callback_metrics["val/acc_best"])
        if self.config.fit.test_after_fit:
            checkpoint = self.trainer.checkpoint_callback
            best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
            results = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)
            metrics["test/acc"] = results[0]["test/acc"]
        hparams_summary(self.trainer, self.model, self.datamodule, metrics)


def run(argv: list[str], subcommand: bool = True, **options: Any) -> CLI:
    """Run ``argv`` (``fit ...``, ``test ...``) from the default recipe; ``subcommand=False`` only builds the
    classes. ``options`` are ``RunFolderCLI``'s: ``callbacks``, ``run_folder``, ``exit_on_error``."""
    return CLI(
        MNISTClassifier,
        L.LightningDataModule,  # any DataModule by class path; default.yaml names MNISTDataModule
        subclass_mode_data=True,
        auto_configure_optimizers=False,  # one place for the optimizer: model.optimizer / model.scheduler
        args=argv,
        recipe=DEFAULT_RECIPE,
        run=subcommand,
        **options,
    )


def fit(argv: list[str]) -> CLI:
    """Train: ``python -m project fit [--config FILE] [--key value]``, in this process; returns the CLI."""
    return run(["fit", *argv])


def validate(argv: list[str]) -> CLI:
    """Run the validation split on a checkpoint (``--ckpt_path``)."""
    return run(["validate", *argv])


def test(argv: list[str]) -> CLI:
    """Run the test split on a checkpoint (``--ckpt_path``)."""
    return run(["test", *argv])


def predict(argv: list[str]) -> CLI:
    """Write predictions (CSV) for a split or a folder of your own images."""
    return run(["predict", *argv])
