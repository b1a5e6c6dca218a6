"""DDP that survives torchrun's restarts (``configs/elastic.yaml``, ``strategy.py``).

No command of its own: ``torchrun --max-restarts N -m project fit ... --config configs/elastic.yaml``.
Its tests are ``tests/test_elastic.py``.
"""

# last.ckpt also every N training steps, beside the recipe's every epoch (ModelCheckpoint takes one of the two per
# instance): a top-level key of its own (hooks.AddsCallbackKeys), set by configs/elastic.yaml.
CALLBACK_KEYS = {"step_checkpoint": "lightning.pytorch.callbacks.ModelCheckpoint"}
