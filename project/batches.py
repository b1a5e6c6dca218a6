"""Batches of images held in memory: a dataset of two tensors gathered a batch at a time, and the random shifts and
rotations applied to a batch on its device.

Not on the reading path: ``data.py`` and the ``folder`` feature's DataModule use it.
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset


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


def random_shift_rotate(x: Tensor, *, background: float, max_shift: float = 2.0, max_degrees: float = 10.0) -> Tensor:
    """Shift each image by up to ``max_shift`` pixels and rotate it by up to ``max_degrees``, on x's device.

    Args:
        x: Normalised images (B, C, H, W); the border is filled with the background value (pixel 0).
        background: The normalised value of a black pixel, used for the uncovered border (the DataModule's
            ``-mean / std``: it owns the statistics).
        max_shift: Largest translation in pixels along each axis.
        max_degrees: Largest rotation in degrees, either way.
    """
    b, _, h, w = x.shape
    angle = (torch.rand(b, device=x.device) * 2 - 1) * math.radians(max_degrees)
    # affine_grid works in [-1, 1] coordinates: one pixel is 2 / size.
    shift = (torch.rand(b, 2, device=x.device) * 2 - 1) * max_shift * 2 / torch.tensor([w, h], device=x.device)
    cos, sin = angle.cos(), angle.sin()
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x - background, grid, align_corners=False, padding_mode="zeros") + background
