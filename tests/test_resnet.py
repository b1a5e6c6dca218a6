import torch

from project.module import MNISTClassifier
from project.resnet import SmallResNet


def test_shapes_and_batch_norm():
    net = SmallResNet(num_classes=7, width=8, blocks=2, dropout=0.2)
    assert net(torch.randn(3, 1, 28, 28)).shape == (3, 7)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_selected_by_class_path_and_reloaded_from_the_checkpoint(run_cli):
    cli = run_cli("fit", "--model.net.class_path=project.resnet.SmallResNet", "--model.net.init_args.width=8")
    assert isinstance(cli.model.net, SmallResNet)
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    loaded = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu")
    assert isinstance(loaded.net, SmallResNet) and loaded.net.head[-1].in_features == 32
    cli = run_cli("test", f"--ckpt_path={ckpt}")
    assert isinstance(cli.model.net, SmallResNet) and "test/acc" in cli.trainer.callback_metrics
