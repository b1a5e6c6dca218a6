"""Pruning with fine-tuning (configs/prune.yaml): the sparsity asked for, plain weights, a checkpoint like any other."""

import itertools

import pytest
import torch

from project.export.compression import GradualPruning
from project.module import MNISTClassifier
from tests.conftest import ROOT


def test_prune_overlay_fine_tunes_to_the_target_sparsity(run_cli, trained_ckpt):
    cli = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "prune.yaml"),
        "--trainer.max_epochs=3",
        f"--model.init_from={trained_ckpt}",
        "--pruning.sparsity=0.8",  # a key of its own: the overlay copies no callback list
    )
    assert "callbacks:" not in (ROOT / "configs" / "prune.yaml").read_text()
    callbacks = [type(c).__name__ for c in cli.trainer.callbacks]
    assert "GradualPruning" in callbacks and "LearningRateMonitor" in callbacks, callbacks  # default.yaml's list kept
    best = cli.trainer.checkpoint_callback.best_model_path
    assert "pruned-epoch02" in best  # the last, fully pruned epoch is the one kept
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not any(k.endswith(("_orig", "_mask")) for k in state)  # permanent: plain weight tensors
    weights = [v for k, v in state.items() if k.endswith("weight") and v.dim() > 1]  # Conv and Linear weights
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(0.8, abs=0.005)
    model = MNISTClassifier.load_from_checkpoint(best, map_location="cpu")
    assert sum(int((p == 0).sum()) for p in model.net.parameters() if p.dim() > 1) > 0
    # It started from the trained weights, not from scratch: the surviving weights are the trained ones, fine-tuned.
    start = torch.load(trained_ckpt, weights_only=True)["state_dict"]
    kept = state["net.classifier.1.weight"] != 0
    change = (state["net.classifier.1.weight"] - start["net.classifier.1.weight"])[kept].abs().mean()
    assert change < start["net.classifier.1.weight"].abs().mean()


def test_the_ramp_reaches_the_target_before_the_last_epoch():
    pruning = GradualPruning(sparsity=0.9)
    pruning.epochs = 5
    targets = [pruning.target_at(e) for e in range(5)]
    assert targets[3] == pytest.approx(0.9) and targets[4] == pytest.approx(0.9)
    assert all(b >= a for a, b in itertools.pairwise(targets))
    remaining = 1.0
    for e in range(5):  # the iterative amounts compound to the target
        remaining *= 1 - pruning.amount_at(e)
    assert 1 - remaining == pytest.approx(0.9)


def test_init_from_a_checkpoint_of_another_network_is_a_clear_error(run_cli, trained_ckpt):
    from project.checkpointing import CheckpointError

    with pytest.raises(CheckpointError, match="do not fit this network"):
        run_cli("fit", f"--model.init_from={trained_ckpt}", "--model.net.init_args.hidden=32")
