"""The command line: ``python -m project {fit,validate,test,predict}``, one hop to LightningCLI."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import env, export
from project.checkpointing import CheckpointError, find_last_checkpoint, load_checkpoint
from project.data import MNISTDataModule
from project.hardware import recommended_precision
from project.module import MNISTClassifier
from project.writer import free_path


class KeepingSaveConfigCallback(SaveConfigCallback):
    """Save the resolved config into the run folder; a resumed run keeps the old file and writes ``config-1.yaml``."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved and not self.overwrite and trainer.log_dir is not None:
            self.config_filename = free_path(Path(trainer.log_dir) / self.config_filename).name
        super().setup(trainer, pl_module, stage)


def logger_init_args(config: Namespace) -> Namespace | None:
    """The ``init_args`` of a single configured logger (``trainer.logger``), or None."""
    logger = config.trainer.get("logger")
    return logger.get("init_args") if isinstance(logger, Namespace) else None


class MNISTCLI(LightningCLI):
    """LightningCLI with the class count linked from the data to the model, and a measured default precision."""

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
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is not None:  # before LightningCLI reads the checkpoint's hyperparameters
            try:
                self._check_checkpoint(self.config[subcommand], subcommand)
            except CheckpointError as exc:
                parser.error(str(exc))

    def _check_checkpoint(self, config: Namespace, subcommand: str) -> None:
        """Resolve ``--ckpt_path last``, refuse missing or unsafe checkpoints, and resume into the same run."""
        if config.get("weights_only") is False:
            raise CheckpointError("weights_only=false is refused: checkpoints are only loaded with weights_only=true.")
        if "weights_only" in config:
            config.weights_only = True
        ckpt = config.get("ckpt_path")
        if not ckpt or (ckpt in ("best", "hpc", "registry") or (ckpt == "last" and subcommand != "fit")):
            return  # Lightning's own keywords, resolved by the Trainer
        logger = logger_init_args(config)
        run_root = None  # <save_dir>/<name> of the configured logger, where the runs are
        if logger is not None and logger.get("save_dir"):
            run_root = Path(logger.save_dir) / (logger.get("name") or "")
        if ckpt == "last":
            found = find_last_checkpoint(run_root) if run_root is not None else None
            if found is None:
                raise CheckpointError(f"--ckpt_path last: no <run>/checkpoints/last.ckpt under {run_root} to resume.")
            ckpt = str(found)
        load_checkpoint(ckpt)
        config.ckpt_path = ckpt
        path = Path(ckpt).resolve()
        run = path.parent.parent  # <save_dir>/<name>/<version>/checkpoints/<file>.ckpt
        resuming_a_run = run_root is not None and path.parent.name == "checkpoints" and run.parent == run_root.resolve()
        if subcommand in ("fit", "validate", "test", "predict") and resuming_a_run:
            logger.version = run.name  # log into the checkpoint's own run (fit: resume it)
            rank_zero_info(f"{'Resuming' if subcommand == 'fit' else 'Logging into'} {run} ({path.name}).")

    def after_fit(self) -> None:
        """Optionally test the best checkpoint, then give TensorBoard's HParams tab the run's real results."""
        trainer = self.trainer
        metrics = {}
        if "val/acc_best" in trainer.callback_metrics:
            metrics["val/acc_best"] = float(trainer.callback_metrics["val/acc_best"])
        if self.config.fit.test_after_fit:
            best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            results = trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)
            metrics["test/acc"] = results[0]["test/acc"]
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and metrics:
                logger.log_hyperparams(
                    {"model": dict(self.model.hparams), "data": dict(self.datamodule.hparams)}, metrics
                )

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as exc:  # a bad value in the config: say which, without a traceback
            self.parser.error(str(exc))

    def before_instantiate_classes(self) -> None:
        # `trainer.precision` left unset (null) means "the fastest that is safe here", decided per machine.
        config = self.config[self.subcommand] if self.subcommand else self.config
        optimizer = config.model.get("optimizer")
        lr = optimizer.get("init_args", Namespace()).get("lr") if isinstance(optimizer, Namespace) else None
        if isinstance(lr, (int, float)) and lr <= 0:
            self.parser.error(f"model.optimizer.init_args.lr must be > 0, got {lr}.")
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if config.trainer.get("enable_progress_bar") is False and config.trainer.get("callbacks"):
            # The configs list a RichProgressBar; Lightning would refuse it beside enable_progress_bar=false.
            callbacks = config.trainer.callbacks
            config.trainer.callbacks = [
                c for c in callbacks if not str(getattr(c, "class_path", "")).endswith("ProgressBar")
            ]
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
    try:
        return MNISTCLI(MNISTClassifier, MNISTDataModule, args=args, save_config_callback=KeepingSaveConfigCallback)
    except SIGTERMException:  # SaveOnInterrupt has saved a checkpoint and said where: exit without a traceback
        raise SystemExit(143) from None


def main() -> None:
    """Entry point of the ``project`` console script (which would treat a returned object as an exit code)."""
    cli_main()
