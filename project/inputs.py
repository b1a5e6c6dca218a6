"""What a checkpoint's model expects of an image, written into the checkpoint: one contract for every consumer.

Each DataModule states it (``input_contract()``, declared in ``hooks.py``), ``KeepInputContract`` writes it
into every checkpoint (``checkpoint["input"]``), and everything that takes a raw image or a model out of training
reads it from there: ``predict --data.predict_dir``, and each feature that converts or answers with a model (docs/
names them). Nothing guesses it from a dataset's name. A DataModule of your own gets the same treatment by defining
``input_contract()`` (and ``load_input_contract(contract)``, to prepare and normalise as a checkpoint's training
did)."""

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, Literal

import lightning as L
import torch
from torch import Tensor

from project.checkpointing import CheckpointError
from project.errors import UserError
from project.hooks import StatesInputContract, TakesInputContract
from project.images import normalize, prepare_image, prepare_resized

KEY = "input"  # checkpoint[KEY]: the contract as plain data, which the safe loader reads
Preparation = Literal["mnist_digit", "resize"]


@dataclass(frozen=True)
class InputContract:
    """The images a model takes and how a raw image becomes one.

    Args:
        size: Side of the square images the network takes (H = W = size).
        channels: 1 (greyscale) or 3 (RGB).
        mean: Per-channel mean subtracted from the pixels scaled to 0-1.
        std: Per-channel standard deviation they are then divided by.
        class_names: The name of each output index.
        preparation: What a raw image file gets before normalisation: ``"mnist_digit"`` (``images.mnist_style``:
            white on black, fitted to a 20x20 box, centred by mass in 28x28, as MNIST was made) or ``"resize"``
            (converted to ``channels`` and resized to ``size`` x ``size``, as the folder DataModule reads its files).
    """

    size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]
    preparation: Preparation

    def __post_init__(self) -> None:
        problems = []
        if self.preparation not in ("mnist_digit", "resize"):
            problems.append(f"preparation {self.preparation!r} is not 'mnist_digit' or 'resize'")
        if self.channels not in (1, 3):
            problems.append(f"channels is {self.channels}, not 1 or 3")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            problems.append(f"mean {list(self.mean)} and std {list(self.std)} need {self.channels} value(s) each")
        if any(s <= 0 for s in self.std):
            problems.append(f"std {list(self.std)} must be > 0")
        if self.size < 1 or not self.class_names:
            problems.append(f"size {self.size} must be >= 1 and class_names not empty")
        if self.preparation == "mnist_digit" and (self.size, self.channels) != (28, 1):
            problems.append("the mnist_digit preparation makes 28x28 greyscale images")
        if problems:
            raise ValueError("input contract: " + "; ".join(problems) + ".")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InputContract":
        """The contract from its plain form (``to_dict``: a checkpoint's ``input``, a file's metadata).

        Raises:
            ValueError: naming the missing or bad fields.
        """
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"input contract: missing {', '.join(missing)} (has {', '.join(data) or 'nothing'}).")
        return cls(
            size=int(data["size"]),
            channels=int(data["channels"]),
            mean=tuple(float(v) for v in data["mean"]),
            std=tuple(float(v) for v in data["std"]),
            class_names=tuple(str(n) for n in data["class_names"]),
            preparation=data["preparation"],
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (ints, floats, strings, lists): what ``torch.load(weights_only=True)`` and JSON both read."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @property
    def shape(self) -> tuple[int, int, int]:
        """One image as the network takes it: (channels, size, size)."""
        return self.channels, self.size, self.size

    def prepare(self, source: Path | BinaryIO, max_pixels: int | None = None) -> Tensor:
        """Decode an image file (or its bytes as a file object) into uint8 (channels, size, size) pixels.

        Raises:
            ValueError: not an image, too large (``images.ImageTooLarge``), or no digit in it (``images.BlankImage``).
        """
        if self.preparation == "mnist_digit":
            return prepare_image(source, max_pixels)[None]  # (1, 28, 28)
        return prepare_resized(source, self.size, self.channels, max_pixels)

    def normalize(self, images: Tensor) -> Tensor:
        """uint8 pixels (B, C, S, S) -> the float images the network takes, channel by channel."""
        return normalize(images, self.mean, self.std)


def read_contract(checkpoint: dict[str, Any], path: str | Path) -> InputContract:
    """The contract a checkpoint (loaded with ``load_checkpoint``) records.

    Raises:
        CheckpointError: naming the file, when it records none or a malformed one.
    """
    saved = checkpoint.get(KEY)
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"ckpt_path {path} does not record what input its model expects (no checkpoint['{KEY}']): it was written "
            "by a DataModule without an input_contract() method, or by a template older than 0.4. Fit it again with "
            "a DataModule that has one (project/inputs.py says what it returns)."
        )
    try:
        return InputContract.from_dict(saved)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"ckpt_path {path}: checkpoint['{KEY}'] is malformed: {exc}") from exc


def stated_contract(datamodule: L.LightningDataModule | None) -> InputContract | None:
    """The contract ``datamodule`` states (``input_contract()``), or None if it states none."""
    return datamodule.input_contract() if isinstance(datamodule, StatesInputContract) else None


def datamodule_of(trainer: L.Trainer) -> L.LightningDataModule | None:
    """The trainer's DataModule, or None. Lightning sets ``trainer.datamodule`` when a run starts and declares it
    nowhere a type checker can see (2.6.6)."""
    return getattr(trainer, "datamodule", None)


def example_input(trainer: L.Trainer) -> Tensor | None:
    """One zero image (1, C, H, W) of the shape the trainer's DataModule states, or None if it states none."""
    if (contract := stated_contract(datamodule_of(trainer))) is None:
        return None
    return torch.zeros(1, contract.channels, contract.size, contract.size)


class KeepInputContract(L.Callback):
    """Write the DataModule's contract into every checkpoint (``checkpoint["input"]``), and hand a loaded
    checkpoint's contract back to the DataModule (``load_input_contract``): resuming, testing and predicting then
    prepare and normalise images as the checkpoint's training did."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if (contract := stated_contract(datamodule_of(trainer))) is not None:
            checkpoint[KEY] = contract.to_dict()

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        datamodule = datamodule_of(trainer)
        if isinstance(datamodule, TakesInputContract) and KEY in checkpoint:  # a malformed one: named, with the file
            datamodule.load_input_contract(read_contract(checkpoint, trainer.ckpt_path or "the checkpoint"))


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
