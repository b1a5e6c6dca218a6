import itertools
import math

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor

from project.schedules import WarmupCosineLR

STEPS_PER_EPOCH = 3  # run_cli's limit_train_batches


def lr_curve(cli) -> list[float]:
    monitor = next(c for c in cli.trainer.callbacks if isinstance(c, LearningRateMonitor))
    return monitor.lrs["lr-AdamW"]


@pytest.mark.parametrize("epochs", [2, 5, 10])
def test_the_default_schedule_follows_max_epochs(run_cli, epochs):
    cli = run_cli("fit", f"--trainer.max_epochs={epochs}", "--trainer.log_every_n_steps=1", "--early_stopping=null")
    lrs = lr_curve(cli)  # logged at every step, before that step's update
    assert len(lrs) == epochs * STEPS_PER_EPOCH
    assert lrs[0] == pytest.approx(1e-3)
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(lrs))  # never rises
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)  # the last step runs at the minimum
    assert lrs[len(lrs) // 2] > 0.2e-3  # and not before: half-way it is still about half the peak


def test_warm_up_then_anneal(run_cli):
    cli = run_cli(
        "fit",
        "--trainer.max_epochs=4",
        "--trainer.log_every_n_steps=1",
        "--early_stopping=null",
        "--model.scheduler.init_args.warmup_steps=4",
        "--model.scheduler.init_args.min_lr_ratio=0.1",
    )
    lrs = lr_curve(cli)
    assert lrs[:4] == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1e-3])
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(lrs[3:]))
    assert lrs[-1] == pytest.approx(0.1e-3)


def test_a_scheduler_without_a_horizon_is_left_alone(run_cli):
    cli = run_cli(
        "fit",
        "--trainer.max_epochs=3",
        "--early_stopping=null",
        "--model.scheduler=torch.optim.lr_scheduler.StepLR",
        "--model.scheduler.init_args.step_size=1",
        "--model.scheduler.init_args.gamma=0.5",
    )
    config = cli.trainer.lr_scheduler_configs[0]
    assert isinstance(config.scheduler, torch.optim.lr_scheduler.StepLR) and config.interval == "epoch"
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)


def test_the_factor_by_hand():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = WarmupCosineLR(optimizer, warmup_steps=2, total_steps=12)
    assert [scheduler.factor(s) for s in (0, 1)] == [0.5, 1.0]
    assert scheduler.factor(2) == 1.0 and scheduler.factor(11) == pytest.approx(0.0)
    assert scheduler.factor(2 + 9 / 2) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
    assert WarmupCosineLR(optimizer).factor(100) == 1.0  # no horizon yet: the base rate
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupCosineLR(optimizer, min_lr_ratio=2.0)


def test_a_resumed_run_anneals_over_its_own_length(run_cli, tmp_path):
    first = run_cli("fit", "--trainer.max_epochs=1", "--early_stopping=null", "--trainer.log_every_n_steps=1")
    assert lr_curve(first)[-1] == pytest.approx(0.0, abs=1e-12)  # a 1-epoch run anneals within its epoch
    resumed = run_cli(
        "fit", "--trainer.max_epochs=3", "--early_stopping=null", "--trainer.log_every_n_steps=1", "--ckpt_path=last"
    )
    scheduler = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.total_steps == 3 * STEPS_PER_EPOCH and scheduler.last_epoch == 3 * STEPS_PER_EPOCH
    lrs = lr_curve(resumed)  # steps 3..8 of a 9-step schedule: from near the peak down to zero
    assert lrs[0] == pytest.approx(1e-3 * scheduler.factor(3)) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
