import json

import torch

from project.cli import cli_main


def test_env_json_has_the_fields(capsys):
    from project.hardware import recommended_precision

    cli_main(["env", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert set(info["versions"]) == {"python", "torch", "torchvision", "lightning", "torchmetrics"}
    assert torch.__version__.startswith(info["versions"]["torch"])
    assert isinstance(info["cuda"]["available"], bool) and isinstance(info["cuda"]["devices"], list)
    assert isinstance(info["cpu"]["native_bf16"], bool)
    assert {"float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32"} <= set(info["tf32"])
    assert info["recommended_precision"] == recommended_precision()
    cli_main(["env"])
    assert "Recommended precision" in capsys.readouterr().out
