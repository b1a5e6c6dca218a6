import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.utilities.model_summary import ModelSummary

from project.__main__ import cli_main
from project.module import MNISTClassifier
from project.net import CNN
from project.schedules import WarmupCosineLR
from tests.conftest import DEFAULT_CONFIG, ROOT

# The fit configs the docs name alone (`fit --config configs/<name>.yaml`, no other --config beside it): each is
# meant to run alone. Your own configs, and those the docs show on top of another, are not held to that.
DOCUMENTED = " ".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
CONFIGS = sorted(set(re.findall(r"(?<!yaml )--config configs/([\w.-]+\.yaml)(?! --config)", DOCUMENTED)))
PACKAGE = cli_main.__module__.split(".")[0]  # "project", or the package_name a copy was given


def best_checkpoint(cli) -> str:
    path = cli.trainer.checkpoint_callback.best_model_path
    assert path and Path(path).is_file()
    return path


def print_config(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli_main(["fit", *args, "--print_config"])
    assert info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("overlay", CONFIGS)
def test_a_documented_overlay_alone_resolves_to_a_model_and_data_of_the_package(overlay, capsys):
    alone = print_config(capsys, "--config", str(ROOT / "configs" / overlay))
    assert "model:" in alone and f"\ndata:\n  class_path: {PACKAGE}." in alone


def test_an_overlay_runs_over_the_default_recipe(capsys):
    # The recipe is loaded before any --config, so an overlay alone is the overlay over default.yaml.
    overlay = str(ROOT / "configs" / "sgd.yaml")
    assert print_config(capsys, "--config", overlay) == print_config(
        capsys, "--config", DEFAULT_CONFIG, "--config", overlay
    )


def test_fit_without_a_config_is_the_default_recipe(capsys):
    # default.yaml is the CLI's own default, so it cannot drift from what `fit` runs.
    assert print_config(capsys) == print_config(capsys, "--config", DEFAULT_CONFIG)
    resolved = print_config(capsys)
    for line in ("test_after_fit: true", "monitor: val/acc", "class_path: project.checkpointing.AtomicCheckpointIO"):
        assert line in resolved, line
    # One place for the optimizer: LightningCLI's top-level optimizer/lr_scheduler keys are not added.
    assert "\noptimizer:" not in resolved and "\nlr_scheduler:" not in resolved


def test_fit_validate_test_predict(run_cli):
    cli = run_cli("fit")
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best"):
        assert key in metrics, key
    log_dir = Path(cli.trainer.log_dir)
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()
    assert (log_dir / "config.yaml").is_file()
    assert any(log_dir.glob("events.out.tfevents.*"))
    # The model summary ran the net on one image of the data's shape: real FLOPs, not "Total FLOPs: 0".
    summary = ModelSummary(cli.model)
    assert summary.in_sizes[0] == [1, 1, 28, 28] and summary.out_sizes[0] == [1, 10] and summary.total_flops > 0
    ckpt = best_checkpoint(cli)

    cli = run_cli("validate", f"--ckpt_path={ckpt}")
    assert "val/acc" in cli.trainer.callback_metrics
    cli = run_cli("test", f"--ckpt_path={ckpt}")
    assert {"test/loss", "test/acc"} <= set(cli.trainer.callback_metrics)

    cli = run_cli("predict", f"--ckpt_path={ckpt}")
    batches = cli.trainer.predict_loop.predictions
    assert len(batches) == 2
    assert batches[0]["preds"].shape == (32,) and batches[0]["probs"].shape == (32, 10)


@pytest.mark.parametrize("overlay", ["plateau.yaml", "sgd.yaml"])
def test_optimizer_and_scheduler_configs_train(run_cli, overlay):
    cli = run_cli("fit", "--trainer.max_epochs=2", config=(overlay,))
    optimizer = cli.trainer.optimizers[0]
    scheduler = cli.trainer.lr_scheduler_configs[0]
    if overlay == "plateau.yaml":
        assert isinstance(scheduler.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        assert scheduler.monitor == "val/loss"
    else:
        assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["nesterov"]
        assert isinstance(scheduler.scheduler, WarmupCosineLR) and scheduler.interval == "step"
    assert cli.trainer.current_epoch == 2


def test_default_recipe_is_adamw_with_cosine(run_cli):
    cli = run_cli("fit")
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["weight_decay"] == 1e-4
    assert isinstance(cli.trainer.lr_scheduler_configs[0].scheduler, WarmupCosineLR)
    assert cli.trainer.gradient_clip_val == 1.0


def test_checkpoint_round_trip_rebuilds_injected_net(run_cli, mnist_dir):
    cli = run_cli("fit", "--model.net.init_args.hidden=24", "--model.net.init_args.channels=[8, 16]")
    ckpt = best_checkpoint(cli)
    trained = cli.model.eval()

    torch.manual_seed(123)
    CNN(channels=(8, 16), hidden=24)  # building the net draws its initial weights from the RNG...
    expected = torch.get_rng_state()
    torch.manual_seed(123)
    loaded = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()  # no other argument
    # ...and loading for inference does nothing more: the checkpoint's saved RNG state is not restored.
    assert torch.equal(torch.get_rng_state(), expected)
    assert isinstance(loaded.net, CNN)
    # Its hparams stay a config, not a pickled module: a checkpoint saved from it loads with weights_only=True.
    assert loaded.hparams["net"]["class_path"] == "project.net.CNN"
    assert loaded.net.classifier[1].out_features == 24
    dm = cli.datamodule
    x = dm.on_after_batch_transfer(next(iter(dm.val_dataloader())), 0)[0]  # uint8 batch → normalised
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), trained(x))

    # `test --ckpt_path` with the default config rebuilds the smaller net from the checkpoint's hparams.
    cli = run_cli("test", f"--ckpt_path={ckpt}")
    assert cli.model.net.classifier[1].out_features == 24


