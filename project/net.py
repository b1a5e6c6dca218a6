"""The MNIST network: a plain ``nn.Module`` with no Lightning import, so it can be copied out as is."""

from torch import Tensor, nn


class CNN(nn.Module):
    """The classic two-convolution MNIST network.

    Conv(1→c1, 3x3) → ReLU → MaxPool(2) → Conv(c1→c2, 3x3) → ReLU → MaxPool(2) → Flatten →
    Linear(c2·7·7→hidden) → ReLU → [Dropout] → Linear(hidden→num_classes).

    Args:
        num_classes: Number of output logits.
        channels: Output channels of the first and second convolution.
        hidden: Width of the hidden fully connected layer.
        dropout: Dropout probability before the last layer; 0 disables it.
        in_channels: Channels of the input images (1 for greyscale).
    """

    def __init__(
        self,
        num_classes: int = 10,
        channels: tuple[int, int] = (32, 64),
        hidden: int = 128,
        dropout: float = 0.0,
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=3, padding=1),  # (B, c1, 28, 28)
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, c1, 14, 14)
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),  # (B, c2, 14, 14)
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, c2, 7, 7)
        )
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
