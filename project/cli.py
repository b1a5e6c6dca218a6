"""fit, validate, test and predict: Lightning's ``LightningCLI`` with the template's recipe as its default.

``python -m project fit`` -> ``__main__.py`` (the command table) -> ``fit`` below -> ``CLI``. The recipe is
``configs/default.yaml``, loaded before any ``--config`` (jsonargparse's ``default_config_files``): an overlay holds
only the keys it changes, and ``--help`` shows the defaults that really apply. Where a run writes and what
``--ckpt_path last/best/auto`` name is ``runs.py``; what a mistake prints is ``mistakes.py``.
"""

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateFinder,
    ModelCheckpoint,
    ModelPruning,
    WeightAveraging,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import runs
from project.checkpointing import CheckpointError, JobIdentity
from project.console import prog_name
from project.errors import UserError
from project.hardware import recommended_precision
from project.inputs import check_net_takes_the_data
from project.mistakes import (
    SuggestingParser,
    TrainerConfigError,
    explain_trainer_error,
    quiet_lightning,
    raised_by_lightning,
)
from project.module import MNISTClassifier

DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
# The callbacks people change most, as top-level keys (`--early_stopping.patience 5`, `--early_stopping null`):
# `--trainer.callbacks.patience` would change the last callback of the list instead.
NAMED_CALLBACKS: dict[str, type] = {
    "checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    "pruning": ModelPruning,  # off unless an overlay names one (configs/prune.yaml)
    "lr_find": LearningRateFinder,  # configs/lr_find.yaml
    "averaging": WeightAveraging,
}
# Model arguments that change how the network runs, not what it is: a command-line value beats the checkpoint's.
RUNTIME_MODEL_KEYS = ("compile", "channels_last")


