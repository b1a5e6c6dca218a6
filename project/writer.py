"""Write ``predict`` results to a CSV file: one row per input, with every class probability."""

import csv
import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from project.hooks import NamesPredictInputs
from project.inputs import datamodule_of


def numbered(folder: Path, prefix: str) -> Iterator[Path]:
    """``folder/<prefix>0``, ``folder/<prefix>1``, ...: the names of runs of one kind (``eval/test_``, ``cv_``)."""
    return (folder / f"{prefix}{n}" for n in itertools.count())


def first_free(candidates: Iterable[Path]) -> Path:
    """The first of ``candidates`` that nothing is at: what the template writes never replaces a file or folder."""
    return next(path for path in candidates if not path.exists())


def free_path(path: Path) -> Path:
    """``path`` if nothing is there, else the first free ``stem-1.suffix``, ``stem-2.suffix``, ..."""
    others = (path.with_name(f"{path.stem}-{n}{path.suffix}") for n in itertools.count(1))
    return first_free(itertools.chain([path], others))


class CSVPredictionWriter(BasePredictionWriter):
    """Collect ``predict_step`` outputs and write them, on global rank 0, to one CSV file.

    Columns: ``index`` (position in the predicted split) and ``label`` when the data is labelled, or ``path`` for
    images from ``data.predict_dir``; then ``pred``, ``pred_name`` (when the model knows its class names), ``prob`` (of
    ``pred``), ``prob_0`` ... ``prob_{C-1}``, and
    ``error``, which names why an image file was skipped.

    Args:
        output: The CSV file to write; a relative path is taken inside the run's folder (``trainer.log_dir``: for
            ``predict --ckpt_path <run>/checkpoints/x.ckpt`` that is ``<run>/eval/predict_<n>/``).
        overwrite: Replace an existing ``output``; when false, an existing file is kept and the results go to the
            first free ``<stem>-N.csv`` beside it.
    """

    def __init__(self, output: str = "predictions.csv", overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.overwrite = overwrite
        self.rows: list[dict[str, Any]] = []
        self.written: Path | None = None  # where the last predict run wrote

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.rows = []

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: dict[str, torch.Tensor],
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        probs = prediction["probs"].float().cpu()  # (B, C)
        preds = prediction["preds"].cpu()  # (B,)
        labels = batch[1].cpu().tolist() if isinstance(batch, (tuple, list)) else None
        datamodule = datamodule_of(trainer)
        files = datamodule.predict_files if isinstance(datamodule, NamesPredictInputs) else None
        indices = batch_indices if batch_indices is not None else [None] * len(preds)
        names = pl_module.hparams.get("class_names")
        for i, index in enumerate(indices):
            row: dict[str, Any] = {"path": str(files[index])} if files else {"index": index}
            if labels is not None:
                row["label"] = labels[i]
            row["pred"] = int(preds[i])
            if names:
                row["pred_name"] = names[int(preds[i])]
            row["prob"] = round(float(probs[i, preds[i]]), 6)
            row.update({f"prob_{c}": round(float(p), 6) for c, p in enumerate(probs[i].tolist())})
            self.rows.append(row)

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows = self.rows
        if dist.is_available() and dist.is_initialized():  # one file for all ranks, written by rank 0
            gathered: list[list[dict[str, Any]] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            # The distributed sampler pads the last batches with repeats: keep each input once.
            unique = {(r.get("index"), r.get("path")): r for part in gathered for r in part or []}
            rows = list(unique.values())
        if trainer.global_rank != 0:
            return
        rows.sort(key=lambda r: (r.get("index") is None, r.get("index") or 0, r.get("path", "")))
        datamodule = datamodule_of(trainer)
        failures: list[tuple[Path, str]] = []  # the files that could not be read, with why
        if isinstance(datamodule, NamesPredictInputs):
            failures = list(datamodule.predict_failures)
        rows += [{"path": str(path), "error": reason} for path, reason in failures]
        output = self.output
        if not output.is_absolute() and trainer.log_dir is not None:
            output = Path(trainer.log_dir) / output
        self.written = output if self.overwrite else free_path(output)
        self.written.parent.mkdir(parents=True, exist_ok=True)
        columns: list[str] = []
        for row in rows:
            columns += [key for key in row if key not in columns]
        columns = [c for c in columns if c != "error"] + ["error"]
        with self.written.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        skipped = f", {len(failures)} file(s) skipped (see the error column)" if failures else ""
        rank_zero_info(f"Wrote {len(rows) - len(failures)} predictions to {self.written}{skipped}.")
