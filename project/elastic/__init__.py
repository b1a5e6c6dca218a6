"""DDP that survives torchrun's restarts (``configs/elastic.yaml``, ``strategy.py``).

No command of its own: ``torchrun --max-restarts N -m project fit ... --config configs/elastic.yaml``.
Its tests are ``tests/test_elastic.py``.
"""
