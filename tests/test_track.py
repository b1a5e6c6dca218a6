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
    from project.__main__ import cli_main

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


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run's file, ``run-<id>.wandb``: W&B's own protobuf ``Record`` messages, framed
    as a LevelDB log (a 7-byte header, then 32 KiB blocks of chunks ``crc32c:4 length:2 (LE) type:1 data``; type 1
    is a whole record, 2/3/4 its first/middle/last part). wandb >= 0.18 ships no Python reader of its own."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in this block for a chunk header: zero padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_overlay_runs_offline_without_network_and_its_run_reads_back(mnist_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed: pip install -e '.[wandb]'")
    from project.__main__ import cli_main
    from tests.conftest import small_run

    monkeypatch.chdir(tmp_path)
    for key in ("WANDB_MODE", "WANDB_API_KEY", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # not the user's ~/.config/wandb
        monkeypatch.setenv(key, str(tmp_path / "home"))
    # Any HTTP(S) that W&B's service process (wandb-core) tried would go to this loopback listener, and be counted.
    # On 127.0.0.2, an address no other test's client uses: a client of another test running beside this one (its
    # server's port picked, closed and reused) could otherwise land on the trap's port and be counted as W&B.
    trap = socket.create_server(("127.0.0.2", 0))
    trap.setblocking(False)
    url = f"http://127.0.0.2:{trap.getsockname()[1]}"
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "WANDB_BASE_URL"):
        monkeypatch.setenv(key, url)
    # And in this process: every connection and name lookup that would leave the machine.
    tried = []
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
        return connect(sock, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host not in (None, "127.0.0.1", "::1", "localhost"):
            tried.append(host)
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    options = [a for a in small_run(mnist_dir, tmp_path) if "save_dir" not in a]  # it would name W&B's folder
    try:
        cli = cli_main(
            [
                "fit",
                "--config",
                str(ROOT / "configs" / "wandb.yaml"),
                *options,
                "--trainer.max_epochs=2",
                "--test_after_fit=false",
            ]
        )
    finally:
        wandb.teardown()  # stops the wandb-core process this fit started
        with contextlib.suppress(BlockingIOError):
            tried.append(trap.accept()[1])
        trap.close()
    assert tried == [], f"W&B tried the network: {tried}"
    run = Path(cli.trainer.log_dir)
    files = list(run.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, sorted(str(p.relative_to(run)) for p in run.rglob("*"))  # in the TensorBoard run's folder
    records = wandb_records(files[0])
    config = {
        item.key: json.loads(item.value_json) for r in records if r.HasField("config") for item in r.config.update
    }
    assert config["trainer"]["max_epochs"] == 2 and config["data"]["init_args"]["batch_size"] == 32
    assert config["model"]["net"]["class_path"] == "project.net.CNN"
    history = [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    val_acc = [h["val/acc"] for h in history if "val/acc" in h]
    assert len(val_acc) == 2 and val_acc[-1] == pytest.approx(float(cli.trainer.callback_metrics["val/acc"]))
    names = [r.run.display_name for r in records if r.HasField("run")]
    assert names and names[0] == f"mnist/{run.name}"


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
