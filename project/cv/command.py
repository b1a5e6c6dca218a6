"""The ``cv`` command: K fits of one config, fold i validating on the i-th of K stratified parts of the data.

    python -m project cv --folds 5 [--test] [fit options]

Fold i is ``fit --kfold project.cv.folds.KFold --kfold.num_folds K --kfold.fold i`` (``folds.py``: the
DataModule's training set in K stratified, seeded, disjoint parts, validating on part i; the test set stays
untouched), a run of its own in ``<save_dir>/<name>/cv_<n>/fold_<i>/``. At the end a table, and
``cv_<n>/summary.json``: each fold's best ``val/acc`` with its ``val/loss`` (and, with ``--test``, the test accuracy
of the fold's best checkpoint), their mean and standard deviation. The same command again continues the
cross-validation it started: finished folds are kept, an interrupted one resumes from its ``last.ckpt``.

On a scheduler the folds run side by side, one job each (a job array): ``--fold i`` runs fold i
alone and ``--summarize`` writes the summary of the finished folds; the same options find the same ``cv_<n>``.
"""

import argparse
import fcntl
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from project.cv.folds import KFold
from project.writer import numbered

# What a fold reports: its best epoch's validation metrics, and the test metric of its best checkpoint.
VAL_ACC, VAL_LOSS, TEST_ACC = "val/acc", "val/loss", "test/acc"


