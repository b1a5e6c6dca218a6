import subprocess
import sys
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
    """net.py is meant to be copied out on its own: loading it must not pull Lightning in."""
    path = Path(__file__).resolve().parents[1] / "project" / "net.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('net', {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod.CNN()\n"
        "assert not any(m.startswith(('lightning', 'pytorch_lightning')) for m in sys.modules), 'lightning imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
