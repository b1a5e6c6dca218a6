"""An HTTP prediction server with dynamic batching (LitServe), for a checkpoint or ONNX file.

The ``serve`` command, ``python -m project serve --ckpt_path CKPT`` (``server.py``), and what only it
needs: the processes' lifetime (``lifetime.py``), a listening socket per HTTP server (``reuse_port.py``),
and every workaround of LitServe's internals, for the LitServe versions they were tested with
(``litserve_workarounds.py``). Its extra is ``serve``, its tests ``tests/test_serve.py``, its benchmark
``benchmarks/serve.py``.
"""


def main(argv: list[str] | None = None) -> None:
    """Run the command: its heavy imports happen only now, once the command is known."""
    from project.serve.server import main as run

    run(argv)
