import subprocess
import sys
from pathlib import Path

import pytest
import torch

from project.cli import cli_main
from project.module import MNISTClassifier
from project.net import CNN
from tests.conftest import DEFAULT_CONFIG, ROOT

CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


def best_checkpoint(cli) -> str:
    path = cli.trainer.checkpoint_callback.best_model_path
    assert path and Path(path).is_file()
    return path


@pytest.mark.parametrize("overlay", CONFIGS)
def test_every_config_parses(overlay, capsys):
    configs = ["--config", DEFAULT_CONFIG]
    if overlay != "default.yaml":
        configs += ["--config", str(ROOT / "configs" / overlay)]
    with pytest.raises(SystemExit) as info:
        cli_main(["fit", *configs, "--print_config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert "model:" in printed and "data_dir: null" in printed


def test_fit_validate_test_predict(run_cli):
    cli = run_cli("fit")
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best"):
        assert key in metrics, key
    log_dir = Path(cli.trainer.log_dir)
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()
    assert (log_dir / "config.yaml").is_file()
    assert any(log_dir.glob("events.out.tfevents.*"))
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
        assert isinstance(scheduler.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)
    assert cli.trainer.current_epoch == 2


def test_default_recipe_is_adamw_with_cosine(run_cli):
    cli = run_cli("fit")
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["weight_decay"] == 1e-4
    assert isinstance(cli.trainer.lr_scheduler_configs[0].scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)
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


def test_module_entry_point_and_console_script():
    for cmd in ([sys.executable, "-m", "project", "--help"], [str(Path(sys.executable).parent / "project"), "--help"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert "fit" in out and "predict" in out


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


def test_enable_progress_bar_false_drops_the_configured_progress_bar(run_cli):
    from lightning.pytorch.callbacks import ProgressBar

    cli = run_cli("fit", "--trainer.enable_progress_bar=false")
    assert not any(isinstance(c, ProgressBar) for c in cli.trainer.callbacks)
    assert cli.trainer.checkpoint_callback is not None  # the other configured callbacks stay
