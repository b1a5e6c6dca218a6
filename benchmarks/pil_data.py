"""The baseline's data path in the template's DataModule: variant (b) of ``benchmarks/run.py``.

Each image goes through torchvision's ``ToTensor`` + ``Normalize`` as a PIL image and the DataLoader collates the
items, as ``torchvision.datasets.MNIST`` does per item (less re-reading the files) and as the tutorial loop
(``baseline_loop.py``) reads them: (b) over (a) is then the cost of Lightning itself, on the same data path.

    python -m project fit --data benchmarks.pil_data.PILMNISTDataModule --data.num_workers 2 ...
"""

from collections.abc import Callable
from typing import Any

from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from project.data import MNISTDataModule


class PILImageDataset(Dataset):
    """Images (N, H, W) uint8 with labels (N,), each image passed through a torchvision transform as a PIL image."""

    def __init__(self, images: Tensor, labels: Tensor | None, transform: Callable[[Image.Image], Tensor]) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | Tensor:
        x = self.transform(Image.fromarray(self.images[index].numpy(), mode="L"))
        return x if self.labels is None else (x, int(self.labels[index]))


class PILMNISTDataModule(MNISTDataModule):
    """``MNISTDataModule`` (same files, same seeded split) with per-image PIL transforms instead of whole batches."""

    def _dataset(self, images: Tensor, labels: Tensor | None) -> PILImageDataset:
        transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((self.mean,), (self.std,))])
        return PILImageDataset(images, labels, transform)

    def _loader(self, split: str, shuffle: bool = False, collate_fn: Callable | None = None) -> DataLoader:
        return super()._loader(split, shuffle, collate_fn)  # None: the DataLoader's default, item by item

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch  # normalised per image already
