"""The rename script turns the template into a package of another name that still imports and runs."""

import importlib
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

COPY = ["project", "configs", "tests", "notebooks", "benchmarks", "scripts", ".ci", "pyproject.toml", "README.md"]
COPY.append("docs")


def test_rename_on_a_copy(tmp_path, monkeypatch, capsys):
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
    texts = [*tmp_path.rglob("*.py"), *tmp_path.rglob("*.yaml"), *tmp_path.rglob("*.ipynb")]
    texts.append(tmp_path / "pyproject.toml")
    for path in texts:
        if path.name == "rename_package.py":
            continue
        text = path.read_text()
        for stale in ("from project", "import project", "project.net", "project.cli", "-m project"):
            assert stale not in text, f"{stale!r} left in {path}"
    # The renamed package imports and runs: in this process (importing it in a fresh one costs ~7 s of torch).
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(SystemExit) as info:
            importlib.import_module("digits.cli").cli_main(["fit", "--config=configs/default.yaml", "--print_config"])
        assert info.value.code == 0
        out = capsys.readouterr().out
    finally:
        for name in [m for m in sys.modules if m == "digits" or m.startswith("digits.")]:
            del sys.modules[name]
    assert "class_path: digits.net.CNN" in out and "digits.writer.CSVPredictionWriter" in out
