"""The package's layout: a core that imports no feature, features in places of their own, commands found, not listed."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

from project.__main__ import COMMANDS
from tests.conftest import ROOT

PACKAGE = ROOT / "project"
FEATURES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the package in ``path``, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "project"]


def test_user_error_and_the_hooks_import_nothing_of_the_package_so_any_module_can_import_them():
    for name in ("errors.py", "hooks.py"):
        assert [n for _, n in imported(PACKAGE / name) if n != "project.inputs"] == [], name  # hooks: a type only


def test_the_core_imports_no_feature():
    wrong = [
        f"{path.name}:{line} imports {name}"
        for path in sorted(PACKAGE.glob("*.py"))
        for line, name in imported(path)
        if name.split(".")[1:2] and name.split(".")[1] in FEATURES
    ]
    assert not wrong, wrong


def test_the_core_holds_no_line_of_a_feature_so_every_copy_has_the_same_core():
    """No marker in the core's modules: a copy's core is the same whatever features it keeps, which is why a copy
    with one feature need not run the core's tests again (template/combos.py)."""
    marker = re.compile(r"#\s*\[[a-z ]+\]\s*$|^\s*#\s*(>>>|<<<) [a-z ]+$")
    marked = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if marker.search(line)
    ]
    assert not marked, marked


def test_a_feature_imports_the_core_and_itself_only():
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line} imports {name}"
        for feature in FEATURES
        for path in sorted((PACKAGE / feature).glob("*.py"))
        for line, name in imported(path)
        if name.split(".")[1:2] and name.split(".")[1] in FEATURES and name.split(".")[1] != feature
    ]
    assert not wrong, wrong


def test_the_command_list_comes_from_the_features_present(tmp_path):
    with_command = [f for f in FEATURES if "def main(" in (PACKAGE / f / "__init__.py").read_text()]
    removed = with_command[:1]  # a feature's place removed, and nothing else edited
    copy = tmp_path / PACKAGE.name
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for feature in removed:
        shutil.rmtree(copy / feature)
    code = f"from {PACKAGE.name}.__main__ import commands; print(' '.join(commands()))"
    listed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    kept = [f for f in with_command if f not in removed]
    assert listed.stdout.split() == [*COMMANDS, *kept]
    for feature in removed:
        gone = subprocess.run(
            [sys.executable, "-m", PACKAGE.name, feature], cwd=tmp_path, capture_output=True, text=True
        )
        assert gone.returncode == 2 and f"unknown command '{feature}'" in gone.stderr


def test_the_pre_commit_hooks_run_the_linters_make_lint_runs_from_the_projects_own_environment():
    """A hook that pins its own ruff or mypy drifts from requirements.lock, which CI runs: they are local hooks."""
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    remote = [hook["id"] for repo in config["repos"] if repo["repo"] != "local" for hook in repo["hooks"]]
    local = {hook["id"]: hook for repo in config["repos"] if repo["repo"] == "local" for hook in repo["hooks"]}
    make_lint = re.search(r"^lint:.*\n((?:\t.+\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split("\n")
    tools = {" ".join(line.split()[:2]).removesuffix(" .") for line in make_lint if line.strip()}
    assert tools == {"ruff check", "ruff format", "mypy"}
    assert not any(name in hook for hook in remote for name in ("ruff", "mypy")), remote
    hooked = {" ".join(h["entry"].split()[:2]) for h in local.values() if h["language"] == "system"}
    assert tools <= hooked, f"make lint runs {sorted(tools)}; the local hooks run {sorted(hooked)}"


def public_names(path: Path) -> list[str]:
    """The public names a module defines at its top level: functions, classes and constants."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("_")]


def test_every_public_name_of_the_core_is_used_by_the_core_or_its_configs():
    """The reverse of the feature rule: a name the core defines only for a feature belongs in that feature."""
    core = {path: path.read_text() for path in sorted(PACKAGE.glob("*.py"))}
    configs = " ".join(path.read_text() for path in sorted((ROOT / "configs").glob("*.yaml")))
    unused = []
    for path, text in core.items():
        for name in public_names(path):
            used = re.compile(rf"(?<![\w.]){re.escape(name)}\b|\.{re.escape(name)}\b")
            elsewhere = any(used.search(other) for other_path, other in core.items() if other_path != path)
            if len(used.findall(text)) <= 1 and not elsewhere and f"{path.stem}.{name}" not in configs:
                unused.append(f"{path.name}:{name}")
    assert not unused, f"core names used by no core module or config (move them to their feature): {unused}"
