"""PyTorch Lightning project template: a CNN on MNIST, driven by LightningCLI."""

from typing import Any

# Imported on first use, so that `python -m project --help` does not pay for torch and Lightning.
_EXPORTS = {"CNN": "net", "MNISTClassifier": "module", "MNISTDataModule": "data"}

__all__ = ["CNN", "MNISTClassifier", "MNISTDataModule"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
