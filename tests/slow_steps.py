"""Test helpers that torchrun's worker processes load by class path: slow steps to kill a run in, a hanging save."""

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from project.checkpointing import AtomicCheckpointIO


class SlowSteps(L.Callback):
    """Sleep after each training step and record ``<pid> <global step>`` in ``folder/rank<r>.txt``.

    Args:
        folder: Where each rank writes its progress file.
        seconds: Sleep per step, so that a test can kill a worker in the middle of a run of a few dozen steps.
    """

    def __init__(self, folder: str, seconds: float = 0.1) -> None:
        self.folder, self.seconds = Path(folder), seconds

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        progress = self.folder / f"rank{trainer.global_rank}.txt"
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()} {trainer.global_step}\n")
        tmp.replace(progress)
        time.sleep(self.seconds)


class HangingCheckpointIO(AtomicCheckpointIO):
    """``AtomicCheckpointIO`` whose second save writes half a file, says so in ``<dir>/writing``, and hangs there.

    Args:
        after: Saves that complete before the one that hangs.
    """

    def __init__(self, after: int = 1) -> None:
        self.after, self.saves = after, 0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.saves += 1
        if self.saves <= self.after:
            return super().save_checkpoint(checkpoint, path, storage_options)
        real_save = torch.save

        def half_then_hang(obj: Any, f: Any) -> None:
            f.write(b"PK" + b"x" * 1000)
            f.flush()
            (Path(path).parent / "writing").write_text(str(os.getpid()))
            time.sleep(300)

        torch.save = half_then_hang
        try:
            super().save_checkpoint(checkpoint, path, storage_options)
        finally:
            torch.save = real_save
