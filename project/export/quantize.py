"""int8 ONNX models with onnxruntime's quantization tools: static (the whole network, calibrated) or dynamic.

- static: the convolutions and Linear layers, weights and activations, calibrated on training images (never the test
  set), in the format that is fast on this CPU: QDQ signed int8 where the CPU has VNNI (AVX-512 VNNI, AVX-VNNI, AMX),
  else QOperator uint8 activations with reduce_range (AVX2 saturates s8s8).
- dynamic: the Linear layers' weights only; activations stay fp32.

``convert.export`` measures the accuracy of both against fp32 and refuses one that loses too much.
"""

from pathlib import Path
from typing import Any

from torch import Tensor

from project.hardware import cpu_flags

# CPU flags for int8 dot products in hardware (VNNI): signed int8 (s8s8) matmuls run fast only with these.
VNNI_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_has_vnni() -> bool:
    """True when the CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX-INT8)."""
    return any(f in cpu_flags() for f in VNNI_CPU_FLAGS)


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
    otherwise insert after the last int8 convolution to go back to NCHW (docs/benchmarks.md).

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
    *,
    per_channel: bool = False,
    quant_format: str = "auto",
    all_layers: bool = False,
) -> dict[str, Any]:
    """Static int8 quantization of the Conv, MatMul and Gemm ops of ``fp32``, with activation ranges from
    ``calibration`` (normalised training images); the format follows the CPU unless ``quant_format`` says.

    The first convolution (on the raw image) stays fp32 unless ``all_layers``: with one input channel it has
    little to gain from int8 and its quantize/dequantize of the full-resolution maps costs more than it saves
    (docs/benchmarks.md).
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
