"""The README and the docs/ pages tell the truth: every test they name exists, every command in them parses."""

import importlib
import pkgutil
import re
import shlex

import pytest

from project.__main__ import cli_main, commands
from tests.conftest import ROOT
from tests.test_layout import FEATURES

README = (ROOT / "README.md").read_text()
PAGES = {"README.md": README} | {f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}


def named_tests() -> list[tuple[str, str]]:
    """(page, file, test) for every `file.py::test_x` and following `::test_y` on every page."""
    found = []
    for page, text in PAGES.items():
        current = None
        for file, test in re.findall(r"(?:tests/)?(test_\w+\.py)?::(test_\w+)", text):
            current = file or current
            found.append((page, current, test))
    return found


def documented_commands() -> list[str]:
    """Every `python -m project ...` line of the pages' code blocks, continuations joined, no comments."""
    blocks = [block for text in PAGES.values() for block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)]
    commands = []
    for language, block in blocks:
        if language not in ("", "bash"):  # json, python, yaml examples
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if "-m project " in line:
                commands.append(line[line.index("-m project ") + len("-m project ") :])
            # a batch script's command and its arguments  # [slurm]
            if script := re.search(r"scripts/slurm/(\w+)\.sbatch(.*)", line):  # [slurm]
                commands.append(script.group(1) + script.group(2))  # [slurm]
    return commands


def test_the_readme_names_only_tests_that_exist():
    tests = named_tests()
    for page, file, test in tests:
        path = ROOT / "tests" / file
        assert path.is_file(), f"{page} names {file}, which does not exist"
        assert re.search(rf"^def {test}\(", path.read_text(), flags=re.M), f"{page} names {file}::{test}"


def test_every_guarantee_of_the_reliability_page_names_its_test():
    """A row of docs/reliability.md without a test is a promise nothing checks (the test above checks the names)."""
    rows = [line for line in PAGES["docs/reliability.md"].splitlines() if line.startswith("| ") and "---" not in line]
    guarantees = rows[1:]  # the header row first
    assert guarantees, "docs/reliability.md has no table of guarantees"
    for row in guarantees:
        assert re.search(r"`(?:tests/)?test_\w+\.py(?:::test_\w+)?`", row), f"no test named in: {row[:90]}"


def test_the_readme_is_short_and_every_link_between_the_pages_resolves():
    assert README.count("\n") <= 110  # the reading path starts here: a page, not a manual
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)#]+\.md)\)", text):
            assert (ROOT / page).parent.joinpath(target).resolve().is_file(), f"{page} links to {target}"


def test_the_reading_path_the_readme_lists_is_at_most_700_lines():
    """The README, then the five files of "What `fit` does", in that order: a newcomer's whole read."""
    files = re.findall(r"^\d\. `([^`]+)`", README, flags=re.MULTILINE)
    assert [f.rsplit("/", 1)[-1] for f in files] == ["default.yaml", "net.py", "module.py", "data.py", "cli.py"]
    lines = README.count("\n") + sum((ROOT / f).read_text().count("\n") for f in files)
    assert lines <= 700, f"the reading path is {lines} lines: README and {files}"


def test_every_page_a_config_comment_names_exists_and_none_points_into_the_readme():
    """The configs' comments send readers to pages: each page exists, and none to a README section (the README is
    short; its sections move)."""
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        comments = "\n".join(line.split("#", 1)[1] for line in config.read_text().splitlines() if "#" in line)
        for page in re.findall(r"\b((?:docs/)?[\w-]+\.md)\b", comments):
            assert (ROOT / page).is_file(), f"configs/{config.name} names {page}, which does not exist"
        assert not re.search(r"\bREADME\b", comments), f"configs/{config.name} points into the README"


def test_every_feature_has_its_page_and_a_row_in_the_readme():
    paged = list(FEATURES)
    paged.append("notebooks")  # [notebooks]
    paged.append("slurm")  # [slurm]
    for feature in paged:
        assert (ROOT / "docs" / f"{feature}.md").is_file(), f"docs/{feature}.md is missing"
        assert f"| `{feature}` |" in README and f"(docs/{feature}.md)" in README, feature


