"""MLflow beside TensorBoard (``configs/mlflow.yaml``): Lightning's logger, given the run's whole config as well."""

from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger

from project.lightning_cli import flatten


class MLFlowLogger(LightningMLFlowLogger):
    """Lightning's ``MLFlowLogger``; the CLI also hands it the resolved config, which it records as the run's
    parameters under ``config/...`` (beside the model's hyperparameters) and as the ``config.yaml`` artifact."""

    def log_config(self, config: dict, path: Path) -> None:
        """Record ``config`` (the resolved config as a dict) and the file it was saved to, ``path``."""
        self.log_hyperparams({f"config/{k}": v for k, v in flatten(config).items()})
        if path.is_file():
            self.experiment.log_artifact(self.run_id, str(path))
