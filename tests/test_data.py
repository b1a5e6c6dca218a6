from pathlib import Path
from urllib.error import URLError

import pytest
import torch
from torchvision import transforms
from torchvision.datasets import MNIST

from project.data import DATASETS, MEAN, STD, MNISTDataModule
from project.mnist_files import IDX_FILES, MNISTDataError
from tests.conftest import N_TEST, N_TRAIN


def test_init_does_no_io_and_defaults_to_path_datasets(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH_DATASETS", str(tmp_path / "nowhere"))
    dm = MNISTDataModule()
    assert dm.data_dir == tmp_path / "nowhere"
    assert not (tmp_path / "nowhere").exists()
    monkeypatch.delenv("PATH_DATASETS")
    assert MNISTDataModule().data_dir == Path("data")
    assert MNISTDataModule(data_dir="/x").data_dir == Path("/x")


def test_seeded_split_and_normalisation(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=32, batch_size=16, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"])) == (N_TRAIN - 32, 32)
    again = MNISTDataModule(data_dir=str(mnist_dir), val_size=32)
    again.setup("fit")
    assert dm.splits["val"].indices == again.splits["val"].indices
    other = MNISTDataModule(data_dir=str(mnist_dir), val_size=32, seed=7)
    other.setup("fit")
    assert dm.splits["val"].indices != other.splits["val"].indices

    x, y = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.long
    # A pixel of value 0 maps to -mean/std, 255 to (1-mean)/std.
    assert x.min().item() == pytest.approx(-MEAN / STD, abs=1e-5)
    assert x.max().item() == pytest.approx((1 - MEAN) / STD, abs=1e-5)


@pytest.mark.parametrize("stage", ["fit", "test"])
def test_in_memory_batches_equal_torchvision_mnist_exactly(mnist_dir, stage):
    """Bit-identical to torchvision's MNIST through ToTensor + Normalize, item by item in the same order: the fast
    path changes speed, not data."""
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=32, batch_size=24)
    dm.setup(stage)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
    reference = MNIST(str(mnist_dir), train=stage == "fit", transform=transform)
    indices = dm.splits["val"].indices if stage == "fit" else list(range(N_TEST))
    seen = 0
    for x, y in dm.val_dataloader() if stage == "fit" else dm.test_dataloader():
        assert x.dtype == torch.uint8 and x.shape == (len(y), 28, 28)
        x, y = dm.on_after_batch_transfer((x, y), 0)
        items = [reference[i] for i in indices[seen : seen + len(y)]]
        assert torch.equal(x, torch.stack([item for item, _ in items])) and y.tolist() == [label for _, label in items]
        seen += len(y)
    assert seen == len(indices)


def test_the_benchmarks_per_image_pil_path_gives_the_same_batches(mnist_dir):
    """benchmarks/run.py's variant (b) measures Lightning on the baseline's data path: the same data, only slower."""
    from benchmarks.pil_data import PILMNISTDataModule

    fast = MNISTDataModule(data_dir=str(mnist_dir), val_size=32, batch_size=24)
    slow = PILMNISTDataModule(data_dir=str(mnist_dir), val_size=32, batch_size=24)
    fast.setup("fit")
    slow.setup("fit")
    for (xf, yf), (xs, ys) in zip(fast.val_dataloader(), slow.val_dataloader(), strict=True):
        assert xs.dtype == torch.float32 and xs.shape == (len(ys), 1, 28, 28)  # normalised per image already
        xf, yf = fast.on_after_batch_transfer((xf, yf), 0)
        assert torch.equal(xf, slow.on_after_batch_transfer((xs, ys), 0)[0]) and torch.equal(yf, ys)


def test_in_memory_loader_shards_under_distributed_sampler(mnist_dir):
    """Lightning re-creates the loader with a DistributedSampler under DDP: ranks must split the data exactly."""
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DistributedSampler

    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=32, batch_size=16)
    dm.setup("fit")
    loader = dm.train_dataloader()
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(loader.dataset, num_replicas=2, rank=rank, shuffle=True, seed=3)
        sharded = _update_dataloader(loader, sampler, mode=RunningStage.TRAINING)
        batches = list(sharded)
        assert all(x.shape[0] == y.shape[0] <= 16 for x, y in batches)
        seen.append(torch.cat([x for x, _ in batches]))
    assert len(seen[0]) == len(seen[1]) == (N_TRAIN - 32) // 2
    everything = {bytes(img.numpy()) for img in torch.cat(seen)}
    expected = {bytes(img.numpy()) for img, _ in (loader.dataset[i] for i in range(len(loader.dataset)))}
    assert everything == expected  # every training image once, none from validation


def test_augmentation_only_in_training(mnist_dir):
    from types import SimpleNamespace

    from project.batches import random_shift_rotate
    from project.images import normalize

    torch.manual_seed(0)
    images = torch.zeros(8, 28, 28, dtype=torch.uint8)
    images[:, 10:18, 10:18] = 255
    x = normalize(images.unsqueeze(1), (MEAN,), (STD,))
    moved = random_shift_rotate(x, background=-MEAN / STD)
    assert moved.shape == x.shape and not torch.equal(moved, x)
    # The background stays the background value; the digit keeps about its mass.
    assert moved[:, :, 0, 0].allclose(torch.tensor(-MEAN / STD))
    assert (moved > 0).sum(dim=(1, 2, 3)).float().mean() == pytest.approx(64, rel=0.3)

    dm = MNISTDataModule(data_dir=str(mnist_dir), augment=True)
    y = torch.zeros(8, dtype=torch.long)
    dm.trainer = SimpleNamespace(training=False)
    assert torch.equal(dm.on_after_batch_transfer((images, y), 0)[0], x)
    dm.trainer = SimpleNamespace(training=True)
    assert not torch.equal(dm.on_after_batch_transfer((images, y), 0)[0], x)


