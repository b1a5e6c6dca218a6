"""The template's copies: `copier copy` with the features picked, and `copier update` of a copy (template only)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

copier = pytest.importorskip("copier", reason="copier is not installed: pip install -e '.[dev]'")
sys.path.insert(0, str(ROOT / "template"))
from combos import PACKAGE, WORDS, generate, mentions  # noqa: E402 (template/ is not a package)
from finish import FEATURES, SKIP_DIRS, SPLIT_FROM_THE_CORE, MarkerError, split_out_notes, strip, text_files  # noqa: E402


def repository_files() -> list[Path]:
    """Every file a copy starts from: git's tracked and untracked ones, its ignored files left out; in a tree that
    is no git checkout (a downloaded archive), every file but the run outputs and environments."""
    if not (ROOT / ".git").exists():
        return [p for p in sorted(ROOT.rglob("*")) if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in listed if (ROOT / p).is_file()]


def tracked() -> list[Path]:
    """The repository's text files that a copy starts from."""
    every = set(repository_files())
    return [p for p in text_files(ROOT) if p in every]


def test_every_marker_names_a_feature_and_every_block_closes():
    for path in tracked():
        text = path.read_text()
        for features in (set(), set(FEATURES)):
            strip(text, features, str(path.relative_to(ROOT)))  # raises MarkerError naming the file and line
    with pytest.raises(MarkerError, match=r"x\.md:1: marker names"):
        strip("a line  <!-- [servr] -->\n", set(), "x.md")
    with pytest.raises(MarkerError, match="never closed"):
        strip("# >>> tune\nx\n", set(), "x.py")


def test_strip_keeps_a_picked_features_lines_without_their_markers_and_no_doubled_blank_lines():
    text = "a\n\n\n# >>> serve\ndef f():\n    pass\n\n\n# <<< serve\n\n\nb = 1  # [tune]\nc = 2  # [serve tune]\n"
    assert strip(text, set()) == "a\n\n\n"
    assert strip(text, {"tune"}) == "a\n\n\nb = 1\nc = 2\n"
    assert strip(text, {"serve"}) == "a\n\n\ndef f():\n    pass\n\n\n\n\nc = 2\n"
    assert strip("x  # [template]\ny\n", set(FEATURES)) == "y\n"  # the template's own lines: never in a copy


def test_no_python_file_holds_jinja():
    jinja = re.compile(r"\{%-?\s|\{\{\s*[A-Za-z_][\w.]*\s*(\||\}\})")  # tags, expressions, filters
    wrong = [p for p in tracked() if p.suffix == ".py" and jinja.search(p.read_text())]
    assert not wrong, f"Jinja syntax in Python files: {wrong}"


def test_every_feature_folder_of_the_package_is_a_copier_choice_that_drops_it():
    """A subpackage is a feature (its command listed, the core importing none of it) only where copier can drop it:
    a folder of the template's own package without its `_exclude` line would reach every copy."""
    folders = {p.parent.name for p in (ROOT / "project").glob("*/__init__.py")}
    dropped = set(re.findall(r"not in features %\}project/(\w+)\{", (ROOT / "copier.yml").read_text()))
    assert folders == dropped, (
        f"folders {sorted(folders - dropped)} no copier choice drops; {sorted(dropped - folders)}"
    )
    assert folders <= set(FEATURES)


@pytest.fixture(scope="module")
def core_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("core") / PACKAGE, [])


