"""fit, validate, test and predict: LightningCLI with the template's recipe as its own default.

The recipe is ``configs/default.yaml``, loaded before any ``--config`` (jsonargparse's ``default_config_files``),
so ``fit``, ``fit --config configs/best.yaml`` and ``fit --config configs/default.yaml --config configs/best.yaml``
resolve to the same run, and ``--help`` shows the defaults that really apply.
"""

import difflib
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateFinder,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelPruning,
    ProgressBar,
    WeightAveraging,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.checkpointing import (
    CheckpointError,
    JobIdentity,
    SaveOnInterrupt,
    best_checkpoint,
    find_last_checkpoint,
    job_identity,
    last_checkpoints,
    load_checkpoint,
)
from project.errors import UserError
from project.hardware import cpu_has_native_bf16, recommended_precision
from project.hooks import Finishes, LogsConfig, UsesRunFolder
from project.inputs import stated_contract
from project.module import MNISTClassifier
from project.visuals import TensorBoardImages
from project.writer import first_free, free_path, numbered

# The recipe every command starts from; --config files and flags override it key by key.
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


class TrainerConfigError(UserError, RuntimeError):
    """The Trainer options given (accelerator, devices, strategy, precision) cannot run on this machine."""


class InputMismatch(UserError, ValueError):
    """The network cannot take the images the DataModule gives, or gives another number of classes."""


def check_net_takes_the_data(net: torch.nn.Module, datamodule: L.LightningDataModule, num_classes: int) -> None:
    """Run ``net`` on two zero images of the shape the DataModule states (its ``input_contract()``), before any
    run folder is made: a channel or size mismatch is one line naming both sides, not a traceback from inside the
    model summary. Eval mode and no grad: batch-norm statistics are left as they were."""
    if (contract := stated_contract(datamodule)) is None:
        return
    shape = contract.shape  # (C, H, W)
    given = [f"data.{k}={datamodule.hparams[k]}" for k in ("channels", "image_size") if k in datamodule.hparams]
    data = f"{type(datamodule).__name__} gives {shape[0]}x{shape[1]}x{shape[2]} images" + (
        f" ({', '.join(given)})" if given else ""
    )
    was_training = net.training
    try:
        with torch.no_grad():
            logits = net.eval()(torch.zeros(2, *shape))
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()[0]
        raise InputMismatch(
            f"model.net ({type(net).__name__}) cannot take the images: {data}, and the network fails on them "
            f"({why}). Make them agree: the network's input (e.g. model.net.init_args.in_channels, or a network for "
            "that size such as project.resnet.SmallResNet) or the data's (data.channels, data.image_size)."
        ) from None
    finally:
        net.train(was_training)
    if tuple(logits.shape) != (2, num_classes):
        raise InputMismatch(
            f"model.net ({type(net).__name__}) gives logits of shape {tuple(logits.shape[1:])} for {data}, not "
            f"({num_classes},): one logit per class of the data. Give the network num_classes={num_classes}."
        )


# The Trainer options that pick the hardware, in the order an error message names them.
HARDWARE_KEYS = ("accelerator", "devices", "strategy", "precision", "num_nodes")
# A Trainer feature that can be switched off, and the configured callbacks that cannot work without it.
NEEDS_FEATURE: dict[str, tuple[type, ...]] = {
    "logger": (LearningRateMonitor, TensorBoardImages),
    "enable_checkpointing": (ModelCheckpoint, SaveOnInterrupt),
    "enable_progress_bar": (ProgressBar,),
}
# The callbacks that are top-level keys of their own (``--early_stopping.patience 5``, ``--pruning.sparsity 0.9``,
# ``--early_stopping null``), and the class each must derive from.
NAMED_CALLBACKS: dict[str, type] = {
    "checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    "pruning": ModelPruning,
    "lr_find": LearningRateFinder,
    "averaging": WeightAveraging,
}
# Model arguments that change how the network runs, not what it is: a command-line value beats the checkpoint's.
RUNTIME_MODEL_KEYS = ("compile", "channels_last")


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


