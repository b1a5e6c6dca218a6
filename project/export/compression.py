"""Pruning with fine-tuning: Lightning's ``ModelPruning`` on a schedule that reaches a target sparsity."""

import lightning as L
from lightning.pytorch.callbacks import ModelPruning
from lightning.pytorch.utilities import rank_zero_info


class GradualPruning(ModelPruning):
    """Global L1 unstructured pruning of every weight (convolutions and Linear layers), rising over the epochs.

    After each training epoch but the last, the smallest-magnitude weights are zeroed so that the sparsity follows
    a cubic ramp (Zhu & Gupta, 2017) to ``sparsity`` after epoch ``max_epochs - 2``; the last epoch fine-tunes at
    the target. Pruning is made permanent in every checkpoint (plain ``weight`` tensors, no ``weight_orig`` /
    ``weight_mask``), so the result exports and serves like any other checkpoint. Unstructured zeros shrink the
    compressed file; they do not speed up dense CPU kernels.

    Args:
        sparsity: The fraction of weights that are zero at the end.
    """

    def __init__(self, sparsity: float = 0.75) -> None:
        if not 0 <= sparsity < 1:
            raise ValueError(f"GradualPruning: sparsity must be in [0, 1), got {sparsity}.")
        self.sparsity = sparsity
        self.epochs = 2
        super().__init__(
            pruning_fn="l1_unstructured",
            parameter_names=["weight"],
            use_global_unstructured=True,
            amount=self.amount_at,
            make_pruning_permanent=True,
            use_lottery_ticket_hypothesis=False,  # fine-tune the trained weights, do not rewind them
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.epochs = max(2, trainer.max_epochs or 2)

    def target_at(self, epoch: int) -> float:
        """The sparsity after the pruning at the end of ``epoch`` (0-based)."""
        ramp = self.epochs - 1  # pruning epochs: all but the last
        progress = min(1.0, (epoch + 1) / ramp)
        return self.sparsity * (1 - (1 - progress) ** 3)

    def amount_at(self, epoch: int) -> float:
        """The fraction of the still-unpruned weights to prune at the end of ``epoch`` (PyTorch prunes iteratively)."""
        before = self.target_at(epoch - 1) if epoch > 0 else 0.0
        after = self.target_at(epoch)
        amount = 0.0 if after <= before else 1 - (1 - after) / (1 - before)
        if amount > 0:
            rank_zero_info(f"Pruning after epoch {epoch}: sparsity {before:.1%} -> {after:.1%} of the weights.")
        return amount
