"""Run folders: where a command writes, what ``--ckpt_path last/best/auto`` name, and what a failed command leaves.

Not on the reading path: ``cli.py``'s ``CLI`` derives from ``RunFolderCLI`` below, which calls these from
LightningCLI's public hooks. The layout they keep:
``<save_dir>/<name>/<version>/`` per run (TensorBoard's), ``checkpoints/`` inside it, and ``eval/<command>_<n>/``
inside it for each validate / test / predict of one of its checkpoints, with that command's config and
``metrics.json``.
"""

import importlib
import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.checkpointing import (
    CheckpointError,
    JobIdentity,
    RandomState,
    SaveOnInterrupt,
    StopOnNonFiniteLoss,
    best_checkpoint,
    find_last_checkpoint,
    job_identity,
    last_checkpoints,
    load_checkpoint,
)
from project.console import prog_name
from project.errors import UserError
from project.hooks import AddsCallbackKeys, AddsDefaultCallbacks, Finishes, LogsConfig, UsesRunFolder, features
from project.inputs import KeepInputContract
from project.mistakes import (
    SuggestingParser,
    TrainerConfigError,
    bad_learning_rate,
    explain_trainer_error,
    quiet_lightning,
    raised_by_lightning,
)
from project.writer import first_free, free_path, numbered

# A Trainer feature that can be switched off, and the configured callbacks that cannot work without it.
NEEDS_FEATURE: dict[str, tuple[type, ...]] = {
    "logger": (LearningRateMonitor,),
    "enable_checkpointing": (ModelCheckpoint, SaveOnInterrupt),
    "enable_progress_bar": (ProgressBar,),
}


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, as Lightning read it from the environment at import: known before a
    Trainer's strategy is set up. (Lightning sets ``rank_zero_only.rank`` on the function; no type declares it.)"""
    return rank_zero_only.rank == 0  # type: ignore[attr-defined]


def import_class(path: str) -> type:
    """The class ``module.Class`` names, imported."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def resolve(class_path: str) -> type | None:
    """The class a config's ``class_path`` names, or None if it cannot be imported (jsonargparse will say why)."""
    try:
        return import_class(class_path)
    except (ImportError, AttributeError, ValueError):
        return None


def run_logger(config: Namespace) -> Namespace | None:
    """The configured logger (``class_path`` and ``init_args``) that owns the run folders: the only one, or the
    first TensorBoardLogger of a list; None without a logger."""
    logger = config.trainer.get("logger")
    if isinstance(logger, list):
        boards = [lg for lg in logger if str(getattr(lg, "class_path", "")).endswith("TensorBoardLogger")]
        logger = boards[0] if boards else None
    return logger if isinstance(logger, Namespace) else None


def command_line_keys(argv: list[str], prefix: str) -> list[str]:
    """The dotted keys under ``prefix`` given as ``--key value`` or ``--key=value`` in ``argv``."""
    keys = [arg[2:].split("=", 1)[0] for arg in argv if arg.startswith(f"--{prefix}")]
    return list(dict.fromkeys(keys))


