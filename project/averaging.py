"""The ``averaging`` key: ``--averaging project.averaging.EMA`` averages the weights (``null``: off).

``EMA`` is Lightning's ``WeightAveraging`` with an exponential moving average of the weights (its
``EMAWeightAveraging``'s, with a warm-up), updated after every optimizer step, validated and checkpointed in place
of the raw weights, with two additions:

- an evaluation of a checkpoint after ``fit`` in the same process (``test_after_fit``) tests the averaged weights
  the checkpoint holds as its ``state_dict``. Lightning's callback reloads the raw weights
  (``current_model_state``) whenever a checkpoint is loaded, so that test would run on the raw model;
- TensorBoard gets the raw weights' accuracy too, ``val/acc_raw``, beside ``val/acc`` (the averaged model's, the one
  the checkpoints are chosen on), one extra forward pass over the validation batches.

A checkpoint keeps both (``state_dict``: averaged; ``current_model_state`` and ``averaging_state``: the raw weights
and the average's step count), so ``--ckpt_path auto`` resumes the average where it was
(``tests/test_averaging.py``). Whatever reads a checkpoint's ``state_dict`` (``test``, ``predict``, the features)
gets the averaged weights.
"""

import copy
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor


def ema_with_warmup(decay: float, warmup: int) -> Callable[[list[Tensor], list[Tensor], Tensor], None]:
    """AveragedModel's ``multi_avg_fn``: ``avg = d * avg + (1 - d) * weights`` with ``d = min(decay, (1 + n) /
    (warmup + n))`` after ``n`` updates. The cap lets the average leave the random start quickly: with a plain
    0.999, the weights of step 1 would still count 37% after 1000 steps, most of a short run."""

    @torch.no_grad()
    def update(averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        n = num_averaged.to(torch.float32)
        d = torch.clamp((1 + n) / (warmup + n), max=decay)
        for average, weights in zip(averaged, current, strict=True):
            if average.is_floating_point():
                average.lerp_(weights, (1 - d).to(average.dtype))
            else:  # a counter (batch norm's num_batches_tracked): the current one
                average.copy_(weights)

    return update


class EMA(WeightAveraging):
    """An exponential moving average of the weights, validated, checkpointed and tested in their place.

    Args:
        decay: Weight of the average so far at each update: ``avg = decay * avg + (1 - decay) * weights``; its
            horizon is about ``1 / (1 - decay)`` updates (0.999: the last ~1000 steps).
        warmup: Early updates use ``min(decay, (1 + n) / (warmup + n))`` after ``n`` updates, so that the
            average forgets the random start within a short run (0: a plain ``decay`` from the first update).
        update_every_n_steps: Update after every n-th optimizer step.
        log_raw: Also validate the raw weights and log their accuracy as ``val/acc_raw``.
    """

    def __init__(self, decay: float = 0.999, warmup: int = 10, update_every_n_steps: int = 1, log_raw: bool = True):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"averaging.init_args.decay must be between 0 and 1 (exclusive), got {decay}.")
        if warmup < 0 or update_every_n_steps < 1:
            raise ValueError(
                f"averaging.init_args: warmup must be >= 0 and update_every_n_steps >= 1, got {warmup} and "
                f"{update_every_n_steps}."
            )
        # use_buffers: batch norm's running statistics are averaged with the weights they belong to
        super().__init__(use_buffers=True, multi_avg_fn=ema_with_warmup(decay, max(warmup, 1)))
        self.update_every_n_steps = update_every_n_steps
        self.log_raw = log_raw
        self._raw: L.LightningModule | None = None  # the raw weights' model while a validation runs
        self._raw_correct = torch.zeros(())
        self._raw_seen = torch.zeros(())

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % self.update_every_n_steps == 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            # MNISTClassifier.configure_model only compiles the network in place (no sharding): the warning that
            # the average cannot follow sharded layers does not apply.
            warnings.filterwarnings("ignore", message=".*overrides the configure_model callback.*")
            super().setup(trainer, pl_module, stage)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Evaluating (test_after_fit, a validate or test with a checkpoint): the averaged weights, already loaded
        # from state_dict, are the model. Only a resumed fit needs the raw weights and the average's state back.
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before the swap below the model holds the raw weights: a copy of it validates them beside the average.
        averaging = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        self._raw = copy.deepcopy(pl_module).eval() if self.log_raw and averaging else None
        self._raw_correct = torch.zeros((), device=pl_module.device)
        self._raw_seen = torch.zeros((), device=pl_module.device)
        super().on_validation_epoch_start(trainer, pl_module)  # the averaged weights into the model

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._raw is None:
            return
        x, y = batch[0], batch[1]  # x: (B, C, H, W), prepared as for validation_step
        with trainer.precision_plugin.val_step_context():
            logits = self._raw(x)
        self._raw_correct += (logits.argmax(dim=1) == y).sum()
        self._raw_seen += len(y)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._raw is not None:
            # Counts summed over DDP ranks, then one accuracy: each rank's share of the batches may differ.
            correct = trainer.strategy.reduce(self._raw_correct, reduce_op="sum")
            seen = trainer.strategy.reduce(self._raw_seen, reduce_op="sum")
            pl_module.log("val/acc_raw", correct / seen.clamp(min=1))
            self._raw = None
        super().on_validation_epoch_end(trainer, pl_module)  # the raw weights back into the model
