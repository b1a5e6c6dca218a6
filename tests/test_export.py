import json
import subprocess
import sys

import pytest
import torch

import project.net as net_module
from project.__main__ import cli_main
from project.checkpointing import CheckpointError
from tests.conftest import ROOT, assert_help_shows_defaults
from tests.test_checkpointing import evil_checkpoint

pytest.importorskip("onnxruntime", reason="the export extra is not installed: pip install -e '.[export]'")


@pytest.fixture
def checkpoint(trained_ckpt) -> str:
    return str(trained_ckpt)


@pytest.fixture(scope="module")
def onnx_export(trained_ckpt, mnist_dir, tmp_path_factory) -> tuple:
    """One ONNX export of the shared checkpoint (the dynamo exporter takes seconds) and its report."""
    out = tmp_path_factory.mktemp("onnx") / "model.onnx"
    return out, export(str(trained_ckpt), "onnx", out, mnist_dir)


def check_set(checkpoint, mnist_dir):
    """What export checks and calibrates on for ``checkpoint``: its DataModule rebuilt, data from ``mnist_dir``."""
    from project.checkpointing import load_checkpoint
    from project.export.checks import check_data
    from project.inputs import read_contract

    saved = load_checkpoint(checkpoint)
    return check_data(saved, read_contract(saved, checkpoint), {"data_dir": str(mnist_dir)})


def export(checkpoint: str, fmt: str, out, data_dir, *extra: str) -> dict:
    args = ["export", f"--ckpt_path={checkpoint}", f"--format={fmt}", f"--output={out}", f"--data_dir={data_dir}"]
    return cli_main([*args, *extra])


def test_export_refuses_a_checkpoint_with_a_pickle_payload(trained_ckpt, tmp_path):
    evil, marker = evil_checkpoint(trained_ckpt, tmp_path)
    with pytest.raises(CheckpointError, match="was refused"):  # `python -m project` prints it as one line
        cli_main(["export", f"--ckpt_path={evil}", "--format=state_dict", f"--output={tmp_path / 'w.pt'}"])
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["onnx", "pt2", "state_dict"])
def test_export_matches_eager(checkpoint, onnx_export, mnist_dir, tmp_path, fmt):
    out = tmp_path / f"model.{fmt}"
    out, report = onnx_export if fmt == "onnx" else (out, export(checkpoint, fmt, out, mnist_dir))
    assert out.is_file() and report["size_bytes"] == out.stat().st_size
    assert report["checked_on"] == "the first 96 of 96 test images of MNISTDataModule"
    assert report["parity"]["ok"] and report["parity"]["max_abs_logit_diff"] <= 1e-4
    assert report["parity"]["same_argmax"]


def test_onnx_has_a_dynamic_batch_axis(onnx_export):
    import onnxruntime as ort

    out = onnx_export[0]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch in (1, 7, 300):
        logits = session.run(None, {session.get_inputs()[0].name: torch.randn(batch, 1, 28, 28).numpy()})[0]
        assert logits.shape == (batch, 10)


def test_pt2_loads_with_torch_export(checkpoint, mnist_dir, tmp_path):
    out = tmp_path / "m.pt2"
    report = export(checkpoint, "pt2", out, mnist_dir)
    # Weights plus a small graph: the example input is a copy, not a view dragging the test set's storage along.
    weights = sum(
        t.numel() * t.element_size() for t in torch.load(checkpoint, weights_only=True)["state_dict"].values()
    )
    assert report["size_bytes"] < 1.3 * weights + 200_000
    program = torch.export.load(str(out))
    assert program.module()(torch.randn(5, 1, 28, 28)).shape == (5, 10)


