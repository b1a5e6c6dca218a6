"""Learning-rate schedules whose length comes from the Trainer, so changing ``trainer.max_epochs`` is one key."""

import math

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class WarmupCosineLR(LRScheduler):
    """Linear warm-up over ``warmup_steps``, then cosine annealing to ``min_lr_ratio`` x the base rate.

    Stepped every optimizer step (``interval = "step"``). With ``total_steps=None`` (the default) the horizon is
    the whole run: ``MNISTClassifier.configure_optimizers`` sets it from ``trainer.estimated_stepping_batches``,
    which follows ``trainer.max_epochs``, ``limit_train_batches``, ``accumulate_grad_batches`` and the number of
    devices. The last step runs at the minimum; the rate never rises after the warm-up.

    Args:
        optimizer: The optimizer whose learning rates are scheduled.
        warmup_steps: Steps of linear warm-up from ``base_lr / warmup_steps`` up to ``base_lr``; 0 for none.
        min_lr_ratio: The final learning rate as a fraction of the base rate.
        total_steps: Optimizer steps of the whole run; ``None`` lets the LightningModule take it from the Trainer
            (and a resumed run keeps its own Trainer's length rather than the checkpoint's).
        last_epoch: The index of the last step, for resuming (PyTorch's name for it).
    """

    interval = "step"  # the unit of warmup_steps and total_steps: the module steps it every optimizer step

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.0,
        total_steps: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        if warmup_steps < 0 or not 0 <= min_lr_ratio <= 1:
            raise ValueError(
                f"WarmupCosineLR: warmup_steps must be >= 0 and min_lr_ratio in [0, 1], got {warmup_steps}, "
                f"{min_lr_ratio}."
            )
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio
        self.total_steps = total_steps
        self.follows_trainer = total_steps is None  # the horizon is the run's, also after a resume
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The multiplier of the base learning rate at optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:  # no horizon yet: the base rate
            return 1.0
        span = max(1, self.total_steps - 1 - self.warmup_steps)  # the cosine reaches its minimum at the last step
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float | Tensor]:  # the supertype's: a base rate may be a tensor
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the position in the schedule; a horizon taken from the Trainer stays the current run's.

        A run resumed with a larger ``trainer.max_epochs`` then anneals over the new length from where it was,
        and its next step already uses the rate of the new schedule (the optimizer's restored rate is replaced).
        """
        horizon = self.total_steps
        super().load_state_dict(state_dict)
        if self.follows_trainer and horizon is not None:
            self.total_steps = horizon
            # step() is what sets the optimizer's rates and get_last_lr() from get_lr(): back one step, and again.
            self.last_epoch -= 1
            self.step()
