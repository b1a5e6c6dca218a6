"""Tracking and profiling a run: MLflow (``mlflow.py``) or W&B (``wandb.py``) beside TensorBoard, a profiled fit.

No command of its own: ``--config configs/mlflow.yaml``, ``configs/wandb.yaml`` or ``configs/profile.yaml``
(``profiler.py``). Its extras are ``track`` (MLflow) and ``wandb``, its tests ``tests/test_track.py``; MLflow's cost
is measured beside the monitors' (docs/track.md).
"""