class KeepingSaveConfigCallback(SaveConfigCallback):
    """Save the resolved config into the run folder; a resumed run keeps the old file and writes ``config-1.yaml``.

    A logger with a ``log_config(config, path)`` method also gets the whole config (a dict) and the saved file.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved and not self.overwrite and trainer.log_dir is not None:
            self.config_filename = free_path(Path(trainer.log_dir) / self.config_filename).name
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        loggers = [logger for logger in trainer.loggers if isinstance(logger, LogsConfig)]
        if loggers:
            config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
            for logger in loggers:
                logger.log_config(config, Path(trainer.log_dir or ".") / self.config_filename)


def resolve_checkpoint(config: Namespace, subcommand: str) -> None:
    """Resolve ``--ckpt_path last`` / ``best`` / ``auto``, refuse missing or unsafe checkpoints, and point the
    logger at the checkpoint's run: the same run folder to resume, ``<run>/eval/<command>_<n>/`` to evaluate.

    Raises:
        CheckpointError: naming the checkpoint and the remedy.
    """
    if config.get("weights_only") is False:
        raise CheckpointError("weights_only=false is refused: checkpoints are only loaded with weights_only=true.")
    if "weights_only" in config:
        config.weights_only = True
    ckpt = config.get("ckpt_path")
    if ckpt == "auto" and subcommand != "fit":
        raise CheckpointError("--ckpt_path auto resumes a training run: it is for fit only.")
    # validate/test/predict run in a new process, where Lightning's "best" and "last" (the checkpoints of a fit
    # in the same process) name nothing: here they are the newest run's.
    evaluating = subcommand != "fit" and ckpt in ("best", "last")
    if not ckpt or ckpt in ("hpc", "registry") or (ckpt == "best" and subcommand == "fit"):
        return  # Lightning's own keywords, resolved by the Trainer
    entry = run_logger(config)
    logger = entry.get("init_args") if entry is not None else None
    run_root = None  # <save_dir>/<name> of the configured logger, where the runs are
    if logger is not None and logger.get("save_dir"):
        run_root = Path(logger.save_dir) / (logger.get("name") or "")
    found: Path | None = None
    if evaluating:
        found = (best_checkpoint if ckpt == "best" else find_last_checkpoint)(run_root) if run_root else None
        if found is None:
            raise CheckpointError(
                f"--ckpt_path {ckpt}: no run under {run_root} has a {ckpt} checkpoint to {subcommand}. Fit one "
                "first, or give the checkpoint's path."
            )
        rank_zero_info(f"--ckpt_path {ckpt}: {found}.")
        ckpt = str(found)
    elif ckpt in ("last", "auto"):
        pick = last_checkpoint_of_this_job if ckpt == "auto" else find_last_checkpoint
        found = pick(run_root) if run_root is not None else None
        if found is None and ckpt == "auto":  # nothing to resume: a new run (a restarted worker finds this one)
            config.ckpt_path = None
            rank_zero_info(f"--ckpt_path auto: no last.ckpt of this job under {run_root}: starting a new run.")
            return
        if found is None:
            raise CheckpointError(f"--ckpt_path last: no <run>/checkpoints/last.ckpt under {run_root} to resume.")
        ckpt = str(found)
    checkpoint = load_checkpoint(ckpt)
    config.ckpt_path = ckpt
    path = Path(ckpt).resolve()
    run = path.parent.parent  # <save_dir>/<name>/<version>/checkpoints/<file>.ckpt
    if logger is None or entry is None or run_root is None:
        return  # no run folder to resume into or evaluate beside
    if path.parent.name != "checkpoints" or run.parent != run_root.resolve():
        return  # a checkpoint from elsewhere: a run folder of its own, as for any run
    if subcommand == "fit":
        logger.version = run.name  # resume into the same run: same folder, same TensorBoard curves
        step = int(checkpoint.get("global_step", 0))
        if issubclass(resolve(str(entry.class_path)) or object, TensorBoardLogger):
            # TensorBoard drops what the interrupted process logged after this step (it is trained again): one
            # curve, not a fork. Points before it stay.
            logger.purge_step = step
        rank_zero_info(f"Resuming {run} ({path.name}, epoch {checkpoint.get('epoch')}, global step {step}).")
        return
    # An evaluation gets a folder of its own inside the run, <run>/eval/<command>_<n>/, with its config, metrics
    # and predictions: traceable to the run without adding points to the run's own curves.
    folder = first_free(numbered(run / "eval", f"{subcommand}_"))
    logger.save_dir, logger.name, logger.version = str(run), "eval", folder.name
    rank_zero_info(f"Evaluating {path.name} of {run}: results in {folder}.")


def last_checkpoint_of_this_job(run_root: Path) -> Path | None:
    """The newest ``last.ckpt`` under ``run_root`` written by this job (``JobIdentity``): a restarted torchrun
    worker or a requeued SLURM job resumes its own run, a new job starts a new one beside the others."""
    job = job_identity()
    for path in last_checkpoints(run_root):
        try:
            owner = load_checkpoint(str(path)).get("job")
        except CheckpointError:
            continue  # not this job's to resume either
        if owner == job:
            return path
        rank_zero_info(
            f"--ckpt_path auto: {path.parents[1].name} was written by "
            f"{owner or 'a process started by hand'}, not by this job ({job or 'started by hand'}): left alone."
        )
    return None


def drop_callbacks_of_switched_off_features(config: Namespace, named: list[str]) -> list[str]:
    """``--trainer.logger false`` and friends: drop the configured callbacks (the list and the ``named`` keys)
    that need the feature; return what was dropped, for one line to the user."""
    dropped: list[str] = []
    for feature, needers in NEEDS_FEATURE.items():
        if config.trainer.get(feature) is not False:
            continue
        kept = []
        for callback in config.trainer.get("callbacks") or []:
            cls = resolve(str(getattr(callback, "class_path", "")))
            if cls is not None and issubclass(cls, needers):
                dropped.append(f"{cls.__name__} (trainer.{feature}=false)")
            else:
                kept.append(callback)
        if config.trainer.get("callbacks"):
            config.trainer.callbacks = kept
        for key in named:
            value = config.get(key)
            cls = resolve(str(value.class_path)) if isinstance(value, Namespace) else None
            if cls is not None and issubclass(cls, needers):
                config[key] = None
                dropped.append(f"{key}: {cls.__name__} (trainer.{feature}=false)")
    if config.trainer.get("logger") is False:
        dropped.append("the HParams summary and the saved config.yaml (trainer.logger=false)")
    if config.trainer.get("enable_checkpointing") is False and config.get("test_after_fit"):
        dropped.append("test_after_fit tests the final weights, not the best checkpoint (no checkpointing)")
    return dropped


def forget_failed_folder(folder: Path | None) -> None:
    """A command stopped by bad input leaves no folder for TensorBoard to list: the one it made (a config and an
    empty event file) goes, unless it holds a checkpoint."""
    if folder is not None and folder.is_dir() and is_rank_zero() and not any(folder.rglob("*.ckpt")):
        shutil.rmtree(folder, ignore_errors=True)
        if folder.parent.name == "eval" and not any(folder.parent.iterdir()):
            folder.parent.rmdir()


def write_metrics(trainer: L.Trainer) -> None:
    """Save an evaluation's metrics as ``metrics.json`` in its folder, beside its config."""
    if trainer.is_global_zero and trainer.logger is not None and trainer.log_dir:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        folder = Path(trainer.log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def tensorboard_logger(trainer: L.Trainer) -> TensorBoardLogger | None:
    """The trainer's first TensorBoardLogger (the HParams tab, and what features draw), or None."""
    return next((logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)), None)


