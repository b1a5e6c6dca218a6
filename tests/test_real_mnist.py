"""Train the default model for one epoch on the real MNIST from $PATH_DATASETS (the ``mnist_ckpt`` fixture).

No skip when the data is absent: the run then fails with the data module's error that says how to provide it.
"""

import pytest

from project.__main__ import cli_main
from tests.conftest import DEFAULT_CONFIG


@pytest.mark.slow
def test_one_epoch_reaches_97_percent(mnist_ckpt, tmp_path):
    cli = cli_main(
        [
            "test",
            "--config",
            DEFAULT_CONFIG,
            f"--ckpt_path={mnist_ckpt}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ]
    )
    assert cli.trainer.callback_metrics["test/acc"] >= 0.97
