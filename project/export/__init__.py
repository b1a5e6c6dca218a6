"""A checkpoint to ONNX (fp32 or int8), torch.export .pt2 or a state dict, verified.

The ``export`` command (``convert.py``) and the pruning callback whose sparse weights it exports
(``compression.py``, ``configs/prune.yaml``). Its extra is ``export``, its tests ``tests/test_export.py`` and
``tests/test_compression.py``, its benchmark ``benchmarks/inference.py``.
"""

# The pruning callback is a top-level key of its own (hooks.AddsCallbackKeys): `--pruning.sparsity 0.9`.
CALLBACK_KEYS = {"pruning": "lightning.pytorch.callbacks.ModelPruning"}


def main(argv: list[str] | None = None) -> object:
    """Run the command: its heavy imports happen only now, once the command is known."""
    from project.export.convert import main as run

    return run(argv)
