"""The monitors feature: its two callbacks on by default, each a key of its own, and what they log, read back with
TensorBoard's reader."""

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


def test_both_monitors_are_on_in_every_run_and_each_is_a_key_of_its_own(run_cli):
    from project.monitors.callbacks import LayerHistograms, Throughput

    def monitors(*args: str) -> list[object]:
        cli = run_cli("fit", "--trainer.max_epochs=1", *args)
        return [c for c in cli.trainer.callbacks if isinstance(c, (LayerHistograms, Throughput))]

    assert sorted(type(c).__name__ for c in monitors()) == ["LayerHistograms", "Throughput"]
    (throughput,) = monitors("--histograms=null", "--throughput.window_size=7")
    assert isinstance(throughput, Throughput) and throughput.kwargs["window_size"] == 7  # ThroughputMonitor keeps it
    assert monitors("--histograms=null", "--throughput=null") == []
