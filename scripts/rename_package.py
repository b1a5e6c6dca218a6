"""Rename the ``project`` package everywhere, so the template becomes your project.

    python scripts/rename_package.py my_digits          # in a fresh clone, before your first commit
    pip install -e ".[dev,export]" && pytest            # the tests pass under the new name

It moves ``project/`` to ``my_digits/`` and rewrites imports, class paths in YAML configs and notebooks,
``python -m project``, the console script and the distribution name in ``pyproject.toml``. Checkpoints written
before the rename name the old classes in their hyperparameters: retrain, or load them before renaming.
"""

import argparse
import keyword
import re
import shutil
from pathlib import Path

TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".ipynb", ".cfg", ".txt"}
TEXT_NAMES = {"Makefile", "run"}  # run: .ci/run
SKIP_DIRS = {".git", ".venv", "venv", "logs", "data", "__pycache__", ".pytest_cache", ".ruff_cache"}


def current_name(root: Path) -> str:
    """The package's current name: the distribution name in pyproject.toml (``project`` in the template)."""
    found = re.search(r'^name = "([^"]+)"$', (root / "pyproject.toml").read_text(), flags=re.M)
    if found is None:
        raise SystemExit(f'No name = "..." in {root / "pyproject.toml"}: run this in the template\'s root folder.')
    return found.group(1)


def rewrite(text: str, old: str, new: str, pyproject: bool = False) -> str:
    """Replace the package name where it names the package, and nowhere else ("project template" stays)."""
    o = re.escape(old)
    if pyproject:  # [project] and [project.*] are PEP 621 tables, not the package
        text = re.sub(rf'^name = "{o}"$', f'name = "{new}"', text, flags=re.M)
        text = re.sub(rf'^{o} = "{o}\.', f'{new} = "{new}.', text, flags=re.M)
        text = re.sub(rf"(?<!\w)-m {o}\b", f"-m {new}", text)  # the comments naming the commands
        return text.replace(f'include = ["{old}*"]', f'include = ["{new}*"]')
    rules = [
        (rf"\bfrom {o}\b", f"from {new}"),
        (rf"\bimport {o}\b", f"import {new}"),
        (rf"(?<!\w)-m {o}\b", f"-m {new}"),
        (rf"``{o}``", f"``{new}``"),
        (rf"(?<![\w\[/-]){o}\.(?=[A-Za-z_])", f"{new}."),  # project.net.CNN, project.cli:main
        (rf"(?<![\w-]){o}/", f"{new}/"),  # paths: project/net.py
        (rf'"{o}"', f'"{new}"'),  # ROOT / "project", the console script's name in tests
        (rf"\b{o} (fit|validate|test|predict|export|env)\b", rf"{new} \1"),  # the console script
    ]
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def rename(root: Path, new: str) -> list[Path]:
    """Rename the package under ``root`` to ``new``; return the files changed."""
    if not new.isidentifier() or keyword.iskeyword(new) or new != new.lower():
        raise SystemExit(f"{new!r} is not a valid lower-case Python package name (e.g. my_digits).")
    old = current_name(root)
    package = root / old
    if not package.is_dir():
        raise SystemExit(f"{package} not found: run this in the template's root folder.")
    if (root / new).exists():
        raise SystemExit(f"{root / new} already exists.")
    changed = []
    for path in sorted(root.rglob("*")):
        if any(part in SKIP_DIRS for part in path.relative_to(root).parts) or not path.is_file():
            continue
        if path.name == Path(__file__).name or not (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES):
            continue  # this script reads the old name from pyproject.toml: it stays as it is
        text = path.read_text()
        updated = rewrite(text, old, new, pyproject=path.name == "pyproject.toml")
        if updated != text:
            path.write_text(updated)
            changed.append(path)
    shutil.move(package, root / new)
    for egg in root.glob(f"{old}.egg-info"):
        shutil.rmtree(egg)
    print(f"Renamed {old}/ to {new}/ and rewrote {len(changed)} files. Reinstall: pip install -e '.[dev,export]'")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the new package name, e.g. my_digits")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the template's root")
    args = parser.parse_args()
    rename(Path(args.root), args.name)


if __name__ == "__main__":
    main()
