"""``python -m project export``: a checkpoint's network to ONNX, a torch.export program or plain weights, verified.

Every export is checked against the eager network on test images before the command reports success:
ONNX through onnxruntime, ``.pt2`` through ``torch.export.load``, the state dict through a fresh ``net`` built
from the checkpoint's hyperparameters. ONNX int8, with onnxruntime's quantization tools:

- ``--quantize static``: the whole CNN (convolutions and Linear layers), weights and activations, calibrated on
  training images (never the test set), in the format that is fast on this CPU: QDQ signed int8 where the CPU has
  VNNI (AVX-512 VNNI, AVX-VNNI, AMX), else QOperator uint8 activations with reduce_range (AVX2 saturates s8s8).
- ``--quantize dynamic`` (alias ``int8``): the Linear layers' weights only; activations stay fp32.

Both measure fp32 and int8 accuracy on the whole test set and refuse to write a model that drops more than
``--max_drop`` points.
"""

import argparse
import importlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from project.checkpointing import CheckpointError, load_checkpoint
from project.cli import HelpFormatter
from project.data import MNISTDataError, MNISTDataModule, load_split, normalize, trained_on
from project.hardware import cpu_has_vnni
from project.module import MNISTClassifier

FORMATS = ("onnx", "pt2", "state_dict")
QUANTIZE = ("static", "dynamic", "int8")  # int8: dynamic, the name this command used first
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
    per_channel: bool = False,
    calibration_images: int = 512,
    quant_format: str = "auto",
    max_drop: float = 0.5,
    all_layers: bool = False,
) -> dict[str, Any]:
    """Export the network of ``ckpt_path`` to ``output`` in ``fmt`` and return the verification report.

    Args:
        ckpt_path: A checkpoint written by ``fit``.
        fmt: ``"onnx"``, ``"pt2"`` or ``"state_dict"``.
        output: File to write; its parent folders are created.
        quantize: ``"static"`` (whole network, calibrated) or ``"dynamic"`` / ``"int8"`` (Linear weights); ONNX only.
        data_dir: Folder holding ``MNIST/raw/`` for the checks; ``None`` means ``$PATH_DATASETS`` or ``data/``.
        samples: Test images the parity check runs on.
        per_channel: Static: one scale per output channel of each weight instead of one per tensor.
        calibration_images: Static: training images the activation ranges are calibrated on.
        quant_format: Static: ``"qdq"`` (signed int8), ``"qoperator"`` (uint8 activations, reduce_range) or
            ``"auto"``, which picks by the CPU: QDQ where it has VNNI, else QOperator.
        max_drop: Refuse (write nothing) when int8 accuracy is more than this many points below fp32.
        all_layers: Static: quantize the first convolution too (by default it stays fp32: faster, measured).

    Raises:
        ValueError: an unknown format, int8 with a format other than ONNX, an export that does not match, or an
            int8 model that loses more than ``max_drop`` points.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantize not in (None, *QUANTIZE):
        raise ValueError(f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize and fmt != "onnx":
        raise ValueError("--quantize is supported with --format onnx (onnxruntime quantization).")
    if quant_format not in ("auto", "qdq", "qoperator"):
        raise ValueError(f"--quant_format must be auto, qdq or qoperator, got {quant_format!r}")
    checkpoint = load_checkpoint(ckpt_path)  # refuses a missing, foreign or unsafe file, before anything else
    dataset = trained_on(checkpoint)["dataset"]
    model = MNISTClassifier.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True, compile=False)
    net = model.net.eval().to(memory_format=torch.contiguous_format)
    out = Path(output)

    data = test_images(data_dir, dataset)  # read once: the parity check takes the first images, int8 all of them
    if quantize == "static" and data is None:
        raise ValueError(
            f"--quantize static needs the {dataset} training images (calibration) and test images (the accuracy "
            "check): set PATH_DATASETS or --data_dir."
        )
    if data is None:  # no data: the checks still run, on random inputs of the training distribution
        x = torch.randn(samples, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        report: dict[str, Any] = {"checked_on": f"{samples} random inputs (no {dataset} test set found)"}
    else:
        x = data[0][:samples]
        report = {"checked_on": f"{len(x)} {dataset} test images"}
    with torch.no_grad():
        reference = net(x)
    report.update(format=fmt, output=str(out), checkpoint=str(ckpt_path))
    out.parent.mkdir(parents=True, exist_ok=True)

    if fmt == "onnx":
        # fp32 (when quantizing) and int8 are written here first; the folder is removed on the way out.
        with tempfile.TemporaryDirectory(prefix="export-") as tmp:
            work = Path(tmp)
            onnx_path = work / "fp32.onnx" if quantize else out
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
                int8 = work / "int8.onnx"
                if quantize == "static":
                    calibration = calibration_set(data_dir, dataset, calibration_images)
                    report["int8"] = quantize_static_onnx(
                        onnx_path, int8, calibration, per_channel, quant_format, all_layers
                    )
                else:
                    report["int8"] = quantize_dynamic_onnx(onnx_path, int8)
                report["int8"].update(compare_accuracy(onnx_path, int8, data))
                drop = report["int8"].get("acc_drop_points")
                if drop is not None and drop > max_drop:
                    raise ValueError(
                        f"int8 ({quantize}) accuracy {report['int8']['int8_acc']:.4f} is {drop:.2f} points below fp32 "
                        f"{report['int8']['fp32_acc']:.4f}, more than --max_drop {max_drop}: "
                        f"nothing was written to {out}. "
                        "Try --per_channel, more --calibration_images, or --quant_format qdq / qoperator."
                    )
                shutil.move(int8, out)
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
    if fmt == "onnx":
        describe_onnx(out, checkpoint, ckpt_path)
    report["size_bytes"] = out.stat().st_size
    if not report["parity"]["ok"]:
        raise ValueError(f"The {fmt} export differs from the eager network: {report['parity']}")
    return report


def describe_onnx(path: Path, checkpoint: dict[str, Any], ckpt_path: str) -> None:
    """Write what a server needs besides the weights into the ONNX file's metadata: classes and normalisation.

    A server reads them with ``session.get_modelmeta().custom_metadata_map``.
    """
    import onnx

    data = trained_on(checkpoint)
    props = {"checkpoint": str(ckpt_path), "dataset": data["dataset"], "mean": str(data["mean"])}
    props.update(std=str(data["std"]), class_names=json.dumps(data["class_names"]))
    net = checkpoint.get("hyper_parameters", {}).get("net")
    props["net"] = json.dumps(net if isinstance(net, dict) else None)  # None: the default CNN, or a net from code
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(path))


def calibration_set(data_dir: str | None, dataset: str, n: int) -> Tensor:
    """``n`` normalised images (n, 1, 28, 28) drawn (seeded) from the training file: never the test set."""
    dm = MNISTDataModule(data_dir=data_dir, dataset=dataset)
    images, _ = load_split(dm.raw_dir, "train")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:n]
    return normalize(images[order], dm.mean, dm.std)


def quantized_ops(path: Path) -> dict[str, int]:
    """Count the compute ops of an int8 ONNX model that run quantized: QLinear*/Integer ops (QOperator), or Conv,
    MatMul and Gemm fed by a DequantizeLinear (QDQ, which onnxruntime fuses into int8 kernels)."""
    import onnx

    graph = onnx.load(str(path)).graph
    dequantized = {o for node in graph.node if node.op_type == "DequantizeLinear" for o in node.output}
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if (
            node.op_type.startswith("QLinear")
            or node.op_type.endswith("Integer")
            or node.op_type == "QGemm"
            or (node.op_type in ("Conv", "MatMul", "Gemm") and any(i in dequantized for i in node.input))
        ):
            name = node.op_type
        else:
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts


def first_conv(path: Path) -> str | None:
    """The name of the Conv node that reads the model's input, if there is one."""
    import onnx

    graph = onnx.load(str(path)).graph
    inputs = {i.name for i in graph.input}
    return next((n.name for n in graph.node if n.op_type == "Conv" and n.input[0] in inputs), None)


