"""The template's copies: `copier copy` with the features picked, and `copier update` of a copy (template only)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

copier = pytest.importorskip("copier", reason="copier is not installed: pip install -e '.[dev]'")
sys.path.insert(0, str(ROOT / "template"))
from combos import PACKAGE, WORDS, generate, mentions  # noqa: E402 (template/ is not a package)
from finish import FEATURES, MarkerError, strip, text_files  # noqa: E402


def tracked() -> list[Path]:
    """The repository's text files that a copy starts from (the working tree, git's ignored files left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    every = {ROOT / p for p in listed}
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
    assert f'name = "{PACKAGE}"' in pyproject and f'{PACKAGE} = "{PACKAGE}.cli:main"' in pyproject
    for command in (["ruff", "check", "--quiet", "."], ["ruff", "format", "--check", "--quiet", "."]):
        done = subprocess.run(command, cwd=core_copy, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_core_alone_lists_only_the_core_commands(core_copy):
    code = f"from {PACKAGE}.cli import commands; print(' '.join(commands()))"
    listed = subprocess.run([sys.executable, "-c", code], cwd=core_copy, capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["fit", "validate", "test", "predict", "cv", "env"]


@pytest.mark.parametrize("feature", FEATURES)
def test_one_feature_alone_keeps_its_places_and_names_no_other(feature, tmp_path):
    copy = generate(tmp_path / PACKAGE, [feature])
    assert mentions(copy, [feature]) == []
    assert any(re.search(w, p.read_text(), flags=re.I) for w in WORDS[feature] for p in text_files(copy))
    if feature != "notebooks":
        assert (copy / PACKAGE / feature / "__init__.py").is_file()
    assert (copy / "docs" / f"{feature}.md").is_file()


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow  # two copier copies of the template's history and a test run of the copy: ~40 s
def test_copier_update_brings_a_template_change_and_keeps_the_users_edit(tmp_path, monkeypatch):
    for key, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@x")
    # The template's history: this working tree as release v1.0.0, then a changed default as v1.1.0.
    template = tmp_path / "template"
    for path in [ROOT / p for p in git("ls-files", "-co", "--exclude-standard", cwd=ROOT).split()]:
        if path.is_file():
            target = template / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    git("init", "-q", cwd=template)
    git("add", "-A", cwd=template)
    git("commit", "-qm", "v1.0.0", cwd=template)
    git("tag", "v1.0.0", cwd=template)
    # The user's project from v1.0.0, committed, then an edit of theirs in the network file.
    project = tmp_path / "mine"
    copier.run_copy(str(template), project, data={"package_name": PACKAGE, "features": []}, defaults=True, unsafe=True)
    assert "_commit: v1.0.0" in (project / ".copier-answers.yml").read_text()
    git("init", "-q", cwd=project)
    git("add", "-A", cwd=project)
    git("commit", "-qm", "from the template", cwd=project)
    net = project / PACKAGE / "net.py"
    edited = net.read_text().replace('"""', '"""My edit: a network of my own.\n\n', 1)
    net.write_text(edited)
    git("commit", "-qam", "my network", cwd=project)
    # The template changes a default and releases v1.1.0.
    config = template / "configs" / "default.yaml"
    assert "max_epochs: 5\n" in config.read_text()
    config.write_text(config.read_text().replace("max_epochs: 5\n", "max_epochs: 6\n", 1))
    git("commit", "-qam", "6 epochs", cwd=template)
    git("tag", "v1.1.0", cwd=template)

    copier.run_update(project, defaults=True, unsafe=True, overwrite=True, quiet=True)

    assert "max_epochs: 6\n" in (project / "configs" / "default.yaml").read_text()
    assert net.read_text() == edited
    assert "_commit: v1.1.0" in (project / ".copier-answers.yml").read_text()
    assert not (project / "project").exists() and mentions(project, []) == []
    env = {**os.environ, "PYTHONPATH": str(project)}
    tests = ["tests/test_net.py", "tests/test_cli.py::test_fit_without_a_config_is_the_default_recipe"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
