"""The README tells the truth: every test it names exists, every `python -m project` command in it parses."""

import importlib
import pkgutil
import re
import shlex

import pytest

from project.cli import cli_main, commands
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def named_tests() -> list[tuple[str, str]]:
    """(file, test) for every `file.py::test_x` and following `::test_y` in the README."""
    found, current = [], None
    for file, test in re.findall(r"(?:tests/)?(test_\w+\.py)?::(test_\w+)", README):
        current = file or current
        found.append((current, test))
    return found


def documented_commands() -> list[str]:
    """Every `python -m project ...` line of the README's code blocks, continuations joined, comments dropped."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
    commands = []
    for language, block in blocks:
        if language not in ("", "bash"):  # json, python, yaml examples
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if "-m project " in line:
                commands.append(line[line.index("-m project ") + len("-m project ") :])
    return commands


def test_the_readme_names_only_tests_that_exist():
    tests = named_tests()
    assert len(tests) >= 8
    for file, test in tests:
        path = ROOT / "tests" / file
        assert path.is_file(), f"README names {file}, which does not exist"
        assert re.search(rf"^def {test}\(", path.read_text(), flags=re.M), f"README names {file}::{test}"


@pytest.mark.parametrize("command", documented_commands())
def test_every_documented_command_parses(command, trained_ckpt, capsys, tmp_path):
    args = shlex.split(command.replace("<best>.ckpt", "x.ckpt"))
    # Placeholders for a checkpoint stand for a real one; tune's output for an overlay like the one it writes.
    best = tmp_path / "best.yaml"
    best.write_text("model:\n  optimizer:\n    init_args:\n      lr: 0.002\n")
    places = {
        "CKPT": trained_ckpt,
        "logs/mnist/version_0/checkpoints/x.ckpt": trained_ckpt,
        "logs/tune/best.yaml": best,
    }
    args = [str(places.get(a, a)) for a in args]
    listed = commands()
    assert args[0] in listed, command
    package = cli_main.__module__.rpartition(".")[0]  # "project", or the name the rename script gave it
    try:
        module = importlib.import_module(f"{package}.{listed[args[0]][0]}")
        if hasattr(module, "__path__"):  # a feature's package: the module of its own that builds the parser
            names = [f"{module.__name__}.{m.name}" for m in pkgutil.iter_modules(module.__path__)]
            module = next(m for m in map(importlib.import_module, names) if hasattr(m, "build_parser"))
    except ImportError as exc:  # serve and tune need their extras; CI installs every extra
        pytest.skip(str(exc))
    if args[0] == "tune":  # its own options, and fit's for every trial
        _, fit_args = module.build_parser().parse_known_args(args[1:])
        args = ["fit", *fit_args]
    elif hasattr(module, "build_parser"):
        module.build_parser().parse_args(args[1:])  # argparse exits on an unknown option or a bad value
        return
    with pytest.raises(SystemExit) as info:
        cli_main([*args, "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err[-2000:]
