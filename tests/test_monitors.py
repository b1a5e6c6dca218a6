"""The monitors on by default (throughput), checked against the tool that reads them (TensorBoard's reader)."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def events(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"histograms": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def test_throughput_scalars_during_training(run_cli):
    # 60 steps of 2 images: past the monitor's window of 50 batches, the rates are logged.
    cli = run_cli("fit", "--data.batch_size=2", "--trainer.limit_train_batches=60", "--trainer.log_every_n_steps=10")
    tags = events(Path(cli.trainer.log_dir)).Tags()["scalars"]
    assert {"train/device/samples_per_sec", "train/device/batches_per_sec"} <= set(tags), tags
