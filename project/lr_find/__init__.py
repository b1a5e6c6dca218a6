"""The learning-rate range test before fit: ``fit --config configs/lr_find.yaml``, its suggestion and curve.

``report.py``'s ``LearningRateReport`` is Lightning's ``LearningRateFinder`` plus the report (the suggested rate with
the command that trains with it, the loss-vs-rate curve in the run folder and TensorBoard), under a top-level key of
its own: ``--lr_find.num_training_steps 50`` (tests: ``test_lr_find.py``; page: ``docs/lr_find.md``).
"""

# The range test is a top-level callback key of its own (hooks.AddsCallbackKeys): `--lr_find.train_after true`.
CALLBACK_KEYS = {"lr_find": "lightning.pytorch.callbacks.LearningRateFinder"}
