"""The monitors feature: its callbacks on by default, each a key of its own, and what they log, read back with
TensorBoard's reader; the pictures as drawn."""

from pathlib import Path

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.monitors.pictures import confusion_image, image_grid, to_uint8


def events(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"histograms": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def test_throughput_scalars_during_training(run_cli):
    # 60 steps of 2 images: past the monitor's window of 50 batches, the rates are logged.
    cli = run_cli("fit", "--data.batch_size=2", "--trainer.limit_train_batches=60", "--trainer.log_every_n_steps=10")
    tags = events(Path(cli.trainer.log_dir)).Tags()["scalars"]
    assert {"train/device/samples_per_sec", "train/device/batches_per_sec"} <= set(tags), tags


def test_the_monitors_are_on_in_every_run_and_each_is_a_key_of_its_own(run_cli):
    from project.monitors.callbacks import LayerHistograms, Throughput
    from project.monitors.pictures import TensorBoardImages

    def monitors(*args: str) -> list[object]:
        cli = run_cli("fit", "--trainer.max_epochs=1", *args)
        return [c for c in cli.trainer.callbacks if isinstance(c, (TensorBoardImages, LayerHistograms, Throughput))]

    assert sorted(type(c).__name__ for c in monitors()) == ["LayerHistograms", "TensorBoardImages", "Throughput"]
    (pictures, throughput) = monitors("--histograms=null", "--throughput.window_size=7", "--pictures.worst=5")
    assert isinstance(throughput, Throughput) and throughput.kwargs["window_size"] == 7  # ThroughputMonitor keeps it
    assert isinstance(pictures, TensorBoardImages) and pictures.worst == 5
    assert monitors("--histograms=null", "--throughput=null", "--pictures=null") == []


def test_without_tensorboard_the_pictures_keep_nothing(run_cli):
    from project.monitors.pictures import TensorBoardImages

    cli = run_cli("fit", "--trainer.max_epochs=1", "--trainer.logger=false")
    (pictures,) = (c for c in cli.trainer.callbacks if isinstance(c, TensorBoardImages))
    assert not pictures.drawing and pictures._worst is None  # no confusion matrix or worst images gathered
    assert int(pictures.confusion.confmat.sum()) == 0


def test_drawings_have_the_expected_shapes():
    grid = image_grid(to_uint8(torch.randn(10, 1, 28, 28)), [f"{i}" for i in range(10)], columns=4)
    assert grid.dtype == np.uint8 and grid.shape[2] == 3 and grid.shape[1] == 4 * (28 * 3 + 4)
    matrix = torch.eye(10, dtype=torch.long) * 5
    matrix[3, 5] = 2
    image = confusion_image(matrix)
    assert image.shape == (40 + 10 * 36, 40 + 10 * 36, 3)
    # A correct cell is blue, an error cell red, an empty off-diagonal cell white.
    cell = lambda t, p: image[40 + t * 36 + 30, 40 + p * 36 + 30]  # noqa: E731
    assert cell(0, 0)[2] == 255 and cell(0, 0)[0] < 100
    assert cell(3, 5)[0] == 255 and cell(3, 5)[2] < 255
    assert tuple(cell(1, 2)) == (255, 255, 255)


def test_rgb_images_keep_their_colours_and_grey_ones_stay_grey():
    red = torch.zeros(2, 3, 8, 8)
    red[:, 0] = 1.0  # a pure red image
    pixels = to_uint8(red)
    assert pixels.shape == (2, 8, 8, 3) and tuple(pixels[0, 0, 0]) == (255, 0, 0)
    assert to_uint8(torch.randn(2, 1, 8, 8)).shape == (2, 8, 8)
    grid = image_grid(pixels, ["cat->dog 0.12", "x"], columns=2)
    tile = grid[2 + 3, 2 + 3]  # inside the first tile
    assert tuple(tile) == (255, 0, 0)


def test_the_pictures_name_the_classes_and_captions_are_ascii(monkeypatch):
    """The model's class_names label the confusion matrix and the captions, "true->predicted" in ASCII (PIL's
    default font has no arrow)."""
    from types import SimpleNamespace

    from lightning.pytorch.loggers import TensorBoardLogger

    import project.monitors.pictures as visuals

    drawn: dict[str, object] = {}
    monkeypatch.setattr(
        visuals, "image_grid", lambda images, captions=None, **kw: drawn.setdefault("captions", captions)
    )
    monkeypatch.setattr(visuals, "confusion_image", lambda matrix, names=None: drawn.setdefault("names", names))
    callback = visuals.TensorBoardImages()
    module = SimpleNamespace(hparams={"num_classes": 3, "class_names": ["cat", "dog", "emu"]}, device="cpu")
    board = SimpleNamespace(add_image=lambda *a, **k: None)
    logger = TensorBoardLogger.__new__(TensorBoardLogger)
    monkeypatch.setattr(TensorBoardLogger, "experiment", property(lambda self: board))
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, loggers=[logger], global_step=1)
    callback.setup(trainer, module, "fit")
    callback.on_validation_epoch_start(trainer, module)
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0]])  # a cat taken for a dog, a right cat
    callback.on_validation_batch_end(
        trainer, module, {"logits": logits}, (torch.zeros(2, 3, 4, 4), torch.tensor([0, 0])), 0
    )
    callback.on_validation_epoch_end(trainer, module)
    assert drawn["names"] == ["cat", "dog", "emu"]
    assert drawn["captions"][0].startswith("cat->dog ") and all(c.isascii() for c in drawn["captions"][0])
