"""``python -m project export``: a checkpoint's network to ONNX, torch.export or plain weights, verified.

Every export is checked against the eager network before the command reports success (one ``verify`` step
for every format): ONNX through onnxruntime, ``.pt2`` through ``torch.export.load``, the state dict through
a fresh ``net`` built from the checkpoint's hyperparameters. The checks run on the checkpoint's own test
images, prepared and normalised as its input contract says (``project.inputs``), or on random inputs of its
shape when the data is not here. ONNX int8 (``--quantize static`` or ``dynamic``, ``quantize.py``) is also
measured against fp32 on the whole test split, and refused when it loses more than ``--max_drop`` points.
An ONNX file carries the contract in its metadata, for whatever runs it (a server: docs/export.md).
"""

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from project.checkpointing import load_checkpoint
from project.errors import UserError
from project.export.checks import CheckData, check_data
from project.export.quantize import quantize_dynamic_onnx, quantize_static_onnx
from project.inputs import InputContract, read_contract
from project.module import MNISTClassifier
from project.runs import resolve


class ExportError(UserError, ValueError):
    """An export that cannot be made or would not be faithful, named with the remedy; nothing was written."""


QUANTIZE = ("static", "dynamic", "int8")  # int8: dynamic, the name this command used first
ATOL = 1e-4  # the largest logit difference an export may show against the eager network
# An exporter writes ``net`` to a file and returns a function that runs the written file (images -> logits) and
# what the report should add about it.
Exporter = Callable[[nn.Module, Tensor, Path, dict[str, Any]], tuple[Callable[[Tensor], Tensor], dict[str, Any]]]


def net_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": {...}}`` that rebuilds the network of ``checkpoint`` (without weights).

    Raises:
        ExportError: the checkpoint does not describe its network (it was injected as an object from Python).
    """
    hparams = checkpoint.get("hyper_parameters", {})
    config = hparams.get("net")
    if config is None:  # MNISTClassifier built its default CNN
        return {"class_path": "project.net.CNN", "init_args": {"num_classes": hparams.get("num_classes", 10)}}
    if isinstance(config, dict) and "class_path" in config:
        return {"class_path": config["class_path"], "init_args": dict(config.get("init_args", {}))}
    raise ExportError("the checkpoint does not say how to build its network: export it with --format onnx or pt2.")


def build_net(config: dict[str, Any]) -> nn.Module:
    """The network ``net_config`` describes, with fresh weights."""
    cls = resolve(config["class_path"])
    if cls is None:
        raise ExportError(f"cannot import the network class {config['class_path']}.")
    return cls(**config["init_args"])


def run_onnx(path: Path, x: Tensor, batch: int = 1000) -> Tensor:
    """Logits of the ONNX model at ``path`` for normalised images ``x``, through onnxruntime on the CPU."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outs = [torch.from_numpy(session.run(None, {name: x[i : i + batch].numpy()})[0]) for i in range(0, len(x), batch)]
    return torch.cat(outs)