def test_the_core_alone_names_no_feature_anywhere(core_copy):
    assert mentions(core_copy, []) == []
    assert (core_copy / PACKAGE / "net.py").is_file() and not (core_copy / "project").exists()
    assert not [p for p in (core_copy / PACKAGE).iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert not (core_copy / "template").exists() and not (core_copy / "copier.yml").exists()
    answers = (core_copy / ".copier-answers.yml").read_text()
    assert "features: []" in answers and f"package_name: {PACKAGE}" in answers
    pyproject = (core_copy / "pyproject.toml").read_text()
    assert f'name = "{PACKAGE}"' in pyproject and f'{PACKAGE} = "{PACKAGE}.__main__:main"' in pyproject
    for command in (["ruff", "check", "--quiet", "."], ["ruff", "format", "--check", "--quiet", "."]):
        done = subprocess.run(command, cwd=core_copy, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_core_alone_lists_only_the_core_commands(core_copy):
    code = f"from {PACKAGE}.__main__ import commands; print(' '.join(commands()))"
    listed = subprocess.run([sys.executable, "-c", code], cwd=core_copy, capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["fit", "validate", "test", "predict"]


@pytest.mark.parametrize("feature", FEATURES)
def test_one_feature_alone_keeps_its_places_and_names_no_other(feature, tmp_path):
    copy = generate(tmp_path / PACKAGE, [feature])
    assert mentions(copy, [feature]) == []
    assert any(re.search(w, p.read_text(), flags=re.I) for w in WORDS[feature] for p in text_files(copy))
    if feature not in ("notebooks", "slurm", "github", "container"):
        assert (copy / PACKAGE / feature / "__init__.py").is_file()
    assert (copy / "docs" / f"{feature}.md").is_file()


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow  # copier copies of the template's history, a refused rename and a test run of the copy: ~60 s
def test_copier_update_brings_a_template_change_and_keeps_the_users_edit(tmp_path, monkeypatch, capfd):
    """The template as a user clones it (no tags): a copy, the user's edit and own files, a template change, then
    `copier update` changes only what the template changed; a rename by update is refused and changes nothing."""
    for key, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@x")
    template = tmp_path / "template"
    for path in repository_files():
        target = template / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    git("init", "-q", cwd=template)
    git("add", "-A", cwd=template)
    git("commit", "-qm", "the template", cwd=template)
    # The user's project, committed, then an edit of theirs in the network file and files of their own: a module
    # with a line ruff would wrap, and an overlay meant to go on top of another config (it does not run alone).
    project = tmp_path / "mine"
    copier.run_copy(str(template), project, data={"package_name": PACKAGE, "features": []}, defaults=True, unsafe=True)
    git("init", "-q", cwd=project)
    git("add", "-A", cwd=project)
    git("commit", "-qm", "from the template", cwd=project)
    net = project / PACKAGE / "net.py"
    edited = net.read_text().replace('"""', '"""My edit: a network of my own.\n\n', 1)
    net.write_text(edited)
    mine = {
        project / PACKAGE / "mynet.py": "import torch\n\nX = torch.zeros(" + ", ".join(["1"] * 50) + ")\n",
        project / "configs" / "my_shapes.yaml": "data:\n  init_args:\n    image_size: 32  # over an overlay of mine\n",
    }
    for path, text in mine.items():
        path.write_text(text)
    git("add", "-A", cwd=project)
    git("commit", "-qm", "my network", cwd=project)
    # The template changes a default.
    config = template / "configs" / "default.yaml"
    assert "max_epochs: 5\n" in config.read_text()
    config.write_text(config.read_text().replace("max_epochs: 5\n", "max_epochs: 6\n", 1))
    git("commit", "-qam", "6 epochs", cwd=template)
    answers = (project / ".copier-answers.yml").read_text()

    capfd.readouterr()
    copier.run_update(project, defaults=True, unsafe=True, overwrite=True, quiet=True)

    # The core-only project is told which features split out of the core it leaves out, and how to keep one.
    assert "copier update --trust --defaults --data 'features=[monitors]'" in capfd.readouterr().err
    assert "max_epochs: 6\n" in (project / "configs" / "default.yaml").read_text()
    assert net.read_text() == edited
    assert all(path.read_text() == text for path, text in mine.items()), "the update touched the user's files"
    assert (project / ".copier-answers.yml").read_text() != answers
    changed = git("status", "--porcelain", cwd=project).split("\n")
    assert sorted(line[3:] for line in changed if line) == [".copier-answers.yml", "configs/default.yaml"]
    assert not (project / "project").exists() and mentions(project, []) == []
    env = {**os.environ, "PYTHONPATH": str(project)}
    tests = ["tests/test_net.py", "tests/test_cli.py::test_fit_without_a_config_is_the_default_recipe"]
    tests += ["tests/test_cli.py::test_a_documented_overlay_alone_resolves_to_a_model_and_data_of_the_package"]
    tests += ["tests/test_readme.py::test_the_layout_page_names_only_modules_that_exist"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    git("commit", "-qam", "update", cwd=project)
    with pytest.raises(Exception, match=r"finish\.py"):  # copier's task error, after the task said why
        copier.run_update(project, data={"package_name": "renamed"}, defaults=True, unsafe=True, overwrite=True)
    assert git("status", "--porcelain", cwd=project) == "" and net.read_text() == edited
    assert not (project / "renamed").exists()


def test_a_copy_with_a_name_of_the_longest_length_allowed_lints_clean(tmp_path):
    """The rename lengthens every line that names the package; lines of prose cannot be re-wrapped by ruff."""
    from finish import MAX_NAME

    name = "n" * MAX_NAME
    copy = generate(tmp_path / name, list(FEATURES), package=name)
    for command in (["ruff", "check", "--quiet", "."], ["ruff", "format", "--check", "--quiet", "."]):
        done = subprocess.run(command, cwd=copy, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["import", "tests", "torch", "json", "x" * 21, "My"])
def test_a_package_name_that_cannot_work_is_refused_before_anything_is_written(tmp_path, name):
    with pytest.raises(ValueError, match="package_name"):
        generate(tmp_path / "copy", [], package=name)
    assert not (tmp_path / "copy").exists()


def test_the_task_finds_the_locked_ruff_without_one_on_path(tmp_path, monkeypatch):
    """Neither on PATH nor in copier's Python: the locked version from the cache (filled by pip on first use)."""
    import finish

    version = finish.locked_ruff(ROOT)
    cached = tmp_path / f"ruff-{version}" / "bin" / "ruff"
    cached.parent.mkdir(parents=True)
    real = shutil.which("ruff")
    assert real and finish.ruff_version([real]) == version, "the dev environment has the locked ruff"
    cached.symlink_to(real)
    monkeypatch.setenv("PROJECT_TEMPLATE_CACHE", str(tmp_path))
    monkeypatch.setattr(finish.shutil, "which", lambda name: None)
    monkeypatch.setattr(finish.sys, "executable", str(tmp_path / "no-python"))
    assert finish.find_ruff(version) == [str(cached)]


def test_the_task_formats_only_the_files_it_is_given(tmp_path):
    import finish

    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    theirs, ours = tmp_path / "theirs.py", tmp_path / "ours.py"
    for path in (theirs, ours):
        path.write_text("x = [1,\n  2]\n")
    finish.tidy(tmp_path, [ours], ROOT)
    assert ours.read_text() == "x = [1, 2]\n" and theirs.read_text() == "x = [1,\n  2]\n"


def test_an_update_names_each_feature_split_out_of_the_core_that_the_project_leaves_out():
    """A project copied before a part of the core became a feature has no record of it among its features: each
    update says so, with the command that keeps it (the recorded features plus that one)."""
    assert set(SPLIT_FROM_THE_CORE) <= set(FEATURES)
    notes = split_out_notes({"serve", "lr_find"})
    assert [note.split()[1] for note in notes] == [f for f in SPLIT_FROM_THE_CORE if f != "lr_find"]
    assert notes[0].startswith("note: monitors ") and notes[0].endswith("--data 'features=[serve,lr_find,monitors]'")
    assert split_out_notes(set(FEATURES)) == []
