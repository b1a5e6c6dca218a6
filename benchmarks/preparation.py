"""Does a digit get the same answer whichever way it arrives? One checkpoint, MNIST test digits four ways.

    python benchmarks/preparation.py --ckpt_path logs/mnist/version_0/checkpoints/<best>.ckpt [--digits 2000]

The ways: as tensors (what ``test`` gives the network), as PNG files (what a user who saves MNIST digits
sends to the HTTP server or ``predict --data.predict_dir``), as photo-like JPEGs (dark ink on tinted paper,
2-5x larger, off-centre on a bigger sheet, sensor noise) and as light-on-dark PNGs 4x larger (a
screenshot). Every file goes through ``project.images.prepare_image``, the preparation the HTTP server and
``predict_dir`` run. A training/serving skew shows as PNG accuracy below tensor accuracy;
docs/benchmarks.md quotes the figures before and after issue 25.
"""

import argparse
import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from run import machine

from project.data import MEAN, STD
from project.images import normalize, prepare_image
from project.mnist_files import load_split
from project.module import MNISTClassifier


def encode(image: Image.Image, fmt: str, **options: int) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **options)
    return buf.getvalue()


def photo(digit: np.ndarray, rng: np.random.Generator) -> bytes:
    """A digit (28, 28) uint8 as a phone photo of ink on paper would show it, as a JPEG."""
    side = int(rng.integers(56, 141))
    ink = np.asarray(Image.fromarray(digit).resize((side, side), Image.Resampling.BICUBIC), np.float32) / 255
    height, width = side + int(rng.integers(20, 120)), side + int(rng.integers(20, 120))
    paper, dark = float(rng.integers(200, 246)), float(rng.integers(10, 60))
    sheet = np.full((height, width), paper, np.float32)
    top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
    sheet[top : top + side, left : left + side] = paper * (1 - ink) + dark * ink
    rgb = np.stack([sheet, sheet * 0.97, sheet * 0.92], axis=-1) + rng.normal(0, 3, (height, width, 3))  # (H, W, 3)
    return encode(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)), "JPEG", quality=85)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint trained on MNIST")
    parser.add_argument("--digits", type=int, default=2000, help="the first N MNIST test digits")
    parser.add_argument("--data_dir", default=os.environ.get("PATH_DATASETS", "data"), help="holds MNIST/raw/")
    args = parser.parse_args()

    torch.set_num_threads(os.cpu_count() or 1)
    model = MNISTClassifier.load_from_checkpoint(args.ckpt_path, map_location="cpu", weights_only=True).eval()
    images, labels = load_split(Path(args.data_dir) / "MNIST" / "raw", "t10k")
    images, labels = images[: args.digits], labels[: args.digits]

    def predict(x: torch.Tensor) -> torch.Tensor:  # (N, 28, 28) uint8 -> (N,) classes
        with torch.inference_mode():
            return torch.cat(
                [
                    model.predict_step(normalize(b.unsqueeze(1), (MEAN,), (STD,)), 0)["probs"].argmax(1)
                    for b in x.split(500)
                ]
            )

    rng = np.random.default_rng(0)
    ways: dict[str, Callable[[np.ndarray], bytes]] = {
        "PNG, as saved from the dataset": lambda d: encode(Image.fromarray(d), "PNG"),
        "photo-like JPEG": lambda d: photo(d, rng),
        "light on dark, 4x, PNG": lambda d: encode(
            Image.fromarray(d).resize((112, 112), Image.Resampling.BICUBIC), "PNG"
        ),
    }
    reference = predict(images)
    print(f"{args.ckpt_path}, the first {len(labels)} MNIST test digits. Machine: {machine()}.\n")
    print("| how the digit arrives | accuracy | wrong | same answer as the tensor |")
    print("|---|---|---|---|")
    print(
        f"| tensor (`test`) | {100 * (reference == labels).float().mean():.2f}% | {(reference != labels).sum()} | - |"
    )
    for way, make in ways.items():
        prepared = torch.stack([prepare_image(io.BytesIO(make(d))) for d in images.numpy()])
        got = predict(prepared)
        print(
            f"| {way} | {100 * (got == labels).float().mean():.2f}% | {(got != labels).sum()} "
            f"| {(got == reference).sum()} of {len(labels)} |"
        )


if __name__ == "__main__":
    main()
