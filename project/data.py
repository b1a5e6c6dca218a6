"""MNIST as a LightningDataModule: files checked up front, a seeded train/val split, the test set for predict."""

import math
import os
import shutil
import tempfile
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, random_split
from torchvision import transforms
from torchvision.datasets import KMNIST, MNIST, FashionMNIST

from project.errors import UserError
from project.images import load_folder, normalize
from project.inputs import InputContract

MEAN, STD = 0.1307, 0.3081
# Same IDX format, same 28x28 greyscale, 10 classes: the torchvision class (which names the folder
# <data_dir>/<class name>/raw/ and downloads it), and the training set's pixel mean and std.
DATASETS: dict[str, tuple[type[MNIST], float, float]] = {
    "mnist": (MNIST, MEAN, STD),
    "fashion_mnist": (FashionMNIST, 0.2860, 0.3530),
    "kmnist": (KMNIST, 0.1918, 0.3483),
}
# The four IDX files torchvision reads from <data_dir>/<class name>/raw/, with their dimensionality.
IDX_FILES = {
    "train-images-idx3-ubyte": 3,
    "train-labels-idx1-ubyte": 1,
    "t10k-images-idx3-ubyte": 3,
    "t10k-labels-idx1-ubyte": 1,
}


def how_to_provide(folder: str = "MNIST") -> str:
    """The remedy for missing files, naming the dataset's own folder (``MNIST``, ``FashionMNIST``, ``KMNIST``)."""
    return (
        "Put the four uncompressed IDX files there, or point the project at a folder that holds "
        f"{folder}/raw/ with `export PATH_DATASETS=/path/to/data` or `--data.data_dir /path/to/data`."
    )


class DataError(UserError, RuntimeError):
    """Data a DataModule cannot use, named with the remedy: the console prints it as one line, no traceback.

    Raise it (or a subclass) from a DataModule of your own for the same treatment.
    """


class MNISTDataError(DataError):
    """The MNIST files are missing, cannot be downloaded, or are malformed."""


def check_folds(num_folds: int | None, fold: int) -> None:
    """``data.num_folds`` / ``data.fold`` must name one of at least two folds; raise ValueError naming the key."""
    if num_folds is not None and (num_folds < 2 or not 0 <= fold < num_folds):
        raise ValueError(
            f"data.num_folds={num_folds}, data.fold={fold}: num_folds must be at least 2, and fold from 0 to "
            "num_folds - 1."
        )


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
            f"data.num_folds={num_folds} needs at least {num_folds} images of every class in the training split, but "
            f"{', '.join(few)}: use fewer folds, or more images of those classes."
        )
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    order = order[torch.argsort(labels[order], stable=True)]  # grouped by class, shuffled within each class
    part = torch.arange(len(labels)) % num_folds  # the n-th image of the grouped list goes to fold n % K
    return order[part != fold].sort().values, order[part == fold].sort().values


def read_idx(path: Path, ndim: int) -> Tensor:
    """Read an uint8 IDX file, checking its header and length against each other.

    Args:
        path: The IDX file.
        ndim: Expected number of dimensions (3 for images, 1 for labels).

    Returns:
        A uint8 tensor of the shape the header gives.

    Raises:
        MNISTDataError: naming the file, if it is not a uint8 IDX file of ``ndim`` dimensions or is truncated.
    """
    data = path.read_bytes()
    header = 4 * (1 + ndim)
    # Magic number: two zero bytes, the element type (0x08 = uint8), the number of dimensions.
    if len(data) < header or data[:4] != bytes([0, 0, 0x08, ndim]):
        raise MNISTDataError(
            f"{path} is not a uint8 IDX file with {ndim} dimension(s) (bad header). "
            f"Replace it with the original file. {how_to_provide(path.parent.parent.name)}"
        )
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + prod(shape)
    if len(data) != expected:
        raise MNISTDataError(
            f"{path} is truncated or corrupt: its header promises shape {tuple(shape)} ({expected} bytes) "
            f"but the file has {len(data)} bytes. Replace it with the original MNIST file."
        )
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=header).view(*shape)


def load_split(raw_dir: Path, prefix: str) -> tuple[Tensor, Tensor]:
    """Read and cross-check one split (``prefix`` "train" or "t10k"): images (N, 28, 28) uint8, labels (N,) int64."""
    images_path = raw_dir / f"{prefix}-images-idx3-ubyte"
    labels_path = raw_dir / f"{prefix}-labels-idx1-ubyte"
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1).long()
    if images.shape[0] != labels.shape[0]:
        raise MNISTDataError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels."
        )
    if labels.numel() and int(labels.max()) > 9:
        raise MNISTDataError(f"{labels_path} holds label {int(labels.max())}; labels must be 0-9.")
    return images, labels


class PILImageDataset(Dataset):
    """Images (N, H, W) uint8 with labels (N,), each image passed through a torchvision transform as a PIL image.

    This is what ``torchvision.datasets.MNIST`` does per item (minus re-reading the files): the slow, general path.
    """

    def __init__(self, images: Tensor, labels: Tensor | None, transform: Callable[[Image.Image], Tensor]) -> None:
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | Tensor:
        x = self.transform(Image.fromarray(self.images[index].numpy(), mode="L"))
        return x if self.labels is None else (x, int(self.labels[index]))


