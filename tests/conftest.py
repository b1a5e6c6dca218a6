"""Shared fixtures: a small synthetic MNIST in the real IDX format, and a helper to drive the CLI in-process."""

import os
import socket
from pathlib import Path

import pytest
import torch

from project.__main__ import cli_main

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = str(ROOT / "configs" / "default.yaml")
N_TRAIN, N_TEST = 192, 96


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_idx(path: Path, array: torch.Tensor) -> None:
    """Write a uint8 tensor as an IDX file: magic (0, 0, 0x08, ndim), big-endian dims, then the bytes."""
    header = bytes([0, 0, 0x08, array.dim()]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.to(torch.uint8).contiguous().numpy().tobytes())


def synthetic_digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 28, 28) uint8 in which class k is a bright bar at row 2k+4 over noise: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = torch.randint(0, 60, (n, 28, 28), generator=g)
    for i, k in enumerate(labels.tolist()):
        images[i, 2 * k + 4 : 2 * k + 6, 4:24] = 255
    return images.to(torch.uint8), labels.to(torch.uint8)


def make_mnist(root: Path, folder: str = "MNIST") -> Path:
    """Write the four IDX files under ``root/<folder>/raw`` (MNIST, FashionMNIST, KMNIST) and return ``root``."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    for prefix, n, seed in (("train", N_TRAIN, 0), ("t10k", N_TEST, 1)):
        images, labels = synthetic_digits(n, seed)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only synthetic MNIST shared by the tests that only read it."""
    root = make_mnist(tmp_path_factory.mktemp("mnist"))
    raw = root / "MNIST" / "raw"
    for f in raw.iterdir():
        f.chmod(0o444)
    raw.chmod(0o555)
    return root


@pytest.fixture
def fresh_mnist_dir(tmp_path: Path) -> Path:
    """A writable synthetic MNIST that a test may damage."""
    return make_mnist(tmp_path / "data")


def small_run(mnist_dir: Path, logs: Path) -> list[str]:
    """Options that make any command tiny: the synthetic data, a few batches, one epoch, logs under ``logs``."""
    return [
        f"--data.data_dir={mnist_dir}",
        "--data.val_size=64",
        "--data.num_workers=0",
        "--data.batch_size=32",
        f"--trainer.logger.init_args.save_dir={logs}",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
        "--trainer.limit_predict_batches=2",
        "--trainer.max_epochs=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_model_summary=false",
    ]


