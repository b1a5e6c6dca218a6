import json
from pathlib import Path

from PIL import Image

from project.lr_find.report import LearningRateReport
from tests.conftest import ROOT


def test_lr_find_overlay_saves_the_curve_and_prints_a_usable_suggestion(run_cli, lightning_log, tmp_path):
    cli = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "lr_find.yaml"),
        "--trainer.limit_train_batches=null",
        "--data.batch_size=4",  # 32 batches in the synthetic training split: the search runs within one epoch
        "--lr_find.num_training_steps=30",
        "--lr_find.min_lr=1e-5",
        "--lr_find.max_lr=0.5",
    )
    assert "callbacks:" not in (ROOT / "configs" / "lr_find.yaml").read_text()  # a key of its own, no list copied
    finder = next(c for c in cli.trainer.callbacks if isinstance(c, LearningRateReport))
    assert isinstance(finder.suggestion, float) and 1e-5 <= finder.suggestion <= 0.5
    run = Path(cli.trainer.log_dir)
    with Image.open(run / "lr_find.png") as image:
        assert image.size == (640, 400)
    record = json.loads((run / "lr_find.json").read_text())
    assert record["suggestion"] == finder.suggestion and len(record["lr"]) == len(record["loss"]) > 10
    assert cli.trainer.global_step == 0  # the search only: the model is restored and not trained
    line = next(m for m in lightning_log if m.startswith("Learning-rate finder: suggested"))
    assert f"--model.optimizer.init_args.lr {finder.suggestion:.3g}" in line
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"images": 1})
    events.Reload()
    assert "lr_find/loss_vs_lr" in events.Tags()["images"]
