"""The two monitors: weight and gradient histograms once per epoch, samples and batches per second."""

import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor
from torch import Tensor

from project.runs import tensorboard_logger


def batch_size(batch: Any) -> int:
    """Samples in a batch of ``(images, labels)`` or of images alone."""
    return len(batch[0] if isinstance(batch, (tuple, list)) else batch)


class LayerHistograms(L.Callback):
    """Once per epoch, on global rank 0: a histogram of every parameter and of its gradient, and per-layer norms.

    The gradients are those of the last training step of the epoch, taken before the optimizer step (after
    clipping: what the optimizer used). TensorBoard shows them in its Histograms and Distributions tabs as
    ``weights/<parameter>`` and ``grads/<parameter>``; the scalars ``grad_norm/<parameter>`` plot the gradient's
    L2 norm over the epochs (vanishing or exploding gradients, dead layers). Nothing is computed on other steps.
    """

    def __init__(self) -> None:
        self._grads: dict[str, Tensor] = {}
        self._batch_idx = 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        last = self._batch_idx + 1 == trainer.num_training_batches
        if not (last and trainer.is_global_zero):
            return
        self._grads = {
            name: p.grad.detach().float().cpu() for name, p in pl_module.named_parameters() if p.grad is not None
        }

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        board = tensorboard_logger(trainer)
        step = trainer.global_step
        norms = {f"grad_norm/{name}": float(g.norm()) for name, g in self._grads.items()}
        if norms:
            for logger in trainer.loggers:
                logger.log_metrics(norms, step=step)
        if board is not None:
            for name, p in pl_module.named_parameters():
                board.experiment.add_histogram(f"weights/{name}", p.detach().float().cpu(), step)
                if name in self._grads:
                    board.experiment.add_histogram(f"grads/{name}", self._grads[name], step)
        self._grads = {}


class Throughput(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` for ``(images, labels)`` batches: ``train|val/samples_per_sec`` and
    ``batches_per_sec`` (and per device) every ``trainer.log_every_n_steps``, so any user's model shows the
    speed figures that BENCHMARKS.md measures.

    Args:
        window_size: Batches the rates are averaged over.
    """

    def __init__(self, window_size: int = 50) -> None:
        super().__init__(batch_size_fn=batch_size, window_size=window_size)
        # No FLOP count for the user's model: Lightning's warning asking for one would show on every run.
        warnings.filterwarnings("ignore", message=r"When using the `ThroughputMonitor`, you need to define")