def test_fit_ckpt_path_resumes(run_cli):
    first = run_cli("fit")
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    steps = first.trainer.global_step
    resumed = run_cli("fit", "--trainer.max_epochs=2", f"--ckpt_path={last}")
    assert resumed.trainer.current_epoch == 2
    assert resumed.trainer.global_step == 2 * steps


def test_bad_config_key_is_refused_before_training(run_cli, capsys):
    with pytest.raises(SystemExit):
        run_cli("fit", "--model.net.init_args.hiden=24")
    assert "hiden" in capsys.readouterr().err


def test_module_entry_point_and_console_script_list_every_command_without_importing_torch():
    for cmd in ([sys.executable, "-m", "project", "--help"], [str(Path(sys.executable).parent / "project"), "--help"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        for command in ("fit", "validate", "test", "predict"):  # the core's; a feature's: test_layout.py
            assert f"\n  {command} " in out, command
        assert out.startswith(f"usage: {'python -m ' + PACKAGE if '-m' in cmd else PACKAGE} <command>")
    no_args = subprocess.run([sys.executable, "-m", "project"], capture_output=True, text=True)
    assert no_args.returncode == 2 and "\n  predict " in no_args.stdout
    typo = subprocess.run([sys.executable, "-m", "project", "fti"], capture_output=True, text=True)
    assert typo.returncode == 2 and "Did you mean 'fit'" in typo.stderr
    code = "import sys; from project.__main__ import cli_main\n"
    code += "try: cli_main(['--help'])\nexcept SystemExit: pass\n"
    code += "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'heavy import for --help'"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_fit_help_shows_the_defaults_that_apply(capsys):
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: ")
    assert "(its test/acc goes into TensorBoard's HParams). (type: bool, default: True)" in out
    assert "--early_stopping" in out and "--checkpoint" in out
    assert "--optimizer " not in out and "--lr_scheduler " not in out


@pytest.mark.slow  # torch.compile: about 45 s on 2 cores
def test_compile_fit_and_predict_leave_plain_checkpoints(run_cli):
    cli = run_cli("fit", "--model.compile=true", "--model.net.init_args.channels=[4, 8]")
    ckpt = best_checkpoint(cli)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert state and not any("_orig_mod" in key for key in state)
    # Loads into an uncompiled model, which computes what the compiled one does.
    plain = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu", compile=False).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), cli.model.eval()(x), atol=1e-4, rtol=1e-4)
    cli = run_cli("predict", f"--ckpt_path={ckpt}", "--model.compile=true")
    assert cli.trainer.predict_loop.predictions[0]["probs"].shape == (32, 10)


def test_channels_last_and_default_precision(run_cli):
    from project.hardware import recommended_precision

    cli = run_cli("fit")
    conv = cli.model.net.features[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    # The default config leaves precision unset: the CLI picks the measured default for this machine.
    assert cli.trainer.precision == recommended_precision("cpu")
    cli = run_cli("fit", "--trainer.precision=32-true", "--model.channels_last=false")
    assert cli.trainer.precision == "32-true"
    assert cli.model.net.features[0].weight.is_contiguous()


@pytest.mark.parametrize(
    "flags",
    [
        ["--trainer.logger=false"],
        ["--trainer.enable_checkpointing=false"],
        ["--trainer.enable_progress_bar=false"],
        ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"],
    ],
)
def test_switching_a_trainer_feature_off_drops_what_needs_it(run_cli, lightning_log, tmp_path, flags):
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar

    from project.checkpointing import SaveOnInterrupt

    cli = run_cli("fit", *flags, "--test_after_fit=true")
    kinds = tuple(type(c) for c in cli.trainer.callbacks)
    off = {flag.split("=")[0].removeprefix("--trainer.") for flag in flags}
    assert any(issubclass(k, LearningRateMonitor) for k in kinds) == ("logger" not in off)
    assert any(issubclass(k, (ModelCheckpoint, SaveOnInterrupt)) for k in kinds) == ("enable_checkpointing" not in off)
    assert any(issubclass(k, ProgressBar) for k in kinds) == ("enable_progress_bar" not in off)
    assert cli.trainer.early_stopping_callback is not None  # what does not need the feature stays
    assert "test/acc" in cli.trainer.callback_metrics  # test_after_fit still ran
    notice = next(m for m in lightning_log if m.startswith("Switched off with their feature"))
    if "logger" in off:
        assert "LearningRateMonitor" in notice
        assert not list(tmp_path.glob("config*.yaml"))  # nothing dropped into the working directory
    if "enable_checkpointing" in off:
        assert "checkpoint: ModelCheckpoint" in notice and "last_checkpoint: ModelCheckpoint" in notice
        assert "SaveOnInterrupt" in notice and "final weights" in notice
    if "enable_progress_bar" in off:
        assert "RichProgressBar" in notice


def test_named_callbacks_change_from_the_command_line(run_cli):
    cli = run_cli("fit", "--early_stopping.patience=5", "--checkpoint.monitor=val/loss", "--checkpoint.mode=min")
    assert cli.trainer.early_stopping_callback.patience == 5
    assert cli.trainer.checkpoint_callback.monitor == "val/loss" and cli.trainer.checkpoint_callback.mode == "min"
    cli = run_cli("fit", "--early_stopping=null")
    assert cli.trainer.early_stopping_callback is None and cli.trainer.checkpoint_callback is not None


def test_model_overrides_beside_a_checkpoint_are_named_as_ignored(run_cli, trained_ckpt, lightning_log):
    cli = run_cli("test", f"--ckpt_path={trained_ckpt}", "--model.net.init_args.hidden=256", "--model.compile=false")
    assert cli.model.net.classifier[1].out_features == 128  # the checkpoint's network
    warning = next(m for m in lightning_log if m.startswith("Warning: ignored"))
    assert "--model.net.init_args.hidden" in warning and str(trained_ckpt) in warning
    assert "--model.compile" not in warning  # a runtime switch, not the architecture: it applies


def test_evaluations_get_their_own_folder_inside_the_run(run_cli, tmp_path):
    import json

    fit = run_cli("fit")
    run = Path(fit.trainer.log_dir)
    ckpt = best_checkpoint(fit)
    before = sorted(p.name for p in run.iterdir())
    events = {p: p.stat().st_size for p in run.glob("events.out.tfevents.*")}
    run_cli("test", f"--ckpt_path={ckpt}")
    run_cli("test", f"--ckpt_path={ckpt}", "--trainer.limit_test_batches=1")  # a partial test lands apart
    cli = run_cli("predict", f"--ckpt_path={ckpt}")
    assert sorted(p.name for p in run.iterdir()) == sorted([*before, "eval"])  # no config-1.yaml, no CSV
    assert {p: p.stat().st_size for p in run.glob("events.out.tfevents.*")} == events  # training curves untouched
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["predict_0", "test_0", "test_1"]
    for name in ("test_0", "test_1"):
        folder = run / "eval" / name
        assert (folder / "config.yaml").is_file() and any(folder.glob("events.out.tfevents.*"))
        assert str(ckpt) in (folder / "config.yaml").read_text()
        assert 0 <= json.loads((folder / "metrics.json").read_text())["test/acc"] <= 1
    assert Path(cli.trainer.log_dir) == run / "eval" / "predict_0"
    assert (run / "eval" / "predict_0" / "predictions.csv").is_file()


def test_a_default_fit_prints_only_what_the_user_needs(run_cli, lightning_log, recwarn):
    import warnings

    warnings.simplefilter("always")  # the CLI's own filters must hold, not pytest's
    run_cli("fit")
    printed = "\n".join(lightning_log)
    for noise in ("💡 Tip", "GPU available: False", "TPU available: False"):
        assert noise not in printed, noise
    assert not [w for w in recwarn if "LeafSpec" in str(w.message) or "many workers" in str(w.message)]


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a CUDA GPU")


@needs_no_gpu
@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            ["--config", "configs/16-mixed.yaml"],
            "trainer.accelerator='gpu' needs a CUDA GPU, and torch sees none on this machine. Use instead: "
            "configs/bf16-mixed.yaml on a CPU with native bf16",
        ),
        (["--config", "configs/ddp.yaml"], "Use instead: configs/ddp_cpu.yaml for several processes on this CPU"),
        (["--trainer.accelerator", "gpu"], "trainer.accelerator='gpu' needs a CUDA GPU"),
        (["--trainer.accelerator", "mps"], "trainer.accelerator='mps': not available on"),
        (["--trainer.devices", "0"], "trainer.devices='0': not available on this machine"),
    ],
)
def test_a_trainer_option_this_machine_cannot_run_is_one_error_line_naming_it(
    options, says, monkeypatch, capsys, tmp_path
):
    from project.__main__ import main

    monkeypatch.chdir(ROOT)  # the overlays by their relative paths, as the README writes them
    logs = f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}"
    monkeypatch.setattr(sys, "argv", ["project", "fit", *options, logs])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert says in lines[0]
    assert not (tmp_path / "logs").exists()  # refused before any run folder was made


