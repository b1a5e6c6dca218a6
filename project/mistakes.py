"""What a mistake in a command's options prints: "did you mean", the Trainer option that cannot run here and what
to use instead, and none of Lightning's lines that the user can do nothing about. Used by ``runs.py`` only.
"""

import difflib
import importlib
import inspect
import logging
import os
import re
import warnings
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from project.errors import UserError
from project.hardware import cpu_has_native_bf16


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


class TrainerConfigError(UserError, RuntimeError):
    """The Trainer options given (accelerator, devices, strategy, precision) cannot run on this machine."""


# The Trainer options that pick the hardware, in the order an error message names them.
HARDWARE_KEYS = ("accelerator", "devices", "strategy", "precision", "num_nodes")


def raised_by_lightning(exc: BaseException) -> bool:
    """Whether the innermost frame that raised ``exc`` is Lightning's (a connector refusing an option)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "/lightning/" in tb.tb_frame.f_code.co_filename


def explain_trainer_error(exc: BaseException, trainer: dict[str, Any]) -> str:
    """One line for a Trainer that cannot be built here: the option and its value, and what to use instead."""
    accelerator = str(trainer.get("accelerator"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
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
            f"trainer.accelerator={accelerator!r} needs a CUDA GPU, and torch sees none on this machine. Use "
            f"instead: {use}."
        )
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # The options Lightning's message names, else those given a value (auto is what an unset one means).
    given = [k for k in HARDWARE_KEYS if trainer.get(k) not in (None, "auto")]
    named = [k for k in HARDWARE_KEYS if k in message.lower()] or given or ["accelerator"]
    options = ", ".join(f"trainer.{k}={trainer.get(k)!r}" for k in named)
    return f"{options}: not available on this machine: {message}"


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
            # The options its --help lists (argparse keeps no public list of them); on this error path only.
            known = sorted(set(re.findall(r"(?<![\w-])--[A-Za-z_][\w.\-]*", parser.format_help())))
            hints = []
            for token in message.split(":", 1)[1].split():
                option = token.split("=", 1)[0]
                close = difflib.get_close_matches(option, known, n=2, cutoff=0.75) if option.startswith("--") else []
                if close:
                    hints.append(f"{option}: did you mean {' or '.join(close)}?")
            if hints:
                message = f"{message}\n" + "\n".join(hints)
        return super().error(message, ex)


def bad_learning_rate(config: Namespace) -> str | None:
    """What is wrong with ``model.optimizer``'s learning rate, if it is not > 0: said before any run folder is made
    (torch's optimizers say it only once the model is built)."""
    optimizer = config.model.get("optimizer")
    lr = optimizer.get("init_args", Namespace()).get("lr") if isinstance(optimizer, Namespace) else None
    return f"model.optimizer.init_args.lr must be > 0, got {lr}." if isinstance(lr, (int, float)) and lr <= 0 else None
