"""The optional hooks the template looks for on your own DataModule, logger, scheduler or feature, in one place.

Every hook is optional: an object without it works, and loses only what the hook gives. The template checks for a
hook with ``isinstance(obj, Hook)`` (the classes below are ``typing.Protocol``\\ s, checked at run time by name),
so implement the methods or attributes as written here; subclassing is not needed. docs/start-a-project.md says
when to write each.
"""

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # inputs imports the checkpoint helpers; a DataModule of yours need not import them to match
    from torch import Tensor

    from project.inputs import InputContract


# --- on a LightningDataModule -----------------------------------------------------------------------------------


@runtime_checkable
class StatesInputContract(Protocol):
    """Says what images the model takes and how a raw image becomes one. Written into every checkpoint, so that
    ``predict --data.predict_dir`` and each feature that answers with a model prepare images as training did."""

    def input_contract(self) -> "InputContract": ...


@runtime_checkable
class TakesInputContract(Protocol):
    """Takes a checkpoint's contract before resuming, testing or predicting, to prepare and normalise the images
    as that checkpoint's training did (rather than from its own arguments)."""

    def load_input_contract(self, contract: "InputContract") -> None: ...


@runtime_checkable
class NamesPredictInputs(Protocol):
    """Names the inputs of ``predict`` by file: the CSV gets a ``path`` column (rather than the index), and a row
    with the ``error`` of each file that could not be read. Both are filled by ``setup("predict")``."""

    predict_files: Sequence[Path]  # the file of each predicted image, in the order of the predict dataloader
    predict_failures: Sequence[tuple[Path, str]]  # (file, why) for each file left out


@runtime_checkable
class TakesASplit(Protocol):
    """Lets a callback choose the validation images (k folds, a list of your own): after ``setup("fit")``,
    ``split_labels()`` is the class of each image the train and val splits were drawn from, and
    ``use_split(train, val)`` trains and validates on those of them instead (indices into the same images). A split
    made at random is seeded with ``seed``; ``class_names`` name the classes in its errors."""

    @property
    def seed(self) -> int: ...

    @property
    def class_names(self) -> list[str]: ...

    def split_labels(self) -> "Tensor": ...

    def use_split(self, train: "Tensor", val: "Tensor") -> None: ...


# --- on a Lightning logger (beside TensorBoard, which owns the run folder) ---------------------------------------


@runtime_checkable
class LogsConfig(Protocol):
    """Gets the resolved config once a run starts: as a dict, and the path of the ``config.yaml`` saved."""

    def log_config(self, config: dict[str, Any], path: Path) -> None: ...


@runtime_checkable
class UsesRunFolder(Protocol):
    """Keeps files of its own (an offline run) in the run's folder, told before the first step (rank 0 only)."""

    def use_run_folder(self, folder: Path) -> None: ...


@runtime_checkable
class Finishes(Protocol):
    """Closes its run when the command is done, so that the next command in this process starts a run of its own
    (each fold of k folds, each trial of a search)."""

    def finish(self) -> None: ...


# --- on a learning-rate scheduler (model.scheduler) -------------------------------------------------------------


@runtime_checkable
class StepsEvery(Protocol):
    """Stepped every ``"step"`` (optimizer step) or ``"epoch"``, whatever ``model.scheduler_interval`` says."""

    interval: str


@runtime_checkable
class StepsOnMetric(Protocol):
    """Stepped on a logged metric (``ReduceLROnPlateau``'s kind), e.g. ``"val/loss"``."""

    monitor: str


@runtime_checkable
class FollowsTrainer(Protocol):
    """Its length is the run's: with ``follows_trainer`` true the LightningModule sets ``total_steps`` to the
    Trainer's ``estimated_stepping_batches`` (max_epochs, batches, accumulation and devices), one key to change."""

    follows_trainer: bool
    total_steps: int | None


# --- on a feature: a folder of the package, its __init__.py -------------------------------------------------------


@runtime_checkable
class HasCommand(Protocol):
    """A feature with a command of its own, named after its folder and described by the first line of its
    ``__init__.py``'s docstring. Import the heavy modules inside ``main``, not above it: ``--help`` stays fast."""

    def main(self, argv: list[str]) -> Any: ...


@runtime_checkable
class AddsCallbackKeys(Protocol):
    """A feature whose callbacks get top-level config keys of their own, like the core's ``checkpoint`` and
    ``early_stopping`` (``--pruning.sparsity 0.9``, ``pruning: null``): key -> import path of the base class."""

    CALLBACK_KEYS: dict[str, str]


@runtime_checkable
class AddsDefaultCallbacks(Protocol):
    """A feature whose callbacks every run gets unless switched off, each under a top-level key of its own
    (``--timer null`` switches one off, ``--timer.duration 00:01:00:00`` sets it): key -> import path of the callback,
    built with its defaults. The recipe (``configs/default.yaml``) need not name them: delete the folder and they
    are gone."""

    DEFAULT_CALLBACKS: dict[str, str]


def features() -> list[ModuleType]:
    """The features present: each folder of the package with an ``__init__.py``, imported (it is light). Delete a
    folder and whatever it declared is gone, with no edit elsewhere."""
    package = Path(__file__).parent
    inits = sorted(package.glob("*/__init__.py"))
    return [importlib.import_module(f"{__package__}.{init.parent.name}") for init in inits]
