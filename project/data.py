"""MNIST as a LightningDataModule: files checked up front, a seeded train/val split, the test set for predict."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import KMNIST, MNIST, FashionMNIST

from project.batches import InMemoryDataset, keep_batch, random_shift_rotate
from project.images import load_folder, normalize
from project.inputs import InputContract
from project.mnist_files import MNISTDataError, check_files, ensure_files, load_split

MEAN, STD = 0.1307, 0.3081
# Same IDX files, 28x28 greyscale, 10 classes: torchvision's class (folder <class name>/raw/), training mean, std.
DATASETS: dict[str, tuple[type[MNIST], float, float]] = {
    "mnist": (MNIST, MEAN, STD),
    "fashion_mnist": (FashionMNIST, 0.2860, 0.3530),
    "kmnist": (KMNIST, 0.1918, 0.3483),
}


class MNISTDataModule(L.LightningDataModule):
    """MNIST (or Fashion-MNIST, KMNIST) through torchvision, normalised with the training set's mean / std.

    Args:
        data_dir: Folder holding ``MNIST/raw/``; ``None`` means ``$PATH_DATASETS``, else ``data/``.
        dataset: ``mnist``, ``fashion_mnist`` (folder ``FashionMNIST/raw/``) or ``kmnist`` (``KMNIST/raw/``).
        batch_size: Samples per batch (per process under DDP).
        num_workers: DataLoader worker processes.
        pin_memory: Pin host memory for faster copies to a GPU.
        val_size: Images held out of the 60k training set for validation.
        seed: Seed of the train/val split (independent of the global seed).
        predict_split: Which split ``predict`` runs on.
        download: Download the files in ``prepare_data`` when they are missing.
        augment: Random shifts (±2 px) and rotations (±10°) of training batches, on the device.
        predict_dir: A folder of your own digit images for ``predict``, made MNIST-like (``images.py``);
            undecodable files are reported and skipped. Overrides ``predict_split``.
    """

    num_classes = 10  # each of DATASETS; linked to model.num_classes by the CLI

    def __init__(
        self,
        data_dir: str | None = None,
        dataset: Literal["mnist", "fashion_mnist", "kmnist"] = "mnist",
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        val_size: int = 5000,
        seed: int = 42,
        predict_split: Literal["train", "val", "test"] = "test",
        download: bool = True,
        augment: bool = False,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        limits = (("batch_size", batch_size, 1), ("num_workers", num_workers, 0), ("val_size", val_size, 1))
        for key, value, low in limits:
            if value < low:
                raise ValueError(f"data.{key} must be at least {low}, got {value}.")
        if dataset not in DATASETS:
            raise ValueError(f"data.dataset must be one of {', '.join(DATASETS)}, got {dataset!r}.")
        self.save_hyperparameters()
        self.data_dir = Path(data_dir if data_dir is not None else os.environ.get("PATH_DATASETS", "data"))
        self.dataset = dataset
        self.torchvision_class, self.mean, self.std = DATASETS[dataset]
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.val_size, self.seed = val_size, seed
        self.predict_split, self.download, self.augment = predict_split, download, augment
        self.predict_dir = Path(predict_dir) if predict_dir is not None else None
        # Set by setup("predict") with predict_dir: the image of each prediction, and the undecodable files.
        self.predict_files: list[Path] = []
        self.predict_failures: list[tuple[Path, str]] = []
        self.splits: dict[str, Dataset] = {}

    @property
    def class_names(self) -> list[str]:
        """torchvision's names of the classes: ``0 - zero`` ... for MNIST, ``T-shirt/top`` ... for Fashion-MNIST."""
        return list(self.torchvision_class.classes)

    @property
    def raw_dir(self) -> Path:
        return self.data_dir / self.torchvision_class.__name__ / "raw"

    def prepare_data(self) -> None:
        """Download the files if any is missing (and ``download`` allows it); otherwise touch nothing."""
        if self.predict_dir is not None and self.trainer is not None and self.trainer.predicting:
            return  # predicting on the user's own images: MNIST is not needed
        ensure_files(self.torchvision_class, self.raw_dir, self.dataset, self.download)

    def setup(self, stage: str) -> None:
        """Check the files and build the datasets; runs on every process, before any training step."""
        if stage == "predict" and self.predict_dir is not None:
            self.predict_files, images, self.predict_failures = load_folder(self.predict_dir)
            self.splits["predict"] = self._dataset(images, None)
            return
        check_files(self.raw_dir, self.dataset)  # prepare_data runs on one process per node only: check here too
        if stage in ("fit", "validate") or (stage == "predict" and self.predict_split != "test"):
            images, self.train_labels = load_split(self.raw_dir, "train")
            if not 0 < self.val_size < len(images):
                raise MNISTDataError(
                    f"data.val_size={self.val_size} must be between 1 and {len(images) - 1} "
                    f"(the training set in {self.raw_dir} has {len(images)} images)."
                )
            self.full = self._dataset(images, self.train_labels)  # train and val: Subsets of it (use_split)
            # the last val_size of a seeded permutation, as torch's random_split takes them
            order = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.seed))
            self.use_split(order[: -self.val_size], order[-self.val_size :])
        if stage in ("test", "predict"):
            self.splits["test"] = self._dataset(*load_split(self.raw_dir, "t10k"))

    def split_labels(self) -> Tensor:
        """The class of each image of the training set, which train and val share (``hooks.TakesASplit``)."""
        return self.train_labels

    def use_split(self, train: Tensor, val: Tensor) -> None:
        """Train on the ``train`` images of the training set and validate on the ``val`` ones."""
        self.splits.update(train=Subset(self.full, train.tolist()), val=Subset(self.full, val.tolist()))

    def _dataset(self, images: Tensor, labels: Tensor | None) -> Dataset:
        return InMemoryDataset(images, labels)  # uint8, normalised a batch at a time in on_after_batch_transfer

    def _loader(self, split: str, shuffle: bool = False, collate_fn: Callable | None = keep_batch) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            collate_fn=collate_fn,  # keep_batch: InMemoryDataset.__getitems__ already gives the batch
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict" if self.predict_dir is not None else self.predict_split)

    def input_contract(self) -> InputContract:
        """What the model trained on this data takes (saved in each checkpoint: ``project.inputs``)."""
        names, mean, std = tuple(self.class_names), (self.mean,), (self.std,)
        return InputContract(size=28, channels=1, mean=mean, std=std, class_names=names, preparation="mnist_digit")

    def load_input_contract(self, contract: InputContract) -> None:
        """Normalise as the checkpoint's training did; refuse a checkpoint whose model takes other images."""
        if contract.preparation != "mnist_digit":
            raise MNISTDataError(
                f"the checkpoint's model takes {contract.channels}-channel {contract.size}x{contract.size} "
                f"{contract.preparation} images, not MNIST digits: use the DataModule it was trained with."
            )
        self.mean, self.std = contract.mean[0], contract.std[0]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Normalise (and, when training with ``augment``, shift/rotate) in-memory batches on their device."""
        x, y = (batch, None) if isinstance(batch, Tensor) else batch
        if x.dtype == torch.uint8:  # the model summary's example input, float (1, C, H, W), comes through here too
            x = normalize(x.unsqueeze(1), (self.mean,), (self.std,))  # uint8 (B, H, W) -> float (B, 1, H, W)
        if self.augment and self.trainer is not None and self.trainer.training:
            x = random_shift_rotate(x, background=-self.mean / self.std)
        return x if y is None else (x, y)
