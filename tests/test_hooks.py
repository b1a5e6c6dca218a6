"""The optional hooks of hooks.py: the template's own classes implement them, and what reads them finds a class
of yours by the declared names alone (no base class), and works without them."""

from pathlib import Path

import torch
from lightning.pytorch.cli import ReduceLROnPlateau
from torch.optim.lr_scheduler import StepLR

from project.data import MNISTDataModule
from project.hooks import (
    FollowsTrainer,
    NamesPredictInputs,
    StatesInputContract,
    StepsEvery,
    StepsOnMetric,
    TakesASplit,
    TakesInputContract,
)
from project.inputs import stated_contract
from project.module import MNISTClassifier
from project.schedules import WarmupCosineLR


def test_the_templates_own_datamodule_and_schedulers_implement_the_declared_hooks():
    data = MNISTDataModule()
    for hook in (StatesInputContract, TakesInputContract, NamesPredictInputs, TakesASplit):
        assert isinstance(data, hook), hook.__name__
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    cosine = WarmupCosineLR(optimizer)
    assert isinstance(cosine, StepsEvery) and isinstance(cosine, FollowsTrainer)
    assert not isinstance(cosine, StepsOnMetric)
    assert isinstance(ReduceLROnPlateau(optimizer, monitor="val/loss"), StepsOnMetric)
    assert not isinstance(StepLR(optimizer, step_size=1), StepsEvery | StepsOnMetric | FollowsTrainer)


class Contracted:
    """A DataModule of your own, reduced to the one hook: no base class of the template's."""

    def input_contract(self):
        return MNISTDataModule().input_contract()


def test_a_class_of_yours_is_found_by_the_hooks_name_and_one_without_it_states_nothing():
    assert isinstance(Contracted(), StatesInputContract) and not isinstance(Contracted(), TakesInputContract)
    assert stated_contract(Contracted()) == MNISTDataModule().input_contract()  # type: ignore[arg-type]
    assert stated_contract(object()) is None  # type: ignore[arg-type]
    assert stated_contract(None) is None


class EveryStepOnAccuracy(StepLR):
    """A scheduler of yours that names its own interval and the metric it follows."""

    interval = "step"
    monitor = "val/acc"


def scheduler_config(scheduler, interval: str = "epoch") -> dict:
    model = MNISTClassifier(scheduler=lambda optimizer: scheduler(optimizer), scheduler_interval=interval)
    return model.configure_optimizers()["lr_scheduler"]


def test_a_schedulers_own_interval_and_monitor_win_and_without_them_the_modules_setting_applies():
    config = scheduler_config(lambda o: EveryStepOnAccuracy(o, step_size=1))
    assert (config["interval"], config["monitor"]) == ("step", "val/acc")
    config = scheduler_config(lambda o: StepLR(o, step_size=1), interval="step")
    assert config["interval"] == "step" and "monitor" not in config
    config = scheduler_config(lambda o: StepLR(o, step_size=1))
    assert config["interval"] == "epoch"


def test_predict_files_are_read_by_the_hook_from_any_object():
    class Named:
        predict_files = (Path("a.png"),)
        predict_failures = ((Path("b.png"), "not an image"),)

    assert isinstance(Named(), NamesPredictInputs) and not isinstance(Contracted(), NamesPredictInputs)


def test_a_features_callback_keys_are_top_level_keys_that_go_with_its_folder(monkeypatch, capsys):
    """A feature declares its callbacks' keys in its __init__.py (hooks.AddsCallbackKeys, e.g. `pruning`); the CLI
    adds them while the folder is there, and without it the key is unknown."""
    import types

    import pytest

    import project.runs
    from project.__main__ import cli_main
    from project.hooks import AddsCallbackKeys

    mine = types.ModuleType("mine")
    mine.CALLBACK_KEYS = {"swa": "lightning.pytorch.callbacks.StochasticWeightAveraging"}  # type: ignore[attr-defined]
    assert isinstance(mine, AddsCallbackKeys)
    args = ["fit", "--swa=lightning.pytorch.callbacks.StochasticWeightAveraging", "--swa.swa_lrs=0.01"]
    monkeypatch.setattr(project.runs, "features", lambda: [mine])
    with pytest.raises(SystemExit) as info:
        cli_main([*args, "--print_config"])
    assert info.value.code == 0 and "swa_lrs: 0.01" in capsys.readouterr().out
    monkeypatch.setattr(project.runs, "features", lambda: [])  # the folder deleted
    with pytest.raises(SystemExit) as info:
        cli_main([*args, "--print_config"])
    assert info.value.code == 2 and "--swa" in capsys.readouterr().err


def test_a_features_default_callbacks_are_on_until_switched_off_and_go_with_its_folder(monkeypatch, capsys):
    """A feature declares callbacks every run gets (hooks.AddsDefaultCallbacks; here a Timer): each is a
    top-level key that is on with no word in the recipe, `--key null` switches it off, and without the folder the
    key is unknown."""
    import types

    import pytest

    import project.runs
    from project.__main__ import cli_main
    from project.hooks import AddsDefaultCallbacks

    mine = types.ModuleType("mine")
    mine.DEFAULT_CALLBACKS = {"timer": "lightning.pytorch.callbacks.Timer"}  # type: ignore[attr-defined]
    assert isinstance(mine, AddsDefaultCallbacks)
    monkeypatch.setattr(project.runs, "features", lambda: [mine])

    def printed(*args: str) -> tuple[int, str]:
        with pytest.raises(SystemExit) as info:
            cli_main(["fit", *args, "--print_config"])
        out = capsys.readouterr()
        return info.value.code, out.out + out.err

    code, config = printed("--timer.interval=epoch")
    assert code == 0 and "timer:\n  class_path: lightning.pytorch.callbacks.Timer" in config, config
    assert "interval: epoch" in config
    code, config = printed("--timer=null")
    assert code == 0 and "\ntimer: null" in config, config
    monkeypatch.setattr(project.runs, "features", lambda: [])  # the folder deleted
    code, config = printed()
    assert code == 0 and "timer" not in config
    assert printed("--timer=null")[0] == 2
