"""fit, validate, test and predict: Lightning's ``LightningCLI`` with the template's recipe as its default.

``python -m project fit`` -> ``__main__.py`` (the command table) -> ``fit`` below -> ``CLI``. The recipe is
``configs/default.yaml``, loaded before any ``--config`` (jsonargparse's ``default_config_files``): an overlay holds
only the keys it changes, and ``--help`` shows the defaults that really apply. Where a run writes and what
``--ckpt_path last/best/auto`` name is ``runs.py`` (``RunFolderCLI``); what a mistake prints is ``mistakes.py``.
"""

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateFinder, ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.checkpointing import JobIdentity, RandomState
from project.console import prog_name
from project.hardware import recommended_precision
from project.hooks import AddsCallbackKeys, features
from project.inputs import KeepInputContract, check_net_takes_the_data
from project.mistakes import SuggestingParser, quiet_lightning
from project.module import MNISTClassifier
from project.runs import KeepingSaveConfigCallback, RunFolderCLI, finish_loggers, hparams_summary, import_class

DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
# The callbacks people change most, as top-level keys (`--early_stopping.patience 5`, `--early_stopping null`):
# `--trainer.callbacks.patience` would change the last callback of the list instead. A feature may add its own.
NAMED_CALLBACKS: dict[str, type] = {
    "checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    "lr_find": LearningRateFinder,  # configs/lr_find.yaml
    "averaging": WeightAveraging,
}


class CLI(RunFolderCLI):
    """LightningCLI with the recipe's keys: the named callbacks (above, and the features'), ``test_after_fit``,
    ``trainer.precision: null`` as the measured default for this machine, and the network checked against the data
    before any run folder is made. ``RunFolderCLI`` (``runs.py``) keeps the run folders and says what went wrong."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="highest",
            help="torch.set_float32_matmul_precision: 'high' enables TF32 matmuls on Ampere-or-newer GPUs.",
        )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, test the best checkpoint in the same run (its test/acc goes into TensorBoard's HParams).",
        )
        self.named_callbacks = dict(NAMED_CALLBACKS)
        for feature in features():
            if isinstance(feature, AddsCallbackKeys):
                self.named_callbacks |= {key: import_class(path) for key, path in feature.CALLBACK_KEYS.items()}
        for key, base in self.named_callbacks.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
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
            results = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)
            metrics["test/acc"] = results[0]["test/acc"]
        hparams_summary(self.trainer, self.model, self.datamodule, metrics)


def run(
    argv: list[str],
    subcommand: bool = True,
    callbacks: list[L.Callback] | None = None,
    run_folder: tuple[str, str] | None = None,
    exit_on_error: bool = True,
) -> CLI:
    """Run ``argv`` (``fit ...``, ``test ...``) through the CLI, starting from the default recipe.

    Args:
        argv: The command and its options; with ``subcommand=False`` options only, and nothing is run.
        subcommand: Run the command (else only build the classes: benchmarks, a search's first look).
        callbacks: Added to the configured ones: objects built in Python (a search's pruning callback).
        run_folder: The run's ``(name, version)`` under the logger's ``save_dir``, whatever the config says.
        exit_on_error: With ``subcommand=False``, ``False`` raises jsonargparse's error instead of exiting.
    """
    quiet_lightning()
    parser_kwargs: dict[str, Any]
    defaults: dict[str, Any] = {"default_config_files": [str(DEFAULT_RECIPE)]} if DEFAULT_RECIPE.is_file() else {}
    if subcommand:
        every = LightningCLI.subcommands()
        commands = [argv[0]] if argv and argv[0] in every else list(every)  # as CLI.subcommands() picks
        parser_kwargs = {"prog": prog_name(), **{command: dict(defaults) for command in commands}}
    else:
        parser_kwargs = {"prog": prog_name(), "exit_on_error": exit_on_error, **defaults}
    try:
        cli = CLI(
            MNISTClassifier,
            L.LightningDataModule,  # any DataModule by class path; default.yaml names MNISTDataModule
            subclass_mode_data=True,
            args=argv,
            argv=list(argv),
            run_folder=run_folder,
            run=subcommand,
            # In every run: what a checkpoint holds beyond Lightning's (the job, the random state, the input
            # contract); and objects no config can describe (a search's pruning callback).
            trainer_defaults={"callbacks": [*(callbacks or []), JobIdentity(), RandomState(), KeepInputContract()]},
            save_config_callback=KeepingSaveConfigCallback,
            parser_class=SuggestingParser,
            auto_configure_optimizers=False,  # one place for the optimizer: model.optimizer / model.scheduler
            parser_kwargs=parser_kwargs,
        )
    except SIGTERMException:  # SaveOnInterrupt has saved a checkpoint and said where: exit without a traceback
        raise SystemExit(143) from None
    if subcommand:
        finish_loggers(cli.trainer)  # a tracker's run: the next run in this process starts one of its own
    return cli


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
