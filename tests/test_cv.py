"""k-fold cross-validation: the `kfold` key's folds, the `cv` command, its errors, its restart after kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from project.__main__ import cli_main
from project.cv.folds import KFold
from project.data import MNISTDataModule
from project.errors import DataError
from project.mnist_files import load_split
from tests.conftest import ROOT, small_run


def test_the_folds_are_stratified_seeded_disjoint_and_cover_the_training_split(mnist_dir):
    labels = load_split(mnist_dir / "MNIST" / "raw", "train")[1]
    parts = []
    for fold in range(5):
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=64)
        dm.setup("fit")
        KFold(5, fold).split(dm)
        train, val = dm.splits["train"].indices, dm.splits["val"].indices
        assert not set(train) & set(val) and len(train) + len(val) == len(labels)
        parts.append(val)
    every = [i for part in parts for i in part]
    assert sorted(every) == list(range(len(labels)))  # disjoint, and every image validates once
    for cls in labels.unique():
        per_fold = [int((labels[part] == cls).sum()) for part in parts]
        assert max(per_fold) - min(per_fold) <= 1, (int(cls), per_fold)
    again = MNISTDataModule(data_dir=str(mnist_dir), val_size=64)
    other = MNISTDataModule(data_dir=str(mnist_dir), val_size=64, seed=7)
    for dm in (again, other):
        dm.setup("fit")
        KFold(5, 2).split(dm)
    assert again.splits["val"].indices == parts[2] != other.splits["val"].indices
    dm.setup("test")
    assert len(dm.splits["test"]) == len(load_split(mnist_dir / "MNIST" / "raw", "t10k")[1])  # untouched


def test_cv_runs_every_fold_and_summarises_them(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    summary = cli_main(["cv", "--folds", "3", "--test", *small_run(mnist_dir, tmp_path / "logs")])
    folder = tmp_path / "logs" / "mnist" / "cv_0"
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert [r["fold"] for r in summary["folds"]] == [0, 1, 2]
    accs = [r["val/acc"] for r in summary["folds"]]
    assert summary["val/acc"]["mean"] == pytest.approx(sum(accs) / 3)
    assert summary["val/acc"]["std"] == pytest.approx(torch.tensor(accs).std().item())
    assert {"val/loss", "test/acc"} <= set(summary)
    for r in summary["folds"]:
        run = folder / f"fold_{r['fold']}"
        assert Path(r["checkpoint"]).parent == run / "checkpoints" and Path(r["checkpoint"]).is_file()
        config = (run / "config.yaml").read_text()
        assert "num_folds: 3" in config and f"fold: {r['fold']}" in config
    table = capsys.readouterr().out
    assert "mean |" in table and " std |" in table and "test/acc" in table
    # The same command once the cross-validation is complete: a new one, beside it.
    cli_main(["cv", "--folds", "2", *small_run(mnist_dir, tmp_path / "logs")])
    assert (tmp_path / "logs" / "mnist" / "cv_1" / "summary.json").is_file()


def test_folds_run_one_at_a_time_and_summarize_into_the_same_summary(mnist_dir, tmp_path, monkeypatch, capsys):
    """What a job array does: `cv --fold i` per job, then `cv --summarize`."""
    monkeypatch.chdir(tmp_path)
    command = ["cv", "--folds", "2", *small_run(mnist_dir, tmp_path / "logs")]
    one = cli_main([*command, "--fold", "1"])
    folder = tmp_path / "logs" / "mnist" / "cv_0"
    assert [r["fold"] for r in one["folds"]] == [1] and not (folder / "fold_0").exists()
    with pytest.raises(SystemExit):  # fold 0 has not run: nothing to summarize yet
        cli_main([*command, "--summarize"])
    assert "--summarize: fold(s) [0] of" in capsys.readouterr().err
    cli_main([*command, "--fold", "0"])
    summary = cli_main([*command, "--summarize"])
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert [r["fold"] for r in summary["folds"]] == [0, 1] and "mean" in summary["val/acc"]
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.startswith(".")) == ["cv_0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--folds", "1"], "--folds 1: a cross-validation needs at least 2 folds"),
        (["--folds", "3", "--kfold.fold=1"], "--kfold.fold=1: cv sets the folds"),
        (["--folds", "3", "--data.batch_size=0"], "data.batch_size must be at least 1"),
        (["--folds", "3", "--fold", "3"], "--fold 3: the folds of --folds 3 are 0 to 2"),
        (["--folds", "3", "--summarize"], "--summarize: fold(s) [0, 1, 2] of"),
    ],
)
def test_cv_refuses_bad_input_before_any_training(mnist_dir, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli_main(["cv", *small_run(mnist_dir, tmp_path / "logs"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()  # no fold started


def test_a_fold_that_does_not_exist_is_one_clear_error(run_cli, capsys):
    with pytest.raises(SystemExit):
        run_cli("fit", "--kfold=project.cv.folds.KFold", "--kfold.num_folds=3", "--kfold.fold=3")
    assert "kfold.num_folds=3, kfold.fold=3: num_folds must be at least 2, and fold from 0 to num_folds - 1" in (
        capsys.readouterr().err
    )


def test_one_fold_is_a_plain_fit_with_the_kfold_key_and_its_config_names_the_fold(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kfold = ["--kfold=project.cv.folds.KFold", "--kfold.num_folds=4", "--kfold.fold=1"]
    cli = cli_main(["fit", *small_run(mnist_dir, tmp_path / "logs"), *kfold])
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=64)
    dm.setup("fit")
    KFold(4, 1).split(dm)
    assert cli.datamodule.splits["val"].indices == dm.splits["val"].indices
    assert abs(len(dm.splits["val"]) - len(dm.train_labels) / 4) <= 10  # each of the 10 classes: at most one off
    config = (Path(cli.trainer.log_dir) / "config.yaml").read_text()
    assert "num_folds: 4" in config and "fold: 1" in config


class NoSplit(MNISTDataModule):
    """A DataModule of yours without the hook."""

    split_labels = None  # type: ignore[assignment]


def test_a_datamodule_that_cannot_take_a_split_is_named(mnist_dir):
    dm = NoSplit(data_dir=str(mnist_dir), val_size=64)
    dm.setup("fit")
    with pytest.raises(DataError, match=r"kfold: NoSplit cannot take a split: give it split_labels\(\) and use_split"):
        KFold(3, 0).split(dm)


def test_more_folds_than_images_of_a_class_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from tests.conftest import synthetic_digits, write_idx

    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images, labels = synthetic_digits(200, 0)
    labels[labels == 3] = 4
    labels[:2] = 3  # class 3: two images
    for prefix in ("train", "t10k"):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli_main(["cv", "--folds", "3", *small_run(tmp_path / "data", tmp_path / "logs")])
    err = capsys.readouterr().err
    assert "kfold.num_folds=3 needs at least 3 images of every class" in err and "'3 - three' has 2" in err
    assert not (tmp_path / "logs").exists()


# >>> folder
def test_folds_of_a_folder_are_stratified_and_disjoint_and_val_is_then_the_test_split(tmp_path):
    from project.folder.data import ImageFolderDataModule
    from tests.conftest import write_classes

    root = write_classes(tmp_path / "a", per_class=10)
    parts = []
    for fold in range(3):
        dm = ImageFolderDataModule(root=str(root))
        dm.setup("fit")
        KFold(3, fold).split(dm)
        train, val = dm.splits["train"].indices, dm.splits["val"].indices
        assert not set(train) & set(val) and len(train) + len(val) == 30
        labels = dm.splits["val"].dataset.labels[val]
        assert torch.bincount(labels, minlength=3).tolist() in ([3, 3, 4], [3, 4, 3], [4, 3, 3])
        assert dm.splits["test"] is dm.splits["val"]  # no val/ folder: the fold's validation images test
        parts += val
    assert sorted(parts) == list(range(30))
    given = tmp_path / "b"
    write_classes(given / "train", per_class=10)
    write_classes(given / "val", per_class=4, seed=5)
    dm = ImageFolderDataModule(root=str(given))
    dm.setup("fit")
    KFold(5, 4).split(dm)
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (24, 6, 12)
    few = ImageFolderDataModule(root=str(write_classes(tmp_path / "c", per_class=2)))
    few.setup("fit")
    with pytest.raises(DataError, match=r"kfold.num_folds=3 needs at least 3 images of every class.*'cat' has 2"):
        KFold(3, 0).split(few)


# <<< folder


@pytest.mark.slow  # a process killed mid-fold, then the same command again: ~40 s
def test_cv_killed_in_fold_3_resumes_it_and_reruns_no_finished_fold(mnist_dir, tmp_path, monkeypatch, capsys):
    progress = tmp_path / "progress"
    args = [
        "cv",
        "--folds",
        "5",
        *small_run(mnist_dir, tmp_path / "logs"),
        "--trainer.max_epochs=3",
        "--trainer.callbacks+=tests.slow_steps.SlowSteps",
        f"--trainer.callbacks.folder={progress}",
        "--trainer.callbacks.seconds=0.3",
    ]
    folder = tmp_path / "logs" / "mnist" / "cv_0"
    last = folder / "fold_2" / "checkpoints" / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "project", *args], cwd=tmp_path, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not last.is_file():  # fold 3 (fold_2) has finished its first epoch: kill it in its second
            assert proc.poll() is None and time.monotonic() < deadline, "cv ended before fold 3 saved a checkpoint"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not (folder / "fold_2" / "result.json").exists() and not (folder / "summary.json").exists()
    finished = {f: (folder / f"fold_{f}" / "result.json").stat().st_mtime_ns for f in (0, 1)}
    interrupted_epoch = torch.load(last, weights_only=True)["epoch"]

    monkeypatch.chdir(tmp_path)
    summary = cli_main(args)
    out = capsys.readouterr().out
    assert "fold 0 of 5 finished before" in out and "fold 1 of 5 finished before" in out
    assert f"fold 2 of 5 was interrupted: resuming it from {last}" in out
    assert {f: (folder / f"fold_{f}" / "result.json").stat().st_mtime_ns for f in (0, 1)} == finished
    assert [r["fold"] for r in summary["folds"]] == [0, 1, 2, 3, 4]
    resumed = summary["folds"][2]
    assert resumed["epochs"] == 3  # the epochs before the kill (kept in the checkpoint) and those after
    assert interrupted_epoch < 3 and not (tmp_path / "logs" / "mnist" / "cv_1").exists()