def test_predict_uses_the_test_set_unless_told(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), num_workers=0)
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == N_TEST
    dm = MNISTDataModule(data_dir=str(mnist_dir), num_workers=0, val_size=20, predict_split="val")
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == 20


def test_offline_read_only_folder_is_left_untouched(mnist_dir, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(MNIST, "download", no_network)
    raw = mnist_dir / "MNIST" / "raw"
    before = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=32)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == before
    assert sorted(p.name for p in (mnist_dir / "MNIST").iterdir()) == ["raw"]


def test_missing_files_error_names_files_folder_and_remedy(tmp_path):
    dm = MNISTDataModule(data_dir=str(tmp_path), download=False)
    with pytest.raises(MNISTDataError) as info:
        dm.prepare_data()
    message = str(info.value)
    for name in IDX_FILES:
        assert name in message
    assert str((tmp_path / "MNIST" / "raw").resolve()) in message
    assert "PATH_DATASETS" in message and "--data.data_dir" in message


def test_failed_download_is_one_clear_error(tmp_path, monkeypatch):
    def unreachable(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried mirror, got:\n" + str(URLError("x")))

    monkeypatch.setattr(MNIST, "download", unreachable)
    dm = MNISTDataModule(data_dir=str(tmp_path))
    with pytest.raises(MNISTDataError, match="download failed") as info:
        dm.prepare_data()
    assert "train-labels-idx1-ubyte" in str(info.value) and "PATH_DATASETS" in str(info.value)


@pytest.mark.parametrize(
    ("name", "damage", "why"),
    [
        ("train-images-idx3-ubyte", lambda b: b[: len(b) // 2], "RuntimeError: shape"),  # shorter than its header
        ("t10k-labels-idx1-ubyte", lambda b: b[:-1], "RuntimeError: shape"),
        ("t10k-images-idx3-ubyte", lambda b: b"\x1f\x8b" + b[2:], "AssertionError: bad magic number"),  # gzipped
        ("train-labels-idx1-ubyte", lambda b: b[:3], "AssertionError: bad magic number"),
    ],
)
def test_corrupt_file_is_named_before_training(fresh_mnist_dir, name, damage, why):
    path = fresh_mnist_dir / "MNIST" / "raw" / name
    path.write_bytes(damage(path.read_bytes()))
    dm = MNISTDataModule(data_dir=str(fresh_mnist_dir), download=False)
    dm.prepare_data()  # the files are all there: nothing to download
    stage = "fit" if name.startswith("train") else "test"
    with pytest.raises(MNISTDataError, match=f"is truncated or has a bad header \\({why}") as info:
        dm.setup(stage)
    assert str(path) in str(info.value) and "Replace it with the original file" in str(info.value)


def test_label_count_mismatch_and_bad_val_size(fresh_mnist_dir):
    raw = fresh_mnist_dir / "MNIST" / "raw"
    labels = raw / "t10k-labels-idx1-ubyte"
    data = labels.read_bytes()
    labels.write_bytes(data[:4] + (N_TEST - 1).to_bytes(4, "big") + data[8:-1])
    with pytest.raises(MNISTDataError, match="labels"):
        MNISTDataModule(data_dir=str(fresh_mnist_dir)).setup("test")
    with pytest.raises(MNISTDataError, match="val_size"):
        MNISTDataModule(data_dir=str(fresh_mnist_dir), val_size=N_TRAIN).setup("fit")


@pytest.mark.parametrize(("dataset", "folder"), [("fashion_mnist", "FashionMNIST"), ("kmnist", "KMNIST")])
def test_fashion_mnist_and_kmnist_are_a_config_switch(run_cli, tmp_path, dataset, folder):
    from tests.conftest import make_mnist

    root = make_mnist(tmp_path / "other", folder)
    cli = run_cli("fit", f"--data.data_dir={root}", f"--data.dataset={dataset}")
    dm = cli.datamodule
    assert dm.raw_dir == root / folder / "raw"
    mean, std = DATASETS[dataset][1:]
    x, _ = dm.on_after_batch_transfer(next(iter(dm.val_dataloader())), 0)
    assert x.min().item() == pytest.approx(-mean / std, abs=1e-5)
    # The MNIST folder is not looked at: without the files in <folder>/raw the error names that folder.
    with pytest.raises(MNISTDataError, match=folder):
        MNISTDataModule(data_dir=str(tmp_path), dataset=dataset, download=False).prepare_data()


def test_unknown_dataset_is_refused():
    with pytest.raises(ValueError, match=r"data\.dataset must be one of mnist, fashion_mnist, kmnist"):
        MNISTDataModule(dataset="cifar10")


@pytest.mark.parametrize(("dataset", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_a_failed_download_writes_nothing_and_the_console_shows_one_line(
    tmp_path, monkeypatch, capsys, dataset, folder
):
    import sys

    from project.__main__ import main

    def offline(self):
        (Path(self.root) / folder / "raw").mkdir(parents=True, exist_ok=True)  # what torchvision does first
        raise RuntimeError("Error downloading:\n<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(DATASETS[dataset][0], "download", offline)
    data = tmp_path / "data"
    data.mkdir()
    argv = [
        "project",
        "fit",
        f"--data.data_dir={data}",
        f"--data.dataset={dataset}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert f"{folder}/raw/ with `export PATH_DATASETS" in lines[0] and "download failed" in lines[0]
    assert list(data.iterdir()) == []  # no empty FashionMNIST/raw/ left behind
