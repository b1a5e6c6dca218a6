"""Training on one's own image folders: classes from folder names, seeded split, clear errors."""

import csv
from pathlib import Path

import pytest
import torch

from project.__main__ import cli_main
from project.folder.data import FileDataset, FolderDataError, ImageFolderDataModule
from tests.conftest import CLASSES, ROOT, new_images, predict_folder, write_classes


def fit_args(root: Path, logs: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config",
        str(ROOT / "configs" / "folder.yaml"),
        f"--data.root={root}",
        "--data.batch_size=16",
        f"--trainer.logger.init_args.save_dir={logs}",
        "--trainer.max_epochs=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_model_summary=false",
        "--test_after_fit=false",
        *extra,
    ]


def test_fit_takes_the_classes_from_the_folders_and_predict_names_them(tmp_path):
    root = write_classes(tmp_path / "my_data")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    cli = cli_main(fit_args(root, tmp_path / "logs"))
    dm = cli.datamodule
    assert dm.class_names == CLASSES and dm.num_classes == 3
    assert cli.model.net.classifier[-1].out_features == 3
    assert [p.name for p, _ in dm.skipped] == ["broken.png"]  # named, skipped, counted
    assert len(dm.splits["train"]) + len(dm.splits["val"]) == 3 * 24
    x, y = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.max() < 3
    assert cli.model.example_input_array.shape == (1, 1, 28, 28)  # the model summary's, from the contract
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    saved = torch.load(ckpt, weights_only=True)
    assert saved["hyper_parameters"]["class_names"] == CLASSES

    predict = cli_main(
        [
            "predict",
            "--config",
            str(ROOT / "configs" / "folder.yaml"),
            f"--data.root={root}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
            f"--ckpt_path={ckpt}",
        ]
    )
    with (Path(predict.trainer.log_dir) / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["pred_name"] == CLASSES[int(r["pred"])] for r in rows)


def test_a_folder_model_predicts_new_images_with_its_class_names_into_its_run(tmp_path):
    """predict --config configs/folder.yaml --data.root R --data.predict_dir D --ckpt_path CK: one row per file, the
    checkpoint's class names and normalisation, the CSV in the checkpoint's run."""
    from project.images import prepare_resized
    from project.module import MNISTClassifier

    root = write_classes(tmp_path / "my_data")
    fit = cli_main(fit_args(root, tmp_path / "logs"))
    ckpt = Path(fit.trainer.checkpoint_callback.best_model_path)
    new = new_images(root, tmp_path / "new_images", per_class=2)
    (new / "notes.txt").write_text("not an image")
    predict, rows = predict_folder(root, new, tmp_path / "logs", ckpt)
    assert (
        Path(predict.trainer.log_dir) / "predictions.csv" == ckpt.parents[1] / "eval" / "predict_0" / "predictions.csv"
    )
    decoded = [r for r in rows if r["pred"]]
    assert [Path(r["path"]).name for r in decoded] == sorted(p.name for p in new.iterdir() if p.suffix != ".txt")
    assert any(Path(r["path"]).name == "notes.txt" for r in rows if r not in decoded)  # named, not predicted
    # Each answer is the checkpoint's model on the file prepared as in training, with the checkpoint's mean/std.
    model = MNISTClassifier.load_from_checkpoint(ckpt, weights_only=True).eval()
    state = torch.load(ckpt, weights_only=True)["input"]  # the input contract: project.inputs
    assert (state["size"], state["channels"], state["preparation"]) == (28, 1, "resize")
    mean, std = torch.tensor(state["mean"]).view(1, -1, 1, 1), torch.tensor(state["std"]).view(1, -1, 1, 1)
    x = torch.stack([prepare_resized(Path(r["path"]), 28, 1) for r in decoded]).float().div(255)
    with torch.no_grad():
        expected = model((x - mean) / std).argmax(dim=1).tolist()
    assert [int(r["pred"]) for r in decoded] == expected
    assert all(r["pred_name"] == CLASSES[int(r["pred"])] for r in decoded)


def test_predict_of_a_folder_model_needs_only_its_checkpoint_and_the_new_images(rgb_folder_ckpt, tmp_path):
    """No --data.root, or a root of other classes (other names, fewer of them): the checkpoint's class names, size
    and normalisation all the same, and no training image is read."""
    ckpt, root = rgb_folder_ckpt
    new = new_images(root, tmp_path / "new", per_class=2)
    _, expected = predict_folder(root, new, tmp_path / "logs", ckpt)
    assert {r["pred_name"] for r in expected} <= set(CLASSES) and len(expected) == 6
    other = write_classes(tmp_path / "other", per_class=2, classes=["x", "y", "z"])
    fewer = write_classes(tmp_path / "fewer", per_class=2, classes=["p", "q"])
    for given in (None, other, fewer):
        cli, rows = predict_folder(given, new, tmp_path / "logs", ckpt)
        assert [(r["path"], r["pred_name"]) for r in rows] == [(r["path"], r["pred_name"]) for r in expected]
        assert set(cli.datamodule.splits) == {"predict"}, "the training images were decoded"


