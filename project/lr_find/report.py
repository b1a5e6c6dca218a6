"""LearningRateReport: Lightning's ``LearningRateFinder`` plus what a user does with its result."""

import json
from pathlib import Path

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import _TunerExitException
from PIL import Image, ImageDraw

from project.runs import tensorboard_logger


class LearningRateReport(LearningRateFinder):
    """Run Lightning's learning-rate range test at the start of ``fit``, then report it.

    The search trains ``num_training_steps`` batches at learning rates rising from ``min_lr`` to ``max_lr`` and
    restores the model and optimizer afterwards. The suggestion (steepest descent of the loss) is printed with the
    command line that trains with it; the loss-vs-learning-rate curve is saved as ``lr_find.png`` and
    ``lr_find.json`` in the run folder and logged to TensorBoard (Images tab, ``lr_find/loss_vs_lr``).

    Args:
        min_lr: Smallest learning rate of the search.
        max_lr: Largest learning rate of the search.
        num_training_steps: Batches of the search, one learning rate each.
        mode: ``"exponential"`` or ``"linear"`` spacing of the learning rates.
        early_stop_threshold: Stop the search once the loss exceeds this multiple of the best loss; None never.
        train_after: Go on to train with the configured learning rate (True), or stop after the search (False).
    """

    def __init__(
        self,
        min_lr: float = 1e-6,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        train_after: bool = False,
    ) -> None:
        # update_attr=False: the optimizer is injected (model.optimizer), there is no `lr` attribute to set.
        super().__init__(min_lr, max_lr, num_training_steps, mode, early_stop_threshold, update_attr=False)
        self.min_lr, self.max_lr = min_lr, max_lr  # the range searched, for the report
        self.train_after = train_after
        self.suggestion: float | None = None

    def lr_find(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().lr_find(trainer, pl_module)  # the search; the model and optimizer are restored after it
        if self.optimal_lr is not None:
            self.suggestion = self.optimal_lr.suggestion()
            if trainer.is_global_zero:
                self._report(trainer)
        if not self.train_after:
            raise _TunerExitException()  # Lightning's own way to end fit after a tuner: no training, no traceback

    def _report(self, trainer: L.Trainer) -> None:
        if self.optimal_lr is None:  # the range test did not run
            return
        lrs, losses = self.optimal_lr.results["lr"], self.optimal_lr.results["loss"]
        image = line_plot(lrs, losses, mark=self.suggestion)
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / "lr_find.png")
        record = {"lr": lrs, "loss": losses, "suggestion": self.suggestion, "range": [self.min_lr, self.max_lr]}
        (folder / "lr_find.json").write_text(json.dumps(record) + "\n")
        if (board := tensorboard_logger(trainer)) is not None:
            board.experiment.add_image("lr_find/loss_vs_lr", image, 0, dataformats="HWC")
            board.experiment.flush()
        if self.suggestion is None:
            rank_zero_info(f"Learning-rate finder: no suggestion (too few finite losses); curve in {folder}.")
            return
        rank_zero_info(
            f"Learning-rate finder: suggested learning rate {self.suggestion:.3g} (searched {self.min_lr:g} to "
            f"{self.max_lr:g}; curve in {folder / 'lr_find.png'}).\n"
            f"Train with it: python -m project fit --model.optimizer.init_args.lr {self.suggestion:.3g}"
        )


def line_plot(
    xs: list[float],
    ys: list[float],
    mark: float | None = None,
    log_x: bool = True,
    size: tuple[int, int] = (640, 400),
    labels: tuple[str, str] = ("learning rate", "loss"),
) -> np.ndarray:
    """Draw ``ys`` against ``xs`` (log-scaled x by default) with axes, tick labels and an optional vertical marker at
    x = ``mark``, as HWC uint8. Non-finite points are left out."""
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if np.isfinite(x) and np.isfinite(y) and (x > 0 or not log_x)]
    width, height = size
    left, right, top, bottom = 70, 20, 20, 40
    canvas = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(canvas)
    if len(points) < 2:
        draw.text((left, top), "not enough finite points to plot", fill="black")
        return np.asarray(canvas)
    tx = (lambda v: float(np.log10(v))) if log_x else float
    x_lo, x_hi = tx(min(p[0] for p in points)), tx(max(p[0] for p in points))
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    x_span, y_span = max(x_hi - x_lo, 1e-12), max(y_hi - y_lo, 1e-12)

    def to_pixel(x: float, y: float) -> tuple[float, float]:
        px = left + (tx(x) - x_lo) / x_span * (width - left - right)
        py = top + (1 - (y - y_lo) / y_span) * (height - top - bottom)
        return px, py

    draw.rectangle((left, top, width - right, height - bottom), outline="black")
    draw.text(
        ((left + width - right) // 2 - 30, height - 16), labels[0] + (" (log scale)" if log_x else ""), fill="black"
    )
    draw.text((4, 4), labels[1], fill="black")
    for i in range(5):  # tick labels: 5 along each axis
        fx = x_lo + x_span * i / 4
        px = left + (width - left - right) * i / 4
        draw.text((px - 14, height - bottom + 6), f"{10**fx if log_x else fx:.0e}", fill="black")
        fy = y_lo + y_span * i / 4
        py = top + (height - top - bottom) * (1 - i / 4)
        draw.text((4, py - 6), f"{fy:.3g}", fill="black")
    draw.line([to_pixel(x, y) for x, y in points], fill=(30, 90, 200), width=2)
    if mark is not None and mark > 0:
        px, _ = to_pixel(mark, y_lo)
        draw.line([(px, top), (px, height - bottom)], fill=(220, 40, 40), width=1)
        draw.text((px + 4, top + 4), f"{mark:.2e}", fill=(220, 40, 40))
    return np.asarray(canvas)
