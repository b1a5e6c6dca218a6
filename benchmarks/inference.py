"""Which deployment format is fastest here: every export of one checkpoint, timed in one run.

    python benchmarks/inference.py --ckpt_path CKPT                # real MNIST ($PATH_DATASETS), writes a table
    python benchmarks/inference.py --ckpt_path CKPT --quick        # a few calls each: checks that all formats run

Formats: eager fp32, eager bf16 autocast (only where the CPU has native bf16), torch.compile, torch.export (.pt2),
ONNX fp32, ONNX int8 dynamic, ONNX int8 static; each written and verified by `python -m project export`.
For each: latency of one image (p50, p99 over --calls calls after a warm-up), throughput at batch 256 over the test
set (images/s), accuracy on the whole test set, file size, threads. torch and onnxruntime run with the same number
of threads. Rounds alternate the order of the formats; the table gives medians over rounds.
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from project.data import MNISTDataModule
from project.export.convert import export
from project.hardware import cpu_has_native_bf16
from project.images import normalize
from project.module import MNISTClassifier

Predict = Callable[[torch.Tensor], torch.Tensor]  # normalised images (B, 1, 28, 28) -> logits (B, 10)


def onnx_runner(path: Path, threads: int) -> Predict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


def data_of(data_dir: str | None) -> dict[str, str] | None:
    """``export``'s data overrides: the checkpoint's MNIST in ``data_dir``, else where it was trained."""
    return {"data_dir": data_dir} if data_dir else None


def build(ckpt: str, data_dir: str | None, folder: Path, threads: int) -> tuple[dict[str, tuple[Predict, int]], str]:
    """Every format's predict function and the size in bytes of what would be shipped; the static int8 format."""
    net = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True, compile=False).net.eval()
    net = net.to(memory_format=torch.contiguous_format)
    weights = folder / "model.pt"
    export(ckpt, "state_dict", str(weights), data=data_of(data_dir))
    size = weights.stat().st_size

    def eager(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return net(x)

    variants: dict[str, tuple[Predict, int]] = {"eager fp32": (eager, size)}
    if cpu_has_native_bf16():

        def bf16(x: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
                return net(x).float()

        variants["eager bf16 autocast"] = (bf16, size)
    compiled_net = torch.compile(net, dynamic=True)

    def compiled(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return compiled_net(x)

    variants["torch.compile"] = (compiled, size)
    export(ckpt, "pt2", str(folder / "model.pt2"), data=data_of(data_dir))
    program = torch.export.load(str(folder / "model.pt2")).module()

    def exported(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return program(x)

    variants["torch.export .pt2"] = (exported, (folder / "model.pt2").stat().st_size)
    export(ckpt, "onnx", str(folder / "fp32.onnx"), data=data_of(data_dir))
    export(ckpt, "onnx", str(folder / "dynamic.onnx"), quantize="dynamic", data=data_of(data_dir))
    static = export(ckpt, "onnx", str(folder / "static.onnx"), quantize="static", data=data_of(data_dir))
    for name, file in (("ONNX fp32", "fp32"), ("ONNX int8 dynamic", "dynamic"), ("ONNX int8 static", "static")):
        path = folder / f"{file}.onnx"
        variants[name] = (onnx_runner(path, threads), path.stat().st_size)
    return variants, static["int8"]["format"]


def measure(predict: Predict, x: torch.Tensor, y: torch.Tensor, calls: int, seconds: float) -> dict[str, float]:
    for i in range(20):  # warm-up: kernel selection, compilation, allocator
        predict(x[i : i + 1])
        predict(x[:256])
    latencies = []
    for i in range(calls):
        one = x[i % len(x) : i % len(x) + 1]
        start = time.perf_counter()
        predict(one)
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    batch = min(256, len(x))  # 256, or the whole (small, synthetic) test set
    images, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i in range(0, len(x) - batch + 1, batch):
            predict(x[i : i + batch])
            images += batch
    throughput = images / (time.perf_counter() - start)
    correct = sum(int((predict(x[i : i + 256]).argmax(1) == y[i : i + 256]).sum()) for i in range(0, len(x), 256))
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "images_per_s": throughput,
        "acc": correct / len(y),
    }


def table(results: dict[str, list[dict[str, float]]], sizes: dict[str, int], threads: int) -> str:
    base = statistics.median(r["images_per_s"] for r in results["eager fp32"])
    rows = [
        "| format | p50 batch 1 (ms) | p99 batch 1 (ms) | images/s at batch 256 | vs eager fp32 | test acc | "
        "file (KB) | threads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        rows.append(
            f"| {name} | {med['p50_ms']:.3f} | {med['p99_ms']:.3f} | {med['images_per_s']:.0f} | "
            f"{med['images_per_s'] / base:.2f} | {med['acc']:.4f} | {sizes[name] / 1024:.0f} | {threads} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit (the default recipe's)")
    parser.add_argument("--data_dir", help="folder holding MNIST/raw/ (default: $PATH_DATASETS)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000, help="batch-1 calls per format and round")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput measuring time per format and round")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="for torch and onnxruntime")
    parser.add_argument("--quick", action="store_true", help="1 round, 30 calls, 0.2 s: checks that all formats run")
    parser.add_argument("--output", help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.seconds = 1, 30, 0.2
    torch.set_num_threads(args.threads)
    dm = MNISTDataModule(data_dir=args.data_dir)
    dm.setup("test")
    x, y = normalize(dm.splits["test"].images.unsqueeze(1), (dm.mean,), (dm.std,)), dm.splits["test"].labels
    with tempfile.TemporaryDirectory() as tmp:
        variants, static_format = build(args.ckpt_path, args.data_dir, Path(tmp), args.threads)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for round_ in range(1, args.rounds + 1):
            order = list(variants) if round_ % 2 else list(variants)[::-1]
            for name in order:
                results[name].append(measure(variants[name][0], x, y, args.calls, args.seconds))
                r = results[name][-1]
                print(f"round {round_} {name}: {r}", flush=True)
        sizes = {name: size for name, (_, size) in variants.items()}
    report = table(results, sizes, args.threads)
    report += f"\n\nONNX int8 static format chosen for this CPU: {static_format}."
    # Paired by round: the machine's speed drifts between rounds (other tenants), both formats of a round share it.
    pairs = zip(results["ONNX int8 static"], results["ONNX fp32"], strict=True)
    ratios = [static["images_per_s"] / fp32["images_per_s"] for static, fp32 in pairs]
    report += (
        f" Batch-256 throughput of ONNX int8 static over ONNX fp32, per round: {', '.join(f'{r:.2f}' for r in ratios)}"
        f"; median {statistics.median(ratios):.2f}x."
    )
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return report


if __name__ == "__main__":
    main()