class InMemoryDataset(Dataset):
    """Images (N, H, W) uint8 and labels (N,) held as two tensors, fetched a whole batch at a time.

    The DataLoader calls ``__getitems__`` with the batch's indices, so a batch costs one gather instead of
    ``batch_size`` PIL round trips; normalisation happens later, per batch, on the target device
    (``MNISTDataModule.on_after_batch_transfer``). Samplers, and so DDP sharding, work as for any dataset.
    """

    def __init__(self, images: Tensor, labels: Tensor | None) -> None:
        self.images = images
        self.labels = labels  # None for unlabelled images: items are then the images alone

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor] | Tensor:
        return self.images[index] if self.labels is None else (self.images[index], self.labels[index])

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor] | Tensor:
        index = torch.as_tensor(indices)
        if self.labels is None:
            return self.images[index]
        return self.images[index], self.labels[index]  # (B, H, W) uint8, (B,) int64


def keep_batch(batch: Any) -> Any:
    """Collate function for ``InMemoryDataset``: ``__getitems__`` already returns the batch, (images (B, C, H, W),
    labels (B,)) or images alone."""
    return batch


def random_shift_rotate(
    x: Tensor, max_shift: float = 2.0, max_degrees: float = 10.0, background: float = -MEAN / STD
) -> Tensor:
    """Shift each image by up to ``max_shift`` pixels and rotate it by up to ``max_degrees``, on x's device.

    Args:
        x: Normalised images (B, C, H, W); the border is filled with the background value (pixel 0).
        max_shift: Largest translation in pixels along each axis.
        max_degrees: Largest rotation in degrees, either way.
        background: The normalised value of a black pixel, used for the uncovered border.
    """
    b, _, h, w = x.shape
    angle = (torch.rand(b, device=x.device) * 2 - 1) * math.radians(max_degrees)
    # affine_grid works in [-1, 1] coordinates: one pixel is 2 / size.
    shift = (torch.rand(b, 2, device=x.device) * 2 - 1) * max_shift * 2 / torch.tensor([w, h], device=x.device)
    cos, sin = angle.cos(), angle.sin()
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x - background, grid, align_corners=False, padding_mode="zeros") + background


