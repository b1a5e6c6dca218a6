"""The MNIST network: a plain ``nn.Module`` with no Lightning import, so it can be copied out as is."""

from torch import Tensor, nn


class CNN(nn.Module):
    """The classic two-convolution MNIST network.

    Conv(1→c1, 3x3) → MaxPool(2) → ReLU → Conv(c1→c2, 3x3) → MaxPool(2) → ReLU → Flatten →
    Linear(c2·7·7→hidden) → ReLU → [Dropout] → Linear(hidden→num_classes).

    Pooling before the ReLU computes exactly what ReLU-then-pool does (max and ReLU commute) on a quarter of the
    elements: on a CPU the element-wise passes over the full-resolution maps, not the convolutions, dominate a step
    of this small network (docs/benchmarks.md).

    Args:
        num_classes: Number of output logits.
        channels: Output channels of the first and second convolution.
        hidden: Width of the hidden fully connected layer.
        dropout: Dropout probability before the last layer; 0 disables it.
        in_channels: Channels of the input images (1 for greyscale).
        batch_norm: Batch norm after each pooling (on the pooled, quarter-size maps): trains faster at high
            learning rates (configs/fast.yaml); off in the default recipe.
    """

    def __init__(
        self,
        num_classes: int = 10,
        channels: tuple[int, int] = (32, 64),
        hidden: int = 128,
        dropout: float = 0.0,
        in_channels: int = 1,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        c1, c2 = channels
        layers: list[nn.Module] = []
        for c_in, c_out in ((in_channels, c1), (c1, c2)):  # (B, c1, 28, 28) → (B, c1, 14, 14) → ... → (B, c2, 7, 7)
            layers += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.MaxPool2d(2)]
            if batch_norm:  # only when asked: the default network keeps its layer indices (and checkpoints)
                layers.append(nn.BatchNorm2d(c_out))
            layers.append(nn.ReLU(inplace=True))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),  # (B, c2·7·7)
            nn.Linear(c2 * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Map images (B, in_channels, 28, 28) to logits (B, num_classes); no softmax."""
        return self.classifier(self.features(x))
