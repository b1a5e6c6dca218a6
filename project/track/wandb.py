"""Weights & Biases beside TensorBoard (``configs/wandb.yaml``): Lightning's logger, offline unless asked otherwise."""

import os
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger


def default_mode() -> str:
    """``$WANDB_MODE`` if set; else online where an API key is (``$WANDB_API_KEY``), else offline."""
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger``, offline by default, its files in the TensorBoard run's folder, given the config.

        Offline it needs no account and opens no connection; ``wandb sync <run>/wandb/offline-run-*`` uploads the run
        later. The CLI hands it the resolved config, recorded as the W&B run's config, and finishes the W&B run when the
    command is done (each fold or trial of a command that runs many fits is a run).

        Args:
            mode: ``"offline"``, ``"online"`` or ``"disabled"``; ``None``: ``$WANDB_MODE``, else ``"online"`` where
                ``$WANDB_API_KEY`` is set, else ``"offline"``.
            project: The W&B project the run belongs to.
            save_dir: Where W&B keeps its files (a ``wandb/`` folder); ``None``: the TensorBoard run's folder.
        name: The W&B run's name; ``None``: the TensorBoard run's, ``<name>/<version>``.
            log_model: Log the checkpoints as W&B artifacts: ``"all"`` as they are written (offline too: they are
                uploaded with the run by ``wandb sync``); ``True`` at the end, of one ModelCheckpoint only.
            **kwargs: Lightning's ``WandbLogger`` arguments (``name``, ``tags``, ``group``, ...), then ``wandb.init``'s.
    """

    def __init__(
        self,
        mode: Literal["offline", "online", "disabled"] | None = None,
        project: str = "mnist",
        save_dir: str | None = None,
        name: str | None = None,
        log_model: bool | Literal["all"] = False,
        **kwargs: Any,
    ) -> None:
        self.run_folder_given = save_dir is not None
        super().__init__(
            mode=mode or default_mode(),
            project=project,
            save_dir=save_dir,  # type: ignore[arg-type]  # None: W&B's own folder until use_run_folder sets one
            name=name,
            log_model=log_model,
            **kwargs,
        )

    def use_run_folder(self, folder: Path) -> None:
        """Keep W&B's files in ``folder`` (the TensorBoard run's) unless ``save_dir`` was given, and name the W&B run
        after it (``mnist/version_3``, ``cv_0/fold_2``) unless ``name`` was; called before the W&B run starts."""
        if self._experiment is not None:
            return
        if not self.run_folder_given:
            folder.mkdir(parents=True, exist_ok=True)  # wandb writes to a temporary folder instead of a missing one
            self._save_dir = self._wandb_init["dir"] = str(folder)
        if self._name is None:
            self._name = self._wandb_init["name"] = f"{folder.parent.name}/{folder.name}"

    def log_config(self, config: dict, path: Path) -> None:
        """Record ``config`` (the resolved config as a nested dict) as the W&B run's config; ``path`` is its file in
        the run folder, beside W&B's own files."""
        self.experiment.config.update(config, allow_val_change=True)  # config["trainer"]["max_epochs"], ...

    def finish(self) -> None:
        """End the W&B run (the CLI calls it when the command is done): the next fit in this process gets its own."""
        if self._experiment is not None:
            self._experiment.finish()
            self._experiment = None
