"""Training on one's own image folders: classes from folder names, seeded split, clear errors."""

import csv
from pathlib import Path

import pytest
import torch

from project.cli import cli_main
from project.data import DataError
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
    (bad / "a").mkdir(parents=True)
    (bad / "a" / "x.png").write_bytes(b"junk")
    with pytest.raises(FolderDataError, match="could be decoded"):
        ImageFolderDataModule(root=str(bad)).setup("fit")
    with pytest.raises(ValueError, match=r"data\.root is not set"):
        ImageFolderDataModule()


def test_folds_of_a_folder_are_stratified_and_disjoint_and_val_is_then_the_test_split(tmp_path):
    root = write_classes(tmp_path / "a", per_class=10)
    parts = []
    for fold in range(3):
        dm = ImageFolderDataModule(root=str(root), num_folds=3, fold=fold)
        dm.setup("fit")
        train, val = dm.splits["train"].indices, dm.splits["val"].indices
        assert not set(train) & set(val) and len(train) + len(val) == 30
        labels = dm.splits["val"].dataset.labels[val]
        assert torch.bincount(labels, minlength=3).tolist() in ([3, 3, 4], [3, 4, 3], [4, 3, 3], [4, 3, 3])
        parts += val
    assert sorted(parts) == list(range(30))
    given = tmp_path / "b"
    write_classes(given / "train", per_class=10)
    write_classes(given / "val", per_class=4, seed=5)
    dm = ImageFolderDataModule(root=str(given), num_folds=5, fold=4)
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (24, 6, 12)
    few = ImageFolderDataModule(root=str(write_classes(tmp_path / "c", per_class=2)), num_folds=3)
    with pytest.raises(DataError, match=r"data.num_folds=3 needs at least 3 images of every class.*'cat' has 2"):
        few.setup("fit")