@needs_no_gpu
def test_project_traceback_shows_lightnings_own_error_for_a_trainer_option(monkeypatch):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from project.__main__ import main

    monkeypatch.setenv("PROJECT_TRACEBACK", "1")
    monkeypatch.setattr(sys, "argv", ["project", "fit", "--trainer.accelerator", "gpu", "--trainer.logger", "false"])
    with pytest.raises(RuntimeError) as info:
        main()
    assert isinstance(info.value.__cause__, MisconfigurationException)


def test_a_misspelt_option_gets_the_closest_real_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["fit", "--trainer.max_epocs=2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "--trainer.max_epocs: did you mean --trainer.max_epochs" in err, err[-800:]
    with pytest.raises(SystemExit) as exit_:  # an argument of the DataModule's class_path: not a 10-line Union error
        cli_main(["fit", "--data.batch_sise", "64"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Union" not in err
    assert "--data.batch_sise: project.data.MNISTDataModule has no argument 'batch_sise'." in err, err[-800:]
    assert "Did you mean --data.batch_size?" in err


def test_ckpt_path_best_and_last_name_the_newest_runs_checkpoints(run_cli, tmp_path):
    """A new process's `test --ckpt_path best` is the newest run's best checkpoint (Lightning's own "best" names a
    fit of the same process only), into that run's eval folder."""
    fit = run_cli("fit", "--trainer.max_epochs=2")
    best = Path(fit.trainer.checkpoint_callback.best_model_path)
    for keyword, expected in (("best", best), ("last", best.parent / "last.ckpt")):
        cli = run_cli("test", f"--ckpt_path={keyword}")
        assert Path(cli.trainer.ckpt_path) == expected
        assert Path(cli.trainer.log_dir).parent == best.parents[1] / "eval"
    with pytest.raises(SystemExit):  # no run under another folder: one error naming it
        run_cli("test", "--ckpt_path=best", f"--trainer.logger.init_args.save_dir={tmp_path / 'none'}")