class LightningNoise(logging.Filter):
    """Drop Lightning's console lines that are not about the user's run (advertising, absent accelerators)."""

    NOISE = re.compile(
        r"💡 Tip|GPU available: False|TPU available: False|HPU available: False"
        r"|Loading `train_dataloader` to estimate number of stepping batches"  # WarmupCosineLR asked for the length
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.NOISE.search(record.getMessage())


def quiet_lightning() -> None:
    """Filter what Lightning prints that the user can do nothing about; idempotent."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, LightningNoise) for f in log.filters):
            log.addFilter(LightningNoise())
    # Lightning's own use of jsonargparse APIs deprecated upstream: not the user's to fix.
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
    # Raised inside Lightning's own pytree helper on every fit with torch >= 2.10; nothing for the user to change.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")  # num_workers=0 is measured fastest
    # The model summary cannot count FLOPs under bf16 autocast on a CPU; the parameter counts it prints are right.
    warnings.filterwarnings("ignore", message=r".*Precision .* is not supported by the model summary.*")
    # Resuming into the run's own checkpoint folder is the point of `--ckpt_path last`.
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")
    warnings.filterwarnings("ignore", message=r".*args parameter is intended to run from within Python.*")  # we do
    if not os.environ.get("SLURM_JOB_ID"):  # outside a SLURM job, `srun` on PATH says nothing about this run
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, as Lightning read it from the environment at import: known before a
    Trainer's strategy is set up. (Lightning sets ``rank_zero_only.rank`` on the function; no type declares it.)"""
    return rank_zero_only.rank == 0  # type: ignore[attr-defined]


def resolve(class_path: str) -> type | None:
    """The class a config's ``class_path`` names, or None if it cannot be imported (jsonargparse will say why)."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
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


def traceback_file(exc: BaseException) -> str:
    """The file of the innermost frame that raised ``exc``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename if tb is not None else ""


def option_source(argv: list[str], key: str) -> str | None:
    """Where the last value of the dotted ``key`` in ``argv`` came from: a ``--config`` file, or the command line."""
    source = None
    top, _, rest = key.partition(".")
    for i, arg in enumerate(argv):
        if (arg in ("--config", "-c") and i + 1 < len(argv)) or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
            try:
                tree = yaml.safe_load(Path(path).read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(tree, dict) and isinstance(tree.get(top), dict) and rest in tree[top]:
                source = path
        elif arg == f"--{key}" or arg.startswith(f"--{key}="):
            source = "the command line"
    return source


def explain_trainer_error(exc: BaseException, trainer: dict[str, Any], argv: list[str]) -> str:
    """One line for a Trainer that cannot be built here: the option, where it was set, and what to use instead."""
    accelerator = str(trainer.get("accelerator"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        where = option_source(argv, "trainer.accelerator")
        by = f" (set by {where})" if where else ""
        instead = []
        if str(trainer.get("precision")) in ("16-mixed", "16", "16-true"):
            bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16: it would be emulated and slow"
            instead.append(
                f"configs/bf16-mixed.yaml on a CPU with native bf16 (this one has {bf16}) or no precision overlay"
            )
        if trainer.get("strategy") not in (None, "auto") or trainer.get("devices") not in (None, "auto", 1):
            instead.append("configs/ddp_cpu.yaml for several processes on this CPU")
        use = "; ".join(instead) or "leave trainer.accelerator at auto (or set cpu)"
        return (
            f"trainer.accelerator={accelerator!r}{by} needs a CUDA GPU, and this machine has none "
            f"(`python -m project env` says what it has). Use instead: {use}."
        )
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    sources = {k: option_source(argv, f"trainer.{k}") for k in HARDWARE_KEYS}
    named = [k for k in HARDWARE_KEYS if k in message.lower()] or [k for k in HARDWARE_KEYS if sources[k]]
    named = [k for k in named if sources[k]] or named or ["accelerator"]  # what the user set, where Lightning says
    options = ", ".join(
        f"trainer.{k}={trainer.get(k)!r}" + (f" (set by {sources[k]})" if sources[k] else "") for k in named
    )
    return f"{options}: not available on this machine: {message} (`python -m project env` says what it has)."


# jsonargparse's error for an argument a class_path's class does not take (its wording in 4.53).
NOT_ACCEPTED = re.compile(
    r'Parser key "(?P<key>[^"]+)":.*?given class_path \'(?P<class_path>[^\']+)\':'
    r"\s+Option '(?P<name>[^']+)' is not accepted",
    re.S,
)


class SuggestingParser(LightningArgumentParser):
    """LightningCLI's parser, whose "unrecognized arguments" error names the closest options that exist."""

    def error(self, message: str, ex: Exception | None = None) -> Any:
        # A misspelt argument of a class given by class_path (--data.batch_sise) is a 10-line Union error.
        found = NOT_ACCEPTED.search(message)
        if found:
            key, class_path, name = found.group("key", "class_path", "name")
            module, _, attr = class_path.rpartition(".")
            params = [
                p.name
                for p in inspect.signature(getattr(importlib.import_module(module), attr)).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            close = difflib.get_close_matches(name, params, n=2, cutoff=0.6)
            hint = f" Did you mean {' or '.join(f'--{key}.{c}' for c in close)}?" if close else ""
            listed = ", ".join(params)
            message = f"--{key}.{name}: {class_path} has no argument {name!r}.{hint} Its arguments: {listed}."
        elif message.startswith("unrecognized arguments:"):
            parser = getattr(ex, "subcommand_parser", None) or self
            known = [o for o in parser._option_string_actions if o.startswith("--")]
            hints = []
            for token in message.split(":", 1)[1].split():
                option = token.split("=", 1)[0]
                close = difflib.get_close_matches(option, known, n=2, cutoff=0.75) if option.startswith("--") else []
                if close:
                    hints.append(f"{option}: did you mean {' or '.join(close)}?")
            if hints:
                message = f"{message}\n" + "\n".join(hints)
        return super().error(message, ex)


class MNISTCLI(LightningCLI):
    """LightningCLI with the recipe as default, named callbacks, features that switch off cleanly, and safe loading.

    Beyond LightningCLI: ``checkpoint``, ``early_stopping``, ``pruning`` and ``lr_find`` are top-level keys
    (``--early_stopping.patience 5``, ``--early_stopping null``, ``--pruning.sparsity 0.9``); ``trainer.precision:
    null`` is the measured default for this machine; a switched-off Trainer feature drops the callbacks that need it;
    every checkpoint is loaded with the safe unpickler first.
    """

    def __init__(
        self,
        *args: Any,
        argv: list[str] | None = None,
        callbacks: list[L.Callback] | None = None,
        run_folder: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._argv = list(argv or [])
        self._run_folder = run_folder
        # Objects no config can describe: a search's pruning callback; the job's identity in every checkpoint.
        self._callbacks = [*(callbacks or []), JobIdentity()]
        self._new_folder: Path | None = None  # the run or evaluation folder this command makes, if it makes one
        try:
            super().__init__(*args, **kwargs)
        except UserError:
            self._forget_failed_folder()
            raise

    def _forget_failed_folder(self) -> None:
        """A command stopped by bad input leaves no folder for TensorBoard to list: the one it made (a config and
        an empty event file) goes, unless it holds a checkpoint."""
        folder = self._new_folder
        if folder is not None and folder.is_dir() and is_rank_zero() and not any(folder.rglob("*.ckpt")):
            shutil.rmtree(folder, ignore_errors=True)
            if folder.parent.name == "eval" and not any(folder.parent.iterdir()):
                folder.parent.rmdir()

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Only the subcommand being run gets a parser: building all four costs ~0.4 s per command."""
        every = LightningCLI.subcommands()
        wanted = self._argv[0] if self._argv else None
        return {wanted: every[wanted]} if wanted in every else every

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
        # Callbacks users change most, as keys of their own: `--trainer.callbacks.patience` would change the last
        # callback of the list instead. null switches one off.
        # pruning and lr_find are off unless an overlay names one (configs/prune.yaml, configs/lr_find.yaml).
        for key, base in NAMED_CALLBACKS.items():
            parser.add_lightning_class_args(base, key, subclass_mode=True, required=False)
        # The data names the classes of a model it trains. A checkpoint's model keeps its own (they are among the
        # hyperparameters LightningCLI rebuilds it from): another folder, or none, cannot rename or resize it.
        evaluating = self._argv[:1] in (["validate"], ["test"], ["predict"]) and command_line_keys(
            self._argv, "ckpt_path"
        )
        if not evaluating:
            parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
            parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
            parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        entry = run_logger(self.config[subcommand]) if subcommand is not None else None
        if self._run_folder is not None and entry is not None:  # before the checkpoint check, which compares folders
            entry.init_args.name, entry.init_args.version = self._run_folder
        if subcommand is not None:  # before LightningCLI reads the checkpoint's hyperparameters
            try:
                self._check_checkpoint(self.config[subcommand], subcommand)
            except CheckpointError as exc:
                parser.error(str(exc))

    def _check_checkpoint(self, config: Namespace, subcommand: str) -> None:
        """Resolve ``--ckpt_path last`` / ``best`` / ``auto``, refuse missing or unsafe checkpoints, and log into the
        checkpoint's run."""
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
        if evaluating:
            pick = best_checkpoint if ckpt == "best" else find_last_checkpoint
            found = pick(run_root) if run_root is not None else None
            if found is None:
                raise CheckpointError(
                    f"--ckpt_path {ckpt}: no run under {run_root} has a {ckpt} checkpoint to {subcommand}. Fit one "
                    "first, or give the checkpoint's path."
                )
            ckpt = str(found)
            rank_zero_info(f"--ckpt_path {config.ckpt_path}: {found}.")
        elif ckpt == "auto":
            found = self._last_checkpoint_of_this_job(run_root) if run_root is not None else None
        elif ckpt == "last":
            found = find_last_checkpoint(run_root) if run_root is not None else None
        if ckpt in ("last", "auto"):
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
                # TensorBoard drops what the interrupted process logged after this step (it is trained again):
                # one curve, not a fork. Points before it stay.
                logger.purge_step = step
            rank_zero_info(f"Resuming {run} ({path.name}, epoch {checkpoint.get('epoch')}, global step {step}).")
            return
        # An evaluation gets a folder of its own inside the run, <run>/eval/<command>_<n>/, with its config, metrics
        # and predictions: traceable to the run without adding points to the run's own curves.
        folder = first_free(numbered(run / "eval", f"{subcommand}_"))
        logger.save_dir, logger.name, logger.version = str(run), "eval", folder.name
        rank_zero_info(f"Evaluating {path.name} of {run}: results in {folder}.")

    @staticmethod
    def _last_checkpoint_of_this_job(run_root: Path) -> Path | None:
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

    def _parse_ckpt_path(self) -> None:
        """Rebuild the model from the checkpoint's hyperparameters, and say which command-line model keys lose."""
        subcommand = self.config.get("subcommand")
        if not subcommand or not self.config[subcommand].get("ckpt_path"):
            return super()._parse_ckpt_path()
        given = self.config[subcommand].model.clone()
        super()._parse_ckpt_path()
        model = self.config[subcommand].model
        ignored = []
        for key in command_line_keys(self._argv, "model."):
            top = key.split(".")[1]  # compare the whole argument: `model.net.hidden` is shorthand for init_args
            if top not in given or given.get(top) == model.get(top):
                continue
            if top in RUNTIME_MODEL_KEYS:
                model[top] = given[top]
            else:
                ignored.append(f"--{key}")
        if ignored:
            rank_zero_info(
                f"Warning: ignored {', '.join(ignored)}: the model is rebuilt from the hyperparameters saved in "
                f"{self.config[subcommand].ckpt_path}, which describe the trained network. To train another one, "
                "use fit without --ckpt_path (or with --model.init_from <ckpt> ... to start from its weights)."
            )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        optimizer = config.model.get("optimizer")
        lr = optimizer.get("init_args", Namespace()).get("lr") if isinstance(optimizer, Namespace) else None
        if isinstance(lr, (int, float)) and lr <= 0:
            self.parser.error(f"model.optimizer.init_args.lr must be > 0, got {lr}.")
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        self._drop_callbacks_of_switched_off_features(config)
        # `trainer.precision` left unset (null) means "the fastest that is safe here", decided per machine.
        if config.trainer.precision is None:
            config.trainer.precision = recommended_precision(str(config.trainer.accelerator))
            rank_zero_info(f"trainer.precision not set: using {config.trainer.precision!r} for this machine.")

    def _drop_callbacks_of_switched_off_features(self, config: Namespace) -> None:
        """``--trainer.logger false`` and friends: drop the configured callbacks that need the feature, say which."""
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
            for key in NAMED_CALLBACKS:
                value = config.get(key)
                cls = resolve(str(value.class_path)) if isinstance(value, Namespace) else None
                if cls is not None and issubclass(cls, needers):
                    config[key] = None
                    dropped.append(f"{key}: {cls.__name__} (trainer.{feature}=false)")
        if config.trainer.get("logger") is False:
            dropped.append("the HParams summary and the saved config.yaml (trainer.logger=false)")
            self.save_config_callback = None
        if config.trainer.get("enable_checkpointing") is False and config.get("test_after_fit"):
            dropped.append("test_after_fit tests the final weights, not the best checkpoint (no checkpointing)")
        if dropped:
            rank_zero_info("Switched off with their feature: " + "; ".join(dropped) + ".")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as exc:  # a bad value in the config: say which, without a traceback
            self.parser.error(str(exc))
        if self.subcommand == "fit":
            check_net_takes_the_data(self.model.net, self.datamodule, int(self.model.hparams["num_classes"]))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        # A named callback set to null (`--early_stopping null`) is absent, not None, in the Trainer's list.
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        extra = [config.get(key) for key in NAMED_CALLBACKS]
        trainer_config = {**config.get("trainer", {}), **kwargs}
        try:
            trainer = self._instantiate_trainer(trainer_config, [c for c in extra if c is not None] + self._callbacks)
        except (MisconfigurationException, ModuleNotFoundError, TypeError) as exc:
            # Lightning's connector says a device, strategy or precision is not available with a 30-line traceback;
            # the user gave the option, so name it. Errors raised elsewhere (our code, a bug) keep their traceback.
            if not isinstance(exc, MisconfigurationException) and "/lightning/" not in traceback_file(exc):
                raise
            raise TrainerConfigError(explain_trainer_error(exc, trainer_config, self._argv)) from exc
        if trainer.log_dir is not None and not Path(trainer.log_dir).exists():
            self._new_folder = Path(trainer.log_dir)
        # A logger beside TensorBoard that keeps files of its own (a tracker's offline run) may keep them in the run's
        # folder: once a command runs (not for a parse only), on the process that writes the run (rank 0).
        board = trainer.loggers[0] if trainer.loggers else None
        keeps_files = self.subcommand is not None and is_rank_zero() and isinstance(board, TensorBoardLogger)
        if keeps_files and board is not None and board.log_dir:
            for logger in trainer.loggers[1:]:
                if isinstance(logger, UsesRunFolder):
                    logger.use_run_folder(Path(board.log_dir))
        return trainer

    def after_fit(self) -> None:
        """Optionally test the best checkpoint, then give TensorBoard's HParams tab the run's real results."""
        trainer = self.trainer
        metrics = {}
        if "val/acc_best" in trainer.callback_metrics:
            metrics["val/acc_best"] = float(trainer.callback_metrics["val/acc_best"])
        if self.config.fit.test_after_fit:
            checkpoint = trainer.checkpoint_callback
            best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
            results = trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)
            metrics["test/acc"] = results[0]["test/acc"]
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and metrics:
                logger.log_hyperparams(
                    {"model": dict(self.model.hparams), "data": dict(self.datamodule.hparams)}, metrics
                )
                logger.experiment.flush()  # the Trainer has finalised the logger already: write it now

    def _write_metrics(self) -> None:
        """Save an evaluation's metrics as ``metrics.json`` in its folder, beside its config."""
        trainer = self.trainer
        if trainer.is_global_zero and trainer.logger is not None and trainer.log_dir:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
            folder = Path(trainer.log_dir)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")

    def after_validate(self) -> None:
        self._write_metrics()

    def after_test(self) -> None:
        self._write_metrics()


def run(
    argv: list[str],
    prog: str = "python -m project",
    subcommand: bool = True,
    callbacks: list[L.Callback] | None = None,
    run_folder: tuple[str, str] | None = None,
    exit_on_error: bool = True,
) -> MNISTCLI:
    """Run ``argv`` (``fit ...``, ``test ...``, ...) through the CLI, starting from the default recipe.

    With ``subcommand=False`` ``argv`` holds only options: the classes are built and nothing is run (benchmarks).
    ``callbacks`` are added to the configured ones (objects built in Python, e.g. a search's pruning callback).
    ``run_folder`` is the run's ``(name, version)`` under the TensorBoard logger's ``save_dir``, whatever the config
    says (a cross-validation's ``mnist/cv_0``, ``fold_2``). A logger with a ``finish()`` method (a tracker's run) is
    finished when the command is done, so that the next run in this process starts a run of its own. With
    ``exit_on_error=False`` (``subcommand=False`` only) a bad option raises jsonargparse's ``ArgumentError``, which
    names it, instead of printing it and exiting.
    """
    quiet_lightning()
    defaults: dict[str, Any] = {"default_config_files": [str(DEFAULT_RECIPE)]} if DEFAULT_RECIPE.is_file() else {}
    parser_kwargs: dict[str, Any]
    if subcommand:
        every = LightningCLI.subcommands()
        commands = [argv[0]] if argv and argv[0] in every else list(every)  # MNISTCLI.subcommands() agrees
        parser_kwargs = {"prog": prog, **{command: dict(defaults) for command in commands}}
    else:
        parser_kwargs = {"prog": prog, "exit_on_error": exit_on_error, **defaults}
    try:
        cli = MNISTCLI(
            MNISTClassifier,
            L.LightningDataModule,  # any DataModule by class path; default.yaml names MNISTDataModule
            subclass_mode_data=True,
            args=argv,
            argv=argv,
            callbacks=callbacks,
            run_folder=run_folder,
            run=subcommand,
            save_config_callback=KeepingSaveConfigCallback,
            parser_class=SuggestingParser,
            auto_configure_optimizers=False,  # one place for the optimizer: model.optimizer / model.scheduler
            parser_kwargs=parser_kwargs,
        )
    except SIGTERMException:  # SaveOnInterrupt has saved a checkpoint and said where: exit without a traceback
        raise SystemExit(143) from None
    for logger in cli.trainer.loggers if subcommand else []:
        if isinstance(logger, Finishes):
            logger.finish()
    return cli


def subcommand_main(name: str) -> Callable[[list[str]], MNISTCLI]:
    """The entry of LightningCLI's subcommand ``name`` (``fit``, ...): ``main(argv)`` as every command has."""

    def main(argv: list[str]) -> MNISTCLI:
        from project.cli import prog_name

        return run([name, *argv], prog=prog_name())

    main.__doc__ = f"``{name}`` with ``argv``, the command's options: returns the LightningCLI."
    return main


fit, validate, test, predict = (subcommand_main(name) for name in ("fit", "validate", "test", "predict"))
