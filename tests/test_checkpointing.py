"""Resume, interruption, non-finite loss, bad configuration and untrusted checkpoints."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from project.__main__ import cli_main
from project.checkpointing import AtomicCheckpointIO, NonFiniteLoss, StopOnNonFiniteLoss, load_checkpoint
from project.mnist_files import MNISTDataError
from project.module import MNISTClassifier
from tests.conftest import DEFAULT_CONFIG, ROOT


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_from_last_matches_an_uninterrupted_run(run_cli, tmp_path):
    # A run of 3 epochs stopped after 1: the same schedule horizon (3 x 3 steps) in both halves, as for a real stop.
    deterministic = [
        "--trainer.deterministic=true",
        "--model.scheduler.init_args.total_steps=9",
        "--trainer.max_epochs=3",
    ]
    straight = run_cli("fit", *deterministic, f"--trainer.logger.init_args.save_dir={tmp_path / 'a'}")
    first = run_cli(
        "fit", *deterministic[:2], "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path / 'b'}"
    )
    assert first.trainer.current_epoch == 1
    resumed = run_cli(
        "fit", *deterministic, f"--trainer.logger.init_args.save_dir={tmp_path / 'b'}", "--ckpt_path=last"
    )
    assert resumed.trainer.current_epoch == 3 and resumed.trainer.global_step == straight.trainer.global_step
    # Same run folder, same TensorBoard run; the first config.yaml is kept beside the resumed run's.
    runs = sorted(p.name for p in (tmp_path / "b" / "mnist").iterdir())
    assert runs == ["version_0"]
    assert {"config.yaml", "config-1.yaml"} <= {p.name for p in (tmp_path / "b" / "mnist" / "version_0").iterdir()}
    a = load_checkpoint(tmp_path / "a/mnist/version_0/checkpoints/last.ckpt")
    b = load_checkpoint(tmp_path / "b/mnist/version_0/checkpoints/last.ckpt")
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"])
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert a["lr_schedulers"] == b["lr_schedulers"]
    for key, value in a["optimizer_states"][0]["state"][0].items():
        assert torch.equal(value, b["optimizer_states"][0]["state"][0][key])
    assert straight.trainer.callback_metrics["val/loss"] == resumed.trainer.callback_metrics["val/loss"]


def fit_command(mnist_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "project",
        "fit",
        f"--config={DEFAULT_CONFIG}",
        f"--data.data_dir={mnist_dir}",
        "--data.val_size=64",
        "--data.batch_size=16",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks=[]",  # none of default.yaml's list, then add back what the test needs
        "--early_stopping=null",
        *extra,
    ]


def default_signal_dispositions() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 1, "Ctrl-C")])
def test_interrupt_saves_a_resumable_checkpoint(mnist_dir, tmp_path, monkeypatch, sig, code, word):
    cmd = fit_command(
        mnist_dir,
        "--trainer.max_epochs=10000",
        "--trainer.callbacks+=project.checkpointing.SaveOnInterrupt",
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell's background job (`nohup pytest &`) ignores SIGINT, and children inherit that: Python would then
        # never raise KeyboardInterrupt. Give the child the default dispositions a terminal user has.
        preexec_fn=default_signal_dispositions,
    )
    try:
        checkpoints = tmp_path / "logs" / "mnist" / "version_0" / "checkpoints"
        deadline = time.monotonic() + 120
        while not any(checkpoints.glob("epoch*.ckpt")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(0.5)  # into the next epoch
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:  # a fit of 10000 epochs must never outlive the test
        proc.kill()
        proc.wait()
    assert proc.returncode == code, out[-2000:]
    assert f"{word}: stopped at epoch" in out and "Checkpoint saved to" in out and "Traceback" not in out, out[-3000:]
    last = load_checkpoint(checkpoints / "last.ckpt")
    assert last["global_step"] > 0
    # Resuming is not about processes: in this one, from the same folder and the same options.
    monkeypatch.chdir(tmp_path)
    resumed = cli_main(fit_command(mnist_dir, f"--trainer.max_epochs={last['epoch'] + 2}", "--ckpt_path=last")[3:])
    assert resumed.trainer.current_epoch == last["epoch"] + 2


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


@pytest.mark.slow  # two training processes: ~25 s
def test_sigterm_to_one_process_of_a_ddp_fit_stops_both_at_one_step_and_saves(mnist_dir, tmp_path):
    """A scheduler signals each process at its own moment: here only rank 1. Both stop at the same step (they agree
    at the end of every batch) and rank 0 saves; with Lightning's own handler, rank 1 left alone and rank 0 waited
    in its next collective until the process group's timeout."""
    cmd = fit_command(
        mnist_dir,
        f"--config={ROOT / 'configs' / 'ddp_cpu.yaml'}",
        "--trainer.max_epochs=10000",
        "--trainer.callbacks+=project.checkpointing.SaveOnInterrupt",
    )
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        checkpoints = tmp_path / "logs" / "mnist" / "version_0" / "checkpoints"
        deadline = time.monotonic() + 120
        while not any(checkpoints.glob("epoch*.ckpt")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        os.kill(children(proc.pid)[0], signal.SIGTERM)  # rank 1: Lightning started it, `python -m project fit` again
        out, _ = proc.communicate(timeout=60)
    finally:  # a fit of 10000 epochs must never outlive the test
        for child in children(proc.pid):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, out[-3000:]
    assert "SIGTERM: stopped at epoch" in out and "Traceback" not in out, out[-3000:]
    assert load_checkpoint(checkpoints / "last.ckpt")["global_step"] > 0


def test_last_ckpt_is_rewritten_every_epoch_also_when_the_best_did_not_improve(run_cli, tmp_path):
    # monitor=epoch in mode min: epoch 0 stays the best, so ModelCheckpoint's own save_last would keep epoch 0 in
    # last.ckpt; the recipe's last_checkpoint rewrites it after every epoch.
    run_cli("fit", "--trainer.max_epochs=3", "--checkpoint.monitor=epoch", "--checkpoint.mode=min")
    (last,) = (tmp_path / "logs").rglob("last.ckpt")
    checkpoint = load_checkpoint(last)
    assert checkpoint["epoch"] == 2 and checkpoint["global_step"] == 9
    (best,) = (s["best_model_path"] for s in checkpoint["callbacks"].values() if s.get("monitor") == "epoch")
    assert Path(best).name.startswith("epoch00")  # and it records the top-k callback's best, beside it


def test_ckpt_path_auto_starts_a_run_then_resumes_it_in_the_same_folder(run_cli, tmp_path, lightning_log):
    first = run_cli("fit", "--ckpt_path=auto", "--trainer.max_epochs=1")
    assert first.trainer.global_step == 3 and any("starting a new run" in m for m in lightning_log)
    second = run_cli("fit", "--ckpt_path=auto", "--trainer.max_epochs=2")
    assert second.trainer.global_step == 6  # went on from step 3
    assert any("Resuming" in m and "global step 3" in m for m in lightning_log)
    assert [p.name for p in (tmp_path / "logs" / "mnist").iterdir()] == ["version_0"]
    with pytest.raises(SystemExit):
        run_cli("test", "--ckpt_path=auto")


def test_ckpt_path_auto_of_a_torchrun_job_leaves_an_unrelated_run_alone(run_cli, tmp_path, monkeypatch, lightning_log):
    """A newer run in the same logs/ from another job (here: an ordinary fit) is not resumed; a restart of the job
    resumes its own run; another job (another run id) starts its own."""
    unrelated = run_cli("fit", "--trainer.max_epochs=1")  # started by hand, no --ckpt_path
    assert unrelated.trainer.global_step == 3
    # What torchrun puts in its workers' environment (one node, the default run id "none").
    for key, value in {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    job = run_cli("fit", "--ckpt_path=auto", "--trainer.max_epochs=1")
    assert Path(job.trainer.log_dir).name == "version_1" and job.trainer.global_step == 3
    assert any("version_0 was written by a process started by hand" in m for m in lightning_log)
    assert torch.load(Path(job.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)["job"].startswith(
        "torchrun-agent:"
    )
    restarted = run_cli("fit", "--ckpt_path=auto", "--trainer.max_epochs=2")  # same agent: the same job
    assert Path(restarted.trainer.log_dir).name == "version_1" and restarted.trainer.global_step == 6
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")  # torchrun --rdzv-id job-b: another job
    other = run_cli("fit", "--ckpt_path=auto", "--trainer.max_epochs=1")
    assert Path(other.trainer.log_dir).name == "version_2" and other.trainer.global_step == 3
    assert sorted(p.name for p in (tmp_path / "logs" / "mnist").iterdir()) == ["version_0", "version_1", "version_2"]


def test_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "good": True}, path)
    # A child process starts saving over it, is stopped half-way through writing, and is SIGKILLed there.
    code = (
        "import sys, time, torch\n"
        "from project.checkpointing import AtomicCheckpointIO\n"
        "def half_then_hang(obj, f):\n"
        "    f.write(b'PK' + b'x' * 1000); f.flush(); print('writing', flush=True); time.sleep(120)\n"
        "torch.save = half_then_hang\n"
        f"AtomicCheckpointIO().save_checkpoint({{'state_dict': {{}}}}, {str(path)!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait()
    assert load_checkpoint(path)["good"] is True


def test_non_finite_loss_stops_with_the_step_and_causes(run_cli, tmp_path):
    with pytest.raises(FloatingPointError, match=r"global step \d+.*learning rate") as info:
        run_cli("fit", "--model.optimizer.init_args.lr=1e12", "--trainer.max_epochs=5")
    assert "model.optimizer.init_args.lr" in str(info.value)
    for ckpt in (tmp_path / "logs").rglob("*.ckpt"):  # whatever was saved before the blow-up is finite
        state = load_checkpoint(ckpt)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values()), ckpt


def first_non_finite(tmp_path: Path, check_every: int) -> tuple[str, list[Path]]:
    """Train a net blown up by a huge learning rate with the loss read every ``check_every`` steps."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = MNISTClassifier(optimizer=lambda params: torch.optim.SGD(params, lr=1e12))
    folder = tmp_path / f"every_{check_every}"
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=folder, save_last=True, every_n_train_steps=3)
    trainer = L.Trainer(
        max_epochs=2,
        callbacks=[StopOnNonFiniteLoss(check_every_n_steps=check_every), checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    with pytest.raises(NonFiniteLoss) as info:
        trainer.fit(model, loader)
    return str(info.value), sorted(folder.glob("*.ckpt"))


def test_a_loss_read_later_names_the_same_first_bad_step_and_nothing_is_saved_after_it(tmp_path):
    """As on a GPU, where the losses are read every log_every_n_steps: the same step is named as when each loss is
    read before its backward pass, and the checkpoint due after it is refused, not written with NaN weights."""
    at_once, saved_at_once = first_non_finite(tmp_path, check_every=1)
    later, saved_later = first_non_finite(tmp_path, check_every=1000)
    assert at_once.split(" Likely")[0] == later.split(" Likely")[0], (at_once, later)
    for ckpt in saved_at_once + saved_later:
        state = load_checkpoint(ckpt)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values()), ckpt
    step = int(re.search(r"global step (\d+)", later).group(1))
    assert step < 3, f"the blow-up at step {step} comes before the first save: the save must be refused"
    assert saved_later == [], saved_later


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.optimizer.init_args.lr=0"], "model.optimizer.init_args.lr must be > 0"),
        (["--model.optimizer.init_args.lr=-0.1"], "model.optimizer.init_args.lr must be > 0"),
        (["--data.batch_size=0"], "data.batch_size must be at least 1"),
        (["--model.optimizer=torch.optim.NoSuchOptimizer"], "NoSuchOptimizer"),
        (["--model.scheduler=torch.optim.lr_scheduler.NoSuchLR"], "NoSuchLR"),
        (["--trainer.max_epohcs=3"], "max_epohcs"),
        (["--model.net.init_args.hiden=8"], "hiden"),
        (["--ckpt_path=nowhere/missing.ckpt"], "nowhere/missing.ckpt: no such file"),
        (["--ckpt_path=last"], "no <run>/checkpoints/last.ckpt"),
        (["--weights_only=false"], "weights_only=false is refused"),
    ],
)
def test_bad_configuration_fails_before_training_and_keeps_old_runs(
    run_cli, trained_ckpt, tmp_path, capsys, args, expected
):
    shutil.copytree(trained_ckpt.parents[3], tmp_path / "old")  # an earlier run: <save_dir>/mnist/version_0/...
    before = snapshot(tmp_path / "old")
    with pytest.raises(SystemExit) as info:
        run_cli("fit", *args)
    assert info.value.code != 0
    assert expected in capsys.readouterr().err
    assert snapshot(tmp_path / "old") == before
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("*.ckpt"))


def test_val_size_too_large_and_non_checkpoint_files(run_cli, tmp_path, capsys):
    with pytest.raises(MNISTDataError, match="val_size"):
        run_cli("fit", "--data.val_size=100000")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(os.urandom(256))
    with pytest.raises(SystemExit):
        run_cli("test", f"--ckpt_path={junk}")
    assert "not a readable PyTorch checkpoint" in capsys.readouterr().err
    (tmp_path / "folder.ckpt").mkdir()
    with pytest.raises(SystemExit):
        run_cli("test", f"--ckpt_path={tmp_path / 'folder.ckpt'}")
    assert "is a folder" in capsys.readouterr().err


class Payload:
    """Unpickling this runs a shell command: what an attacker would put in a shared checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_checkpoint(good: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of ``good`` whose hyperparameters unpickle to ``touch <marker>``; returns (checkpoint, marker)."""
    marker, evil = folder / "pwned", folder / "evil.ckpt"
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["hyper_parameters"]["surprise"] = Payload(marker)
    torch.save(checkpoint, evil)
    return evil, marker


@pytest.mark.parametrize("command", ["test", "predict", "validate", "fit"])
def test_checkpoint_with_a_pickle_payload_is_refused_and_never_runs(run_cli, trained_ckpt, tmp_path, capsys, command):
    evil, marker = evil_checkpoint(trained_ckpt, tmp_path)
    with pytest.raises(SystemExit):
        run_cli(command, f"--ckpt_path={evil}")
    assert "was refused" in capsys.readouterr().err
    assert not marker.exists()


def test_interrupt_during_a_save_finishes_the_write_then_interrupts(tmp_path, monkeypatch):
    """Ctrl-C inside torch.save would corrupt the zip writer and hide the interrupt: it waits for the write."""
    path = tmp_path / "last.ckpt"
    real_save = torch.save

    def save_then_signal(obj, f):
        os.kill(os.getpid(), signal.SIGINT)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", save_then_signal)
    # Python's own Ctrl-C handler, whatever the parent left (a background job ignores SIGINT); restored after.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}}, path)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.equal(load_checkpoint(path)["state_dict"]["w"], torch.ones(2))


class InterruptInValidation(L.Callback):
    """Ctrl-C while fit validates: trainer.training is False there, and the save must not depend on it."""

    def on_validation_batch_start(self, *args, **kwargs) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_during_validation_saves_last_too(run_cli, tmp_path, lightning_log):
    with pytest.raises(SystemExit):
        run_cli("fit", "--trainer.callbacks+=tests.test_checkpointing.InterruptInValidation")
    saved = list((tmp_path / "logs").rglob("last.ckpt"))
    assert len(saved) == 1 and load_checkpoint(saved[0])["global_step"] == 3
    assert any("Ctrl-C: stopped at epoch 0" in m for m in lightning_log)


class InterruptInTraining(L.Callback):
    """Ctrl-C at the third training step."""

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == 2:
            raise KeyboardInterrupt


class RememberTrainer(L.Callback):
    seen: list[L.Trainer] = []  # noqa: RUF012 (one test reads it back)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        RememberTrainer.seen.append(trainer)


def test_ctrl_c_says_how_to_resume_after_the_progress_bar_stops(run_cli, tmp_path):
    """A live progress bar's last redraw covered the "Resume with" line in a terminal."""
    import logging

    from lightning.pytorch.callbacks import RichProgressBar

    trainers = RememberTrainer.seen = []
    bar_live_at: dict[str, bool] = {}  # whether the progress bar was still live when the line was logged

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            bar = trainers[0].progress_bar_callback if trainers else None
            if "Resume with" in record.getMessage() and isinstance(bar, RichProgressBar):
                bar_live_at["resume"] = bar.progress is not None and bar.progress.live.is_started

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Watch(level=logging.INFO)
    logger.addHandler(handler)
    try:
        with pytest.raises(SystemExit):  # default.yaml's order: SaveOnInterrupt before RichProgressBar
            run_cli(
                "fit",
                "--trainer.callbacks+=tests.test_checkpointing.InterruptInTraining",
                "--trainer.callbacks+=tests.test_checkpointing.RememberTrainer",
            )
    finally:
        logger.removeHandler(handler)
    assert isinstance(trainers[0].progress_bar_callback, RichProgressBar)
    assert bar_live_at == {"resume": False}


class InterruptWhileSavingBest(L.Callback):
    """Ctrl-C at epoch 1 after ModelCheckpoint named its new best file and before it wrote it (the checkpoint's dict
    is being built then): the race that made a resumed fit's test of "best" fail with FileNotFoundError."""

    sent = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        best = trainer.checkpoint_callback.best_model_path
        if not InterruptWhileSavingBest.sent and trainer.current_epoch == 1 and best and not Path(best).exists():
            InterruptWhileSavingBest.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_while_a_new_best_is_saved_leaves_a_last_ckpt_naming_only_written_files(run_cli, tmp_path):
    # monitor=epoch: every epoch is a new best, so epoch 1 replaces epoch 0's file.
    options = ["--trainer.max_epochs=3", "--checkpoint.monitor=epoch"]
    InterruptWhileSavingBest.sent = False
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's pytest ignores SIGINT
    try:
        with pytest.raises(SystemExit):
            run_cli("fit", *options, "--trainer.callbacks+=tests.test_checkpointing.InterruptWhileSavingBest")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert InterruptWhileSavingBest.sent
    (last,) = (tmp_path / "logs").rglob("last.ckpt")
    (state,) = (s for s in load_checkpoint(last)["callbacks"].values() if s.get("monitor") == "epoch")
    assert all(Path(path).is_file() for path in state["best_k_models"])
    # ModelCheckpoint names epoch 1 before writing it: forgotten, and the next epoch saves a new best.
    assert state["best_model_path"] == "" and state["best_k_models"] == {}
    resumed = run_cli("fit", *options, "--ckpt_path=last", "--test_after_fit=true")
    assert resumed.trainer.current_epoch == 3 and "test/acc" in resumed.trainer.callback_metrics
    assert Path(resumed.trainer.checkpoint_callback.best_model_path).name.startswith("epoch02")
