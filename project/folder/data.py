"""Your own images, no code: one folder per class (``my_data/cat/*.png``, ``my_data/dog/*.jpg``) as a DataModule."""

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from project.batches import InMemoryDataset, keep_batch, random_shift_rotate
from project.errors import DataError
from project.images import IMAGE_SUFFIXES, list_files, normalize, prepare_resized
from project.inputs import InputContract


class FolderDataError(DataError):
    """The image folder is missing, empty, has a class without images, or no image could be decoded."""


class FileDataset(Dataset):
    """Images decoded from disk on every access: for a set too large to hold in memory (use num_workers > 0)."""

    def __init__(self, files: list[Path], labels: Tensor, size: int, channels: int) -> None:
        self.files, self.labels, self.size, self.channels = files, labels, size, channels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return prepare_resized(self.files[index], self.size, self.channels), self.labels[index]


class ImageFolderDataModule(L.LightningDataModule):
    """Images in one sub-folder per class; the class names and their number come from the folder names.

    ``root/<class>/*.png`` (or JPEG, BMP, GIF, WebP, TIFF: ``images.IMAGE_SUFFIXES``), or ``root/train/<class>/...``
    and ``root/val/<class>/...`` to fix the split yourself. Images are converted to ``channels`` x ``image_size``
    x ``image_size`` (grey 28x28 feeds the default CNN), normalised with the training images' per-channel mean and
    std. Files that cannot be decoded are named, skipped and counted.

    Args:
        root: The folder of class folders (or of ``train/`` and ``val/``). Not needed to ``predict`` a
            ``predict_dir`` with a checkpoint: its classes, size and normalisation are the checkpoint's.
        image_size: Side the images are resized to.
        channels: 1 for greyscale, 3 for RGB (then set ``model.net.init_args.in_channels: 3``).
        batch_size: Samples per batch (per process under DDP).
        num_workers: DataLoader worker processes (useful only when the images are read from disk).
        val_fraction: Share of the images held out for validation when there is no ``val/`` folder.
        seed: Seed of the train/val split.
        in_memory: ``"auto"`` decodes every image once into one uint8 tensor when that takes at most
            ``max_memory_mb``, else reads files per batch; ``True`` / ``False`` force either.
        max_memory_mb: The memory the decoded images may take on the in-memory path.
        augment: Random shifts and small rotations of training batches, on the device.
        predict_dir: A folder of new images for ``predict`` (any of the files' formats and sizes), prepared as the
            checkpoint's training images were: its size, channels, mean and std, its class names (``root`` is
            neither needed nor read). Files that cannot be decoded are reported and skipped. Unset: ``predict``
            runs on the validation split.
    """

    def __init__(
        self,
        root: str | None = None,
        image_size: int = 28,
        channels: Literal[1, 3] = 1,
        batch_size: int = 128,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        seed: int = 42,
        in_memory: bool | Literal["auto"] = "auto",
        max_memory_mb: int = 2048,
        augment: bool = False,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        if root is None and predict_dir is None:
            raise ValueError("data.root is not set: give the folder that holds one sub-folder per class.")
        if not 0 < val_fraction < 1:
            raise ValueError(f"data.val_fraction must be between 0 and 1, got {val_fraction}.")
        if image_size < 4 or batch_size < 1:
            raise ValueError(f"data.image_size must be >= 4 and data.batch_size >= 1, got {image_size}, {batch_size}.")
        self.save_hyperparameters()
        self.root = Path(root) if root is not None else None
        self.image_size = image_size
        self.channels: int = channels  # the checkpoint's, once load_input_contract has taken it
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_fraction, self.seed = val_fraction, seed
        self.in_memory, self.max_memory_mb, self.augment = in_memory, max_memory_mb, augment
        self.splits: dict[str, Dataset] = {}
        self.full: InMemoryDataset | FileDataset  # set by setup: all the images, or root/train's (train's base)
        self.mean = torch.zeros(channels)
        self.std = torch.ones(channels)
        self.skipped: list[tuple[Path, str]] = []
        self.predict_dir = Path(predict_dir) if predict_dir is not None else None
        # Set by setup("predict") with predict_dir: the image of each prediction, and the undecodable files.
        self.predict_files: list[Path] = []
        self.predict_failures: list[tuple[Path, str]] = []
        self.contract: InputContract | None = None  # a checkpoint's, once load_input_contract has taken it

    def _class_folders(self, folder: Path) -> list[Path]:
        if not folder.is_dir():
            raise FolderDataError(f"data.root: {folder} is not a folder. Give a folder with one sub-folder per class.")
        classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not classes:
            raise FolderDataError(
                f"data.root: {folder} has no class folders. Put each class's images in a sub-folder named after "
                "the class (my_data/cat/1.png, my_data/dog/2.jpg)."
            )
        if len(classes) == 1:
            raise FolderDataError(
                f"data.root: {folder} has one class folder ({classes[0].name}): a classifier needs two or more. Add "
                "a folder per other class beside it (my_data/cat/, my_data/dog/)."
            )
        return classes

    @property
    def _split_folders(self) -> dict[str, Path]:
        """``{"train": root/train, "val": root/val}`` when both exist, else ``{"all": root}``."""
        if self.root is None:
            raise FolderDataError("data.root is not set: give the folder that holds one sub-folder per class.")
        if (self.root / "train").is_dir() and (self.root / "val").is_dir():
            return {"train": self.root / "train", "val": self.root / "val"}
        return {"all": self.root}

    @property
    def class_names(self) -> list[str]:
        """The class folder names, sorted: class index i is ``class_names[i]`` (a loaded checkpoint's, if any)."""
        if self.contract is not None:
            return list(self.contract.class_names)
        first = next(iter(self._split_folders.values()))
        return [p.name for p in self._class_folders(first)]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def _list(self, folder: Path) -> tuple[list[Path], list[int]]:
        """Image files and their class indices under ``folder``; a class folder without images is an error."""
        names = [p.name for p in self._class_folders(folder)]
        if names != self.class_names:
            raise FolderDataError(
                f"data.root: the class folders of {folder} ({', '.join(names)}) differ from those of the training "
                f"images ({', '.join(self.class_names)})."
            )
        files, labels = [], []
        for index, name in enumerate(names):
            images = [p for p in list_files(folder / name) if p.suffix.lower() in IMAGE_SUFFIXES]
            if not images:
                raise FolderDataError(
                    f"data.root: class folder {folder / name} holds no images ({', '.join(IMAGE_SUFFIXES)})."
                )
            files += images
            labels += [index] * len(images)
        return files, labels

    def _decode_all(self, files: list[Path], labels: list[int]) -> tuple[Tensor, Tensor, list[Path]]:
        """Decode every file once: images (N, C, S, S) uint8 and labels (N,), skipping what cannot be decoded."""
        images, kept_labels, kept = [], [], []
        for path, label in zip(files, labels, strict=True):
            try:
                images.append(prepare_resized(path, self.image_size, self.channels))
            except Exception as exc:  # PIL raises several types for truncated or foreign files
                self.skipped.append((path, f"{type(exc).__name__}: {exc}"))
                continue
            kept_labels.append(label)
            kept.append(path)
        if not images:
            raise FolderDataError(f"data.root: none of the {len(files)} images under {self.root} could be decoded.")
        return torch.stack(images), torch.tensor(kept_labels), kept

    def _fits_in_memory(self, n: int) -> bool:
        if self.in_memory != "auto":
            return bool(self.in_memory)
        return n * self.channels * self.image_size**2 <= self.max_memory_mb * 2**20

    def setup(self, stage: str) -> None:
        """List the files, split them with ``seed``, decode them (in memory) and measure the normalisation.

        ``predict`` of a ``predict_dir`` reads those images only (after the checkpoint's contract is loaded)."""
        if stage == "predict" and self.predict_dir is not None:
            if not self.predict_dir.is_dir():
                raise FolderDataError(f"data.predict_dir: {self.predict_dir} is not a folder of images.")
            return
        if not self.splits:  # fit, then test_after_fit: decode once
            self._setup_splits()

    def _load_predict_dir(self, folder: Path) -> None:
        """The images of ``predict_dir`` as the predict split, in file-name order (unlabelled), prepared by the input
        contract in force: the checkpoint's, once ``load_input_contract`` has taken it."""
        images = []
        self.predict_files, self.predict_failures = [], []
        for path in list_files(folder):
            try:
                images.append(prepare_resized(path, self.image_size, self.channels))
            except Exception as exc:  # PIL raises several types for truncated or foreign files
                self.predict_failures.append((path, f"{type(exc).__name__}: {exc}"))
                continue
            self.predict_files.append(path)
        if not images:
            reasons = "; ".join(f"{path.name}: {why}" for path, why in self.predict_failures[:5]) or "it is empty"
            raise FolderDataError(f"data.predict_dir: no image in {folder} could be decoded ({reasons}).")
        self.splits["predict"] = InMemoryDataset(torch.stack(images), None)  # (N, C, S, S) uint8

    def _setup_splits(self) -> None:
        self.skipped = []
        folders = self._split_folders
        listed = {split: self._list(folder) for split, folder in folders.items()}
        in_memory = self._fits_in_memory(sum(len(f) for f, _ in listed.values()))
        datasets: dict[str, Any] = {}  # InMemoryDataset or FileDataset per folder, then Subsets of one
        for split, (files, labels) in listed.items():
            if in_memory:
                images, targets, _ = self._decode_all(files, labels)
                datasets[split] = InMemoryDataset(images, targets)
            else:
                datasets[split] = FileDataset(files, torch.tensor(labels), self.image_size, self.channels)
        if "all" in datasets:
            self.full = datasets.pop("all")
            generator = torch.Generator().manual_seed(self.seed)
            order = torch.randperm(len(self.full), generator=generator)
            n_val = max(1, round(len(self.full) * self.val_fraction))
            if n_val >= len(self.full):
                raise FolderDataError(
                    f"data.root: {len(self.full)} image(s) are too few to hold out a validation split."
                )
            self.splits = {}
            self.use_split(order[n_val:], order[:n_val])  # the seeded split is a split like a fold's
        else:
            self.full = datasets["train"]
            self.splits = {**datasets, "test": datasets["val"], "predict": datasets["val"]}
            self._measure_normalisation(datasets["train"])
        if self.skipped:
            shown = "; ".join(f"{p}: {why}" for p, why in self.skipped[:5])
            more = f" (and {len(self.skipped) - 5} more)" if len(self.skipped) > 5 else ""
            rank_zero_info(f"Skipped {len(self.skipped)} file(s) that could not be decoded: {shown}{more}.")
        sizes = ", ".join(f"{k} {len(self.splits[k])}" for k in ("train", "val"))  # type: ignore[arg-type]
        where = "in memory" if in_memory else "read from disk per batch"
        rank_zero_info(f"{self.root}: {self.num_classes} classes ({', '.join(self.class_names)}); {sizes}; {where}.")

    def split_labels(self) -> Tensor:
        """The class of each training image: those of ``root``, or of ``root/train`` (``hooks.TakesASplit``)."""
        assert self.full.labels is not None  # training images are labelled
        return self.full.labels

    def use_split(self, train: Tensor, val: Tensor) -> None:
        """Train on the ``train`` images of ``split_labels`` and validate on the ``val`` ones; ``root/val``, if
        there, becomes the test split (else the new validation images are). Normalised with the new training ones."""
        train_images, val_images = Subset(self.full, train.tolist()), Subset(self.full, val.tolist())
        self.splits.update(train=train_images, val=val_images, predict=val_images)
        if "val" not in self._split_folders:
            self.splits["test"] = val_images
        self._measure_normalisation(train_images)

    def _measure_normalisation(self, train: InMemoryDataset | FileDataset | Subset) -> None:
        """Per-channel mean and std of (up to 2000 of) the training images, as the network sees them (0-1)."""
        n = min(len(train), 2000)
        batch = torch.stack([train[i][0] for i in range(n)]).float().div(255)  # (n, C, S, S)
        self.mean = batch.mean(dim=(0, 2, 3))
        self.std = batch.std(dim=(0, 2, 3)).clamp_min(1e-3)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = self.splits[split]
        base = dataset.dataset if isinstance(dataset, Subset) else dataset
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=keep_batch if isinstance(base, InMemoryDataset) else None,  # batches gathered whole
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        # Decoded only now, after the Trainer restored the checkpoint's contract (which follows setup).
        if self.predict_dir is not None:
            self._load_predict_dir(self.predict_dir)
        return self._loader("predict")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """uint8 (B, C, S, S) → normalised float on the batch's device; shifts/rotations when training with augment."""
        x, y = (batch, None) if isinstance(batch, Tensor) else batch  # predict_dir's images come without labels
        if x.dtype == torch.uint8:
            x = normalize(x, self.mean, self.std)
        if self.augment and self.trainer is not None and self.trainer.training:
            x = random_shift_rotate(x, background=float((-self.mean / self.std).mean()))
        return x if y is None else (x, y)

    def input_contract(self) -> InputContract:
        """What the model trained on these images takes (saved in each checkpoint: ``project.inputs``)."""
        if self.root is None and self.contract is not None:  # predicting a predict_dir: the checkpoint's
            return self.contract
        return InputContract(
            size=self.image_size,
            channels=self.channels,
            mean=tuple(self.mean.tolist()),
            std=tuple(self.std.tolist()),
            class_names=tuple(self.class_names),
            preparation="resize",
        )

    def load_input_contract(self, contract: InputContract) -> None:
        """Prepare, normalise and name classes as the checkpoint's training did: its size, channels, mean, std and
        class names."""
        if contract.preparation != "resize":
            raise FolderDataError(
                f"the checkpoint's model takes {contract.preparation} images, not resized folder images: use the "
                "DataModule it was trained with."
            )
        if (contract.size, contract.channels) != (self.image_size, self.channels):
            rank_zero_info(
                f"Using the checkpoint's data.image_size={contract.size}, data.channels={contract.channels} "
                f"(configured: {self.image_size}, {self.channels})."
            )
            self.image_size, self.channels = contract.size, contract.channels
            if self.splits:  # decoded at the configured size: again at the checkpoint's
                self._setup_splits()
        self.mean, self.std = torch.tensor(contract.mean), torch.tensor(contract.std)
        self.contract = contract
