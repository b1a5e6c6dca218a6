"""What this machine can do fast: native bfloat16 on the CPU or GPU, and the precision to train in."""

import platform
from pathlib import Path

import torch

# CPU flags (Linux /proc/cpuinfo) that mean bfloat16 matmuls/convolutions run in hardware, not emulated.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU feature flags of the first core, from ``cpuinfo``; empty where that file does not exist."""
    if not cpuinfo.is_file():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX on x86)."""
    return platform.machine().lower() in ("x86_64", "amd64") and any(f in cpu_flags() for f in NATIVE_BF16_CPU_FLAGS)


def recommended_precision(accelerator: str = "auto") -> str:
    """The Trainer precision measured fastest for this template on ``accelerator``, without losing accuracy.

    ``bf16-mixed`` on CPUs with native bf16 (faster: docs/benchmarks.md); other CPUs emulate bf16 and get slower, so
    they keep ``32-true``. GPUs keep ``32-true`` until measured: pick ``configs/16-mixed.yaml`` or
    ``configs/bf16-mixed.yaml`` there yourself.
    """
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if not on_gpu and accelerator in ("auto", "cpu") and cpu_has_native_bf16():
        return "bf16-mixed"
    return "32-true"
