from pathlib import Path

import pytest
import torch

from project.net import CNN


def test_default_layers_and_logit_shape():
    net = CNN()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 32, (3, 3), (1, 1)),
        (32, 64, (3, 3), (1, 1)),
    ]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(64 * 7 * 7, 128), (128, 10)]
    logits = net(torch.randn(5, 1, 28, 28))
    assert logits.shape == (5, 10)
    # Logits, not probabilities: rows do not sum to one.
    assert not torch.allclose(logits.sum(dim=1), torch.ones(5))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_widths_hidden_and_dropout_are_arguments(dropout):
    net = CNN(num_classes=7, channels=(8, 16), hidden=24, dropout=dropout)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 7)
    assert any(isinstance(m, torch.nn.Dropout) for m in net.modules()) == (dropout > 0)
    assert sum(p.numel() for p in net.parameters()) < sum(p.numel() for p in CNN().parameters())


def test_network_file_does_not_import_lightning():
    """net.py is meant to be copied out on its own: it imports torch only. (test_export.py loads it in a fresh
    interpreter without Lightning, from the file alone.)"""
    import ast

    path = Path(__file__).resolve().parents[1] / "project" / "net.py"
    tree = ast.parse(path.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and all(name == "torch" or name.startswith("torch.") for name in imported), imported


def test_pooling_before_relu_computes_what_relu_before_pooling_does():
    net = CNN(channels=(8, 16), hidden=24).eval()
    x = torch.randn(6, 1, 28, 28, requires_grad=True)
    conv1, pool1, _, conv2, pool2, _ = net.features
    reference = pool2(torch.relu(conv2(pool1(torch.relu(conv1(x))))))  # the classic order
    torch.testing.assert_close(net.features(x), torch.relu(reference), rtol=0, atol=0)
    assert [type(m).__name__ for m in CNN(batch_norm=True).features].count("BatchNorm2d") == 2
