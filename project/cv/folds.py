"""One fold of k: the ``kfold`` key makes a fit validate on part ``fold`` of K stratified, seeded parts of the data.

    python -m project fit --kfold project.cv.folds.KFold --kfold.num_folds 5 --kfold.fold 2

The DataModule builds its splits as usual, then ``KFold`` replaces its train/val split with the fold's through the
DataModule's ``split_labels`` / ``use_split`` (``hooks.TakesASplit``); the test split stays untouched.
"""

import lightning as L
import torch
from torch import Tensor

from project.errors import DataError
from project.hooks import TakesASplit
from project.inputs import datamodule_of


def fold_indices(labels: Tensor, num_folds: int, fold: int, seed: int, names: list[str]) -> tuple[Tensor, Tensor]:
    """The (train, val) indices of fold ``fold`` of ``num_folds`` stratified, seeded, disjoint parts of ``labels``.

    The images are shuffled with ``seed``, grouped by class, and dealt out in turn: every class is spread over the
    folds as evenly as it can be (counts differ by at most one), and the K validation parts cover every image once.

    Raises:
        DataError: naming the class, if a class has fewer images than there are folds.
    """
    counts = torch.bincount(labels, minlength=len(names))
    few = [f"{names[c]!r} has {int(n)}" for c, n in enumerate(counts) if int(n) < num_folds]
    if few:
        raise DataError(
            f"kfold.num_folds={num_folds} needs at least {num_folds} images of every class in the training split, but "
            f"{', '.join(few)}: use fewer folds, or more images of those classes."
        )
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    order = order[torch.argsort(labels[order], stable=True)]  # grouped by class, shuffled within each class
    part = torch.arange(len(labels)) % num_folds  # the n-th image of the grouped list goes to fold n % K
    return order[part != fold].sort().values, order[part == fold].sort().values


class KFold(L.Callback):
    """Validate on part ``fold`` of ``num_folds`` stratified parts of the DataModule's training images, seeded with
    its ``seed``, and train on the others (the ``cv`` command runs every fold).

    Args:
        num_folds: K, the number of parts: at least 2.
        fold: The part that validates, ``0`` to ``num_folds - 1``.
    """

    def __init__(self, num_folds: int = 5, fold: int = 0) -> None:
        if num_folds < 2 or not 0 <= fold < num_folds:
            raise ValueError(
                f"kfold.num_folds={num_folds}, kfold.fold={fold}: num_folds must be at least 2, and fold from 0 to "
                "num_folds - 1."
            )
        self.num_folds, self.fold = num_folds, fold

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning sets the DataModule up before the callbacks: its own split is there to be replaced.
        if stage in ("fit", "validate"):
            self.split(datamodule_of(trainer))

    def split(self, datamodule: object) -> None:
        """Give ``datamodule`` (set up for ``fit``) this fold's train/val split.

        Raises:
            DataError: if the DataModule cannot take a split, or a class has fewer images than there are folds.
        """
        if not isinstance(datamodule, TakesASplit):
            raise DataError(
                f"kfold: {type(datamodule).__name__} cannot take a split: give it split_labels() and use_split() "
                "(project/hooks.py, TakesASplit)."
            )
        labels = datamodule.split_labels()
        train, val = fold_indices(labels, self.num_folds, self.fold, datamodule.seed, datamodule.class_names)
        datamodule.use_split(train, val)
