"""Weight averaging (project.averaging.EMA, the `averaging` key): resumed exactly, validated, checkpointed
and tested on the averaged weights, the raw weights' accuracy logged beside."""

import shutil

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.averaging import EMA, ema_with_warmup
from project.checkpointing import load_checkpoint

AVERAGING = ["--averaging=project.averaging.EMA", "--averaging.init_args.decay=0.9"]


def test_the_average_follows_its_formula_with_the_warmup_cap():
    update = ema_with_warmup(decay=0.9, warmup=10)
    average, counter = [torch.zeros(3)], [torch.tensor(0)]
    for n, value in enumerate([1.0, 2.0, 3.0], start=1):
        update([*average, *counter], [torch.full((3,), value), torch.tensor(n)], torch.tensor(n))
    expected = 0.0
    for n, value in enumerate([1.0, 2.0, 3.0], start=1):
        d = min(0.9, (1 + n) / (10 + n))
        expected = d * expected + (1 - d) * value
    assert torch.allclose(average[0], torch.full((3,), expected)) and counter[0] == 3  # counters are copied


def test_a_resumed_run_ends_with_the_averaged_weights_of_an_uninterrupted_one(run_cli, tmp_path):
    """And the test can fail: the same resume from a checkpoint without the averaging state ends elsewhere."""
    deterministic = ["--trainer.deterministic=true", "--model.scheduler.init_args.total_steps=9", *AVERAGING]
    run_cli("fit", *deterministic, "--trainer.max_epochs=3", f"--trainer.logger.init_args.save_dir={tmp_path / 'a'}")
    run_cli("fit", *deterministic, "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path / 'b'}")
    last = "mnist/version_0/checkpoints/last.ckpt"
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    stripped = torch.load(tmp_path / "c" / last, weights_only=True)
    assert stripped["averaging_state"]["n_averaged"] == 3  # one epoch of 3 steps
    for key in ("averaging_state", "current_model_state"):  # a checkpoint of an averaging that keeps no state
        del stripped[key]
    torch.save(stripped, tmp_path / "c" / last)
    for folder in ("b", "c"):
        logs = f"--trainer.logger.init_args.save_dir={tmp_path / folder}"
        run_cli("fit", *deterministic, "--trainer.max_epochs=3", logs, "--ckpt_path=last")
    a, b, c = (load_checkpoint(tmp_path / folder / last) for folder in "abc")
    assert a["averaging_state"]["n_averaged"] == b["averaging_state"]["n_averaged"] == 9
    for part in ("state_dict", "current_model_state"):  # the average, and the raw weights
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), (part, key)
    assert not all(torch.equal(value, c["state_dict"][key]) for key, value in a["state_dict"].items())


def test_the_averaged_weights_are_checkpointed_and_tested_and_the_raw_accuracy_is_logged(run_cli):
    fitted = run_cli("fit", *AVERAGING, "--trainer.max_epochs=2", "--test_after_fit=true")
    events = EventAccumulator(fitted.trainer.logger.log_dir)
    events.Reload()
    shown = {tag: len(events.Scalars(tag)) for tag in events.Tags()["scalars"]}
    assert shown["val/acc"] == shown["val/acc_raw"] == 2  # one point per epoch each, in one TensorBoard run
    best = fitted.trainer.checkpoint_callback.best_model_path
    checkpoint = load_checkpoint(best)
    averaged, raw = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert not all(torch.equal(value, raw[key]) for key, value in averaged.items())
    # test_after_fit tested the averaged weights: the same figure as a test of the checkpoint in a new Trainer,
    # which reads state_dict only. (Lightning's callback alone would have tested the raw weights there.)
    tested = run_cli("test", f"--ckpt_path={best}")
    assert fitted.trainer.callback_metrics["test/loss"] == tested.trainer.callback_metrics["test/loss"]
    off = run_cli("fit", *AVERAGING, "--averaging=null")
    assert not [c for c in off.trainer.callbacks if isinstance(c, EMA)]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--averaging.init_args.decay=1.5", "decay must be between 0 and 1"),
        ("--averaging.init_args.warmup=-1", "warmup"),
    ],
)
def test_a_bad_averaging_value_is_refused_by_name(run_cli, capsys, option, message):
    with pytest.raises(SystemExit) as exit_:
        run_cli("fit", "--averaging=project.averaging.EMA", option)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