@pytest.fixture
def run_cli(mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``cli_main`` with the default config on the synthetic data, tiny limits, in tmp_path (logs, CSVs)."""
    monkeypatch.chdir(tmp_path)  # relative outputs land here

    def run(subcommand: str, *extra: str, config: tuple[str, ...] = ()):
        args = [subcommand, "--config", DEFAULT_CONFIG]
        for c in config:
            args += ["--config", str(ROOT / "configs" / c)]
        args += small_run(mnist_dir, tmp_path / "logs")
        if subcommand == "fit":
            args.append("--test_after_fit=false")  # tests that want it turn it back on
        return cli_main([*args, *extra])

    return run


def best_checkpoint_of_fit(args: list[str]) -> Path:
    """Run ``fit`` with ``args`` in-process; the path of its best checkpoint."""
    cli = cli_main(["fit", *args])
    path = Path(cli.trainer.checkpoint_callback.best_model_path)
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def trained_ckpt(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of one short fit, shared by every test that only reads or evaluates a checkpoint.

    Tests must not write into its run folder: evaluate it with ``run_cli`` (logs elsewhere) or copy it.
    """
    logs = tmp_path_factory.mktemp("trained") / "logs"
    return best_checkpoint_of_fit([*small_run(mnist_dir, logs), "--test_after_fit=false"])


@pytest.fixture(scope="session")
def mnist_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of one epoch of the default recipe on the real MNIST ($PATH_DATASETS), for slow tests.

    No skip when the data is absent: the fit then fails with the data module's error that says how to provide it.
    """
    logs = tmp_path_factory.mktemp("mnist") / "logs"
    return best_checkpoint_of_fit(
        [
            "--config",
            DEFAULT_CONFIG,
            "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={logs}",
            "--trainer.enable_model_summary=false",
            "--test_after_fit=false",
        ]
    )


# >>> folder
CLASSES = ["cat", "dog", "emu"]
TINTS = ((1.0, 0.7, 0.4), (0.5, 1.0, 0.8), (0.9, 0.6, 1.0))  # per-image RGB factors: channels differ


def write_classes(
    root: Path, per_class: int = 24, seed: int = 0, classes: list[str] = CLASSES, tinted: bool = False
) -> Path:
    """PNG/JPEG files in root/<class>/: class k is the synthetic digit k (a bar at row 2k+4), RGB, 40x40.

    ``tinted``: each image's channels scaled by one of ``TINTS`` (grey otherwise), so the three differ.
    """
    from PIL import Image

    images, labels = synthetic_digits(10 * per_class, seed)
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        picks = (labels == k).nonzero().flatten()[:per_class]
        for i, index in enumerate(picks.tolist()):
            grey = images[index].float()
            tint = TINTS[i % 3] if tinted else (1.0, 1.0, 1.0)
            rgb = torch.stack([grey * f for f in tint], dim=-1).to(torch.uint8).numpy()  # (28, 28, 3)
            image = Image.fromarray(rgb, mode="RGB").resize((40, 40))
            image.save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def new_images(root: Path, folder: Path, per_class: int) -> Path:
    """``per_class`` files of each class of ``root`` copied into ``folder`` under new names, one of them resized to
    another size and shape (dog_1.png, 97x61)."""
    import shutil

    from PIL import Image

    folder.mkdir()
    for name in CLASSES:
        for i in range(per_class):
            source = root / name / f"{i}.{'png' if i % 2 else 'jpg'}"
            shutil.copy(source, folder / f"{name}_{source.name}")
    Image.open(folder / "dog_1.png").resize((97, 61)).save(folder / "dog_1.png")
    return folder


def predict_folder(root: Path | None, images: Path, logs: Path, ckpt: Path, *extra: str):
    """``predict`` of the folder-trained ``ckpt`` on the files of ``images`` (``--data.root`` only if ``root``): the
    LightningCLI, and its CSV's rows."""
    import csv

    from project.__main__ import cli_main

    cli = cli_main(
        [
            "predict",
            "--config",
            str(ROOT / "configs" / "folder.yaml"),
            *([f"--data.root={root}"] if root is not None else []),
            f"--data.predict_dir={images}",
            f"--trainer.logger.init_args.save_dir={logs}",
            f"--ckpt_path={ckpt}",
            *extra,
        ]
    )
    with (Path(cli.trainer.log_dir) / "predictions.csv").open() as f:
        return cli, list(csv.DictReader(f))


@pytest.fixture(scope="session")
def rgb_folder_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A folder-trained RGB 32x32 model (SmallResNet, 3 classes, 2 epochs): its best checkpoint and its folder."""
    root = write_classes(tmp_path_factory.mktemp("rgb") / "my_data", tinted=True)
    ckpt = best_checkpoint_of_fit(
        [
            "--config",
            str(ROOT / "configs" / "folder.yaml"),
            f"--data.root={root}",
            "--data.channels=3",
            "--data.image_size=32",
            "--data.batch_size=16",
            "--model.net=project.resnet.SmallResNet",
            "--model.net.init_args.in_channels=3",
            f"--trainer.logger.init_args.save_dir={root.parent / 'logs'}",
            "--trainer.max_epochs=2",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_model_summary=false",
            "--test_after_fit=false",
        ]
    )
    return ckpt, root


# <<< folder


@pytest.fixture
def lightning_log():
    """The messages Lightning's rank-zero logger emits during the test (the CLI's console lines), after filters."""
    import logging

    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Collect(level=logging.INFO)
    # Filters of the logger run before its handlers: what reaches this handler is what the console shows.
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: one intra-op thread each, instead of two threads each fighting for both cores.
    torch.set_num_threads(1)


def assert_help_shows_defaults(command: str, shown: str, capsys: pytest.CaptureFixture) -> None:
    """``<command> --help`` exits 0 and shows ``shown`` (a default), and no option says "(default: None)"."""
    from project.__main__ import cli_main

    with pytest.raises(SystemExit) as info:
        cli_main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert shown in (out if "  " in shown else " ".join(out.split())), out[-1500:]
    assert "(default: None)" not in out  # required options and unset ones say nothing