def flatten_channels_last(path: Path) -> bool:
    """Rewrite ``path`` so the features are flattened in (H, W, C) order, the layout onnxruntime's int8 convolutions
    run in: ``Reshape(x) -> Gemm(W)`` becomes ``Transpose(x, NHWC) -> Reshape -> Gemm(W')``, with W's columns
    permuted to match, so the logits are the same. onnxruntime cancels the new Transpose against the one it would
    otherwise insert after the last int8 convolution to go back to NCHW (measured: 0.9 of 9.3 ms per batch of 256).

    Returns:
        Whether the pattern was found (a 4-D feature map flattened into a Gemm with constant weights) and rewritten.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.value_info}
    weights = {i.name: i for i in graph.initializer}
    for node in graph.node:
        if node.op_type not in ("Reshape", "Flatten") or len(shapes.get(node.input[0], [])) != 4:
            continue
        _, c, h, w = shapes[node.input[0]]
        readers = [n for n in graph.node if node.output[0] in n.input]
        if min(c, h, w) < 1 or shapes.get(node.output[0], [0, 0])[1:] != [c * h * w] or len(readers) != 1:
            continue
        gemm = readers[0]
        transposed = any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
        if gemm.op_type != "Gemm" or gemm.input[0] != node.output[0] or not transposed or gemm.input[1] not in weights:
            continue
        weight = numpy_helper.to_array(weights[gemm.input[1]])  # (out, C*H*W), columns in (C, H, W) order
        permuted = weight.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(weight.shape)
        weights[gemm.input[1]].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(permuted), gemm.input[1]))
        nhwc = f"{node.input[0]}_nhwc"
        position = list(graph.node).index(node)
        to_nhwc = helper.make_node("Transpose", [node.input[0]], [nhwc], "flatten_channels_last", perm=[0, 2, 3, 1])
        graph.node.insert(position, to_nhwc)
        node.input[0] = nhwc
        onnx.save(model, str(path))
        return True
    return False


def quantize_static_onnx(
    fp32: Path,
    int8: Path,
    calibration: Tensor,
    per_channel: bool = False,
    quant_format: str = "auto",
    all_layers: bool = False,
) -> dict[str, Any]:
    """Static int8 quantization of the Conv, MatMul and Gemm ops of ``fp32``, with activation ranges from
    ``calibration`` (normalised training images); the format follows the CPU unless ``quant_format`` says.

    The first convolution (on the raw image) stays fp32 unless ``all_layers``: with one input channel it has
    little to gain from int8 and its quantize/dequantize of the full-resolution maps costs more than it saves
    (measured: the whole model at 0.7x the fp32 throughput with it, 1.5x without it, on a 2-core AMX Xeon).
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quant_pre_process
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    class Images(CalibrationDataReader):
        def __init__(self, images: Tensor, batch: int = 64) -> None:
            self.batches = iter(images.split(batch))

        def get_next(self) -> dict[str, Any] | None:
            batch = next(self.batches, None)
            return None if batch is None else {"images": batch.numpy()}

    chosen = quant_format if quant_format != "auto" else ("qdq" if cpu_has_vnni() else "qoperator")
    prepared = fp32.with_name("prepared.onnx")
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)  # also infers the shapes used below
    channels_last = flatten_channels_last(prepared)
    excluded = [] if all_layers else [name for name in [first_conv(prepared)] if name]
    signed = chosen == "qdq"  # s8s8 needs VNNI to be fast; u8s8 with reduce_range avoids AVX2's saturation
    ort_quantize_static(
        str(prepared),
        str(int8),
        Images(calibration),
        quant_format=QuantFormat.QDQ if signed else QuantFormat.QOperator,
        activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        reduce_range=not signed,
        op_types_to_quantize=["Conv", "MatMul", "Gemm"],
        nodes_to_exclude=excluded,
    )
    return {
        "method": "static",
        "kept_fp32": ["first convolution"] if excluded else [],
        "flatten_channels_last": channels_last,
        "format": "QDQ s8s8" if signed else "QOperator u8s8 reduce_range",
        "chosen_because": "asked" if quant_format != "auto" else ("CPU has VNNI" if signed else "CPU without VNNI"),
        "per_channel": per_channel,
        "calibration_images": len(calibration),
        "calibration_split": "train",
        "quantized_ops": quantized_ops(int8),
        "fp32_bytes": fp32.stat().st_size,
        "int8_bytes": int8.stat().st_size,
        "size_ratio": int8.stat().st_size / fp32.stat().st_size,
    }