def hparams_summary(trainer: L.Trainer, model: L.LightningModule, data: L.LightningDataModule, metrics: dict) -> None:
    """Give TensorBoard's HParams tab the run's hyperparameters and its real results (``val/acc_best``, ...)."""
    board = tensorboard_logger(trainer)
    if board is not None and metrics:
        board.log_hyperparams({"model": dict(model.hparams), "data": dict(data.hparams)}, metrics)
        board.experiment.flush()  # the Trainer has finalised the logger already: write it now


def warn_ignored_model_keys(given: Namespace, config: Namespace, argv: list[str], runtime: tuple[str, ...]) -> None:
    """Say which ``--model.*`` options of ``argv`` lost to the hyperparameters of ``config.ckpt_path``'s checkpoint
    (``config.model``, rebuilt from them); those in ``runtime`` (how the network runs, not what it is) win."""
    ignored = []
    for key in command_line_keys(argv, "model."):
        top = key.split(".")[1]  # compare the whole argument: `model.net.hidden` is shorthand for init_args
        if top not in given or given.get(top) == config.model.get(top):
            continue
        if top in runtime:
            config.model[top] = given[top]
        else:
            ignored.append(f"--{key}")
    if ignored:
        rank_zero_info(
            f"Warning: ignored {', '.join(ignored)}: the model is rebuilt from the hyperparameters saved in "
            f"{config.ckpt_path}, which describe the trained network. To train another one, use fit without "
            "--ckpt_path (or with --model.init_from <ckpt> ... to start from its weights)."
        )


