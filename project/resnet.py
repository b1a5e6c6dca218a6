"""A small residual CNN with batch norm: a second plain ``nn.Module``, selectable with ``--model.net.class_path``."""

from torch import Tensor, nn


def conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """3x3 convolution (no bias: batch norm follows) → BatchNorm."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out))


class ResidualBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity skip: relu(x + f(x)), shape preserved."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(channels, channels), nn.ReLU(inplace=True), conv_bn(channels, channels))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(x + self.body(x))


class SmallResNet(nn.Module):
    """Three stages of residual blocks at 28, 14 and 7 pixels, then global average pooling.

    Args:
        num_classes: Number of output logits.
        width: Channels of the first stage; doubled at each of the two downsamplings.
        blocks: Residual blocks per stage.
        dropout: Dropout probability before the last layer; 0 disables it.
        in_channels: Channels of the input images (1 for greyscale).
    """

    def __init__(
        self, num_classes: int = 10, width: int = 16, blocks: int = 1, dropout: float = 0.0, in_channels: int = 1
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(in_channels, width), nn.ReLU(inplace=True)]  # (B, w, 28, 28)
        for stage in range(3):
            c = width * 2**stage
            if stage > 0:  # halve the resolution, double the channels: (B, c, 14, 14), then (B, c, 7, 7)
                layers += [conv_bn(c // 2, c, stride=2), nn.ReLU(inplace=True)]
            layers += [ResidualBlock(c) for _ in range(blocks)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 4w)
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(width * 4, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Map images (B, in_channels, H, W) to logits (B, num_classes)."""
        return self.head(self.features(x))
