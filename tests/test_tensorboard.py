"""TensorBoard: a real server on 127.0.0.1 must list the scalars and the hparams of a short run, and what the
features draw there."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def tensorboard_run(run_cli, tmp_path) -> Path:
    run_cli("fit", "--trainer.max_epochs=2", "--test_after_fit=true", "--trainer.log_every_n_steps=1")
    return tmp_path / "logs"


def test_tensorboard_server_lists_scalars_and_hparams(tensorboard_run):
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
        # TensorBoardImages: the inputs, and per validation the confusion matrix and the worst mistakes.
        images = get(f"{base}/images/tags")[run]
        assert {"inputs/train_samples", "val/confusion_matrix", "val/worst_misclassified"} <= set(images)
        assert images["val/confusion_matrix"]["samples"] == 1
        # <<< monitors

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
