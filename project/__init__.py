"""PyTorch Lightning project template: a CNN on MNIST, driven by LightningCLI."""

from project.data import MNISTDataModule
from project.module import MNISTClassifier
from project.net import CNN

__all__ = ["CNN", "MNISTClassifier", "MNISTDataModule"]
