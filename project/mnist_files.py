"""The MNIST files on disk: checked, read with torchvision's own IDX readers, and downloaded all or nothing.

Not on the reading path: ``data.py`` uses it. Every problem is an ``MNISTDataError`` naming the file and the remedy.
"""

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch import Tensor
from torchvision.datasets import MNIST
from torchvision.datasets.mnist import read_image_file, read_label_file

from project.errors import DataError

# The four IDX files torchvision reads from <data_dir>/<class name>/raw/.
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def how_to_provide(folder: str = "MNIST") -> str:
    """The remedy for missing files, naming the dataset's own folder (``MNIST``, ``FashionMNIST``, ``KMNIST``)."""
    return (
        "Put the four uncompressed IDX files there, or point the project at a folder that holds "
        f"{folder}/raw/ with `export PATH_DATASETS=/path/to/data` or `--data.data_dir /path/to/data`."
    )


class MNISTDataError(DataError):
    """The MNIST files are missing, cannot be downloaded, or are malformed."""


def read_idx(path: Path, reader: Callable[[str], Tensor]) -> Tensor:
    """``reader(path)`` (torchvision's ``read_image_file`` or ``read_label_file``), its failure named with the file.

    Raises:
        MNISTDataError: naming the file, when its header is not a uint8 IDX one of the right rank (torchvision
            asserts) or the file is shorter than its header promises (the reshape fails).
    """
    try:
        return reader(str(path))
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else "bad magic number"
        raise MNISTDataError(
            f"{path} is truncated or has a bad header ({type(exc).__name__}: {why}). Replace it with the original "
            f"file. {how_to_provide(path.parent.parent.name)}"
        ) from exc


def load_split(raw_dir: Path, prefix: str) -> tuple[Tensor, Tensor]:
    """Read and cross-check one split (``prefix`` "train" or "t10k"): images (N, 28, 28) uint8, labels (N,) int64."""
    images_path = raw_dir / f"{prefix}-images-idx3-ubyte"
    labels_path = raw_dir / f"{prefix}-labels-idx1-ubyte"
    images, labels = read_idx(images_path, read_image_file), read_idx(labels_path, read_label_file)
    if images.shape[0] != labels.shape[0]:
        raise MNISTDataError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels."
        )
    if labels.numel() and int(labels.max()) > 9:
        raise MNISTDataError(f"{labels_path} holds label {int(labels.max())}; labels must be 0-9.")
    return images, labels


def download(torchvision_class: type[MNIST], raw_dir: Path) -> None:
    """Download into a temporary folder and move the files into ``raw_dir`` only once all four are there.

    A failed download (offline, a mirror down) then leaves the data folder exactly as it was: no empty folders.
    """
    with tempfile.TemporaryDirectory(prefix="download-") as tmp:
        torchvision_class(tmp, train=True, download=True)
        torchvision_class(tmp, train=False, download=True)
        fetched = Path(tmp) / torchvision_class.__name__ / "raw"
        raw_dir.mkdir(parents=True, exist_ok=True)
        for name in IDX_FILES:
            if not (raw_dir / name).is_file():
                shutil.move(fetched / name, raw_dir / name)


def check_files(raw_dir: Path, dataset: str, why: str = "") -> None:
    """Raise ``MNISTDataError`` if any of the four files is missing: which, where, why (if known), and the remedy."""
    missing = [name for name in IDX_FILES if not (raw_dir / name).is_file()]
    if missing:
        where = f"{dataset} files missing from {raw_dir.resolve()}: {', '.join(missing)}"
        raise MNISTDataError(f"{where}{'; ' + why if why else ''}. {how_to_provide(raw_dir.parent.name)}")


def ensure_files(torchvision_class: type[MNIST], raw_dir: Path, dataset: str, allowed: bool) -> None:
    """Download the missing files when ``allowed``; when all four are there, touch nothing (the folder may be
    read-only). Raise ``MNISTDataError`` for what is still missing, and why."""
    if all((raw_dir / name).is_file() for name in IDX_FILES):
        return
    why = "downloading is off (--data.download false)"
    if allowed:
        try:
            download(torchvision_class, raw_dir)
        except Exception as exc:  # urllib, HTTP, checksum and permission errors all end here
            why = f"the download failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    check_files(raw_dir, dataset, why)
