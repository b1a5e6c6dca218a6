import json
import subprocess
import sys

import pytest
import torch

import project.net as net_module
from project.cli import cli_main

pytest.importorskip("onnxruntime", reason="the export extra is not installed: pip install -e '.[export]'")


@pytest.fixture
def checkpoint(trained_ckpt) -> str:
    return str(trained_ckpt)


@pytest.fixture(scope="module")
def onnx_export(trained_ckpt, mnist_dir, tmp_path_factory) -> tuple:
    """One ONNX export of the shared checkpoint (the dynamo exporter takes seconds) and its report."""
    out = tmp_path_factory.mktemp("onnx") / "model.onnx"
    return out, export(str(trained_ckpt), "onnx", out, mnist_dir)


def export(checkpoint: str, fmt: str, out, data_dir, *extra: str) -> dict:
    args = ["export", f"--ckpt_path={checkpoint}", f"--format={fmt}", f"--output={out}", f"--data_dir={data_dir}"]
    return cli_main([*args, *extra])


@pytest.mark.parametrize("fmt", ["onnx", "pt2", "state_dict"])
def test_export_matches_eager(checkpoint, onnx_export, mnist_dir, tmp_path, fmt):
    out = tmp_path / f"model.{fmt}"
    out, report = onnx_export if fmt == "onnx" else (out, export(checkpoint, fmt, out, mnist_dir))
    assert out.is_file() and report["size_bytes"] == out.stat().st_size
    assert report["checked_on"] == "96 mnist test images"
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
