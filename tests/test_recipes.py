"""benchmarks/recipes.py: the recipe table on made-up figures, and the folder recipe's data on synthetic digits."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipes():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # recipes.py imports its neighbour run.py, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("recipes", ROOT / "benchmarks" / "recipes.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


# >>> folder
def test_the_folder_recipe_reads_back_the_test_digits_with_their_labels(recipes, mnist_dir, tmp_path):
    from project.data import MNISTDataModule
    from project.folder.data import ImageFolderDataModule

    recipes.write_folders(str(mnist_dir), tmp_path / "digits")
    mnist = MNISTDataModule(data_dir=str(mnist_dir))
    mnist.setup("test")
    folder = ImageFolderDataModule(root=str(tmp_path / "digits"), val_fraction=0.1)
    folder.setup("fit")
    assert folder.class_names == [str(i) for i in range(10)]
    n = len(mnist.splits["test"])
    assert len(folder.splits["train"]) + len(folder.splits["val"]) == n
    # Every held-out image is one of the test digits, pixel for pixel, under the label MNIST gives it.
    images, labels = mnist.splits["test"].images, mnist.splits["test"].labels
    for i in range(len(folder.splits["val"])):
        x, y = folder.splits["val"][i]
        match = (images == x.squeeze(0)).flatten(1).all(dim=1).nonzero().flatten()
        assert len(match) >= 1 and int(labels[match[0]]) == int(y)


# <<< folder


def test_the_table_gives_mean_min_max_per_seed_and_the_ratio_to_the_loop(recipes):
    def run(acc: float, process: float) -> dict:
        return {
            "test_acc": acc,
            "epochs": 1,
            "fit_s": 6.0,
            "first_step_s": 5.0,
            "process_s": process,
            "precision": "32-true",
        }

    results = {"fast": [run(0.9910, 12.0), run(0.9904, 13.0), run(0.9922, 14.0)]}
    table = recipes.table(results, [7, 8, 9], baseline=[40.0, 26.0, 35.0])
    row = next(line for line in table.splitlines() if line.startswith("| `fast`"))
    assert "| 32-true | 0.9912 | 0.9904 | 0.9922 | 0.9910, 0.9904, 0.9922 | 1 | 6.0 | 5.0 | 13.0 |" in row
    assert "median **0.40** (0.30, 0.50, 0.40" in table  # each fast run over the loop run beside it
    assert "the promise, <= 0.40: held" in table
    assert row.endswith("| missed (min 0.9904 < 0.9905; mean 0.9912 < 0.9915) |")  # fast: each >= 99.05, mean 99.15
    assert "Seeds (`--seed_everything`): 7, 8, 9" in table
    kept = recipes.table({"fast": [run(0.9920, 12.0), run(0.9906, 12.0), run(0.9921, 12.0)]}, [1, 2, 3], [])
    assert "| held (each >= 0.9905, mean >= 0.9915) |" in kept


def test_the_table_gives_best_over_the_recipe_it_replaced_run_beside_it(recipes):
    def run(process: float) -> dict:
        return {
            "test_acc": 0.997,
            "epochs": 14,
            "fit_s": 1.0,
            "first_step_s": 1.0,
            "process_s": process,
            "precision": "x",
        }

    best, before = [run(300.0), run(330.0), run(280.0)], [run(300.0), run(275.0), run(280.0)]
    table = recipes.table({"best": best, "best-12": before}, [1, 2, 3], [])
    assert "median **1.00** (1.00, 1.20, 1.00; the promise, <= 1.10: held)" in table  # round by round, not medians
    slower = recipes.table({"best": [run(340.0)] * 3, "best-12": before}, [1, 2, 3], [])
    assert "median **1.21** (1.13, 1.24, 1.21; the promise, <= 1.10: missed)" in slower
    assert "`best` whole process" not in recipes.table({"best": best}, [1, 2, 3], [])  # no reference: no ratio


def test_a_seed_a_recipe_was_tuned_on_is_refused_before_anything_runs(recipes, monkeypatch):
    monkeypatch.setenv("PATH_DATASETS", "unused")
    tuned = recipes.TUNED_ON["fast"][0]
    monkeypatch.setattr(sys, "argv", ["recipes.py", "--recipes", "fast", "--seeds", str(tuned), "100", "101"])
    monkeypatch.setattr(recipes, "run_recipe", lambda argv: pytest.fail(f"ran {argv}"))
    with pytest.raises(SystemExit, match=rf"--seeds: {tuned} tuned a recipe run here"):
        recipes.main()