class CLI(LightningCLI):
    """LightningCLI plus: the named callback keys above, ``trainer.precision: null`` as the measured default for this
    machine, ``test_after_fit``, ``--ckpt_path last/best/auto``, and the network checked against the data before any
    run folder is made."""

    def __init__(self, *args: Any, argv: list[str], run_folder: tuple[str, str] | None = None, **kwargs: Any) -> None:
        self.argv = argv
        self.run_folder = run_folder  # (name, version) under the logger's save_dir, whatever the config says
        self.new_folder: Path | None = None  # the folder this command makes, removed if bad input stops it
        self.given_model = Namespace()  # the model options before a checkpoint's hyperparameters replace them
        try:
            super().__init__(*args, **kwargs)
        except UserError:
            runs.forget_failed_folder(self.new_folder)
            raise

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Only the subcommand being run gets a parser: building all four costs ~0.4 s per command."""
        every = LightningCLI.subcommands()
        return {self.argv[0]: every[self.argv[0]]} if self.argv and self.argv[0] in every else every

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
        for key, base in NAMED_CALLBACKS.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
        # The data names the classes of a model it trains. A checkpoint's model keeps its own (they are among the
        # hyperparameters LightningCLI rebuilds it from): another folder, or none, cannot rename or resize it.
        evaluating = self.argv[:1] in (["validate"], ["test"], ["predict"]) and runs.command_line_keys(
            self.argv, "ckpt_path"
        )
        if not evaluating:
            parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
            parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
            parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        logger = runs.run_logger(config)
        if self.run_folder is not None and logger is not None:  # before the checkpoint check, which compares folders
            logger.init_args.name, logger.init_args.version = self.run_folder
        try:
            runs.resolve_checkpoint(config, subcommand)
        except CheckpointError as exc:
            parser.error(str(exc))
        self.given_model = config.model.clone()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("ckpt_path"):  # LightningCLI has rebuilt the model from the checkpoint's hyperparameters
            ignored = runs.ignored_model_keys(self.given_model, config.model, self.argv, RUNTIME_MODEL_KEYS)
            if ignored:
                rank_zero_info(
                    f"Warning: ignored {', '.join(ignored)}: the model is rebuilt from the hyperparameters saved in "
                    f"{config.ckpt_path}, which describe the trained network. To train another one, use fit "
                    "without --ckpt_path (or with --model.init_from <ckpt> ... to start from its weights)."
                )
        optimizer = config.model.get("optimizer")
        lr = optimizer.get("init_args", Namespace()).get("lr") if isinstance(optimizer, Namespace) else None
        if isinstance(lr, (int, float)) and lr <= 0:
            self.parser.error(f"model.optimizer.init_args.lr must be > 0, got {lr}.")
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        dropped = runs.drop_callbacks_of_switched_off_features(config, list(NAMED_CALLBACKS))
        if dropped:
            rank_zero_info("Switched off with their feature: " + "; ".join(dropped) + ".")
        if config.trainer.get("logger") is False:
            self.save_config_callback = None
        # `trainer.precision` left unset (null) means "the fastest that is safe here", decided per machine.
        if config.trainer.precision is None:
            config.trainer.precision = recommended_precision(str(config.trainer.accelerator))
            rank_zero_info(f"trainer.precision not set: using {config.trainer.precision!r} for this machine.")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as exc:  # a bad value in the config: say which, without a traceback
            self.parser.error(str(exc))
        if self.subcommand == "fit":
            check_net_takes_the_data(self.model.net, self.datamodule, int(self.model.hparams["num_classes"]))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        named = [config.get(key) for key in NAMED_CALLBACKS]  # `--early_stopping null`: absent, not None
        kwargs["callbacks"] = [*(config.trainer.get("callbacks") or []), *(c for c in named if c is not None)]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ModuleNotFoundError, TypeError) as exc:
            # Lightning's connector says a device, strategy or precision is not available with a 30-line traceback;
            # the user gave the option, so name it. Errors raised elsewhere (our code, a bug) keep their traceback.
            if not isinstance(exc, MisconfigurationException) and not raised_by_lightning(exc):
                raise
            raise TrainerConfigError(explain_trainer_error(exc, {**config.trainer, **kwargs}, self.argv)) from exc
        if trainer.log_dir is not None and not Path(trainer.log_dir).exists():
            self.new_folder = Path(trainer.log_dir)
        if self.subcommand is not None:
            runs.share_run_folder(trainer)
        return trainer

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
        runs.hparams_summary(self.trainer, self.model, self.datamodule, metrics)

    def after_validate(self) -> None:
        runs.write_metrics(self.trainer)

    def after_test(self) -> None:
        runs.write_metrics(self.trainer)


def run(
    argv: list[str],
    subcommand: bool = True,
    callbacks: list[L.Callback] | None = None,
    run_folder: tuple[str, str] | None = None,
    exit_on_error: bool = True,
) -> CLI:
    """Run ``argv`` (``fit ...``, ``test ...``, ...) through the CLI, starting from the default recipe.

    With ``subcommand=False`` ``argv`` holds only options: the classes are built and nothing is run (benchmarks).
    ``callbacks`` are added to the configured ones (objects built in Python, e.g. a search's pruning callback).
    ``run_folder`` is the run's ``(name, version)`` under the TensorBoard logger's ``save_dir``, whatever the config
    says (a cross-validation's ``mnist/cv_0``, ``fold_2``). With ``exit_on_error=False`` (``subcommand=False`` only)
    a bad option raises jsonargparse's ``ArgumentError``, which names it, instead of printing it and exiting.
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
            # Objects no config can describe: a search's pruning callback; the job's identity in every checkpoint.
            trainer_defaults={"callbacks": [*(callbacks or []), JobIdentity()]},
            save_config_callback=runs.KeepingSaveConfigCallback,
            parser_class=SuggestingParser,
            auto_configure_optimizers=False,  # one place for the optimizer: model.optimizer / model.scheduler
            parser_kwargs=parser_kwargs,
        )
    except SIGTERMException:  # SaveOnInterrupt has saved a checkpoint and said where: exit without a traceback
        raise SystemExit(143) from None
    if subcommand:
        runs.finish_loggers(cli.trainer)  # a tracker's run: the next run in this process starts one of its own
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