def to_onnx(net: nn.Module, example: Tensor, out: Path, checkpoint: dict[str, Any]) -> tuple[Callable, dict]:
    """Dynamo-based ``torch.onnx.export`` with a dynamic batch axis, one self-contained file."""
    torch.onnx.export(
        net,
        (example,),
        str(out),
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    return (lambda x: run_onnx(out, x)), {}


def to_pt2(net: nn.Module, example: Tensor, out: Path, checkpoint: dict[str, Any]) -> tuple[Callable, dict]:
    """A ``torch.export`` program with a dynamic batch axis."""
    # clone: a slice would drag the whole test set into the file (its storage, saved as the sample input).
    program = torch.export.export(net, (example.clone(),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, str(out))
    return torch.export.load(str(out)).module(), {}


def to_state_dict(net: nn.Module, example: Tensor, out: Path, checkpoint: dict[str, Any]) -> tuple[Callable, dict]:
    """The plain weights, and ``<output>.json`` with the network's class and arguments: no Lightning to load them."""
    config = net_config(checkpoint)
    torch.save(net.state_dict(), out)
    out.with_suffix(".json").write_text(json.dumps(config, indent=2) + "\n")
    fresh = build_net(config).eval()
    fresh.load_state_dict(torch.load(out, map_location="cpu", weights_only=True))
    return fresh, {"net": config}


EXPORTERS: dict[str, Exporter] = {"onnx": to_onnx, "pt2": to_pt2, "state_dict": to_state_dict}


def verify(reference: Tensor, exported: Callable[[Tensor], Tensor], x: Tensor) -> dict[str, Any]:
    """How far the exported model's logits on ``x`` are from the eager network's (``reference``)."""
    with torch.no_grad():
        logits = exported(x)
    max_diff = (reference - logits).abs().max().item()
    same_argmax = bool(torch.equal(reference.argmax(1), logits.argmax(1)))
    return {"max_abs_logit_diff": max_diff, "same_argmax": same_argmax, "ok": max_diff <= ATOL and same_argmax}


def export(
    ckpt_path: str,
    fmt: str,
    output: str,
    *,
    quantize: str | None = None,
    data: dict[str, Any] | None = None,
    samples: int = 256,
    per_channel: bool = False,
    calibration_images: int = 512,
    quant_format: str = "auto",
    max_drop: float = 0.5,
    all_layers: bool = False,
) -> dict[str, Any]:
    """Export the network of ``ckpt_path`` to ``output`` in ``fmt``, verify it, and return the report.

    Args:
        ckpt_path: A checkpoint written by ``fit``.
        fmt: ``"onnx"``, ``"pt2"`` or ``"state_dict"``.
        output: File to write; its parent folders are created.
        quantize: ``"static"`` (whole network, calibrated) or ``"dynamic"`` / ``"int8"`` (Linear weights); ONNX only.
        data: Arguments of the checkpoint's DataModule to change for the checks (``{"data_dir": ...}``,
            ``{"root": ...}``): where its files are on this machine.
        samples: Test images the parity check runs on.
        per_channel: Static: one scale per output channel of each weight instead of one per tensor.
        calibration_images: Static: training images the activation ranges are calibrated on.
        quant_format: Static: ``"qdq"``, ``"qoperator"`` or ``"auto"`` (QDQ where the CPU has VNNI).
        max_drop: Refuse (write nothing) when int8 accuracy is more than this many points below fp32.
        all_layers: Static: quantize the first convolution too (by default it stays fp32: faster).

    Raises:
        CheckpointError: the checkpoint is missing, unsafe, or records no input contract.
        ExportError: a bad option, the data not found for static int8, an export that does not match, or an int8
            model that loses more than ``max_drop`` (a ValueError).
    """
    if fmt not in EXPORTERS:
        raise ExportError(f"--format must be one of {', '.join(EXPORTERS)}, got {fmt!r}")
    if quantize not in (None, *QUANTIZE):
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize and fmt != "onnx":
        raise ExportError("--quantize is supported with --format onnx (onnxruntime quantization).")
    if quant_format not in ("auto", "qdq", "qoperator"):
        raise ExportError(f"--quant_format must be auto, qdq or qoperator, got {quant_format!r}")
    checkpoint = load_checkpoint(ckpt_path)  # refuses a missing, foreign or unsafe file, before anything else
    contract = read_contract(checkpoint, ckpt_path)
    checks = check_data(checkpoint, contract, data or {})  # read once: parity takes the first images, int8 all
    if quantize == "static" and checks is None:
        raise ExportError(
            "--quantize static needs the checkpoint's training images (calibration) and test images (the accuracy "
            "check), which are not here: say where with --data_dir (MNIST) or --data root=... (a folder)."
        )
    model = MNISTClassifier.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True, compile=False)
    net = model.net.eval().to(memory_format=torch.contiguous_format)
    if checks is None:  # no data: the checks still run, on random inputs of the network's shape
        x = torch.randn(samples, *contract.shape, generator=torch.Generator().manual_seed(0))
        report: dict[str, Any] = {"checked_on": f"{samples} random inputs (the checkpoint's test split is not here)"}
    else:
        x = checks.images[:samples]
        report = {"checked_on": f"the first {len(x)} of {checks.described}"}
    with torch.no_grad():
        reference = net(x)
    out = Path(output)
    report.update(format=fmt, output=str(out), checkpoint=str(ckpt_path), input=contract.to_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:  # fp32 and int8 are written here first when quantizing
        written = Path(tmp) / "fp32.onnx" if quantize else out
        exported, extra = EXPORTERS[fmt](net, x[:2], written, checkpoint)
        report["parity"] = verify(reference, exported, x)
        report.update(extra)
        if quantize:
            int8 = Path(tmp) / "int8.onnx"
            options: dict[str, Any] = {
                "per_channel": per_channel,
                "quant_format": quant_format,
                "all_layers": all_layers,
            }
            report["int8"] = (
                quantize_static_onnx(written, int8, checks.calibration(calibration_images), **options)
                if quantize == "static" and checks is not None  # static without check data was refused above
                else quantize_dynamic_onnx(written, int8)
            )
            report["int8"].update(compare_accuracy(written, int8, checks))
            refuse_a_lossy_int8(report["int8"], quantize, max_drop, out)
            shutil.move(int8, out)
    if fmt == "onnx":
        describe_onnx(out, contract, checkpoint, ckpt_path)
    report["size_bytes"] = out.stat().st_size
    if not report["parity"]["ok"]:
        raise ExportError(f"The {fmt} export differs from the eager network: {report['parity']}")
    return report


def refuse_a_lossy_int8(int8: dict[str, Any], quantize: str, max_drop: float, out: Path) -> None:
    """Raise ExportError, before anything is written to ``out``, when int8 lost more than ``max_drop`` points."""
    drop = int8.get("acc_drop_points")
    if drop is not None and drop > max_drop:
        raise ExportError(
            f"int8 ({quantize}) accuracy {int8['int8_acc']:.4f} is {drop:.2f} points below fp32 "
            f"{int8['fp32_acc']:.4f}, more than --max_drop {max_drop}: nothing was written to {out}. "
            "Try --per_channel, more --calibration_images, or --quant_format qdq / qoperator."
        )


def describe_onnx(path: Path, contract: InputContract, checkpoint: dict[str, Any], ckpt_path: str) -> None:
    """Write what a server needs besides the weights into the ONNX file's metadata: the input contract (``input``,
    JSON, what a server reads), its fields one by one for people, the checkpoint and the network.

    A reader gets them with ``onnxruntime.InferenceSession(path).get_modelmeta().custom_metadata_map``.
    """
    import onnx

    props = {"checkpoint": str(ckpt_path), "input": json.dumps(contract.to_dict())}
    props.update({key: json.dumps(value) for key, value in contract.to_dict().items()})
    net = checkpoint.get("hyper_parameters", {}).get("net")
    props["net"] = json.dumps(net if isinstance(net, dict) else None)  # None: the default CNN, or a net from code
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(path))


def compare_accuracy(fp32: Path, int8: Path, checks: CheckData | None) -> dict[str, Any]:
    """fp32 and int8 accuracy on the whole test split, and the drop in points (nothing without the data)."""
    if checks is None:
        return {}
    fp32_acc = (run_onnx(fp32, checks.images).argmax(1) == checks.labels).float().mean().item()
    int8_acc = (run_onnx(int8, checks.images).argmax(1) == checks.labels).float().mean().item()
    return {
        "test_images": len(checks.labels),
        "fp32_acc": fp32_acc,
        "int8_acc": int8_acc,
        "acc_drop_points": 100 * (fp32_acc - int8_acc),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also what the README test parses its documented commands with)."""
    parser = argparse.ArgumentParser(
        prog="python -m project export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt_path", required=True, help="checkpoint written by fit")
    parser.add_argument("--format", choices=list(EXPORTERS), required=True, help="what to write")
    parser.add_argument("--output", required=True, help="file to write (.onnx, .pt2, .pt)")
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE,
        help="onnx int8: static (whole network, calibrated on training images) or dynamic / int8 (Linear weights)",
    )
    parser.add_argument(
        "--per_channel", action="store_true", help="static: one weight scale per output channel (default: %(default)s)"
    )
    parser.add_argument(
        "--calibration_images",
        type=int,
        default=512,
        help="static: training images to calibrate (default: %(default)s)",
    )
    parser.add_argument(
        "--quant_format",
        choices=["auto", "qdq", "qoperator"],
        default="auto",
        help="static: auto picks by the CPU (default: %(default)s)",
    )
    parser.add_argument(
        "--max_drop",
        type=float,
        default=0.5,
        help="refuse an int8 model more than this many points below fp32 (default: %(default)s)",
    )
    parser.add_argument(
        "--all_layers",
        action="store_true",
        help="static: quantize the first convolution too (slower, measured) (default: %(default)s)",
    )
    parser.add_argument(
        "--data_dir", help="where the checkpoint's MNIST is, if not where it was trained (folder holding MNIST/raw/)"
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an argument of the checkpoint's DataModule for the checks, e.g. --data root=my_data (repeatable) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--samples", type=int, default=256, help="test images for the parity check (default: %(default)s)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing output file (default: %(default)s)"
    )
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Export as ``argv`` says and print the report (JSON)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if Path(args.output).exists() and not args.overwrite:
        parser.error(f"{args.output} exists: choose another --output or pass --overwrite")
    data = {}
    for item in args.data:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--data {item!r}: give KEY=VALUE, e.g. --data root=my_data")
        data[key] = yaml.safe_load(value)  # typed as in a config file: 32, true, null
    if args.data_dir is not None:
        data["data_dir"] = args.data_dir
    report = export(
        args.ckpt_path,
        args.format,
        args.output,
        quantize=args.quantize,
        data=data,
        samples=args.samples,
        per_channel=args.per_channel,
        calibration_images=args.calibration_images,
        quant_format=args.quant_format,
        max_drop=args.max_drop,
        all_layers=args.all_layers,
    )
    print(json.dumps(report, indent=2))
    return report
