"""The images an export is checked and calibrated on: the checkpoint's own data, prepared by its input contract.

The DataModule is rebuilt from the checkpoint (its class path and arguments, as ``fit`` saved them), with the
caller's overrides (``--data_dir``, ``--data root=...``): an MNIST checkpoint is checked on the MNIST test set, a
folder-trained one on its own held-out images, each normalised as its contract says.
"""

import inspect
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Subset

from project.errors import DataError
from project.hooks import TakesInputContract
from project.inputs import InputContract
from project.runs import resolve


@dataclass
class CheckData:
    """Labelled, normalised images (N, C, S, S) of the checkpoint's test split, and where its training images are.

    Args:
        images: The test split's images, normalised by the contract.
        labels: Their classes (N,).
        described: What they are, for the report (``"96 test images of MNISTDataModule"``).
        datamodule: The rebuilt DataModule, set up for test; ``calibration`` sets it up for fit and draws from its
            training split.
        contract: The checkpoint's input contract.
    """

    images: Tensor
    labels: Tensor
    described: str
    datamodule: L.LightningDataModule
    contract: InputContract

    def calibration(self, n: int) -> Tensor:
        """``n`` training images (never the test split), drawn with a fixed seed, normalised: (n, C, S, S)."""
        self.datamodule.setup("fit")  # only now: the checks themselves read the test split alone
        train = self.datamodule.train_dataloader()
        order = torch.randperm(len(train.dataset), generator=torch.Generator().manual_seed(0))[:n]
        subset = DataLoader(Subset(train.dataset, order.tolist()), batch_size=256, collate_fn=train.collate_fn)
        return normalized(subset, self.contract)[0]


def normalized(loader: DataLoader, contract: InputContract) -> tuple[Tensor, Tensor]:
    """Every batch of ``loader`` as (images (N, C, S, S) normalised by ``contract``, labels (N,))."""
    images, labels = [], []
    for x, y in loader:
        # The in-memory DataModules give uint8 pixels; the per-image PIL path gives them normalised already.
        images.append(contract.normalize(x.view(-1, *contract.shape)) if x.dtype == torch.uint8 else x.float())
        labels.append(y.long())
    return torch.cat(images), torch.cat(labels)


def rebuild_datamodule(checkpoint: dict[str, Any], overrides: dict[str, Any]) -> L.LightningDataModule | None:
    """The checkpoint's DataModule, built again from its saved class path and arguments with ``overrides``.

    Returns:
        None when the checkpoint does not record its DataModule's class (one built in Python, not by the CLI).

    Raises:
        DataError: an override names an argument the DataModule does not take.
    """
    saved = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    cls = resolve(str(saved.get("_class_path", "")))
    if cls is None:
        return None
    accepted = inspect.signature(cls).parameters
    unknown = [key for key in overrides if key not in accepted]
    if unknown:
        names = ", ".join(p for p in accepted if p != "self")
        raise DataError(f"--data {', '.join(unknown)}: {cls.__name__} takes none of these. Its arguments: {names}.")
    kwargs = {k: v for k, v in saved.items() if not k.startswith("_") and k in accepted}
    return cls(**{**kwargs, **overrides, **({"predict_dir": None} if "predict_dir" in accepted else {})})


def check_data(checkpoint: dict[str, Any], contract: InputContract, overrides: dict[str, Any]) -> CheckData | None:
    """The checkpoint's test images and its training split for calibration, or None when its data is not here."""
    datamodule = rebuild_datamodule(checkpoint, overrides)
    if datamodule is None:
        return None
    try:
        datamodule.setup("test")
    except (DataError, OSError):  # the files are elsewhere: the fp32 checks run on random inputs
        return None
    if isinstance(datamodule, TakesInputContract):
        datamodule.load_input_contract(contract)
    images, labels = normalized(datamodule.test_dataloader(), contract)
    described = f"{len(labels)} test images of {type(datamodule).__name__}"
    return CheckData(images, labels, described, datamodule, contract)
