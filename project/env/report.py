"""``python -m project env``: the versions, devices and precision support of this machine."""

import argparse
import importlib.metadata
import json
import platform
from typing import Any

import torch

from project.hardware import cpu_has_native_bf16, recommended_precision

PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics")


def collect() -> dict[str, Any]:
    """Everything ``env`` reports, as one JSON-serialisable dict."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    cuda = torch.cuda.is_available()
    devices = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "index": i,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}",
                # bf16 runs natively from Ampere (8.0) on; TF32 likewise.
                "native_bf16": props.major >= 8,
                "tf32_capable": props.major >= 8,
            }
        )
    return {
        "versions": versions,
        "platform": platform.platform(),
        "cpu": {
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "native_bf16": cpu_has_native_bf16(),
        },
        "cuda": {"available": cuda, "version": torch.version.cuda, "devices": devices},
        "tf32": {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        },
        "recommended_precision": recommended_precision(),
    }


def render(info: dict[str, Any]) -> str:
    v = info["versions"]
    lines = [
        "Versions: " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v),
        f"Platform: {info['platform']}",
        f"CPU: {info['cpu']['machine']}, {info['cpu']['threads']} threads, native bf16: {info['cpu']['native_bf16']}",
        f"CUDA available: {info['cuda']['available']} (CUDA {info['cuda']['version']})",
    ]
    for d in info["cuda"]["devices"]:
        lines.append(
            f"  GPU {d['index']}: {d['name']}, {d['memory_gib']} GiB, compute {d['compute_capability']}, "
            f"native bf16: {d['native_bf16']}, TF32: {d['tf32_capable']}"
        )
    t = info["tf32"]
    lines += [
        f"TF32: float32_matmul_precision={t['float32_matmul_precision']}, cuda matmul={t['cuda_matmul_allow_tf32']}, "
        f"cudnn={t['cudnn_allow_tf32']}",
        f"Recommended precision: {info['recommended_precision']} (what trainer.precision: null picks)",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also what the README test parses its documented commands with)."""
    parser = argparse.ArgumentParser(
        prog="python -m project env",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return info
