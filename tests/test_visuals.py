"""TensorBoard: a real server on 127.0.0.1 must list the scalars, the images and the hparams of a short run."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from project.visuals import confusion_image, image_grid, to_uint8
from tests.conftest import free_port


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


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def tensorboard_run(run_cli, tmp_path) -> Path:
    run_cli("fit", "--trainer.max_epochs=2", "--test_after_fit=true", "--trainer.log_every_n_steps=1")
    return tmp_path / "logs"


def test_tensorboard_server_lists_scalars_images_and_hparams(tensorboard_run):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", f"--logdir={tensorboard_run}", "--host=127.0.0.1", f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/data/plugin"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scalars = get(f"{base}/scalars/tags")
                if scalars:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "tensorboard did not start"
            time.sleep(0.5)
        run = "mnist/version_0"
        for tag in ("train/loss_step", "train/acc", "val/loss", "val/acc", "val/acc_best", "test/acc", "lr-AdamW"):
            assert tag in scalars[run], tag
        # >>> monitors
        # LayerHistograms: every parameter's weights and last-step gradient, and the per-parameter gradient norm.
        histograms = get(f"{base}/histograms/tags")[run]
        for name in ("net.features.0.weight", "net.classifier.4.bias"):
            assert f"weights/{name}" in histograms and f"grads/{name}" in histograms, name
            assert f"grad_norm/{name}" in scalars[run], name
        assert len(get(f"{base}/histograms/histograms?run={run}&tag=weights/net.features.0.weight")) == 2  # per epoch
        # <<< monitors
        images = get(f"{base}/images/tags")[run]
        assert {"inputs/train_samples", "val/confusion_matrix", "val/worst_misclassified"} <= set(images)
        assert images["val/confusion_matrix"]["samples"] == 1

        experiment = get(f"{base}/hparams/experiment", {"experimentName": ""})
        metric_tags = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert metric_tags == {"val/acc_best", "test/acc"}
        hparams = {h["name"] for h in experiment["hparamInfos"]}
        assert {"model/optimizer/init_args/lr", "data/batch_size", "model/net/class_path"} <= hparams
        # The HParams values are the real results, not Lightning's -1 placeholder.
        test_acc = get(f"{base}/scalars/scalars?run={run}&tag=test/acc")
        assert all(0 <= point[2] <= 1 for point in test_acc)
        assert "hp_metric" not in scalars[run]
    finally:
        server.terminate()
        server.wait(timeout=30)


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

    import project.visuals as visuals

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
