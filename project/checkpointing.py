"""Checkpoints that survive: atomic writes, a save on SIGTERM / Ctrl-C, and safe, checked loading."""

import os
import pickle
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import UserError


class CheckpointError(UserError, ValueError):
    """A ``--ckpt_path`` that does not exist, is not a checkpoint, or carries more than tensors and plain data."""


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back until the block is done, then deliver them: a save is never cut in half.

    Nested blocks are fine: the inner one delivers to the outer one's handler, which delivers at its own end.
    """
    pending: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():  # only the main thread may swap handlers
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda received, _frame: pending.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for received in pending:  # a signal that arrived inside the block is delivered now
            signal.raise_signal(received)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file in the same folder, fsync it, then rename it into place.

    A rename within one filesystem is atomic: a process killed mid-write (SIGKILL, power loss) leaves the
    previous ``last.ckpt`` intact instead of a truncated one. SIGINT and SIGTERM are held back until the write
    is done: raised inside ``torch.save`` they would surface as a zip-writer error instead of the interrupt that
    ``SaveOnInterrupt`` handles.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with signals_held():
            try:
                with tmp.open("wb") as f:
                    torch.save(checkpoint, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)


class SaveOnInterrupt(L.Callback):
    """On SIGTERM or Ctrl-C during ``fit``, save ``last.ckpt`` in the run's checkpoint folder and say how to resume.

    SIGTERM (a scheduler's requeue or preemption, ``docker stop``, torchrun stopping its workers) stops every process
    of the run at the same training step: while it trains, the handler only notes the signal, and at the end of each
    training batch the processes agree (one all-reduce of that note) and stop together. Lightning's own handler
    (2.6.6) broadcasts from inside the signal handler and lets each process check its own flag at a different
    point, so two processes signalled at slightly different moments meet in different collectives and wait forever:
    2 of 6 SLURM requeues of a 2-task job hung that way before this. A SIGTERM during validation stops at the next
    training batch (or at the end of training).
    """

    def __init__(self) -> None:
        self._signalled = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._signalled = False
        if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
            return

        def note(signum: int, _frame: Any) -> None:
            launcher = trainer.strategy.launcher
            if not self._signalled and launcher is not None:  # processes Lightning started itself get it too
                launcher.kill(signum)
            self._signalled = True

        # Lightning's handler (set when fit started) comes back when the Trainer tears down at the end of fit.
        signal.signal(signal.SIGTERM, note)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._stop_together(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_together(trainer)  # a SIGTERM during the last validation has no next batch to stop at

    def _stop_together(self, trainer: L.Trainer) -> None:
        """Every process raises SIGTERMException here if any one of them was signalled (all reach this point)."""
        if trainer.strategy.reduce_boolean_decision(self._signalled, all=False):
            raise SIGTERMException

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            return
        what = "SIGTERM" if isinstance(exception, SIGTERMException) else "Ctrl-C"
        # A live progress bar redraws itself once more when it stops, over the last lines written below it, and it
        # may come after this callback: stop it first (RichProgressBar's on_exception; stopping twice is a no-op).
        if trainer.progress_bar_callback is not None:
            trainer.progress_bar_callback.on_exception(trainer, pl_module, exception)
        # During fit, also while it validates (trainer.training is False then): a Ctrl-C lands there often.
        if trainer.state.fn != TrainerFn.FITTING:  # test_after_fit, validate, test, predict: nothing to resume
            running = trainer.state.fn.value if trainer.state.fn else "it"
            rank_zero_info(f"\n{what}: stopped while running {running}; nothing was saved.")
            return
        callback = trainer.checkpoint_callback
        dirpath = callback.dirpath if isinstance(callback, ModelCheckpoint) else None
        folder = Path(dirpath) if dirpath else Path(trainer.default_root_dir)
        path = folder / "last.ckpt"
        for checkpointing in trainer.checkpoint_callbacks:
            if isinstance(checkpointing, ModelCheckpoint):
                forget_unwritten(checkpointing)
        trainer.save_checkpoint(path, weights_only=False)  # the whole state, to resume from
        rank_zero_info(
            f"\n{what}: stopped at epoch {trainer.current_epoch}, global step {trainer.global_step}. "
            f"Checkpoint saved to {path}.\n"
            "Resume with: python -m project fit <same --config options> --ckpt_path last"
        )


def forget_unwritten(callback: ModelCheckpoint) -> None:
    """Drop from ``callback``'s top-k the files an interrupted save named but never wrote.

    ``ModelCheckpoint`` records a new best before writing it: a Ctrl-C in between, saved as is, would leave a last.ckpt
    naming a missing best, and a resumed fit's test of "best" would fail. (SIGTERM is only noted until the batch ends.)
    """
    written = {path: score for path, score in callback.best_k_models.items() if Path(path).is_file()}
    if len(written) == len(callback.best_k_models):
        return
    callback.best_k_models = written
    # Fewer than save_top_k entries now: ModelCheckpoint saves the next result whatever kth_value says.
    best = min if callback.mode == "min" else max
    callback.best_model_path = best(written, key=written.__getitem__) if written else ""
    callback.best_model_score = written.get(callback.best_model_path)
    if callback.kth_best_model_path not in written:
        callback.kth_best_model_path = ""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load ``path`` with torch's safe unpickler (``weights_only=True``) and check it is a Lightning checkpoint.

    Raises:
        CheckpointError: naming the path, when it is missing, a folder, unreadable, not a checkpoint, or holds
            objects other than tensors and plain data (a pickle payload is refused, never executed).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"ckpt_path {path}: no such file. Give a .ckpt written by fit, or 'last' to resume.")
    if not path.is_file():
        raise CheckpointError(f"ckpt_path {path} is a folder: give the .ckpt file inside its checkpoints/ folder.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # The safe unpickler names the global (function or class) a payload asked for: that is a refusal.
        # Anything else is not a pickle at all: random bytes, another format.
        globals_ = [line.strip() for line in str(exc).splitlines() if "global" in line.lower()]
        if not globals_:
            raise CheckpointError(f"ckpt_path {path} is not a readable PyTorch checkpoint: {exc}") from exc
        raise CheckpointError(
            f"ckpt_path {path} was refused: it holds objects other than tensors and plain data, which could run "
            f"code when loaded ({globals_[0]}). Only load checkpoints you trust; this template never unpickles them."
        ) from exc
    except Exception as exc:  # truncated zip, random bytes, ...
        raise CheckpointError(f"ckpt_path {path} is not a readable PyTorch checkpoint: {exc}") from exc
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"ckpt_path {path} is not a Lightning checkpoint (it has no 'state_dict').")
    return checkpoint


def find_last_checkpoint(root: Path) -> Path | None:
    """The most recently written ``last.ckpt`` under ``root`` (e.g. ``logs/mnist``), or None."""
    candidates = last_checkpoints(root)
    return candidates[0] if candidates else None


def best_checkpoint(root: Path) -> Path | None:
    """The best checkpoint of the newest run under ``root`` (e.g. ``logs/mnist``), as its ``last.ckpt`` records it
    (ModelCheckpoint's ``best_model_path``, looked up beside it: the run folder may have moved); None without one.
    The recipe's ``last_checkpoint`` records ``last.ckpt`` itself as its "best": not a best of anything."""
    last = find_last_checkpoint(root)
    if last is None:
        return None
    for state in load_checkpoint(str(last)).get("callbacks", {}).values():
        best = state.get("best_model_path") if isinstance(state, dict) else None
        if best and Path(best).name != last.name and (last.parent / Path(best).name).is_file():
            return last.parent / Path(best).name
    return None


def last_checkpoints(root: Path) -> list[Path]:
    """Every ``<run>/checkpoints/last.ckpt`` under ``root``, the most recently written first."""
    candidates = [p for p in root.glob("*/checkpoints/last.ckpt") if p.is_file()]
    return sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True)


def job_identity() -> str | None:
    """Who launched this process as one job, the same in each of its processes and across its restarts.

    SLURM's job ID (kept when the job is requeued), torchrun's ``--rdzv-id``, or, under torchrun with its default
    run ID ("none") on one node, the torchrun agent on this host (the parent of every worker it restarts: its PID
    and start time). None for a process started by hand, and on several nodes without ``--rdzv-id``.
    """
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm:{os.environ['SLURM_JOB_ID']}"
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchrun:{run_id}"
    if run_id == "none" and os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE"):
        agent = os.getppid()
        try:  # field 22 of /proc/<pid>/stat: its start time, so that a reused PID is another agent
            started = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            started = "?"
        return f"torchrun-agent:{socket.gethostname()}:{agent}:{started}"
    return None


class JobIdentity(L.Callback):
    """Record ``job_identity()`` in every checkpoint (``checkpoint["job"]``): ``--ckpt_path auto`` resumes only a
    run of the same job, never an unrelated run that happens to be the newest in the same ``logs/``."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["job"] = job_identity()


class RandomState(L.Callback):
    """Keep torch's random state in every checkpoint (``checkpoint["rng_states"]``) and restore it on resume.

    Lightning does not keep it; without it a resumed run draws other shuffles and augmentations than an uninterrupted
    one. On a checkpoint loaded for evaluation nothing is restored: its random state is not the evaluation's.
    """

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng_states"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        states = checkpoint.get("rng_states", {})
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states["cuda"])


def load_weights(module: torch.nn.Module, path: str) -> None:
    """Start ``module`` from the weights of the checkpoint ``path`` (fine-tuning), through the safe loader.

    Raises:
        CheckpointError: naming ``path``, when it is not a safe checkpoint or its weights do not fit ``module``.
    """
    try:
        module.load_state_dict(load_checkpoint(path)["state_dict"])
    except RuntimeError as exc:
        raise CheckpointError(
            f"model.init_from {path}: its weights do not fit this network ({str(exc).splitlines()[0]}). "
            "Use the same model.net settings as the run that wrote it."
        ) from exc
    rank_zero_info(f"Starting from the weights of {path} (a new run: fresh optimizer and schedule).")


class NonFiniteLoss(UserError, FloatingPointError):
    """The training loss became NaN or inf: the message names the step and the likely causes."""


class StopOnNonFiniteLoss(L.Callback):
    """Stop ``fit`` at a NaN/inf training loss, naming its step, and never save a checkpoint after one.

    On a CPU each loss is read before its backward pass: no weight ever becomes NaN. On a GPU reading a loss waits
    for the device, so the losses are kept there and read together every ``check_every_n_steps`` steps, at the end
    of training and before every checkpoint save (the error names the first bad step all the same).

    Args:
        check_every_n_steps: Read the losses every this many steps; ``None``: 1 on a CPU, else the Trainer's
            ``log_every_n_steps`` (when the loggers wait for the device anyway).
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        self.check_every_n_steps = check_every_n_steps
        self.batch_idx = 0
        self.losses: list[torch.Tensor] = []  # detached, on their device, not read yet
        self.steps: list[tuple[int, int, int]] = []  # (global step, epoch, batch) of each

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.batch_idx = idx

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach())
        self.steps.append((trainer.global_step, trainer.current_epoch, self.batch_idx))
        logged = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning, declared nowhere
        every = self.check_every_n_steps or (1 if loss.device.type == "cpu" else logged)
        if len(self.losses) >= max(1, every):
            self.check()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.check()  # before the file is written: weights after a bad loss are never saved

    def check(self) -> None:
        """Read the kept losses (one wait for the device); raise ``NonFiniteLoss`` at the first that is not finite."""
        if not self.losses:
            return
        values = torch.stack(self.losses).float().cpu()
        steps, self.losses, self.steps = self.steps, [], []
        bad = (~torch.isfinite(values)).nonzero()
        if len(bad) == 0:
            return
        first = int(bad[0])
        step, epoch, batch = steps[first]
        raise NonFiniteLoss(
            f"train/loss is {values[first].item()} at global step {step} (epoch {epoch}, batch {batch}). Likely "
            "causes: a learning rate too high (model.optimizer.init_args.lr), no gradient clipping "
            "(trainer.gradient_clip_val), or bad input data (NaN/inf pixels or labels out of range). Training "
            "stopped; no checkpoint was written after that step."
        )
