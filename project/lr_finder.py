"""The learning-rate range test before fit: Lightning's ``LearningRateFinder`` plus what a user does with it."""

import json
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import _TunerExitException
from PIL import Image

from project.visuals import line_plot


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
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image("lr_find/loss_vs_lr", image, 0, dataformats="HWC")
                logger.experiment.flush()
        if self.suggestion is None:
            rank_zero_info(f"Learning-rate finder: no suggestion (too few finite losses); curve in {folder}.")
            return
        rank_zero_info(
            f"Learning-rate finder: suggested learning rate {self.suggestion:.3g} (searched {self.min_lr:g} to "
            f"{self.max_lr:g}; curve in {folder / 'lr_find.png'}).\n"
            f"Train with it: python -m project fit --model.optimizer.init_args.lr {self.suggestion:.3g}"
        )