def layout_tree() -> str:
    """The tree of docs/layout.md, which the README sends readers to for every file beyond the reading path."""
    package, page = ROOT / "project", PAGES["docs/layout.md"]
    start = page.index(f"```\n{package.name}/")  # the package_name of a copy, in a copy
    return page[start : page.index("```", start + 3)]


def test_the_layout_page_names_only_modules_that_exist():
    """What docs/layout.md's tree names exists. Modules of your own need no line in it (docs/start-a-project.md)."""
    package = ROOT / "project"
    tree = layout_tree()
    shown = set(re.findall(r"^  (\w+\.py|\w+/)", tree, flags=re.M))
    present = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    present |= {f"{feature}/" for feature in FEATURES}
    assert shown <= present, f"docs/layout.md names {sorted(shown - present)}, not in {package.name}/"
    for feature, line in re.findall(r"^  (\w+)/ +(.*)$", tree, flags=re.M):  # the files a feature's line names
        named = set(re.findall(r"\b\w+\.py\b", line))
        files = {p.name for p in (package / feature).glob("*.py") if not p.name.startswith("__")}
        extra, omitted = sorted(named - files), sorted(files - named)
        assert named == files, f"docs/layout.md's {feature}/ line names {extra}, not there, and omits {omitted}"
    for entry in re.findall(r"^([\w.-]+/?) ", tree, flags=re.M):  # the top-level folders and files
        assert (ROOT / entry).exists(), f"docs/layout.md shows {entry}, which does not exist"


# >>> template
def test_the_layout_page_names_every_module_of_the_template():
    """The template's own form, checked in the template only: a copy's page need not list the user's modules."""
    shown = set(re.findall(r"^  (\w+\.py|\w+/)", layout_tree(), flags=re.M))
    present = {p.name for p in (ROOT / "project").glob("*.py") if p.name != "__init__.py"}
    present |= {f"{feature}/" for feature in FEATURES}
    assert present <= shown, f"missing from docs/layout.md: {sorted(present - shown)}"


# <<< template


@pytest.mark.parametrize("command", documented_commands())
def test_every_documented_command_parses(command, trained_ckpt, capsys, tmp_path):
    args = shlex.split(command.replace("<best>.ckpt", "x.ckpt"))
    # Placeholders for a checkpoint stand for a real one.
    places = {"CKPT": trained_ckpt, "logs/mnist/version_0/checkpoints/x.ckpt": trained_ckpt, "best": trained_ckpt}
    # >>> tune
    # tune's output: an overlay like the one it writes
    places["logs/tune/best.yaml"] = tmp_path / "best.yaml"
    places["logs/tune/best.yaml"].write_text("model:\n  optimizer:\n    init_args:\n      lr: 0.002\n")
    # <<< tune
    args = [str(places.get(a, a)) for a in args]
    listed = commands()
    assert args[0] in listed, command
    package = cli_main.__module__.rpartition(".")[0]  # "project", or the package_name of a copy
    try:
        module = importlib.import_module(f"{package}.{listed[args[0]][0]}")
        if hasattr(module, "__path__"):  # a feature's package: the module of its own that builds the parser
            names = [f"{module.__name__}.{m.name}" for m in pkgutil.iter_modules(module.__path__)]
            module = next(m for m in map(importlib.import_module, names) if hasattr(m, "build_parser"))
    except ImportError as exc:  # a feature without its extra installed; CI installs every extra
        pytest.skip(str(exc))
    # >>> cv
    if args[0] == "cv":  # its own options, and fit's for every fold
        _, fit_args = module.build_parser().parse_known_args(args[1:])
        args, module = ["fit", *fit_args], None
    # <<< cv
    # >>> tune
    if args[0] == "tune":  # its own options, and fit's for every trial
        _, fit_args = module.build_parser().parse_known_args(args[1:])
        args, module = ["fit", *fit_args], None
    # <<< tune
    if hasattr(module, "build_parser"):
        module.build_parser().parse_args(args[1:])  # argparse exits on an unknown option or a bad value
        return
    helping = any(a == "--help" or a.endswith(".help") for a in args)  # help exits 0 by itself
    with pytest.raises(SystemExit) as info:
        cli_main(args if helping else [*args, "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err[-2000:]
