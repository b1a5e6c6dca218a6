"""MLflow beside TensorBoard (``configs/mlflow.yaml``): Lightning's logger, given the run's whole config as well."""

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [2]}`` → ``{"a/b": 1, "c": "[2]"}``: a nested config as flat tracking parameters."""
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}/"))
        return flat
    return {prefix.rstrip("/"): tree if isinstance(tree, (int, float, str, bool)) or tree is None else str(tree)}


class MLFlowLogger(LightningMLFlowLogger):
    """Lightning's ``MLFlowLogger``; the CLI also hands it the resolved config, which it records as the run's
    parameters under ``config/...`` (beside the model's hyperparameters) and as the ``config.yaml`` artifact."""

    def log_config(self, config: dict, path: Path) -> None:
        """Record ``config`` (the resolved config as a dict) and the file it was saved to, ``path``."""
        self.log_hyperparams({f"config/{k}": v for k, v in flatten(config).items()})
        if path.is_file():
            self.experiment.log_artifact(self.run_id, str(path))