def quantize_dynamic_onnx(fp32: Path, int8: Path) -> dict[str, Any]:
    """Quantize the MatMul/Gemm (Linear) weights of ``fp32`` to int8 into ``int8`` (activations stay fp32)."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    prepared = fp32.with_name("prepared.onnx")
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_dynamic(str(prepared), str(int8), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    return {
        "method": "dynamic",
        "quantized_ops": quantized_ops(int8),
        "fp32_bytes": fp32.stat().st_size,
        "int8_bytes": int8.stat().st_size,
        "size_reduction": 1 - int8.stat().st_size / fp32.stat().st_size,
    }


def compare_accuracy(fp32: Path, int8: Path, data: tuple[Tensor, Tensor] | None) -> dict[str, Any]:
    """fp32 and int8 accuracy on ``data`` (normalised test images and labels), and the drop in points."""
    if data is None:
        return {}
    x, y = data
    fp32_acc = (run_onnx(fp32, x).argmax(1) == y).float().mean().item()
    int8_acc = (run_onnx(int8, x).argmax(1) == y).float().mean().item()
    return {
        "test_images": len(y),
        "fp32_acc": fp32_acc,
        "int8_acc": int8_acc,
        "acc_drop_points": 100 * (fp32_acc - int8_acc),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also what the README test parses its documented commands with)."""
    parser = argparse.ArgumentParser(
        prog="python -m project export", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("--ckpt_path", required=True, help="checkpoint written by fit")
    parser.add_argument("--format", choices=FORMATS, required=True, help="what to write")
    parser.add_argument("--output", required=True, help="file to write (.onnx, .pt2, .pt)")
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE,
        help="onnx int8: static (whole network, calibrated on training images) or dynamic / int8 (Linear weights)",
    )
    parser.add_argument("--per_channel", action="store_true", help="static: one weight scale per output channel")
    parser.add_argument("--calibration_images", type=int, default=512, help="static: training images to calibrate")
    parser.add_argument(
        "--quant_format", choices=["auto", "qdq", "qoperator"], default="auto", help="static: auto picks by the CPU"
    )
    parser.add_argument(
        "--max_drop", type=float, default=0.5, help="refuse an int8 model more than this many points below fp32"
    )
    parser.add_argument(
        "--all_layers", action="store_true", help="static: quantize the first convolution too (slower, measured)"
    )
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
        report = export(
            args.ckpt_path,
            args.format,
            args.output,
            args.quantize,
            args.data_dir,
            args.samples,
            args.per_channel,
            args.calibration_images,
            args.quant_format,
            args.max_drop,
            args.all_layers,
        )
    except CheckpointError as exc:
        parser.error(str(exc))
    print(json.dumps(report, indent=2))
    return report
