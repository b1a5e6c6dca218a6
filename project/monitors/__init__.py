"""Seeing inside a run: pictures of the inputs and the mistakes, per-layer weight and gradient histograms, and
training throughput, in every run's TensorBoard.

Three callbacks (``pictures.py``, ``callbacks.py``), each under a top-level key of its own that every run gets unless
it is switched off: ``--pictures.worst 48``, ``--histograms null``, ``--throughput.window_size 20``
(docs/monitors.md; tests: ``tests/test_monitors.py``).
"""

# Callbacks on by default, declared to the CLI through hooks.AddsDefaultCallbacks: key -> class.
DEFAULT_CALLBACKS = {
    "pictures": "project.monitors.pictures.TensorBoardImages",
    "histograms": "project.monitors.callbacks.LayerHistograms",
    "throughput": "project.monitors.callbacks.Throughput",
}
