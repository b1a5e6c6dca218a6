import pytest
import torch
from lightning.pytorch.cli import ReduceLROnPlateau

from project.module import MNISTClassifier
from project.net import CNN


def test_predict_step_returns_classes_and_probabilities():
    model = MNISTClassifier(net=CNN(num_classes=10)).eval()
    x, y = torch.randn(6, 1, 28, 28), torch.zeros(6, dtype=torch.long)
    for batch in ((x, y), x):
        out = model.predict_step(batch, 0)
        assert out["preds"].shape == (6,) and out["preds"].dtype == torch.long
        assert out["probs"].shape == (6, 10)
        torch.testing.assert_close(out["probs"].sum(dim=1), torch.ones(6))
        assert torch.equal(out["preds"], out["probs"].argmax(dim=1))


def test_default_optimizer_is_adamw_without_scheduler():
    model = MNISTClassifier()
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["weight_decay"] == 1e-4


def test_injected_optimizer_and_plateau_scheduler_carry_their_monitor():
    model = MNISTClassifier(
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        scheduler=lambda o: ReduceLROnPlateau(o, monitor="val/loss"),
    )
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD)
    assert config["lr_scheduler"]["monitor"] == "val/loss"
    assert config["lr_scheduler"]["interval"] == "epoch"


def test_epoch_metrics_cover_exactly_one_run_of_the_loader():
    """test/acc and test/loss are the whole loader's accuracy and mean loss, and a second run starts from zero."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = MNISTClassifier(net=CNN(num_classes=10)).eval()
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    # Batch sizes 32 + 8: the mean loss must be weighted by batch size, not averaged per batch.
    for n in (40, 23):
        x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
        with torch.no_grad():
            logits = model(x)
        scores = trainer.test(model, DataLoader(TensorDataset(x, y), batch_size=32), verbose=False)[0]
        assert scores["test/acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), abs=1e-6)
        assert scores["test/loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)


def test_step_loss_is_logged_on_every_step_the_logger_writes(tmp_path):
    """train/loss_step is logged only on the steps the logger writes, and each written value is that step's loss."""
    import csv

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    class Losses(L.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.losses.append(outputs["loss"].item())

    torch.manual_seed(0)
    x, y = torch.randn(56, 1, 28, 28), torch.randint(0, 10, (56,))
    losses = Losses()
    trainer = L.Trainer(
        max_epochs=2, log_every_n_steps=3, logger=CSVLogger(tmp_path), callbacks=[losses],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(MNISTClassifier(net=CNN(num_classes=10)), DataLoader(TensorDataset(x, y), batch_size=8))
    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["train/loss_step"]]
    assert [int(row["step"]) for row in rows] == [2, 5, 8, 11]  # 14 steps over two epochs, every third written
    for row in rows:
        assert float(row["train/loss_step"]) == pytest.approx(losses.losses[int(row["step"])], rel=1e-6)


def test_label_smoothing_softens_the_training_loss_only():
    """model.label_smoothing changes the loss that trains; val/test loss stay the plain cross-entropy."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = MNISTClassifier(net=CNN(num_classes=10), label_smoothing=0.1)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    logits = model(x)
    train_loss, _ = model._shared_step((x, y), "train")
    val_loss, _ = model._shared_step((x, y), "val")
    torch.testing.assert_close(train_loss, F.cross_entropy(logits, y, label_smoothing=0.1))
    torch.testing.assert_close(val_loss, F.cross_entropy(logits, y))
    assert not torch.allclose(train_loss, val_loss)
    with pytest.raises(ValueError, match=r"model.label_smoothing must be in \[0, 1\), got 1.0"):
        MNISTClassifier(label_smoothing=1.0)