def test_state_dict_loads_into_a_plain_cnn_without_lightning(checkpoint, mnist_dir, tmp_path):
    out = tmp_path / "weights.pt"
    cli_main(
        ["export", f"--ckpt_path={checkpoint}", "--format=state_dict", f"--output={out}", f"--data_dir={mnist_dir}"]
    )
    config = json.loads(out.with_suffix(".json").read_text())
    assert config["class_path"] == "project.net.CNN" and config["init_args"]["num_classes"] == 10
    # A fresh interpreter that imports only torch and net.py: no Lightning in the loading path.
    code = (
        "import sys, json, torch, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('net', {net_module.__file__!r})\n"
        "net = importlib.util.module_from_spec(spec); spec.loader.exec_module(net)\n"
        f"cfg = json.load(open({str(out.with_suffix('.json'))!r}))\n"
        "model = net.CNN(**cfg['init_args'])\n"
        f"model.load_state_dict(torch.load({str(out)!r}, weights_only=True))\n"
        "assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)\n"
        "assert not any(m.startswith('lightning') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_int8_quantization_reports_size_and_accuracy(checkpoint, mnist_dir, tmp_path):
    out = tmp_path / "m.int8.onnx"
    report = export(checkpoint, "onnx", out, mnist_dir, "--quantize=int8")
    q = report["int8"]
    assert q["int8_bytes"] < 0.5 * q["fp32_bytes"] and q["size_reduction"] > 0.5  # the Linear weights dominate
    assert q["test_images"] == 96 and 0 <= q["int8_acc"] <= 1
    assert abs(q["acc_drop_points"] - 100 * (q["fp32_acc"] - q["int8_acc"])) < 1e-9


def test_bad_requests_are_refused(checkpoint, mnist_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match="onnx"):
        export(checkpoint, "pt2", tmp_path / "x", mnist_dir, "--quantize=int8")
    existing = tmp_path / "exists.onnx"
    existing.write_text("keep me")
    with pytest.raises(SystemExit):
        export(checkpoint, "onnx", existing, mnist_dir)
    assert existing.read_text() == "keep me" and "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
def test_static_int8_quantizes_the_convolutions_and_agrees_with_fp32(
    checkpoint, onnx_export, mnist_dir, tmp_path, quant_format
):
    import onnxruntime as ort

    from project.export.convert import run_onnx

    out = tmp_path / "static.onnx"
    report = export(
        checkpoint,
        "onnx",
        out,
        mnist_dir,
        "--quantize=static",
        f"--quant_format={quant_format}",
        "--calibration_images=64",
        # 96 test images: one flipped prediction is 1.04 points, and QDQ forced on a CPU without VNNI (AVX2)
        # saturates s8s8 products; the agreement below is what this test checks, the guard has a test of its own.
        "--max_drop=5",
    )
    q = report["int8"]
    # The second convolution and both Linear layers; the first convolution stays fp32 (faster, measured).
    convs = q["quantized_ops"].get("Conv", 0) + q["quantized_ops"].get("QLinearConv", 0)
    linears = sum(q["quantized_ops"].get(k, 0) for k in ("Gemm", "QGemm", "MatMul", "QLinearMatMul"))
    assert convs == 1 and linears == 2 and q["kept_fp32"] == ["first convolution"], q
    assert q["flatten_channels_last"], q
    assert q["calibration_split"] == "train" and q["calibration_images"] == 64 and q["test_images"] == 96
    assert q["format"].startswith("QDQ" if quant_format == "qdq" else "QOperator")
    assert q["int8_bytes"] < 0.5 * q["fp32_bytes"]
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = check_set(checkpoint, mnist_dir).images
    agree = (run_onnx(out, x).argmax(1) == run_onnx(onnx_export[0], x).argmax(1)).float().mean().item()
    assert agree >= 0.9


def test_flatten_channels_last_keeps_the_logits(checkpoint, onnx_export, mnist_dir, tmp_path):
    import onnx
    from onnxruntime.quantization import quant_pre_process

    from project.export.convert import run_onnx
    from project.export.quantize import flatten_channels_last

    rewritten = tmp_path / "nhwc.onnx"
    quant_pre_process(str(onnx_export[0]), str(rewritten), skip_symbolic_shape=True)  # with the shapes it reads
    assert flatten_channels_last(rewritten)
    transposes = [n for n in onnx.load(str(rewritten)).graph.node if n.op_type == "Transpose"]
    assert [list(n.attribute[0].ints) for n in transposes] == [[0, 2, 3, 1]]
    x = check_set(checkpoint, mnist_dir).images
    assert torch.allclose(run_onnx(rewritten, x), run_onnx(onnx_export[0], x), atol=1e-4)


def test_all_layers_quantizes_the_first_convolution_too(checkpoint, mnist_dir, tmp_path):
    report = export(checkpoint, "onnx", tmp_path / "all.onnx", mnist_dir, "--quantize=static", "--all_layers")
    ops = report["int8"]["quantized_ops"]  # QDQ (a CPU with VNNI): Conv; QOperator (without): QLinearConv
    assert ops.get("Conv", 0) + ops.get("QLinearConv", 0) == 2 and report["int8"]["kept_fp32"] == []


def test_calibration_reads_training_images_only(checkpoint, mnist_dir):
    from project.data import MEAN, STD
    from project.images import normalize
    from project.mnist_files import load_split

    images = check_set(checkpoint, mnist_dir).calibration(50)
    train, _ = load_split(mnist_dir / "MNIST" / "raw", "train")
    test, _ = load_split(mnist_dir / "MNIST" / "raw", "t10k")
    as_bytes = lambda t: {bytes(row.numpy()) for row in t}  # noqa: E731
    calibrated = as_bytes(images.reshape(len(images), -1))
    assert len(images) == 50
    assert calibrated <= as_bytes(normalize(train.unsqueeze(1), (MEAN,), (STD,)).reshape(len(train), -1))
    assert not calibrated & as_bytes(normalize(test.unsqueeze(1), (MEAN,), (STD,)).reshape(len(test), -1))


def test_the_accuracy_guard_writes_nothing(checkpoint, mnist_dir, tmp_path):
    out = tmp_path / "refused.onnx"
    with pytest.raises(ValueError, match=r"more than --max_drop -100.0: nothing was written"):
        export(checkpoint, "onnx", out, mnist_dir, "--quantize=static", "--max_drop=-100", "--calibration_images=32")
    assert not out.exists()


@pytest.mark.slow  # torch.compile of the network: ~30 s on 2 cores
def test_inference_benchmark_runs_every_format(trained_ckpt, mnist_dir, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("inference", ROOT / "benchmarks" / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    out = tmp_path / "table.md"
    inference.main(["--ckpt_path", str(trained_ckpt), "--data_dir", str(mnist_dir), "--quick", "--output", str(out)])
    table = out.read_text()
    for name in (
        "eager fp32",
        "torch.compile",
        "torch.export .pt2",
        "ONNX fp32",
        "ONNX int8 dynamic",
        "ONNX int8 static",
    ):
        assert f"| {name} |" in table, name
    assert "format chosen for this CPU" in table


def test_the_export_help_shows_the_defaults(capsys):
    assert_help_shows_defaults("export", "(default: 0.5)", capsys)


# >>> folder
def test_a_folder_model_exports_verified_on_its_own_images_with_its_own_contract(rgb_folder_ckpt, tmp_path):
    """RGB 32x32 from an image folder: checked on its held-out images, normalised per channel as in training, the
    checkpoint's contract in the ONNX metadata, static int8 calibrated on its own training images."""
    import onnxruntime as ort

    from project.export.convert import run_onnx

    ckpt, root = rgb_folder_ckpt
    contract = torch.load(ckpt, weights_only=True)["input"]
    assert (contract["size"], contract["channels"], contract["preparation"]) == (32, 3, "resize")
    assert len(set(contract["mean"])) == 3  # the tinted channels differ: per-channel mean and std
    fp32, int8 = tmp_path / "folder.onnx", tmp_path / "folder.int8.onnx"
    report = cli_main(["export", f"--ckpt_path={ckpt}", "--format=onnx", f"--output={fp32}", f"--data=root={root}"])
    held_out = round(0.1 * 3 * 24)  # data.val_fraction of the 72 images: the folder's test split is its val split
    assert report["checked_on"] == f"the first {held_out} of {held_out} test images of ImageFolderDataModule"
    assert report["parity"]["ok"] and report["input"] == contract
    meta = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    assert json.loads(meta["input"]) == contract and json.loads(meta["mean"]) == contract["mean"]
    args = ["export", f"--ckpt_path={ckpt}", "--format=onnx", f"--output={int8}", "--quantize=static"]
    static = cli_main([*args, "--calibration_images=32", "--max_drop=100"])["int8"]  # 7 images: 1 = 14 points
    assert static["calibration_split"] == "train" and static["calibration_images"] == 32
    assert static["test_images"] == held_out and sum(static["quantized_ops"].values()) >= 1
    meta = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    assert json.loads(meta["input"]) == contract
    logits = run_onnx(int8, torch.randn(5, 3, 32, 32))
    assert logits.shape == (5, 3)


def test_export_names_an_argument_the_datamodule_does_not_take(rgb_folder_ckpt, tmp_path):
    from project.errors import DataError

    ckpt, _ = rgb_folder_ckpt
    with pytest.raises(DataError, match=r"--data data_dir: ImageFolderDataModule takes none of these.*root"):
        cli_main(["export", f"--ckpt_path={ckpt}", "--format=onnx", f"--output={tmp_path / 'x.onnx'}", "--data_dir=d"])
    assert not (tmp_path / "x.onnx").exists()


# <<< folder
