"""PyTorch Lightning project template: a CNN on MNIST, driven by LightningCLI."""
