"""``python -m project export``: a checkpoint's network to ONNX, a torch.export program or plain weights, verified.

Every export is checked against the eager network on test images before the command reports success:
ONNX through onnxruntime, ``.pt2`` through ``torch.export.load``, the state dict through a fresh ``net`` built
from the checkpoint's hyperparameters. ``--quantize int8`` (ONNX) quantizes the Linear layers' weights to int8
with onnxruntime and measures the accuracy drop on the whole test set.
"""

import argparse
import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from project.checkpointing import CheckpointError, load_checkpoint
from project.data import MNISTDataError, MNISTDataModule, normalize
from project.module import MNISTClassifier

FORMATS = ("onnx", "pt2", "state_dict")
ATOL = 1e-4  # the largest logit difference an export may show against the eager network


def net_config(checkpoint: dict[str, Any], ckpt_path: str) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": {...}}`` that rebuilds the network of ``checkpoint`` (without weights).

    Raises:
        ValueError: the checkpoint does not describe its network (it was injected as an object from Python).
    """
    hparams = checkpoint.get("hyper_parameters", {})
    config = hparams.get("net")
    if config is None:  # MNISTClassifier built its default CNN
        return {"class_path": "project.net.CNN", "init_args": {"num_classes": hparams.get("num_classes", 10)}}
    if isinstance(config, dict) and "class_path" in config:
        return {"class_path": config["class_path"], "init_args": dict(config.get("init_args", {}))}
    raise ValueError(f"{ckpt_path} does not say how to build its network: export it with --format onnx or pt2.")


def build_net(config: dict[str, Any]) -> nn.Module:
    module, _, name = config["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**config["init_args"])


def test_images(data_dir: str | None, dataset: str = "mnist") -> tuple[Tensor, Tensor] | None:
    """The normalised test images (N, 1, 28, 28) and their labels (N,), or None without data."""
    dm = MNISTDataModule(data_dir=data_dir, dataset=dataset)
    try:
        dm.setup("test")
    except MNISTDataError:
        return None
    split = dm.splits["test"]
    return normalize(split.images, dm.mean, dm.std), split.labels


def run_onnx(path: Path, x: Tensor, batch: int = 1000) -> Tensor:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outs = [torch.from_numpy(session.run(None, {name: x[i : i + batch].numpy()})[0]) for i in range(0, len(x), batch)]
    return torch.cat(outs)


def parity(reference: Tensor, exported: Tensor) -> dict[str, Any]:
    max_diff = (reference - exported).abs().max().item()
    same_argmax = bool(torch.equal(reference.argmax(1), exported.argmax(1)))
    return {"max_abs_logit_diff": max_diff, "same_argmax": same_argmax, "ok": max_diff <= ATOL and same_argmax}


def export(
    ckpt_path: str,
    fmt: str,
    output: str,
    quantize: str | None = None,
    data_dir: str | None = None,
    samples: int = 256,
) -> dict[str, Any]:
    """Export the network of ``ckpt_path`` to ``output`` in ``fmt`` and return the verification report.

    Args:
        ckpt_path: A checkpoint written by ``fit``.
        fmt: ``"onnx"``, ``"pt2"`` or ``"state_dict"``.
        output: File to write; its parent folders are created.
        quantize: ``"int8"`` for dynamic int8 quantization of the Linear layers (ONNX only).
        data_dir: Folder holding ``MNIST/raw/`` for the checks; ``None`` means ``$PATH_DATASETS`` or ``data/``.
        samples: Test images the parity check runs on.

    Raises:
        ValueError: an unknown format, int8 with a format other than ONNX, or an export that does not match.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize must be int8, got {quantize!r}")
    if quantize and fmt != "onnx":
        raise ValueError("--quantize int8 is supported with --format onnx (onnxruntime dynamic quantization).")
    checkpoint = load_checkpoint(ckpt_path)  # refuses a missing, foreign or unsafe file, before anything else
    dataset = checkpoint.get("datamodule_hyper_parameters", {}).get("dataset", "mnist")
    model = MNISTClassifier.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True, compile=False)
    net = model.net.eval().to(memory_format=torch.contiguous_format)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)

    data = test_images(data_dir, dataset)  # read once: the parity check takes the first images, int8 all of them
    if data is None:  # no data: the checks still run, on random inputs of the training distribution
        x = torch.randn(samples, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        report: dict[str, Any] = {"checked_on": f"{samples} random inputs (no {dataset} test set found)"}
    else:
        x = data[0][:samples]
        report = {"checked_on": f"{len(x)} {dataset} test images"}
    with torch.no_grad():
        reference = net(x)
    report.update(format=fmt, output=str(out), checkpoint=str(ckpt_path))

    if fmt == "onnx":
        onnx_path = Path(tempfile.mkdtemp()) / "fp32.onnx" if quantize else out
        torch.onnx.export(
            net,
            (x[:2],),
            str(onnx_path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        report["parity"] = parity(reference, run_onnx(onnx_path, x))
        if quantize:
            report["int8"] = quantize_onnx(onnx_path, out, data)
    elif fmt == "pt2":
        # clone: a slice would drag the whole test set into the file (its storage, saved as sample input: 33 MB).
        program = torch.export.export(net, (x[:2].clone(),), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, str(out))
        with torch.no_grad():
            report["parity"] = parity(reference, torch.export.load(str(out)).module()(x))
    else:
        torch.save(net.state_dict(), out)
        config = net_config(checkpoint, ckpt_path)
        out.with_suffix(".json").write_text(json.dumps(config, indent=2) + "\n")
        fresh = build_net(config).eval()
        fresh.load_state_dict(torch.load(out, map_location="cpu", weights_only=True))
        with torch.no_grad():
            report["parity"] = parity(reference, fresh(x))
        report["net"] = config
    report["size_bytes"] = out.stat().st_size
    if not report["parity"]["ok"]:
        raise ValueError(f"The {fmt} export differs from the eager network: {report['parity']}")
    return report


def quantize_onnx(fp32: Path, int8: Path, data: tuple[Tensor, Tensor] | None) -> dict[str, Any]:
    """Quantize the MatMul/Gemm (Linear) weights of ``fp32`` to int8 into ``int8``; measure size, and accuracy on
    ``data`` (normalised test images and labels) when there is any."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    prepared = fp32.with_name("prepared.onnx")
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_dynamic(str(prepared), str(int8), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    result: dict[str, Any] = {
        "fp32_bytes": fp32.stat().st_size,
        "int8_bytes": int8.stat().st_size,
        "size_reduction": 1 - int8.stat().st_size / fp32.stat().st_size,
    }
    if data is not None:
        x, y = data
        fp32_acc = (run_onnx(fp32, x).argmax(1) == y).float().mean().item()
        int8_acc = (run_onnx(int8, x).argmax(1) == y).float().mean().item()
        result.update(
            test_images=len(y),
            fp32_acc=fp32_acc,
            int8_acc=int8_acc,
            acc_drop_points=100 * (fp32_acc - int8_acc),
        )
    return result


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also what the README test parses its documented commands with)."""
    parser = argparse.ArgumentParser(prog="python -m project export", description=__doc__)
    parser.add_argument("--ckpt_path", required=True, help="checkpoint written by fit")
    parser.add_argument("--format", choices=FORMATS, required=True, help="what to write")
    parser.add_argument("--output", required=True, help="file to write (.onnx, .pt2, .pt)")
    parser.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantization of Linear layers (onnx)")
    parser.add_argument("--data_dir", help="folder holding MNIST/raw/ for the checks (default: $PATH_DATASETS)")
    parser.add_argument("--samples", type=int, default=256, help="test images for the parity check")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if Path(args.output).exists() and not args.overwrite:
        parser.error(f"{args.output} exists: choose another --output or pass --overwrite")
    try:
        report = export(args.ckpt_path, args.format, args.output, args.quantize, args.data_dir, args.samples)
    except CheckpointError as exc:
        parser.error(str(exc))
    print(json.dumps(report, indent=2))
    return report
