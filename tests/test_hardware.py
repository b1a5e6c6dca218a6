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


X86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu sse2 other\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "flags"), [(X86, {"fpu", "sse2", "avx2", "avx512_bf16"}), (ARM, {"fp", "asimd", "bf16"})]
)
def test_cpu_flags_are_the_first_cores_on_x86_and_arm(tmp_path, text, flags):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert hardware.cpu_flags(cpuinfo) == flags
    assert hardware.cpu_flags(tmp_path / "absent") == set()  # not Linux: no flags, no error


def test_cpu_flags_of_this_machine_are_its_own():
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo (not Linux)")
    flags = hardware.cpu_flags()
    base = {"x86_64": "sse2", "aarch64": "fp"}.get(hardware.platform.machine())  # every CPU of the kind has it
    assert base is None or base in flags, sorted(flags)
