"""Make a user's digit photo or drawing look like an MNIST digit, as MNIST itself was prepared.

MNIST digits are white on black, size-normalised to fit a 20x20 box (aspect ratio kept) and centred by
centre of mass in a 28x28 field. ``mnist_style`` applies the same steps to any image PIL can decode, and leaves an
image that already is such a digit as it is: prepared twice, a digit would drift from what the network was trained on.
"""

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from project.errors import DataError

# The formats PIL decodes that training and prediction both take (one list: a file that predicts also trains).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class ImageTooLarge(ValueError):
    """An image with more pixels than the caller allows (a decompression bomb, or simply too big)."""


class BlankImage(ValueError):
    """An image that decodes but holds no digit: one colour throughout."""


def list_files(folder: Path) -> list[Path]:
    """The files in ``folder`` (not recursive, hidden files left out), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def read_image(path: Path) -> Tensor:
    """Decode the image file ``path`` and prepare it as an MNIST digit (28, 28) uint8.

    Raises:
        ValueError: naming why the file cannot be predicted: no image suffix, or see ``prepare_image``.
    """
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"not an image file (suffix {path.suffix or 'none'}; expected {', '.join(IMAGE_SUFFIXES)})")
    return prepare_image(path)


def prepare_image(source: Path | BinaryIO, max_pixels: int | None = None) -> Tensor:
    """Decode an image (a file, or its bytes as a file object) and prepare it as an MNIST digit (28, 28) uint8.

    What ``predict --data.predict_dir`` runs, and every command that answers for an image file: one preparation.

    Args:
        source: A path or a binary file object holding a PNG, JPEG, BMP or any format PIL decodes.
        max_pixels: Refuse images with more pixels than this before decoding them (a tiny PNG can declare
            20000x20000 and take gigabytes to decode); ``None`` keeps PIL's own limit.

    Raises:
        ImageTooLarge: more than ``max_pixels`` pixels.
        BlankImage: it decodes, but there is no digit in it.
        ValueError: not an image PIL decodes (foreign or truncated bytes).
    """
    digit = decode(source, max_pixels, mnist_style)
    if not digit.any():
        raise BlankImage("blank image: no ink found (one colour throughout), so there is no digit to predict")
    return digit


def prepare_resized(source: Path | BinaryIO, size: int, channels: int, max_pixels: int | None = None) -> Tensor:
    """Decode an image and resize it as the folder DataModule reads its files: uint8 (channels, size, size).

    Raises:
        ImageTooLarge: more than ``max_pixels`` pixels.
        ValueError: not an image PIL decodes (foreign or truncated bytes).
    """
    return decode(source, max_pixels, lambda image: resized(image, size, channels))


def resized(image: Image.Image, size: int, channels: int) -> Tensor:
    """``image`` as uint8 (channels, size, size): greyscale or RGB, resized bilinearly (aspect ratio not kept)."""
    image = image.convert("L" if channels == 1 else "RGB").resize((size, size), Image.Resampling.BILINEAR)
    array = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return array.view(size, size, channels).permute(2, 0, 1).contiguous()


def decode(source: Path | BinaryIO, max_pixels: int | None, prepare: Callable[[Image.Image], Tensor]) -> Tensor:
    """Open an image, refuse it by its header if it has more than ``max_pixels`` pixels, decode it and ``prepare`` it.

    Raises:
        ImageTooLarge: more than ``max_pixels`` pixels (or than PIL's own limit).
        ValueError: not an image PIL decodes (foreign or truncated bytes).
    """
    try:
        with Image.open(source) as image:  # reads the header only: the size is known before any pixel is decoded
            if max_pixels is not None and image.width * image.height > max_pixels:
                raise ImageTooLarge(
                    f"image is {image.width}x{image.height} = {image.width * image.height:,} pixels, "
                    f"over the limit of {max_pixels:,}"
                )
            image.load()
            return prepare(image)
    except ImageTooLarge:
        raise
    except Image.DecompressionBombError as exc:
        # PIL refuses a header of more than 2x its MAX_IMAGE_PIXELS inside Image.open, before the check above
        # can run: the same message as that check's, not PIL's wording.
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(found.group(1)):,} pixels" if found else "more pixels than PIL decodes safely"
        limit = max_pixels if max_pixels is not None else 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise ImageTooLarge(f"image is {size}, over the limit of {limit:,}") from exc
    except UnidentifiedImageError:
        raise ValueError("cannot decode: not in an image format PIL reads (PNG, JPEG, BMP, GIF, TIFF, WebP)") from None
    except Exception as exc:  # PIL raises several types for truncated or foreign files
        raise ValueError(f"cannot decode: {type(exc).__name__}: {exc}") from exc


def mnist_style(image: Image.Image, box: int = 20, size: int = 28) -> Tensor:
    """Return ``image`` as an MNIST-like uint8 tensor (size, size): white digit, black background.

    Args:
        image: Any PIL image: colour or greyscale, any size, dark-on-light or light-on-dark.
        box: Side of the box the digit is scaled to fit.
        size: Side of the output field.
    """
    if image.mode in ("RGBA", "LA", "P"):  # transparent background → white, as on paper
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    grey = np.asarray(ImageOps.exif_transpose(image).convert("L"), dtype=np.float32)
    # The border is background: invert when it is lighter than the middle (a dark digit on light paper).
    background = float(np.median(np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])))
    if background <= 127 and is_mnist_digit(grey, box, size):
        # An MNIST test digit saved as PNG: re-cropped and rescaled it would lose 0.7 points of accuracy (issue 25).
        return torch.from_numpy(grey.astype(np.uint8))
    if background > 127:
        grey, background = 255 - grey, 255 - background
    # Stretch from the background level to the brightest ink, so faint strokes and grey paper still work.
    grey = np.clip(grey - background, 0, None)
    if grey.max() > 0:
        grey = grey * (255 / grey.max())
    ink = grey > 0.2 * 255
    if not ink.any():
        return torch.zeros(size, size, dtype=torch.uint8)
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    digit = grey[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = digit.shape
    scale = box / max(h, w)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    digit = np.asarray(
        Image.fromarray(digit.astype(np.uint8)).resize((new_w, new_h), Image.Resampling.LANCZOS), dtype=np.float32
    )  # PIL's resize of a uint8 image rounds and clips: the pixels returned, so the centre below is theirs
    field = np.zeros((size, size), dtype=np.float32)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    field[top : top + new_h, left : left + new_w] = digit
    # Move the centre of mass to pixel (size/2, size/2) in whole pixels, as MNIST did: on all 10,000 of its test
    # digits it lies within half a pixel of (14, 14), not of the field's middle (13.5, 13.5).
    cy, cx = centre_of_mass(field)
    dy, dx = round(size / 2 - cy), round(size / 2 - cx)
    field = np.roll(field, (dy, dx), axis=(0, 1))  # the digit is 20 px in 28: a shift of ≤ 4 px wraps only zeros
    return torch.from_numpy(field.astype(np.uint8))


def centre_of_mass(grey: np.ndarray) -> tuple[float, float]:
    """The (row, column) centre of mass of a greyscale image (H, W), in pixels from the top left."""
    mass = grey.sum()
    rows, cols = np.arange(grey.shape[0]), np.arange(grey.shape[1])
    return float((rows * grey.sum(axis=1)).sum() / mass), float((cols * grey.sum(axis=0)).sum() / mass)


def is_mnist_digit(grey: np.ndarray, box: int = 20, size: int = 28) -> bool:
    """Whether a light-on-dark greyscale image (H, W) already is an MNIST-style digit, as ``mnist_style`` makes them.

    It is when it is ``size`` x ``size``, its ink (every pixel above 0, MNIST's background) fits ``box`` x ``box``,
    and its centre of mass lies within half a pixel of (size/2, size/2): true of every MNIST digit, and of what
    ``mnist_style`` returns, so preparing a prepared digit again changes nothing.
    """
    if grey.shape != (size, size) or not grey.any():
        return False
    rows, cols = np.flatnonzero(grey.any(axis=1)), np.flatnonzero(grey.any(axis=0))
    if max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1 > box:
        return False
    cy, cx = centre_of_mass(grey)
    return max(abs(cy - size / 2), abs(cx - size / 2)) <= 0.5 + 1e-4  # float sums: a hair of slack


def load_folder(folder: Path) -> tuple[list[Path], Tensor, list[tuple[Path, str]]]:
    """Decode and preprocess every file in ``folder``.

    Returns:
        The decoded files, their MNIST-style images (N, 28, 28) uint8, and (file, reason) for each file that was
        skipped: not an image, undecodable, or blank.

    Raises:
        FileNotFoundError: ``folder`` is not a folder.
        ValueError: it holds no file with an image suffix.
        DataError: none of its images could be decoded (each file's reason named).
    """
    if not folder.is_dir():
        raise FileNotFoundError(
            f"data.predict_dir: {folder} is not a folder. Give a folder of images (PNG, JPEG, BMP, GIF, WebP, TIFF)."
        )
    files = list_files(folder)
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        raise ValueError(
            f"data.predict_dir: {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}). Put digit images there."
        )
    decoded, images, failed = [], [], []
    for path in files:
        try:
            images.append(read_image(path))
            decoded.append(path)
        except ValueError as exc:
            failed.append((path, str(exc)))
    if not images:
        reasons = "; ".join(f"{path.name}: {reason}" for path, reason in failed)
        raise DataError(f"data.predict_dir: no image in {folder} could be decoded ({reasons}).")
    return decoded, torch.stack(images), failed


def normalize(images: Tensor, mean: Sequence[float] | Tensor, std: Sequence[float] | Tensor) -> Tensor:
    """uint8 pixels (B, C, H, W) -> float, scaled to 0-1, minus ``mean`` and divided by ``std`` per channel (C,):
    the arithmetic of torchvision's ToTensor + Normalize, for training, ``predict``, export and serving alike."""
    mean = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return (images.float().div(255) - mean) / std
