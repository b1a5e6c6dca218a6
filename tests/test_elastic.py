"""configs/elastic.yaml under torchrun: a killed worker is restarted and resumes; without restarts the job fails fast.

Real processes on this machine (gloo): torchrun, its agent and two workers per job, on the synthetic MNIST. Each
test kills what it started. `SlowSteps` (tests/slow_steps.py) slows the steps down so that a kill lands mid-run.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import pytest

from project.__main__ import cli_main
from project.checkpointing import load_checkpoint
from tests.conftest import DEFAULT_CONFIG, ROOT

STEPS_PER_EPOCH = 8  # 128 training images, 2 workers x 8 per step
EPOCHS = 6


class LastCkptSteps(L.Callback):
    """Records the global step held by last.ckpt at the start of every training batch."""

    seen: list[int] = []  # noqa: RUF012 (one test reads it back)

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        if last.is_file():
            LastCkptSteps.seen.append(load_checkpoint(last)["global_step"])


def test_last_ckpt_is_rewritten_every_n_training_steps_and_every_epoch(run_cli):
    LastCkptSteps.seen = []
    run_cli(
        "fit",
        "--trainer.strategy=auto",  # one process: the steps, not the restarts
        "--step_checkpoint.init_args.every_n_train_steps=2",
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=5",
        "--data.batch_size=16",  # 8 batches in an epoch, 5 of them run
        "--trainer.callbacks+=tests.test_elastic.LastCkptSteps",
        config=("elastic.yaml",),
    )
    # Steps 2, 4, 6, 8 and 10 (step_checkpoint), and the end of epoch 0 at step 5 (the recipe's last_checkpoint).
    assert LastCkptSteps.seen == [2, 2, 4, 5, 6, 6, 8, 8]


def torchrun(tmp: Path, mnist_dir: Path, max_restarts: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "-m", "project", "fit"]
    for config in (DEFAULT_CONFIG, ROOT / "configs" / "ddp_cpu.yaml", ROOT / "configs" / "elastic.yaml"):
        cmd.append(f"--config={config}")
    cmd += [
        f"--data.data_dir={mnist_dir}",
        "--data.val_size=64",
        "--data.batch_size=8",
        f"--trainer.max_epochs={EPOCHS}",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={tmp / 'logs'}",
        "--test_after_fit=false",
        "--step_checkpoint.init_args.every_n_train_steps=3",  # mid-epoch saves: 3, 6, 9 (epoch ends: 8, 16)
        "--trainer.callbacks+=tests.slow_steps.SlowSteps",
        f"--trainer.callbacks.folder={tmp / 'progress'}",
        "--trainer.callbacks.seconds=0.15",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def progress(tmp: Path, rank: int) -> tuple[int, int] | None:
    """(pid, global step) that rank ``rank`` last reported, or None before its first step."""
    try:
        pid, step = (tmp / "progress" / f"rank{rank}.txt").read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    return int(pid), int(step)


def last_ckpt(tmp: Path) -> Path:
    (path,) = (tmp / "logs" / "mnist").glob("version_*/checkpoints/last.ckpt")
    return path


def wait_until(condition, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout} s")


def kill_group(proc: subprocess.Popen) -> None:
    """Kill whatever is left of a job: torchrun, its agent, its workers (a stopped one included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for the job to end by itself; then kill whatever of it is left (or all of it, on a timeout)."""
    try:
        out = proc.communicate(timeout=timeout)[0]
    finally:
        kill_group(proc)
    return proc.returncode, out


def val_acc(ckpt: Path, mnist_dir: Path, tmp: Path) -> float:
    cli = cli_main(
        [
            "validate",
            f"--ckpt_path={ckpt}",
            f"--data.data_dir={mnist_dir}",
            "--data.val_size=64",
            f"--trainer.logger.init_args.save_dir={tmp / 'eval'}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    return float(cli.trainer.callback_metrics["val/acc"])


@pytest.mark.slow  # three torchrun jobs of two workers: ~1 min on 2 cores
def test_a_killed_worker_is_restarted_and_the_job_resumes_from_the_mid_epoch_checkpoint(mnist_dir, tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    killed.mkdir(), clean.mkdir()
    start = time.monotonic()
    proc = torchrun(killed, mnist_dir, 2)
    try:
        # A mid-epoch last.ckpt exists and training has gone past it: kill rank 1 there (SIGKILL, as the OOM killer).
        def mid_epoch_checkpoint() -> int | None:
            try:
                step = load_checkpoint(last_ckpt(killed))["global_step"]
            except (ValueError, Exception):
                return None
            return step if step >= 6 and step % STEPS_PER_EPOCH else None

        saved = wait_until(mid_epoch_checkpoint, 180, proc)
        pid, step_at_kill = wait_until(lambda: (p := progress(killed, 1)) and p[1] > saved and p, 60, proc)
        os.kill(pid, signal.SIGKILL)
        rc, out = finish(proc, 300)
    finally:
        kill_group(proc)
    killed_wall = time.monotonic() - start
    assert rc == 0, out[-3000:]
    resumed = [int(s) for s in re.findall(r"Resuming .*global step (\d+)\)", out)]
    assert resumed and 0 < resumed[0] <= step_at_kill and resumed[0] % 3 == 0, out[-3000:]
    assert resumed[0] >= saved
    assert len(list((killed / "logs" / "mnist").iterdir())) == 1  # one run folder: no second version_N
    final = load_checkpoint(last_ckpt(killed))
    assert final["global_step"] == EPOCHS * STEPS_PER_EPOCH and final["epoch"] == EPOCHS - 1

    start = time.monotonic()
    proc = torchrun(clean, mnist_dir, 0)
    rc, out = finish(proc, 300)
    clean_wall = time.monotonic() - start
    assert rc == 0, out[-3000:]
    acc_killed, acc_clean = val_acc(last_ckpt(killed), mnist_dir, killed), val_acc(last_ckpt(clean), mnist_dir, clean)
    print(
        f"work lost: {step_at_kill - resumed[0]} steps (checkpoint at {resumed[0]}, killed at {step_at_kill}); "
        f"wall {killed_wall:.1f} s killed and restarted vs {clean_wall:.1f} s uninterrupted; "
        f"val/acc {acc_killed:.4f} vs {acc_clean:.4f}"
    )
    assert abs(acc_killed - acc_clean) <= 0.05


@pytest.mark.slow  # one torchrun job: ~20 s
def test_without_restarts_a_worker_killed_mid_save_fails_the_job_fast_and_the_last_checkpoint_loads(
    mnist_dir, tmp_path
):
    # Rank 0, the only writer, hangs half-way through its second save; it is SIGKILLed there.
    proc = torchrun(tmp_path, mnist_dir, 0, "--trainer.plugins=tests.slow_steps.HangingCheckpointIO")
    try:
        marker = wait_until(lambda: next((tmp_path / "logs").rglob("writing"), None), 180, proc)
        writer = int(marker.read_text())
        before = load_checkpoint(last_ckpt(tmp_path))["global_step"]
        start = time.monotonic()
        os.kill(writer, signal.SIGKILL)
        rc, out = finish(proc, 120)
    finally:
        kill_group(proc)
    detection = time.monotonic() - start
    assert rc != 0
    assert re.search(r"rank\s*:\s*0", out), out[-3000:]  # torchrun's report names the lost rank
    assert detection < 90, f"the job took {detection:.1f} s to fail"  # well within elastic.yaml's 90 s timeout
    assert load_checkpoint(last_ckpt(tmp_path))["global_step"] == before  # the interrupted write left it intact
    print(f"detection: {detection:.1f} s after SIGKILL of rank 0 during a save")


@pytest.mark.slow  # one torchrun job, up to the 20 s timeout
def test_a_hung_peer_fails_the_others_after_the_process_group_timeout(mnist_dir, tmp_path):
    # SIGSTOP: the worker is alive to torchrun but answers nobody, as on a lost node. Only the timeout ends it.
    proc = torchrun(tmp_path, mnist_dir, 0, "--trainer.strategy.init_args.timeout=0:00:20")
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), x) for x in proc.stdout), daemon=True)
    try:
        reader.start()
        pid, _ = wait_until(lambda: (p := progress(tmp_path, 1)) and p[1] >= 4 and p, 180, proc)
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        # The survivor's collective gives up after the timeout and names the peer it lost.
        timed_out = re.compile(r"[Tt]ime(d )?out|Traceback")
        failed = wait_until(
            lambda: next((t for t, x in list(lines) if t > start and timed_out.search(x)), None), 90, proc
        )
        # torchrun would stop the job by itself, but a stopped worker goes only when its 30 s grace for SIGTERM ends
        # in SIGKILL: that is torchrun's part, so the test ends the stopped worker itself and the job fails at once.
        os.kill(pid, signal.SIGKILL)
        rc = proc.wait(timeout=60)
        reader.join(10)
    finally:
        kill_group(proc)
    assert rc != 0
    detection = failed - start
    assert detection <= 40, f"{detection:.1f} s: more than twice the 20 s timeout"
    print(
        f"detection of a hung peer: {detection:.1f} s with a 20 s timeout; job ended {time.monotonic() - start:.1f} s"
    )
