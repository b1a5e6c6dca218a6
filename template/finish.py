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

The task touches only the files copier rendered from the template (the template's files less copier.yml's
``_exclude``): in ``copier update`` it runs in the user's project, whose own files are theirs. It formats them with
the ruff version of the template's ``requirements.lock`` (the one the copy's CI runs), fetched with pip when the
Python running copier has none, so that a copy is lint-clean whatever is installed beside copier. A ``copier
update`` that would rename the package is refused before anything is changed (it would lose the user's edits).
"""

import argparse
import keyword
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FEATURES = (
    *("serve", "tune", "export", "elastic", "folder", "cv", "lr_find", "env"),
    *("monitors", "track", "notebooks", "slurm", "github", "container"),
)
# Features that were part of the core in earlier versions of the template. An update keeps the features recorded in
# .copier-answers.yml, so a project copied before one of these was split out loses it unless the user adds it back.
SPLIT_FROM_THE_CORE = {
    "lr_find": "the learning-rate range test, configs/lr_find.yaml",
    "monitors": "TensorBoard images, weight/gradient histograms and throughput in every run",
    "env": "the env command: versions, devices and the precision picked on this machine",
}
TEMPLATE_ONLY = "template"
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".ipynb", ".cfg", ".txt", ".lock", ".sh", ".html", ".sbatch"}
TEXT_NAMES = {"Makefile", "run", ".gitignore", "Containerfile", ".containerignore"}  # run: .ci/run
SKIP_DIRS = {".git", ".venv", "venv", "logs", "data", "exports", "__pycache__", ".pytest_cache", ".ruff_cache"}
TEMPLATE_NAME = "project"  # the package's name in the template

TAGS = r"([a-z][a-z_ ]*?)"  # feature names: lower case, words joined by _
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
        text = text.replace(f'files = ["{old}"]', f'files = ["{new}"]')  # [tool.mypy]: the package it checks
        return text.replace(f'include = ["{old}*"]', f'include = ["{new}*"]')
    rules = [
        (rf"\bfrom {o}\b", f"from {new}"),
        (rf"\bimport {o}\b", f"import {new}"),
        (rf"(?<!\w)-m {o}\b", f"-m {new}"),
        (rf"``{o}``", f"``{new}``"),
        (rf"(?<![\w\[/-]){o}\.(?=[A-Za-z_])", f"{new}."),  # project.net.CNN, project.__main__:main
        (rf"(?<![\w-]){o}/", f"{new}/"),  # paths: project/net.py
        (rf'"{o}"', f'"{new}"'),  # ROOT / "project", the console script's name in tests
        (rf"\b{o} (fit|validate|test|predict|export|env)\b", rf"{new} \1"),  # the console script
    ]
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    # docs/layout.md's tree: `project/    the core` keeps its comment in the column of the lines below it.
    pad = len(old) - len(new)
    return re.sub(rf"(?m)^{re.escape(new)}/( {{2,}})(?=\S)", lambda m: f"{new}/" + " " * max(2, len(m[1]) + pad), text)


TITLE = "# PyTorch Lightning project template — a CNN on MNIST\n"


def retitle(text: str, package: str) -> str:
    """A copy's README is its project's, titled with its name; the template it came from is named below."""
    if not text.startswith(TITLE):
        return text
    return (
        f"# {package}\n\nStarted from the PyTorch Lightning project template (a CNN on MNIST is its worked example).\n"
        + text[len(TITLE) :]
    )


def text_files(root: Path) -> list[Path]:
    """The project's text files under ``root``, run outputs and environments left out."""
    return [
        path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not any(part in SKIP_DIRS for part in path.relative_to(root).parts)
        and is_text(path)
        and not path.name.startswith(".copier-answers")  # copier's record: its paths are not the package's
    ]


def is_text(path: Path) -> bool:
    return path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES


MAX_NAME = 20  # tests/test_template.py copies the template with a name this long: it must lint clean
# Names a package cannot take: the project's own folders, and the packages it imports (it would shadow them).
TAKEN = {"configs", "docs", "tests", "benchmarks", "notebooks", "scripts", "template", "data", "logs", "exports"}
TAKEN |= {"torch", "torchvision", "lightning", "torchmetrics", "tensorboard", "jsonargparse", "rich", "numpy", "yaml"}
TAKEN |= {"pytest", "copier", "ruff", "PIL", "onnx", "onnxruntime", "litserve", "optuna", "mlflow", "wandb"}


def check_name(package: str) -> None:
    """Refuse a package name that is no importable, unshadowed Python package name, saying why."""
    if not package.isidentifier() or package != package.lower():
        raise SystemExit(f"package_name {package!r} is not a lower-case Python identifier (e.g. my_digits).")
    if len(package) > MAX_NAME:
        raise SystemExit(
            f"package_name {package!r} has {len(package)} characters; {MAX_NAME} at most keep the copy's docstrings, "
            "which name the package, within its line length."
        )
    if keyword.iskeyword(package):
        raise SystemExit(f"package_name {package!r} is a Python keyword: `import {package}` cannot work.")
    if package in TAKEN or package in sys.stdlib_module_names:
        raise SystemExit(
            f"package_name {package!r} is taken: the project's folder or a package it imports (the standard "
            f"library's or a dependency's) has that name, and `import {package}` would find one of them. Pick "
            f"another, e.g. my_{package}."
        )


def rendered(root: Path, template: Path, features: set[str]) -> list[Path]:
    """The files under ``root`` that copier rendered from ``template``: its files less copier.yml's ``_exclude``
    for these features, as copier matches them. The user's own files are not among them."""
    import jinja2  # copier's own dependencies: whatever runs copier has them
    import pathspec
    import yaml

    config = yaml.safe_load((template / "copier.yml").read_text())
    rendered_patterns = [jinja2.Template(p).render(features=sorted(features)) for p in config["_exclude"]]
    # copier's own choice of pattern style for the installed pathspec (copier._main._pathspec_pattern)
    style = "gitignore" if int(pathspec.__version__.split(".")[0]) >= 1 else "gitwildmatch"
    excluded = pathspec.PathSpec.from_lines(style, [p for p in rendered_patterns if p.strip()])
    found = []
    for path in sorted(template.rglob("*")):
        relative = path.relative_to(template)
        if ".git" in relative.parts or not path.is_file() or excluded.match_file(str(relative)):
            continue
        if relative.suffix == ".jinja":  # copier's own templated file: the answers file, copier's record
            continue
        if (root / relative).is_file():
            found.append(root / relative)
    return found


def previous_package(root: Path) -> str | None:
    """The package_name of the last copy or update, from the answers file git has committed (``copier update``
    only runs in a clean git repository); None outside one (copier's temporary copies)."""
    shown = subprocess.run(["git", "show", "HEAD:./.copier-answers.yml"], cwd=root, capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    found = re.search(r"^package_name: *['\"]?(\w+)", shown.stdout, flags=re.M)
    return found.group(1) if found else None


def refuse_rename(root: Path, old: str, new: str) -> None:
    """Put the project back as git has it (the update has only rendered template files over it), then exit."""
    subprocess.run(["git", "checkout", "--quiet", "HEAD", "--", "."], cwd=root, check=True)
    subprocess.run(["git", "clean", "--quiet", "-d", "--force", "--", "."], cwd=root, check=True)
    raise SystemExit(
        f"copier update: package_name {old!r} -> {new!r} refused: an update re-generates the package under the new "
        "name and would drop your edits to it. Nothing was changed. To rename it yourself: `git mv "
        f"{old} {new}`, replace `{old}` by `{new}` in imports, configs/*.yaml and pyproject.toml, set `package_name: "
        f"{new}` in .copier-answers.yml and commit; later updates then use the new name (docs/start-a-project.md)."
    )


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


def finish(
    root: Path, package: str, features: set[str], template: Path | None = None, operation: str = "copy"
) -> list[Path]:
    """Strip the markers in the files copier rendered under ``root`` from ``template`` (every text file under
    ``root`` without one), rename the package to ``package`` and format what changed; return the files."""
    check_name(package)
    unknown = sorted(features - set(FEATURES))
    if unknown:
        raise SystemExit(f"features: {unknown} are not features of this template; pick from {', '.join(FEATURES)}.")
    if operation == "update" and (old := previous_package(root)) not in (None, package):
        refuse_rename(root, old, package)
    files = [p for p in rendered(root, template, features) if is_text(p)] if template else text_files(root)
    for path in files:
        text = path.read_text()
        updated = strip(text, features, str(path.relative_to(root)))
        if package != TEMPLATE_NAME:
            updated = rewrite(updated, TEMPLATE_NAME, package, pyproject=path.name == "pyproject.toml")
        if path == root / "README.md":
            updated = retitle(updated, package)
        if updated != text:
            path.write_text(updated)
    if package != TEMPLATE_NAME:
        move_package(root, TEMPLATE_NAME, package)
        files = [
            root / package / p.relative_to(root / TEMPLATE_NAME) if root / TEMPLATE_NAME in p.parents else p
            for p in files
        ]
    tidy(root, [p for p in files if p.suffix == ".py"], template or Path(__file__).resolve().parents[1])
    if operation == "update":
        for line in split_out_notes(features):
            print(line, file=sys.stderr)
    return files


def split_out_notes(features: set[str]) -> list[str]:
    """One line for each feature split out of the core that ``features`` leave out: what it was, and the update
    that keeps it (the recorded features plus that one)."""
    notes = []
    for feature, what in SPLIT_FROM_THE_CORE.items():
        if feature not in features:
            kept = ",".join(f for f in FEATURES if f in features or f == feature)
            notes.append(
                f"note: {feature} ({what}) was part of the core in earlier versions of the template and is not among "
                f"this project's features, so this update leaves it out. To keep it: "
                f"copier update --trust --defaults --data 'features=[{kept}]'"
            )
    return notes


def locked_ruff(template: Path) -> str:
    """The ruff version the copy's requirements.lock pins (its CI's), e.g. ``0.17.6``."""
    found = re.search(r"^ruff==([\w.]+)", (template / "requirements.lock").read_text(), flags=re.M)
    if not found:
        raise SystemExit(f"finish.py: {template / 'requirements.lock'} pins no ruff version.")
    return found.group(1)


def ruff_version(command: list[str]) -> str | None:
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return done.stdout.split()[-1] if done.returncode == 0 and done.stdout.strip() else None


def find_ruff(version: str) -> list[str] | None:
    """A ruff of ``version``: on PATH, in the Python running copier, in the cache, or fetched into the cache with
    pip (``$PROJECT_TEMPLATE_CACHE``, else ``~/.cache/project-template``)."""
    on_path = shutil.which("ruff")
    for command in ([[on_path]] if on_path else []) + [[sys.executable, "-m", "ruff"]]:
        if ruff_version(command) == version:
            return command
    cache = Path(os.environ.get("PROJECT_TEMPLATE_CACHE") or Path.home() / ".cache" / "project-template")
    target = cache / f"ruff-{version}"
    binary = target / "bin" / ("ruff.exe" if os.name == "nt" else "ruff")
    if ruff_version([str(binary)]) == version:
        return [str(binary)]
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    done = subprocess.run([*pip, "--target", str(target), f"ruff=={version}"], capture_output=True, text=True)
    if done.returncode == 0 and ruff_version([str(binary)]) == version:
        return [str(binary)]
    print(f"finish.py: could not install ruff=={version} with pip: {done.stderr.strip()[-500:]}", file=sys.stderr)
    return None


def tidy(root: Path, files: list[Path], template: Path) -> None:
    """Re-sort imports and re-wrap lines of ``files`` with the locked ruff: a new name changes line lengths and the
    order of imports, and a cut block leaves blank lines."""
    if not files:
        return
    version = locked_ruff(template)
    ruff = find_ruff(version)
    if ruff is None:
        raise SystemExit(
            f"finish.py: ruff {version} is needed to format the copy and could not be found or installed. Install it "
            f"(`pip install ruff=={version}`) where copier runs, then copy again."
        )
    names = [str(p.relative_to(root)) for p in files]
    subprocess.run([*ruff, "check", "--quiet", "--no-cache", "--fix-only", "--select", "I", *names], cwd=root)
    subprocess.run([*ruff, "format", "--quiet", "--no-cache", *names], cwd=root, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, help="the package's name, e.g. digits")
    parser.add_argument("--features", default="", help="the features kept, comma-separated (empty: the core only)")
    parser.add_argument("--root", default=".", help="the generated project (default: the current folder)")
    parser.add_argument("--template", type=Path, help="the template copier renders (its files are the ones touched)")
    parser.add_argument("--operation", default="copy", choices=["copy", "update"], help="copier's operation")
    args = parser.parse_args(argv)
    try:
        features = {f for f in args.features.split(",") if f}
        finish(Path(args.root), args.package, features, args.template, args.operation)
    except MarkerError as error:
        sys.exit(f"template marker error: {error}")


if __name__ == "__main__":
    main()
