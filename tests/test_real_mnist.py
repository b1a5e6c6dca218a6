"""Train the default model for one epoch on the real MNIST from $PATH_DATASETS.

No skip when the data is absent: the run then fails with the data module's error that says how to provide it.
"""

import pytest

from project.cli import cli_main
from tests.conftest import DEFAULT_CONFIG


@pytest.mark.slow
def test_one_epoch_reaches_97_percent(tmp_path):
    cli = cli_main(
        [
            "fit",
            "--config",
            DEFAULT_CONFIG,
            "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_model_summary=false",
        ]
    )
    results = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best")
    assert results[0]["test/acc"] >= 0.97
