"""Tracking and profiling a run: MLflow beside TensorBoard (``mlflow.py``), a short profiled fit (``profiler.py``).

No command of its own: ``--config configs/mlflow.yaml`` or ``--config configs/profile.yaml``. Its extra is ``track``,
its tests ``tests/test_track.py``; its cost is a variant of ``benchmarks/monitors.py``.
"""
