"""TensorBoard images: input samples, a confusion matrix and the worst-misclassified validation images.

Drawn with PIL (no plotting library), on global rank 0 only, once per validation epoch: the cost is a few
milliseconds per epoch. The confusion matrix is accumulated on every rank and reduced across them.
"""

from typing import Any

import lightning as L
import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from project.runs import tensorboard_logger


def to_uint8(images: Tensor) -> np.ndarray:
    """Images (B, C, H, W) of any scale → uint8 (B, H, W) for C = 1, (B, H, W, 3) for RGB, each image stretched to
    0-255 over all its channels (so an RGB image keeps its colours) for display."""
    x = images.float()
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    high = x.amax(dim=(1, 2, 3), keepdim=True)
    scaled = ((x - low) / (high - low).clamp_min(1e-8) * 255).round().byte().cpu()
    return scaled[:, 0].numpy() if scaled.shape[1] == 1 else scaled.permute(0, 2, 3, 1).numpy()


def image_grid(images: np.ndarray, captions: list[str] | None = None, columns: int = 8, scale: int = 3) -> np.ndarray:
    """Tile uint8 images, grey (B, H, W) or RGB (B, H, W, 3), each enlarged ``scale`` times with an optional
    caption, into one HWC image."""
    b, h, w = images.shape[:3]
    mode = "L" if images.ndim == 3 else "RGB"
    caption_h = 12 if captions else 0
    width = max([w * scale] + [6 * len(c) for c in captions or []])  # a caption's width: PIL's font is 6 px
    cell_h, cell_w = h * scale + caption_h + 4, width + 4
    rows = -(-b // columns)
    canvas = Image.new("RGB", (columns * cell_w, rows * cell_h), (40, 40, 40))
    draw = ImageDraw.Draw(canvas)
    for i in range(b):
        top, left = (i // columns) * cell_h, (i % columns) * cell_w
        tile = Image.fromarray(images[i], mode=mode).resize((w * scale, h * scale), Image.Resampling.NEAREST)
        canvas.paste(tile.convert("RGB"), (left + 2, top + 2))
        if captions:
            draw.text((left + 2, top + h * scale + 2), captions[i], fill=(255, 220, 80))
    return np.asarray(canvas)


def confusion_image(matrix: Tensor, names: list[str] | None = None, cell: int = 36) -> np.ndarray:
    """Draw a confusion matrix (rows: true class, columns: predicted) with its counts and the classes' names (their
    indices without ``names``), as HWC uint8."""
    counts = matrix.cpu().long()
    n = counts.shape[0]
    labels = list(names) if names is not None and len(names) == n else [str(k) for k in range(n)]
    share = counts.float() / counts.sum(dim=1, keepdim=True).clamp_min(1)
    # Errors are shaded against the largest error, so that a handful of confusions still stands out.
    errors = counts.float().fill_diagonal_(0)
    error_share = errors / errors.max().clamp_min(1)
    top = 40
    left = max(40, 6 * max(len(label) for label in labels) + 12)  # the row labels, whole; PIL's font is 6 px wide
    canvas = Image.new("RGB", (left + n * cell, top + n * cell), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((left, 4), "predicted", fill="black")
    draw.text((2, top - 14), "true", fill="black")
    fits = (cell - 2) // 6  # characters of a column label that fit its cell
    for k, label in enumerate(labels):
        shown = label if len(label) <= fits else label[: fits - 1] + "."
        draw.text((left + k * cell + (cell - 6 * len(shown)) // 2, 22), shown, fill="black")
        draw.text((left - 6 * len(label) - 6, top + k * cell + cell // 2 - 6), label, fill="black")
    for t in range(n):
        for p in range(n):
            v = float(share[t, p] if t == p else error_share[t, p])
            # Diagonal in blue (share of the true class), errors in red (relative to the largest error).
            colour = (
                (int(255 * (1 - v)), int(255 * (1 - v)), 255)
                if t == p
                else (255, int(255 * (1 - v)), int(255 * (1 - v)))
            )
            box = (left + p * cell, top + t * cell, left + (p + 1) * cell - 1, top + (t + 1) * cell - 1)
            draw.rectangle(box, fill=colour)
            text_colour = "white" if v > 0.5 else "black"
            draw.text((box[0] + 3, box[1] + cell // 2 - 6), str(int(counts[t, p])), fill=text_colour)
    return np.asarray(canvas)


class TensorBoardImages(L.Callback):
    """Log input samples at the start of training, and after each validation epoch a confusion matrix and a grid
    of the worst-misclassified validation images (true / predicted label and the probability of the true one).

    Expects ``validation_step`` to return a dict with ``logits`` (B, C). Does nothing without a TensorBoardLogger
    (``--trainer.logger false``, or loggers of other kinds only): not even the confusion matrix is kept then.

    Args:
        num_classes: Classes of the confusion matrix; ``None`` takes the model's ``num_classes``.
        worst: How many misclassified images the grid shows.
        samples: How many training inputs to show once at the start.
    """

    def __init__(self, num_classes: int | None = None, worst: int = 24, samples: int = 32) -> None:
        self.num_classes = num_classes
        self.confusion = MulticlassConfusionMatrix(num_classes or 10)
        self.worst = worst
        self.samples = samples
        self._worst: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # images, true, pred, p(true)
        self.names = [str(k) for k in range(num_classes or 10)]  # set from the model's class_names in setup
        self.drawing = True  # whether a TensorBoardLogger is there to draw in, set in setup (the same on every rank)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.drawing = tensorboard_logger(trainer) is not None
        n = self.num_classes or int(pl_module.hparams.get("num_classes", 10))
        if self.confusion.num_classes != n:
            self.confusion = MulticlassConfusionMatrix(n)
        names = pl_module.hparams.get("class_names")  # the data's names of the classes, kept in the checkpoint
        self.names = [str(name) for name in names] if names and len(names) == n else [str(k) for k in range(n)]

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0 and trainer.current_epoch == 0 and trainer.is_global_zero:
            board = tensorboard_logger(trainer)
            if board is not None:
                x, y = batch
                grid = image_grid(to_uint8(x[: self.samples]), [self.names[int(v)] for v in y[: self.samples]])
                board.experiment.add_image("inputs/train_samples", grid, trainer.global_step, dataformats="HWC")

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.confusion = self.confusion.to(pl_module.device)
        self.confusion.reset()
        self._worst = None

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self.drawing or trainer.sanity_checking or not isinstance(outputs, dict) or "logits" not in outputs:
            return
        x, y = batch
        logits = outputs["logits"].float()
        self.confusion.update(logits, y)
        probs = logits.softmax(dim=1)
        pred = probs.argmax(dim=1)
        wrong = pred != y
        if not wrong.any():
            return
        p_true = probs[wrong, y[wrong]]
        # Keep the `worst` misclassified images seen so far (lowest probability of the true class).
        candidates = (x[wrong].detach().cpu(), y[wrong].cpu(), pred[wrong].cpu(), p_true.cpu())
        if self._worst is not None:
            images, true, pred, p = (torch.cat([a, b]) for a, b in zip(self._worst, candidates, strict=True))
            candidates = (images, true, pred, p)
        keep = candidates[3].argsort()[: self.worst]
        self._worst = tuple(t[keep] for t in candidates)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.drawing or trainer.sanity_checking:
            return
        matrix = self.confusion.compute()  # reduced across ranks: every rank must call it
        board = tensorboard_logger(trainer)
        if not trainer.is_global_zero or board is None:
            return
        step = trainer.global_step
        board.experiment.add_image("val/confusion_matrix", confusion_image(matrix, self.names), step, dataformats="HWC")
        if self._worst is not None:
            images, true, pred, p_true = self._worst
            # "true->predicted p(true)": ASCII, which PIL's built-in font draws (it has no arrow glyph)
            captions = [
                f"{self.names[t]}->{self.names[p]} {q:.2f}"
                for t, p, q in zip(true.tolist(), pred.tolist(), p_true.tolist(), strict=True)
            ]
            grid = image_grid(to_uint8(images), captions)
            board.experiment.add_image("val/worst_misclassified", grid, step, dataformats="HWC")