def share_run_folder(trainer: L.Trainer) -> None:
    """A logger beside TensorBoard that keeps files of its own (a tracker's offline run) may keep them in the run's
    folder (``UsesRunFolder``): on the process that writes the run (rank 0)."""
    board = trainer.loggers[0] if trainer.loggers else None
    if is_rank_zero() and isinstance(board, TensorBoardLogger) and board.log_dir:
        for logger in trainer.loggers[1:]:
            if isinstance(logger, UsesRunFolder):
                logger.use_run_folder(Path(board.log_dir))


def finish_loggers(trainer: L.Trainer) -> None:
    """Finish each logger that has a ``finish()`` (a tracker's run) once the command is done."""
    for logger in trainer.loggers:
        if isinstance(logger, Finishes):
            logger.finish()


# Model arguments that change how the network runs, not what it is: a command-line value beats the checkpoint's.
RUNTIME_MODEL_KEYS = ("compile", "channels_last")


class RunFolderCLI(LightningCLI):
    """LightningCLI that keeps the run folders and says what went wrong, through its public hooks.

    ``--ckpt_path last/best/auto`` are resolved; a resumed run continues in its own folder; an evaluation writes
    into ``<run>/eval/<command>_<n>/`` with ``metrics.json``; a folder made by a command that bad input stopped is
    removed; a checkpoint's hyperparameters beat ``--model.*`` options, and the user is told which; a Trainer option
    this machine cannot run, a bad value and a learning rate <= 0 are one line each. Every run gets the callbacks a
    checkpoint needs beyond Lightning's (the job, the random state, the input contract) and the NaN-loss stop. The
    subclass's ``NAMED_CALLBACKS``, and those the features declare (``hooks.AddsCallbackKeys``, on by default with
    ``hooks.AddsDefaultCallbacks``), are top-level callback keys (``--early_stopping null``).

    Args:
        model_class: The LightningModule; ``datamodule_class``: the DataModule (both as LightningCLI takes them).
        args: The command and its options (``fit --trainer.max_epochs 3``); with ``run=False`` the options only.
        recipe: The default config, loaded before any ``--config`` (jsonargparse's ``default_config_files``).
        run: Run the command; ``False`` only builds the classes (benchmarks, a search's first look).
        callbacks: Added to the configured ones: objects built in Python (a search's pruning callback).
        run_folder: The run's ``(name, version)`` under the logger's ``save_dir``, whatever the config says.
        exit_on_error: With ``run=False``, ``False`` raises jsonargparse's error instead of exiting.
    """

    NAMED_CALLBACKS: ClassVar[dict[str, type]] = {}

    def __init__(
        self,
        model_class: type[L.LightningModule],
        datamodule_class: type[L.LightningDataModule],
        *,
        args: list[str],
        recipe: Path,
        run: bool = True,
        callbacks: list[L.Callback] | None = None,
        run_folder: tuple[str, str] | None = None,
        exit_on_error: bool = True,
        **kwargs: Any,
    ) -> None:
        quiet_lightning()
        self.argv = list(args)
        self.run_folder = run_folder
        self.named_callbacks = dict(self.NAMED_CALLBACKS)
        self.new_folder: Path | None = None  # the folder this command makes, removed if bad input stops it
        self.given_model = Namespace()  # the model options before a checkpoint's hyperparameters replace them
        defaults: dict[str, Any] = {"default_config_files": [str(recipe)]} if recipe.is_file() else {}
        parser_kwargs: dict[str, Any]
        if run:
            parser_kwargs = {"prog": prog_name(), **{command: dict(defaults) for command in self.subcommands()}}
        else:
            parser_kwargs = {"prog": prog_name(), "exit_on_error": exit_on_error, **defaults}
        every_run = [StopOnNonFiniteLoss(), JobIdentity(), RandomState(), KeepInputContract()]
        try:
            super().__init__(
                model_class,
                datamodule_class,
                args=self.argv,
                run=run,
                trainer_defaults={"callbacks": [*(callbacks or []), *every_run]},
                save_config_callback=KeepingSaveConfigCallback,
                parser_class=SuggestingParser,
                parser_kwargs=parser_kwargs,
                **kwargs,
            )
        except UserError:
            forget_failed_folder(self.new_folder)
            raise
        except SIGTERMException:  # SaveOnInterrupt has saved a checkpoint and said where: exit without a traceback
            raise SystemExit(143) from None
        if run:
            finish_loggers(self.trainer)  # a tracker's run: the next run in this process starts one of its own

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Only the subcommand being run gets a parser: building all four costs ~0.4 s per command."""
        every = LightningCLI.subcommands()
        return {self.argv[0]: every[self.argv[0]]} if self.argv and self.argv[0] in every else every

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        on: dict[str, dict[str, str]] = {}  # the default callbacks' keys: on unless the config says `key: null`
        for feature in features():
            if isinstance(feature, AddsCallbackKeys):
                self.named_callbacks |= {key: import_class(path) for key, path in feature.CALLBACK_KEYS.items()}
            if isinstance(feature, AddsDefaultCallbacks):
                self.named_callbacks |= {key: import_class(path) for key, path in feature.DEFAULT_CALLBACKS.items()}
                on |= {key: {"class_path": path} for key, path in feature.DEFAULT_CALLBACKS.items()}
        for key, base in self.named_callbacks.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
        parser.set_defaults(on)

    def evaluating_a_checkpoint(self) -> bool:
        """validate, test or predict of a ``--ckpt_path``: the model is the checkpoint's, not the data's."""
        return self.argv[:1] in (["validate"], ["test"], ["predict"]) and bool(
            command_line_keys(self.argv, "ckpt_path")
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        logger = run_logger(config)
        if self.run_folder is not None and logger is not None:  # before the checkpoint check, which compares folders
            logger.init_args.name, logger.init_args.version = self.run_folder
        try:
            resolve_checkpoint(config, subcommand)
        except CheckpointError as exc:
            parser.error(str(exc))
        self.given_model = config.model.clone()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("ckpt_path"):  # LightningCLI has rebuilt the model from the checkpoint's hyperparameters
            warn_ignored_model_keys(self.given_model, config, self.argv, RUNTIME_MODEL_KEYS)
        if problem := bad_learning_rate(config):
            self.parser.error(problem)
        dropped = drop_callbacks_of_switched_off_features(config, list(self.named_callbacks))
        if dropped:
            rank_zero_info("Switched off with their feature: " + "; ".join(dropped) + ".")
        if config.trainer.get("logger") is False:
            self.save_config_callback = None

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as exc:  # a bad value in the config: say which, without a traceback
            self.parser.error(str(exc))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        named = [config.get(key) for key in self.named_callbacks]  # `--early_stopping null`: absent, not None
        kwargs["callbacks"] = [*(config.trainer.get("callbacks") or []), *(c for c in named if c is not None)]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ModuleNotFoundError, TypeError) as exc:
            # Lightning's connector says a device, strategy or precision is not available with a 30-line traceback;
            # the user gave the option, so name it. Errors raised elsewhere (our code, a bug) keep their traceback.
            if not isinstance(exc, MisconfigurationException) and not raised_by_lightning(exc):
                raise
            raise TrainerConfigError(explain_trainer_error(exc, {**config.trainer, **kwargs})) from exc
        if trainer.log_dir is not None and not Path(trainer.log_dir).exists():
            self.new_folder = Path(trainer.log_dir)
        if self.subcommand is not None:
            share_run_folder(trainer)
        return trainer

    def after_validate(self) -> None:
        write_metrics(self.trainer)

    def after_test(self) -> None:
        write_metrics(self.trainer)
