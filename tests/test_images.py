import csv
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from project.data import MNISTDataModule
from project.errors import DataError
from project.images import load_folder, mnist_style, prepare_image
from project.mnist_files import load_split


def drawn_seven(size: tuple[int, int] = (64, 64), dark_on_light: bool = True, mode: str = "RGB") -> Image.Image:
    """A thick '7' drawn large and off-centre, as a photo or scan of a digit would be."""
    w, h = size
    ink, paper = ((20, 20, 30), (235, 230, 220)) if dark_on_light else ((250, 250, 250), (0, 0, 0))
    image = Image.new("RGB", size, paper)
    draw = ImageDraw.Draw(image)
    stroke = max(2, w // 12)
    draw.line([(0.15 * w, 0.2 * h), (0.6 * w, 0.2 * h), (0.35 * w, 0.85 * h)], fill=ink, width=stroke)
    return image.convert(mode)


def centre_of_mass(x: torch.Tensor) -> tuple[float, float]:
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    m = x.float()
    return float((ys * m).sum() / m.sum()), float((xs * m).sum() / m.sum())


@pytest.mark.parametrize(
    ("size", "dark_on_light", "mode"),
    [
        ((64, 64), True, "RGB"),
        ((300, 180), True, "L"),
        ((50, 90), False, "RGB"),
        ((64, 64), True, "RGBA"),
        ((28, 28), False, "L"),  # MNIST's size and polarity, but off-centre: not left as it is
    ],
)
def test_mnist_style_is_white_on_black_20px_and_centred(size, dark_on_light, mode):
    x = mnist_style(drawn_seven(size, dark_on_light, mode))
    assert x.shape == (28, 28) and x.dtype == torch.uint8
    assert x.max() == 255 and x[0].max() == 0 and x[:, 0].max() == 0  # bright ink, black border
    rows = torch.nonzero(x.amax(dim=1) > 50).flatten()
    cols = torch.nonzero(x.amax(dim=0) > 50).flatten()
    assert max(rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1) in (19, 20, 21)
    cy, cx = centre_of_mass(x)
    assert abs(cy - 14) <= 0.5 and abs(cx - 14) <= 0.5  # where MNIST's digits have theirs (images.mnist_style)


def png(x: torch.Tensor) -> io.BytesIO:
    buf = io.BytesIO()
    Image.fromarray(x.numpy()).save(buf, format="PNG")
    buf.seek(0)
    return buf


@pytest.mark.parametrize("size", [(64, 64), (300, 180), (50, 90)])
def test_a_prepared_digit_prepared_again_is_unchanged(size):
    x = mnist_style(drawn_seven(size))
    assert torch.equal(prepare_image(png(x)), x)


@pytest.mark.slow  # the real MNIST ($PATH_DATASETS)
def test_mnist_test_digits_as_png_files_are_prepared_into_the_tensors_the_network_was_tested_on():
    """No training/serving skew: a test digit sent as a file reaches the network as ``test`` gives it (issue 25)."""
    images, _ = load_split(Path(os.environ.get("PATH_DATASETS", "data")) / "MNIST" / "raw", "t10k")
    changed = [i for i, x in enumerate(images) if not torch.equal(prepare_image(png(x)), x)]
    assert not changed, f"{len(changed)} of {len(images)} test digits changed, the first {changed[:10]}"


def test_dark_on_light_and_light_on_dark_agree():
    a = mnist_style(drawn_seven((64, 64), True)).float()
    b = mnist_style(drawn_seven((64, 64), False)).float()
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.95


def test_blank_image_gives_blank_digit():
    assert mnist_style(Image.new("RGB", (40, 40), "white")).max() == 0


def write_folder(folder: Path) -> None:
    folder.mkdir()
    drawn_seven((64, 64)).save(folder / "a.png")
    drawn_seven((80, 60), mode="L").save(folder / "b.jpg")
    drawn_seven((64, 64), dark_on_light=False).save(folder / "c.bmp")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
    Image.new("RGB", (40, 40), "white").save(folder / "d_blank.png")
    (folder / "notes.txt").write_text("not an image")


def test_load_folder_skips_and_reports_undecodable_blank_and_other_files(tmp_path):
    write_folder(tmp_path / "imgs")
    files, images, failed = load_folder(tmp_path / "imgs")
    assert [f.name for f in files] == ["a.png", "b.jpg", "c.bmp"]
    assert images.shape == (3, 28, 28)
    reasons = {p.name: reason for p, reason in failed}
    assert list(reasons) == ["broken.png", "d_blank.png", "notes.txt"]
    assert "cannot decode" in reasons["broken.png"] and "not in an image format" in reasons["broken.png"]
    assert "blank image" in reasons["d_blank.png"]
    assert "not an image file (suffix .txt" in reasons["notes.txt"]


def test_empty_folder_and_folder_without_images_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty holds no images"):
        load_folder(tmp_path / "empty")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("x")
    with pytest.raises(ValueError, match="no images"):
        load_folder(tmp_path / "text")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_folder(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"junk")
    with pytest.raises(DataError, match=r"no image .* could be decoded \(x.png"):
        MNISTDataModule(predict_dir=str(tmp_path / "bad")).setup("predict")


def test_predict_dir_from_the_cli_writes_paths_and_errors(run_cli, trained_ckpt, tmp_path):
    write_folder(tmp_path / "imgs")
    # No MNIST is needed to predict on one's own images: point data_dir at an empty folder.
    cli = run_cli(
        "predict",
        f"--ckpt_path={trained_ckpt}",
        f"--data.predict_dir={tmp_path / 'imgs'}",
        f"--data.data_dir={tmp_path}",
        "--data.download=false",
    )
    with (Path(cli.trainer.log_dir) / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["path"]).name for r in rows] == ["a.png", "b.jpg", "c.bmp", "broken.png", "d_blank.png", "notes.txt"]
    assert all(r["pred"].isdigit() and not r["error"] for r in rows[:3])
    assert all(r["pred"] == "" and r["error"] for r in rows[3:])  # skipped, with the reason: no invented digit
    assert "blank image" in rows[4]["error"] and "not an image file" in rows[5]["error"]
    assert "label" not in rows[0]
    probs = np.array([[float(r[f"prob_{c}"]) for c in range(10)] for r in rows[:3]])
    assert np.allclose(probs.sum(axis=1), 1, atol=1e-4)


def test_a_header_pil_itself_refuses_gets_the_same_message_as_max_pixels(tmp_path):
    """A 20000x20000 PNG header: PIL raises in Image.open, before our check; the message is still ours."""
    import io
    import struct
    import zlib

    from project.images import ImageTooLarge, prepare_image

    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    png = bytearray(buffer.getvalue())
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type: its data starts here
    png[ihdr : ihdr + 8] = struct.pack(">II", 20000, 20000)
    png[ihdr + 13 : ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(png[ihdr - 4 : ihdr + 13])))
    with pytest.raises(ImageTooLarge, match=r"^image is 400,000,000 pixels, over the limit of 25,000,000$"):
        prepare_image(io.BytesIO(bytes(png)), max_pixels=25_000_000)
    path = tmp_path / "bomb.png"
    path.write_bytes(bytes(png))
    with pytest.raises(ImageTooLarge, match=r"^image is 400,000,000 pixels, over the limit of 178,956,970$"):
        prepare_image(path)  # predict_dir: PIL's own limit
