import importlib.metadata
import json
from types import SimpleNamespace

import torch

from project.__main__ import cli_main
from project.env import report as env
from project.hardware import cpu_has_native_bf16, recommended_precision


def test_env_reports_this_machine_as_json_and_as_text(capsys):
    cli_main(["env", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert info["versions"]["lightning"] == importlib.metadata.version("lightning")
    assert info["versions"]["torch"] == importlib.metadata.version("torch")
    assert info["cuda"]["available"] == torch.cuda.is_available()
    assert len(info["cuda"]["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert info["cpu"] == {
        "machine": info["cpu"]["machine"],
        "threads": torch.get_num_threads(),
        "native_bf16": cpu_has_native_bf16(),
    }
    assert info["recommended_precision"] == recommended_precision()
    cli_main(["env"])
    text = capsys.readouterr().out
    assert f"Recommended precision: {recommended_precision()} " in text
    assert f"{torch.get_num_threads()} threads, native bf16: {cpu_has_native_bf16()}" in text


def test_env_lists_each_gpu_with_bf16_and_tf32_from_its_compute_capability(monkeypatch):
    """Ampere (8.0) and later run bf16 and TF32 natively; a Turing card (7.5) neither."""
    cards = [("NVIDIA A100", 8, 0, 80 * 2**30), ("Tesla T4", 7, 5, 15 * 2**30)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    props = [SimpleNamespace(name=n, major=a, minor=b, total_memory=m) for n, a, b, m in cards]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    info = env.collect()
    assert [
        (d["name"], d["compute_capability"], d["native_bf16"], d["tf32_capable"]) for d in info["cuda"]["devices"]
    ] == [
        ("NVIDIA A100", "8.0", True, True),
        ("Tesla T4", "7.5", False, False),
    ]
    assert info["cuda"]["devices"][0]["memory_gib"] == 80.0
    text = env.render(info)
    assert "GPU 1: Tesla T4, 15.0 GiB, compute 7.5, native bf16: False, TF32: False" in text
