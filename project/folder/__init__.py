"""Training and predicting on your own images, one folder per class (``configs/folder.yaml``, ``data.py``).

No command of its own: ``fit`` / ``predict`` with ``--config configs/folder.yaml --data.root my_data``. Its tests are
``tests/test_folder.py``.
"""
