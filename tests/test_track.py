"""The track feature: the profiler trace and MLflow tracking, each checked against the tool that reads it."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, synthetic_digits, write_idx


def test_profile_overlay_writes_a_trace_and_the_slowest_ops(run_cli):
    cli = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "profile.yaml"),
        "--data.batch_size=2",
        "--trainer.limit_val_batches=2",
    )
    run = Path(cli.trainer.log_dir)
    traces = list(run.glob("*.pt.trace.json"))
    assert len(traces) == 1, sorted(p.name for p in run.iterdir())
    trace = json.loads(traces[0].read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("aten::conv") for n in names) and any(n.startswith("ProfilerStep#") for n in names)
    summary = (run / "fit-profile.txt").read_text()
    assert "Self CPU" in summary and "aten::" in summary


def test_the_profile_recipe_as_shipped_writes_and_prints_the_slowest_ops(tmp_path, monkeypatch, capsys):
    """configs/profile.yaml unchanged (batch 128, 40 steps, 5 validation batches): the training cycle's table survives
    the validation steps, which Lightning runs on the same schedule, and is printed too."""
    from project.cli import cli_main

    raw = tmp_path / "data" / "MNIST" / "raw"  # enough digits for 40 batches of 128 and 5 of validation
    raw.mkdir(parents=True)
    for prefix, n, seed in (("train", 6000, 0), ("t10k", 100, 1)):
        images, labels = synthetic_digits(n, seed)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    monkeypatch.chdir(tmp_path)
    cli = cli_main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "profile.yaml"),
            f"--data.data_dir={tmp_path / 'data'}",
            "--data.val_size=640",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert cli.datamodule.batch_size == 128 and cli.trainer.global_step == 40
    assert cli.trainer.num_val_batches == [5]
    summary = (Path(cli.trainer.log_dir) / "fit-profile.txt").read_text()
    assert "Self CPU" in summary and "aten::conv" in summary and "ProfilerStep*" in summary
    printed = capsys.readouterr()
    assert "aten::conv" in printed.out + printed.err


mlflow = pytest.importorskip("mlflow", reason="the track extra is not installed: pip install -e '.[track]'")


def check_mlflow_run(tracking_uri: str) -> dict:
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("mnist")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="attributes.status = 'FINISHED'")
    params = run.data.params
    assert params["net/class_path"] == "project.net.CNN" and params["config/model/optimizer/init_args/lr"] == "0.001"
    history = client.get_metric_history(run.info.run_id, "val/acc")
    assert len(history) == 2 and all(0 <= m.value <= 1 for m in history)
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "config.yaml" in artifacts and "last" in artifacts and any(a.startswith("epoch") for a in artifacts)
    # Each kept checkpoint is a folder of its own (Lightning's log_model): the .ckpt and its metadata.
    best = next(a for a in artifacts if a.startswith("epoch"))
    assert f"{best}/{best}.ckpt" in [a.path for a in client.list_artifacts(run.info.run_id, best)]
    return {"params": len(params), "val/acc": [m.value for m in history], "artifacts": artifacts}


def test_mlflow_overlay_tracks_params_metrics_and_checkpoints_beside_tensorboard(run_cli, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cli = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "mlflow.yaml"),
        "--trainer.max_epochs=2",
        f"--trainer.logger.init_args.tracking_uri={store}",
        f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}",
    )
    check_mlflow_run(store)
    assert list(Path(cli.trainer.log_dir).glob("events.out.tfevents.*"))  # TensorBoard keeps working


@pytest.mark.slow  # the server takes ~20 s to start on 2 cores
def test_a_real_mlflow_server_receives_the_run(run_cli, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination", str(tmp_path)]
    # Its own process group: `mlflow server` runs the web server in child processes, all stopped below.
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
                time.sleep(0.5)
        run_cli(
            "fit",
            "--config",
            str(ROOT / "configs" / "mlflow.yaml"),
            "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.tracking_uri={url}",
            "--trainer.logger.init_args.artifact_location=null",
        )
        check_mlflow_run(url)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        with contextlib.suppress(ProcessLookupError):  # nothing of the group may outlive the test
            os.killpg(server.pid, signal.SIGKILL)