def test_the_split_is_seeded_and_train_val_folders_are_used_as_given(tmp_path):
    root = write_classes(tmp_path / "a", per_class=10)
    one, two, other = (ImageFolderDataModule(root=str(root), seed=s) for s in (1, 1, 2))
    for dm in (one, two, other):
        dm.setup("fit")
    assert one.splits["val"].indices == two.splits["val"].indices != other.splits["val"].indices
    given = tmp_path / "b"
    write_classes(given / "train", per_class=10)
    write_classes(given / "val", per_class=4, seed=5)
    dm = ImageFolderDataModule(root=str(given))
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"])) == (30, 12)


def test_rgb_and_the_file_path_when_the_images_do_not_fit(tmp_path):
    root = write_classes(tmp_path / "rgb", per_class=6)
    dm = ImageFolderDataModule(root=str(root), channels=3, image_size=32, in_memory="auto", max_memory_mb=0)
    dm.setup("fit")
    assert isinstance(dm.splits["train"].dataset, FileDataset)
    x, _ = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.shape[1:] == (3, 32, 32) and dm.mean.shape == (3,)


def test_folder_errors_are_clear(tmp_path):
    with pytest.raises(FolderDataError, match="is not a folder"):
        ImageFolderDataModule(root=str(tmp_path / "missing")).setup("fit")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FolderDataError, match="has no class folders"):
        ImageFolderDataModule(root=str(tmp_path / "empty")).setup("fit")
    root = write_classes(tmp_path / "one_empty", per_class=4)
    (root / "zebra").mkdir()
    (root / "zebra" / "notes.txt").write_text("no images here")
    with pytest.raises(FolderDataError, match=r"class folder .*zebra holds no images"):
        ImageFolderDataModule(root=str(root)).setup("fit")
    bad = tmp_path / "bad"
    for name in ("a", "b"):
        (bad / name).mkdir(parents=True)
        (bad / name / "x.png").write_bytes(b"junk")
    with pytest.raises(FolderDataError, match="could be decoded"):
        ImageFolderDataModule(root=str(bad)).setup("fit")
    with pytest.raises(ValueError, match=r"data\.root is not set"):
        ImageFolderDataModule()


@pytest.mark.parametrize("extra", [["--data.channels=3"], ["--data.image_size=32"]])
def test_a_network_that_cannot_take_the_data_is_one_line_before_any_run_folder(tmp_path, extra, capsys, monkeypatch):
    from project.__main__ import main

    root = write_classes(tmp_path / "my_data", per_class=4)
    logs = tmp_path / "logs"
    monkeypatch.setattr("sys.argv", ["python -m project", *fit_args(root, logs, *extra)])
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err.strip()
    assert info.value.code == 1 and len(err.splitlines()) == 1, err
    assert "model.net (CNN) cannot take the images: ImageFolderDataModule gives" in err
    assert extra[0][2:] in err and "data.channels, data.image_size" in err and "in_channels" in err
    assert not list(logs.rglob("version_*")), "a run folder was made"


def test_a_failed_fit_or_predict_leaves_no_folder_for_tensorboard(tmp_path, rgb_folder_ckpt):
    one = tmp_path / "one"
    write_classes(one, per_class=4, classes=["cat"])
    logs = tmp_path / "logs"
    with pytest.raises(FolderDataError, match=r"has one class folder \(cat\): a classifier needs two or more"):
        cli_main(fit_args(one, logs))
    assert not list(logs.rglob("version_*")), "the failed fit left its run folder"
    ckpt, _ = rgb_folder_ckpt
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no image")
    runs = ckpt.parents[1]
    before = sorted(runs.rglob("*"))
    with pytest.raises(FolderDataError, match="no image in"):
        predict_folder(None, empty, runs.parents[1], ckpt)
    assert sorted(runs.rglob("*")) == before, "the failed predict left eval/predict_<n>/"


def test_training_takes_every_format_predict_and_serve_take(tmp_path):
    from PIL import Image

    root = write_classes(tmp_path / "my_data", per_class=4)
    for name in CLASSES:  # one more image per class in each of the other formats
        for suffix in (".gif", ".webp", ".tif"):
            Image.open(next((root / name).glob("*.png"))).save(root / name / f"more{suffix}")
    dm = ImageFolderDataModule(root=str(root), val_fraction=0.2)
    dm.setup("fit")
    assert len(dm.splits["train"]) + len(dm.splits["val"]) == 3 * (4 + 3) and not dm.skipped
