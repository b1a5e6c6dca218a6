import csv
from pathlib import Path

from tests.conftest import N_TEST


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_predict_writes_one_row_per_test_image(run_cli, tmp_path):
    ckpt = run_cli("fit").trainer.checkpoint_callback.best_model_path
    cli = run_cli("predict", f"--ckpt_path={ckpt}", "--trainer.limit_predict_batches=null")
    rows = read_csv(tmp_path / "predictions.csv")
    assert len(rows) == N_TEST
    assert list(rows[0]) == ["index", "label", "pred", "prob"] + [f"prob_{c}" for c in range(10)] + ["error"]
    assert [int(r["index"]) for r in rows] == list(range(N_TEST))
    for r in rows[:5]:
        probs = [float(r[f"prob_{c}"]) for c in range(10)]
        assert abs(sum(probs) - 1) < 1e-4
        assert int(r["pred"]) == max(range(10), key=probs.__getitem__)
        assert float(r["prob"]) == max(probs)
    # The CSV agrees with what predict returned.
    preds = [int(p) for batch in cli.trainer.predict_loop.predictions for p in batch["preds"]]
    assert [int(r["pred"]) for r in rows] == preds


def test_existing_file_is_kept_unless_overwrite(run_cli, tmp_path):
    ckpt = run_cli("fit").trainer.checkpoint_callback.best_model_path
    mine = tmp_path / "predictions.csv"
    mine.write_text("my precious results\n")
    run_cli("predict", f"--ckpt_path={ckpt}")
    assert mine.read_text() == "my precious results\n"
    assert len(read_csv(tmp_path / "predictions-1.csv")) == 2 * 32  # limit_predict_batches=2, batch 32
    run_cli("predict", f"--ckpt_path={ckpt}")
    assert (tmp_path / "predictions-2.csv").is_file()


def test_overwrite_flag_replaces_the_file(mnist_dir, tmp_path):
    import lightning as L

    from project.data import MNISTDataModule
    from project.module import MNISTClassifier
    from project.writer import CSVPredictionWriter

    out = tmp_path / "out" / "p.csv"
    out.parent.mkdir()
    out.write_text("old\n")
    writer = CSVPredictionWriter(output=str(out), overwrite=True)
    trainer = L.Trainer(callbacks=[writer], logger=False, enable_progress_bar=False, limit_predict_batches=1)
    trainer.predict(MNISTClassifier(), datamodule=MNISTDataModule(data_dir=str(mnist_dir), batch_size=8))
    assert writer.written == out
    assert len(read_csv(out)) == 8
