"""The LightningModule: wraps an injected network with the loss, metrics and optimisation recipe."""

import warnings
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from project.checkpointing import load_weights
from project.hooks import FollowsTrainer, StepsEvery, StepsOnMetric
from project.inputs import example_input
from project.net import CNN

Batch = tuple[Tensor, Tensor]


class MNISTClassifier(L.LightningModule):
    """Image classifier trained with cross-entropy on the logits of ``net``.

    Args:
        net: Images (B, C, H, W) -> logits (B, num_classes); ``None``: the default ``CNN`` (``--model.net``).
        num_classes: Number of classes; linked from ``data.num_classes`` by the CLI.
        class_names: The name of each class index, linked from ``data.class_names``; ``predict`` writes them.
        optimizer: Factory ``params -> Optimizer``; ``None`` means AdamW(lr=1e-3, weight_decay=1e-4).
        scheduler: Factory ``optimizer -> LRScheduler``, or ``None`` for a constant learning rate. Its optional
            attributes (``monitor``, ``interval``, ``follows_trainer``) are declared in ``project.hooks``.
        scheduler_interval: Step the scheduler every ``"epoch"`` or ``"step"``, unless it names its own ``interval``.
        channels_last: Store conv weights (and so activations) as NHWC, which oneDNN and cuDNN run faster.
        compile: ``torch.compile`` the network (in place: checkpoints load with or without it).
        init_from: A checkpoint whose weights ``fit`` starts from, with a fresh optimizer and schedule (fine-tuning).
        label_smoothing: Share of each training target spread over all classes; val/ and test/loss stay plain.
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        channels_last: bool = False,
        compile: bool = False,
        init_from: str | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing!r}")
        # Under LightningCLI the hparams are the config (class paths and init args), which is what lets
        # `MNISTClassifier.load_from_checkpoint(path)` rebuild an injected net with no other argument.
        # load_from_checkpoint passes the rebuilt net object; on_load_checkpoint puts its config back.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`")
            self.save_hyperparameters()
        self.net = net if net is not None else CNN(num_classes=num_classes)
        self.optimizer, self.scheduler, self.scheduler_interval = optimizer, scheduler, scheduler_interval
        self.compile_net = compile  # not `self.compile`: nn.Module.compile is a method
        self.init_from = init_from
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.loss_fn = nn.CrossEntropyLoss()  # takes logits: log-softmax is inside
        self.train_loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # One metric object per stage: torchmetrics keeps running state that must not mix stages. Each step
        # updates them (~30 us); each epoch-end hook logs them once (self.log costs ~0.5 ms a call on a CPU).
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        # A NaN loss makes the epoch mean NaN (EarlyStopping then stops and says so) instead of raising or vanishing.
        self.train_loss, self.val_loss, self.test_loss = (MeanMetric(nan_strategy=float("nan")) for _ in range(3))
        self.val_acc_best = MaxMetric()

    def forward(self, x: Tensor) -> Tensor:
        """Return logits (B, num_classes) for normalised images (B, C, H, W)."""
        return self.net(x)

    def on_train_start(self) -> None:
        self.val_acc_best.reset()  # the sanity-check validation run does not count

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = self._shared_step(batch, "train")[0]
        every = self.trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning, declared nowhere
        if every and (self.trainer.global_step + 1) % every == 0:
            # Only on the steps the loggers write (trainer.log_every_n_steps), averaged across DDP ranks.
            self.log("train/loss_step", loss, prog_bar=True, sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        loss, logits = self._shared_step(batch, "val")
        return {"loss": loss, "logits": logits.detach()}  # for callbacks that look at predictions (mistakes)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")
        if self.trainer.sanity_checking:
            return
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True, sync_dist=True)

    def test_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._shared_step(batch, "test")[0]

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: Batch | Tensor, batch_idx: int) -> dict[str, Tensor]:
        """Return ``preds`` (B,) class indices and ``probs`` (B, num_classes) softmax probabilities."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        probs = self(x).float().softmax(dim=-1)
        return {"preds": probs.argmax(dim=-1), "probs": probs}

    def configure_optimizers(self) -> Any:
        params = self.parameters()
        if self.optimizer is None:
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-4)
        else:
            optimizer = self.optimizer(params)
        if self.scheduler is None:
            return optimizer
        scheduler = self.scheduler(optimizer)
        if isinstance(scheduler, FollowsTrainer) and scheduler.follows_trainer:
            # The horizon follows the run (max_epochs, limit_train_batches, accumulation, devices): one key to change.
            scheduler.total_steps = int(self.trainer.estimated_stepping_batches)
        interval = scheduler.interval if isinstance(scheduler, StepsEvery) else self.scheduler_interval
        config = {"scheduler": scheduler, "interval": interval}
        if isinstance(scheduler, StepsOnMetric):
            config["monitor"] = scheduler.monitor
        return {"optimizer": optimizer, "lr_scheduler": config}

    def setup(self, stage: str) -> None:
        if stage == "fit" and not self.compile_net:
            # The model summary runs it: FLOPs and each layer's in/out sizes instead of "Total FLOPs: 0". Not for
            # a compiled net, which would compile once more for a batch of one.
            self.example_input_array = example_input(self.trainer)
        if stage == "fit" and self.init_from and self.trainer.ckpt_path is None:  # a resumed fit has its own weights
            load_weights(self, self.init_from)

    def configure_model(self) -> None:
        if self.compile_net:
            # In place: unlike `torch.compile(net)` this adds no `_orig_mod.` prefix to the state dict.
            self.net.compile()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved_net = checkpoint.get("hyper_parameters", {}).get("net")
        if isinstance(saved_net, dict) and isinstance(self.hparams.get("net"), nn.Module):
            # Keep hparams serialisable (a config, not a pickled module) for the next checkpoint.
            self.hparams["net"] = saved_net

    def _shared_step(self, batch: Batch, stage: str) -> tuple[Tensor, Tensor]:
        """Loss and logits (B, C) of one batch, added to the stage's epoch loss and accuracy."""
        x, y = batch
        logits = self(x)
        loss = (self.train_loss_fn if stage == "train" else self.loss_fn)(logits, y)
        getattr(self, f"{stage}_loss").update(loss.detach(), weight=len(y))  # weighted: the last batch is smaller
        getattr(self, f"{stage}_acc").update(logits, y)
        return loss, logits

    def _log_epoch(self, stage: str) -> None:
        # Lightning computes logged Metric objects (synced across DDP ranks) at the end of the epoch, then resets them.
        self.log(f"{stage}/loss", getattr(self, f"{stage}_loss"), prog_bar=True)
        self.log(f"{stage}/acc", getattr(self, f"{stage}_acc"), prog_bar=True)