class MNISTDataModule(L.LightningDataModule):
    """MNIST (or Fashion-MNIST, KMNIST) through torchvision, normalised with the training set's mean / std.

    Args:
        data_dir: Folder holding ``MNIST/raw/``; ``None`` means ``$PATH_DATASETS``, else ``data/``.
        dataset: ``mnist``, ``fashion_mnist`` (folder ``FashionMNIST/raw/``) or ``kmnist`` (``KMNIST/raw/``).
        batch_size: Samples per batch (per process under DDP).
        num_workers: DataLoader worker processes.
        pin_memory: Pin host memory for faster copies to a GPU.
        val_size: Images held out of the 60k training set for validation (unless ``num_folds`` is set).
        seed: Seed of the train/val split (independent of the global seed).
        num_folds: Split the training set into this many stratified, seeded, disjoint parts and validate on part
            ``fold`` (``python -m project cv`` runs them all); ``None``: hold out ``val_size`` images.
        fold: Which part validates, ``0`` to ``num_folds - 1``.
        predict_split: Which split ``predict`` runs on.
        download: Download the files in ``prepare_data`` when they are missing.
        in_memory: Keep the images as one uint8 tensor, gather whole batches and normalise them on the target
            device (fast); ``False`` uses the per-image PIL + torchvision transform path.
        augment: Random shifts (±2 px) and rotations (±10°) of training batches, on the device.
        predict_dir: A folder of PNG/JPEG/BMP/GIF/WebP/TIFF digit images for ``predict``, made MNIST-like (see
            ``project.images``); files that cannot be decoded are reported and skipped. Overrides
            ``predict_split``.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        dataset: Literal["mnist", "fashion_mnist", "kmnist"] = "mnist",
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        val_size: int = 5000,
        seed: int = 42,
        num_folds: int | None = None,
        fold: int = 0,
        predict_split: Literal["train", "val", "test"] = "test",
        download: bool = True,
        in_memory: bool = True,
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
        check_folds(num_folds, fold)
        self.save_hyperparameters()
        self.data_dir = Path(data_dir if data_dir is not None else os.environ.get("PATH_DATASETS", "data"))
        self.dataset = dataset
        self.torchvision_class, self.mean, self.std = DATASETS[dataset]
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.val_size = val_size
        self.seed = seed
        self.num_folds, self.fold = num_folds, fold
        self.predict_split = predict_split
        self.download = download
        self.in_memory = in_memory
        self.augment = augment
        self.predict_dir = Path(predict_dir) if predict_dir is not None else None
        # Set by setup("predict") with predict_dir: the image of each prediction, and the undecodable files.
        self.predict_files: list[Path] = []
        self.predict_failures: list[tuple[Path, str]] = []
        self.splits: dict[str, Dataset] = {}

    @property
    def num_classes(self) -> int:
        return 10

    @property
    def class_names(self) -> list[str]:
        """torchvision's names of the classes: ``0 - zero`` ... for MNIST, ``T-shirt/top`` ... for Fashion-MNIST."""
        return list(self.torchvision_class.classes)

    @property
    def raw_dir(self) -> Path:
        return self.data_dir / self.torchvision_class.__name__ / "raw"

    def _missing_files(self) -> list[str]:
        return [name for name in IDX_FILES if not (self.raw_dir / name).is_file()]

    def _missing_error(self, missing: list[str], why: str = "") -> MNISTDataError:
        """The one error for absent files: which, where, why (if known), and how to provide them."""
        where = f"{self.dataset} files missing from {self.raw_dir.resolve()}: {', '.join(missing)}"
        remedy = how_to_provide(self.torchvision_class.__name__)
        return MNISTDataError(f"{where}{'; ' + why if why else ''}. {remedy}")

    def prepare_data(self) -> None:
        """Download missing files; when all four are there, touch nothing (the folder may be read-only)."""
        if self.predict_dir is not None and self.trainer is not None and self.trainer.predicting:
            return  # predicting on the user's own images: MNIST is not needed
        missing = self._missing_files()
        if not missing:
            return
        error = "downloading is off (--data.download false)"
        if self.download:
            try:
                self._download()
            except Exception as exc:  # urllib, HTTP, checksum and permission errors all end here
                error = f"the download failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
            missing = self._missing_files()
        if missing:
            raise self._missing_error(missing, error)

    def _download(self) -> None:
        """Download into a temporary folder and move the files into ``raw_dir`` only once all four are there.

        A failed download (offline, a mirror down) then leaves ``data_dir`` exactly as it was: no empty folders.
        """
        with tempfile.TemporaryDirectory(prefix="download-") as tmp:
            self.torchvision_class(tmp, train=True, download=True)
            self.torchvision_class(tmp, train=False, download=True)
            fetched = Path(tmp) / self.torchvision_class.__name__ / "raw"
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            for name in IDX_FILES:
                if not (self.raw_dir / name).is_file():
                    shutil.move(fetched / name, self.raw_dir / name)

    def setup(self, stage: str) -> None:
        """Check the files and build the datasets; runs on every process, before any training step."""
        if stage == "predict" and self.predict_dir is not None:
            self.predict_files, images, self.predict_failures = load_folder(self.predict_dir)
            if not self.predict_files:
                reasons = "; ".join(f"{path.name}: {reason}" for path, reason in self.predict_failures)
                raise MNISTDataError(f"data.predict_dir: no image in {self.predict_dir} could be decoded ({reasons}).")
            self.splits["predict"] = self._dataset(images, None)
            return
        missing = self._missing_files()
        if missing:  # prepare_data runs on one process per node only, so say it again here.
            raise self._missing_error(missing)
        if stage in ("fit", "validate") or (stage == "predict" and self.predict_split != "test"):
            images, labels = load_split(self.raw_dir, "train")
            if self.num_folds is not None:
                train, val = fold_indices(labels, self.num_folds, self.fold, self.seed, self.class_names)
                full = self._dataset(images, labels)
                self.splits.update(train=Subset(full, train.tolist()), val=Subset(full, val.tolist()))
            elif not 0 < self.val_size < len(images):
                raise MNISTDataError(
                    f"data.val_size={self.val_size} must be between 1 and {len(images) - 1} "
                    f"(the training set in {self.raw_dir} has {len(images)} images)."
                )
            else:
                full = self._dataset(images, labels)
                generator = torch.Generator().manual_seed(self.seed)
                parts = random_split(full, [len(full) - self.val_size, self.val_size], generator=generator)
                self.splits.update(train=parts[0], val=parts[1])
        if stage in ("test", "predict"):
            self.splits["test"] = self._dataset(*load_split(self.raw_dir, "t10k"))

    @property
    def transform(self) -> transforms.Compose:
        """The per-image path's torchvision transform (``in_memory=False``), with the current mean and std."""
        return transforms.Compose([transforms.ToTensor(), transforms.Normalize((self.mean,), (self.std,))])

    def _dataset(self, images: Tensor, labels: Tensor | None) -> InMemoryDataset | PILImageDataset:
        return InMemoryDataset(images, labels) if self.in_memory else PILImageDataset(images, labels, self.transform)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            collate_fn=keep_batch if self.in_memory else None,
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
        return InputContract(
            size=28,
            channels=1,
            mean=(self.mean,),
            std=(self.std,),
            class_names=tuple(self.class_names),
            preparation="mnist_digit",
        )

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
        if x.dtype == torch.uint8:
            x = normalize(x.unsqueeze(1), (self.mean,), (self.std,))  # (B, H, W) -> (B, 1, H, W)
        if self.augment and self.trainer is not None and self.trainer.training:
            x = random_shift_rotate(x, background=-self.mean / self.std)
        return x if y is None else (x, y)
