"""Data-parallel training on this CPU: two processes through the CLI, and two 'nodes' through torchrun."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import DEFAULT_CONFIG, ROOT, free_port

SMALL_RUN = [
    "--data.val_size=64",
    "--data.batch_size=16",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.callbacks=[]",  # the recipe's checkpoint (best on val/acc + last.ckpt) stays
    "--early_stopping=null",
]


def written_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_cpu_ddp_overlay_runs_two_processes_and_writes_once(mnist_dir, tmp_path):
    cmd = [sys.executable, "-m", "project", "fit", f"--config={DEFAULT_CONFIG}"]
    cmd += [f"--config={ROOT / 'configs' / 'ddp_cpu.yaml'}", f"--data.data_dir={mnist_dir}", *SMALL_RUN]
    # A timeout, not a hang, if config saving or the exit barrier deadlocks.
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    runs = list((tmp_path / "logs" / "mnist").iterdir())
    assert [r.name for r in runs] == ["version_0"]  # one TensorBoard run, written by rank 0
    files = written_files(runs[0])
    assert "config.yaml" in files and "hparams.yaml" in files
    assert any(f.startswith("events.out.tfevents") for f in files)  # fit, then test_after_fit, in this run
    ckpts = [f for f in files if f.endswith(".ckpt")]
    assert "checkpoints/last.ckpt" in ckpts and len(ckpts) == 2
    state = torch.load(runs[0] / "checkpoints" / "last.ckpt", weights_only=True)
    # 128 training images, 2 ranks x 16 per step: each rank ran 3 steps (limit_train_batches) in the epoch.
    assert state["global_step"] == 3


@pytest.mark.slow  # four processes (two launchers, two workers) on two cores: ~15-25 s; CI runs it
def test_torchrun_two_nodes_on_loopback(mnist_dir, tmp_path):
    port = free_port()
    procs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        cmd += [f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "project", "fit"]
        cmd += [f"--config={DEFAULT_CONFIG}", f"--data.data_dir={mnist_dir}", *SMALL_RUN]
        cmd += ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=2", "--trainer.strategy=ddp"]
        # Testing the best checkpoint needs it on storage all nodes share; these two "nodes" have separate folders.
        cmd += ["--test_after_fit=false"]
        procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    for p in procs:
        assert p.returncode == 0, outputs[0][-2000:] + outputs[1][-2000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    node0 = written_files(tmp_path / "node0")
    assert "logs/mnist/version_0/checkpoints/last.ckpt" in node0 and "logs/mnist/version_0/config.yaml" in node0
    assert written_files(tmp_path / "node1") == []  # global rank 1 wrote nothing
