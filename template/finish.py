"""Copier's post-copy task: rename the package and drop the lines of the features that were not picked.

copier.yml runs it in the new project after copier has written the files (and again, the same way, in the copies
``copier update`` makes to compute its diff)::

    python template/finish.py --package digits --features serve,tune

A feature's own places (``project/serve/``, ``tests/test_serve.py``, ``docs/serve.md``, ...) are left out by
copier.yml's ``_exclude``. What remains are lines of shared files that name a feature, marked in the template:

- a line ending in ``# [serve]`` or ``<!-- [serve] -->`` is kept only with ``serve`` (``[serve tune]``: with either);
- the lines between ``# >>> serve`` and ``# <<< serve`` (or ``<!-- >>> serve -->`` and ``<!-- <<< serve -->``),
  likewise; blocks nest;
- ``template`` marks what only the template repository has (its copier checks): never kept in a copy.

Kept lines lose their markers, so a generated project shows none. The repository itself is the project with every
feature: its files are plain Python, YAML, TOML and Markdown that run and lint as they are.
"""

import argparse
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

FEATURES = ("serve", "tune", "export", "elastic", "folder", "track", "notebooks")
TEMPLATE_ONLY = "template"
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".ipynb", ".cfg", ".txt", ".lock", ".sh"}
TEXT_NAMES = {"Makefile", "run", ".gitignore"}  # run: .ci/run
SKIP_DIRS = {".git", ".venv", "venv", "logs", "data", "exports", "__pycache__", ".pytest_cache", ".ruff_cache"}
TEMPLATE_NAME = "project"  # the package's name in the template

TAGS = r"([a-z][a-z ]*?)"
LINE_MARK = re.compile(rf"\s*(?:#\s*\[{TAGS}\]|<!--\s*\[{TAGS}\]\s*-->)\s*$")
OPEN = re.compile(rf"^\s*(?:#|<!--)\s*>>>\s*{TAGS}\s*(?:-->)?\s*$")
CLOSE = re.compile(rf"^\s*(?:#|<!--)\s*<<<\s*{TAGS}\s*(?:-->)?\s*$")


class MarkerError(ValueError):
    """A marker names no feature, or a block is not closed."""


def wanted(tags: str, features: set[str], where: str) -> bool:
    """Whether a marked line or block stays: one of its features was picked (``template``: never)."""
    names = tags.split()
    unknown = [n for n in names if n not in (*FEATURES, TEMPLATE_ONLY)]
    if unknown:
        raise MarkerError(f"{where}: marker names {unknown}; the features are {', '.join(FEATURES)} (or template).")
    return any(n in features for n in names)


def strip(text: str, features: set[str], where: str = "<text>") -> str:
    """``text`` with the lines of features not in ``features`` removed and every marker taken off."""
    out, stack = [], []  # stack: (tags, kept) of the open blocks
    dropped = False  # the lines just before were dropped: blank lines after them would double the blank before
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        place = f"{where}:{number}"
        if opened := OPEN.match(line):
            stack.append((opened.group(1), wanted(opened.group(1), features, place)))
            dropped = dropped or not stack[-1][1]
            continue
        if closed := CLOSE.match(line):
            if not stack or stack[-1][0] != closed.group(1):
                raise MarkerError(f"{place}: '<<< {closed.group(1)}' closes no '>>> {closed.group(1)}'.")
            stack.pop()
            continue
        if not all(kept for _, kept in stack):
            continue
        if mark := LINE_MARK.search(line):
            if not wanted(mark.group(1) or mark.group(2), features, place):
                dropped = True
                continue
            ending = line[len(line.rstrip("\r\n")) :]
            line = line[: mark.start()].rstrip() + ending
        if dropped and not line.strip() and (not out or not out[-1].strip()):
            continue
        dropped = False
        out.append(line)
    if stack:
        raise MarkerError(f"{where}: '>>> {stack[-1][0]}' is never closed.")
    return "".join(out)


def rewrite(text: str, old: str, new: str, pyproject: bool = False) -> str:
    """Replace the package name where it names the package, and nowhere else ("project template" stays)."""
    o = re.escape(old)
    if pyproject:  # [project] and [project.*] are PEP 621 tables, not the package
        text = re.sub(rf'^name = "{o}"$', f'name = "{new}"', text, flags=re.M)
        text = re.sub(rf'^{o} = "{o}\.', f'{new} = "{new}.', text, flags=re.M)
        text = re.sub(rf'"{o}\[', f'"{new}[', text)  # dev = ["project[serve]"]: the extras of the features kept
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


def text_files(root: Path) -> list[Path]:
    """The project's text files under ``root``, run outputs and environments left out."""
    return [
        path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not any(part in SKIP_DIRS for part in path.relative_to(root).parts)
        and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES)
        and not path.name.startswith(".copier-answers")  # copier's record: its paths are not the package's
    ]


def move_package(root: Path, old: str, new: str) -> None:
    """Move ``old/`` to ``new/``. Files already in ``new/`` (``copier update`` writes the template's files into an
    existing project, then replays the user's edits as a diff) are replaced by the freshly written ones."""
    source, target = root / old, root / new
    if not source.is_dir():
        return
    for path in sorted(source.rglob("*")):
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, destination)
    shutil.rmtree(source)


def finish(root: Path, package: str, features: set[str]) -> None:
    """Strip the markers in every text file under ``root``, then rename the package to ``package``."""
    if not package.isidentifier() or keyword.iskeyword(package) or package != package.lower():
        raise SystemExit(f"package_name {package!r} is not a lower-case Python identifier (e.g. my_digits).")
    unknown = sorted(features - set(FEATURES))
    if unknown:
        raise SystemExit(f"features: {unknown} are not features of this template; pick from {', '.join(FEATURES)}.")
    for path in text_files(root):
        text = path.read_text()
        updated = strip(text, features, str(path.relative_to(root)))
        if package != TEMPLATE_NAME:
            updated = rewrite(updated, TEMPLATE_NAME, package, pyproject=path.name == "pyproject.toml")
        if updated != text:
            path.write_text(updated)
    if package != TEMPLATE_NAME:
        move_package(root, TEMPLATE_NAME, package)
    tidy(root)


def tidy(root: Path) -> None:
    """Re-sort imports and re-wrap lines with ruff: a new name changes line lengths and the order of imports."""
    ruff = shutil.which("ruff")
    if ruff is None:
        print("finish.py: ruff is not installed here; run `ruff check --fix . && ruff format .` in the project.")
        return
    subprocess.run([ruff, "check", "--quiet", "--no-cache", "--fix-only", "--select", "I", "."], cwd=root, check=False)
    subprocess.run([ruff, "format", "--quiet", "--no-cache", "."], cwd=root, check=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, help="the package's name, e.g. digits")
    parser.add_argument("--features", default="", help="the features kept, comma-separated (empty: the core only)")
    parser.add_argument("--root", default=".", help="the generated project (default: the current folder)")
    args = parser.parse_args(argv)
    try:
        finish(Path(args.root), args.package, {f for f in args.features.split(",") if f})
    except MarkerError as error:
        sys.exit(f"template marker error: {error}")


if __name__ == "__main__":
    main()
