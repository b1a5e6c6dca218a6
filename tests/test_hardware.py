from pathlib import Path

import pytest

from project import hardware


@pytest.mark.parametrize(
    ("machine", "flags", "native"),
    [
        ("x86_64", {"avx512f", "avx512_bf16"}, True),
        ("x86_64", {"avx512f", "amx_bf16", "amx_tile"}, True),
        ("x86_64", {"avx512f", "avx2"}, False),
        ("aarch64", {"bf16"}, False),
    ],
)
def test_native_bf16_decides_the_default_precision(monkeypatch, machine, flags, native):
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.setattr(hardware.torch.cuda, "is_available", lambda: False)
    assert hardware.cpu_has_native_bf16() is native
    assert hardware.recommended_precision("auto") == ("bf16-mixed" if native else "32-true")
    assert hardware.recommended_precision("cpu") == ("bf16-mixed" if native else "32-true")
    # GPUs are never assumed: fp32 until the user picks a mixed-precision overlay.
    assert hardware.recommended_precision("gpu") == "32-true"


def test_cpu_flags_reads_this_machine():
    flags = hardware.cpu_flags()
    if Path("/proc/cpuinfo").is_file():  # Linux: every CPU reports some flags (fpu, sse2, neon, ...)
        assert flags and all(isinstance(f, str) for f in flags)
    else:
        assert flags == set()
