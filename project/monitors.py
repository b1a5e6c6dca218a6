"""Seeing inside a run: per-layer weight and gradient histograms, training throughput, a short profiled fit."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor


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

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        last = trainer.fit_loop.epoch_loop.batch_progress.current.ready == trainer.num_training_batches
        if not (last and trainer.is_global_zero):
            return
        self._grads = {
            name: p.grad.detach().float().cpu() for name, p in pl_module.named_parameters() if p.grad is not None
        }

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        board = next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        step = trainer.global_step
        norms = {f"grad_norm/{name}": float(g.norm()) for name, g in self._grads.items()}
        if norms:
            for logger in trainer.loggers:
                logger.log_metrics(norms, step=step)
        if board is not None:
            for name, p in pl_module.named_parameters():
                board.add_histogram(f"weights/{name}", p.detach().float().cpu(), step)
                if name in self._grads:
                    board.add_histogram(f"grads/{name}", self._grads[name], step)
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
        self._module_has_flops = False  # no FLOP count: Lightning would warn on every run


class StepProfiler(PyTorchProfiler):
    """Lightning's ``PyTorchProfiler`` on a schedule set from the config: skip ``wait`` steps, warm up for
    ``warmup``, record ``active`` steps, ``repeat`` times; the Chrome/Perfetto trace and the table of the slowest ops
    go into the run folder (``dirpath=None``).

    Args:
        wait: Steps skipped before each recording cycle (the first steps are slow: allocation, kernel selection).
        warmup: Steps profiled but discarded, so the recording starts warm.
        active: Steps recorded per cycle.
        repeat: Cycles; 0 repeats until the end of training.
        filename: Stem of the text summary (``<filename>.txt`` per stage) in the run folder.
        row_limit: Rows of the summary table.
        sort_by_key: The summary's sort column: ``cpu_time_total`` (ops with their children), ``cpu_time``, ``count``...
    """

    def __init__(
        self,
        wait: int = 5,
        warmup: int = 5,
        active: int = 20,
        repeat: int = 1,
        filename: str = "profile",
        row_limit: int = 25,
        sort_by_key: str = "cpu_time_total",
    ) -> None:
        schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
        super().__init__(
            filename=filename,
            row_limit=row_limit,
            sort_by_key=sort_by_key,
            export_to_chrome=True,
            schedule=schedule,
            # Lightning runs the validation steps on the same schedule: once they reach its warm-up, torch starts a
            # new cycle and, by default, drops the events of the training cycle already recorded: an empty table
            # (fit-profile.txt of 0 bytes) whenever validation has more than `wait` batches. Keep them.
            acc_events=True,
        )

    def summary(self) -> str:
        text = super().summary()
        if text and rank_zero_only.rank == 0:  # to fit-profile.txt, and the console: what a profiled run is for
            print(text, flush=True)
        return text
