import csv
from pathlib import Path

import pytest

from tests.conftest import N_TEST


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_predict_writes_one_row_per_test_image_into_the_run_folder(run_cli, trained_ckpt, tmp_path):
    cli = run_cli("predict", f"--ckpt_path={trained_ckpt}", "--trainer.limit_predict_batches=null")
    path = Path(cli.trainer.log_dir) / "predictions.csv"
    assert not (tmp_path / "predictions.csv").exists()  # never into the working directory
    rows = read_csv(path)
    assert len(rows) == N_TEST
    assert list(rows[0]) == ["index", "label", "pred", "pred_name", "prob"] + [f"prob_{c}" for c in range(10)] + [
        "error"
    ]
    assert [int(r["index"]) for r in rows] == list(range(N_TEST))
    for r in rows[:5]:
        probs = [float(r[f"prob_{c}"]) for c in range(10)]
        assert abs(sum(probs) - 1) < 1e-4
        assert int(r["pred"]) == max(range(10), key=probs.__getitem__)
        assert float(r["prob"]) == max(probs)
    # The CSV agrees with what predict returned.
    preds = [int(p) for batch in cli.trainer.predict_loop.predictions for p in batch["preds"]]
    assert [int(r["pred"]) for r in rows] == preds


@pytest.fixture
def predict_with_writer(mnist_dir):
    import lightning as L

    from project.data import MNISTDataModule
    from project.module import MNISTClassifier
    from project.writer import CSVPredictionWriter

    def predict(out: Path, overwrite: bool) -> CSVPredictionWriter:
        writer = CSVPredictionWriter(output=str(out), overwrite=overwrite)
        trainer = L.Trainer(callbacks=[writer], logger=False, enable_progress_bar=False, limit_predict_batches=1)
        trainer.predict(MNISTClassifier(), datamodule=MNISTDataModule(data_dir=str(mnist_dir), batch_size=8))
        return writer

    return predict


def test_existing_file_is_kept_unless_overwrite(predict_with_writer, tmp_path):
    mine = tmp_path / "predictions.csv"
    mine.write_text("my precious results\n")
    assert predict_with_writer(mine, overwrite=False).written == tmp_path / "predictions-1.csv"
    assert mine.read_text() == "my precious results\n"
    assert len(read_csv(tmp_path / "predictions-1.csv")) == 8
    assert predict_with_writer(mine, overwrite=False).written == tmp_path / "predictions-2.csv"
    assert predict_with_writer(mine, overwrite=True).written == mine
    assert len(read_csv(mine)) == 8
