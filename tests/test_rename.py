"""The rename script turns the template into a package of another name that still imports and runs."""

import os
import shutil
import subprocess
import sys

from tests.conftest import ROOT

COPY = ["project", "configs", "tests", "notebooks", "benchmarks", "scripts", ".ci", "pyproject.toml", "README.md"]


def test_rename_on_a_copy(tmp_path):
    for name in COPY:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "logs"))
        else:
            shutil.copy(source, tmp_path / name)
    subprocess.run([sys.executable, "scripts/rename_package.py", "digits", f"--root={tmp_path}"], check=True, cwd=ROOT)

    assert (tmp_path / "digits" / "net.py").is_file() and not (tmp_path / "project").exists()
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert 'name = "digits"' in pyproject and 'digits = "digits.cli:main"' in pyproject and "[project]" in pyproject
    for path in [*tmp_path.rglob("*.py"), *tmp_path.rglob("*.yaml"), *tmp_path.rglob("*.ipynb")]:
        if path.name == "rename_package.py":
            continue
        text = path.read_text()
        for stale in ("from project", "import project", "project.net", "project.cli", "-m project"):
            assert stale not in text, f"{stale!r} left in {path}"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "digits", "fit", "--config=configs/default.yaml", "--print_config"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "class_path: digits.net.CNN" in out and "digits.writer.CSVPredictionWriter" in out
