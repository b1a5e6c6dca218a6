"""The MNIST files on disk: the four IDX files torchvision reads, read and checked, and downloaded all or nothing.

Not on the reading path: ``data.py`` uses it. Every problem is an ``MNISTDataError`` naming the file and the remedy.
"""

import shutil
import tempfile
from math import prod
from pathlib import Path

import torch
from torch import Tensor
from torchvision.datasets import MNIST

from project.errors import DataError

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


class MNISTDataError(DataError):
    """The MNIST files are missing, cannot be downloaded, or are malformed."""


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