def build_parser() -> argparse.ArgumentParser:
    """cv's own options; everything else on the command line is a ``fit`` option."""
    parser = argparse.ArgumentParser(
        prog="python -m project cv", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folds", type=int, required=True, help="K: the number of folds, at least 2")
    parser.add_argument(
        "--test",
        action="store_true",
        help="also test each fold's best checkpoint on the test set (default: %(default)s)",
    )
    alone = parser.add_mutually_exclusive_group()
    alone.add_argument("--fold", type=int, help="run only this fold (0 to K-1), e.g. one per job of an array")
    alone.add_argument(
        "--summarize", action="store_true", help="run no fold: summarize the finished ones (default: %(default)s)"
    )
    return parser


def cv_folder(root: Path, command: dict[str, Any]) -> Path:
    """The unfinished ``root/cv_<n>`` this same command started (to continue it), else the next free ``cv_<n>``."""

    def unfinished(folder: Path) -> bool:
        started = folder / "cv.json"
        same = started.is_file() and json.loads(started.read_text()) == command
        return same and not (folder / "summary.json").exists()

    return next(folder for folder in numbered(root, "cv_") if not folder.exists() or unfinished(folder))


class FoldHistory(L.Callback):
    """Each validated epoch's ``val/acc`` and ``val/loss``, kept in the fold's checkpoints: a fold resumed after a
    kill still reports the epochs before it."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logged = trainer.callback_metrics
        if not trainer.sanity_checking and VAL_ACC in logged:
            kept = [e for e in self.epochs if e["epoch"] != trainer.current_epoch]  # an epoch validated again
            scores = {key: float(logged[key]) for key in (VAL_ACC, VAL_LOSS) if key in logged}
            self.epochs = [*kept, {"epoch": trainer.current_epoch, **scores}]

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = list(state_dict["epochs"])


def fold_result(cli: Any, fold: int, history: FoldHistory, seconds: float) -> dict[str, Any]:
    """What one finished fold reports: its best epoch (by ``val/acc``), its best checkpoint and, if run, its test."""
    if not history.epochs:
        raise RuntimeError(f"fold {fold} logged no {VAL_ACC}: did it validate (trainer.limit_val_batches > 0)?")
    best = max(history.epochs, key=lambda e: e[VAL_ACC])
    checkpoint = cli.trainer.checkpoint_callback
    result: dict[str, Any] = {"fold": fold, **best, "epochs": len(history.epochs), "seconds": round(seconds, 1)}
    result["checkpoint"] = checkpoint.best_model_path if checkpoint is not None else ""
    if TEST_ACC in cli.trainer.callback_metrics:
        result[TEST_ACC] = float(cli.trainer.callback_metrics[TEST_ACC])
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The folds' results with the mean and the (sample) standard deviation of each metric."""
    summary: dict[str, Any] = {"folds": results}
    for key in (VAL_ACC, VAL_LOSS, TEST_ACC):
        values = [r[key] for r in results if key in r]
        if len(values) == len(results):
            summary[key] = {"mean": statistics.mean(values), "std": statistics.stdev(values)}
    return summary


def table(summary: dict[str, Any]) -> str:
    """The folds as rows, then mean ± std."""
    keys = [k for k in (VAL_ACC, VAL_LOSS, TEST_ACC) if k in summary]
    lines = ["fold | " + " | ".join(f"{k:>8}" for k in keys) + " | epochs | best checkpoint"]
    for r in summary["folds"]:
        values = " | ".join(f"{r[k]:8.4f}" for k in keys)
        lines.append(f"{r['fold']:4} | {values} | {r['epochs']:6} | {r['checkpoint']}")
    lines.append("mean | " + " | ".join(f"{summary[k]['mean']:8.4f}" for k in keys))
    lines.append(" std | " + " | ".join(f"{summary[k]['std']:8.4f}" for k in keys))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (or continue) the cross-validation; return its summary."""
    parser = build_parser()
    args, fit_args = parser.parse_known_args(argv)
    if args.folds < 2:
        parser.error(f"--folds {args.folds}: a cross-validation needs at least 2 folds.")
    if args.fold is not None and not 0 <= args.fold < args.folds:
        parser.error(f"--fold {args.fold}: the folds of --folds {args.folds} are 0 to {args.folds - 1}.")
    taken = [a for a in fit_args if a.split("=", 1)[0].split(".")[0] in ("--kfold", "--ckpt_path")]
    if taken:
        parser.error(f"{', '.join(taken)}: cv sets the folds and resumes its own folds; leave them out.")
    from project.cli import run
    from project.errors import UserError

    def folds(fold: int) -> list[str]:  # fit's options that make it fold `fold`
        kfold = f"--kfold={KFold.__module__}.{KFold.__name__}"
        return [
            kfold,
            f"--kfold.num_folds={args.folds}",
            f"--kfold.fold={fold}",
            f"--test_after_fit={str(args.test).lower()}",
        ]

    # Every option checked and the first fold's split made before any training: a bad value or too few images of
    # a class is one error now, not after K-1 fits.
    probe = run([*fit_args, *folds(0)], subcommand=False)
    board = probe.trainer.loggers[0] if probe.trainer.loggers else None
    if not isinstance(board, TensorBoardLogger):
        parser.error("cv keeps each fold as a TensorBoard run: trainer.logger must be (or start with) one.")
    try:
        probe.datamodule.setup("fit")
        KFold(args.folds, 0).split(probe.datamodule)
    except UserError as exc:
        parser.error(str(exc))
    root, name = Path(board.save_dir), board.name
    del probe

    command = {"folds": args.folds, "test": args.test, "fit": fit_args}
    if args.summarize:  # the folds ran elsewhere (an array of jobs): their folder must be there, all of them done
        folder = cv_folder(root / name, command)
        missing = [f for f in range(args.folds) if not (folder / f"fold_{f}" / "result.json").is_file()]
        if missing:
            parser.error(f"--summarize: fold(s) {missing} of {folder} have no result.json yet: run them first.")
    else:
        (root / name).mkdir(parents=True, exist_ok=True)
        # Folds started at once (an array of jobs) pick the folder one at a time: each finds the one the first made.
        with open(root / name / ".cv.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            folder = cv_folder(root / name, command)
            folder.mkdir(exist_ok=True)
            (folder / "cv.json").write_text(json.dumps(command, indent=2) + "\n")
    results = []
    for fold in range(args.folds) if args.fold is None else [args.fold]:
        done = folder / f"fold_{fold}" / "result.json"
        if done.is_file():
            print(f"cv: fold {fold} of {args.folds} finished before: {done}")
            results.append(json.loads(done.read_text()))
            continue
        fit = ["fit", *fit_args, *folds(fold)]
        last = folder / f"fold_{fold}" / "checkpoints" / "last.ckpt"
        if last.is_file():
            print(f"cv: fold {fold} of {args.folds} was interrupted: resuming it from {last}")
            fit.append(f"--ckpt_path={last}")
        else:
            print(f"cv: fold {fold} of {args.folds}")
        history, start = FoldHistory(), time.perf_counter()
        cli = run(fit, callbacks=[history], run_folder=(f"{name}/{folder.name}", f"fold_{fold}"))
        result = fold_result(cli, fold, history, time.perf_counter() - start)
        done.write_text(json.dumps(result, indent=2) + "\n")
        results.append(result)
        del cli
    if args.fold is not None:  # the other folds run elsewhere; --summarize once they are all done
        print(f"cv: fold {args.fold} of {args.folds}: {folder / f'fold_{args.fold}' / 'result.json'}")
        return {"command": command, "folds": results}
    summary = {"command": command, **summarize(results)}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table(summary))
    print(f"cv: {folder / 'summary.json'}")
    return summary
