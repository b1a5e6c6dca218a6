"""The GitHub workflows (docs/github.md), checked offline: GitHub's schema, actionlint, and that they run what the
README, the Makefile and the package say."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, make_mnist

pytest.importorskip("check_jsonschema", reason="the workflow checks need the github extra: pip install -e '.[dev]'")

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent  # the tools the extra installs, beside this Python


def steps(workflow: str, job: str) -> list[dict]:
    return yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())["jobs"][job]["steps"]


def run_lines(workflow: str, job: str) -> list[str]:
    """The shell lines of a job's `run:` steps, comments and blank lines left out."""
    lines = [line.strip() for step in steps(workflow, job) for line in step.get("run", "").splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "{", "}", "echo"))]


def test_both_workflows_are_there_and_pass_githubs_schema_and_actionlint():
    # the template's two; a workflow of your own beside them is checked as well
    assert {"ci.yml", "template-sync.yml"} <= {p.name for p in WORKFLOWS}
    schema = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)]
    # The files named: without them actionlint looks for a git repository (a copy or an archive may have none)
    for command in (schema, [str(BIN / "actionlint"), "-no-color", *map(str, WORKFLOWS)]):
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command[0]}:\n{done.stdout}{done.stderr}"


def test_actionlint_finds_a_broken_workflow(tmp_path):
    """The check can fail: an expression on an undefined context and an action's unknown input are caught."""
    broken = tmp_path / ".github" / "workflows" / "ci.yml"
    broken.parent.mkdir(parents=True)
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    # a typo in a context's name (github.workflow -> githb.workflow), and an input setup-python does not have
    text = text.replace("github.workflow", "githb.workflow", 1).replace("cache: pip", "cache: pip\n          bogus: 1")
    broken.write_text(text)
    done = subprocess.run([str(BIN / "actionlint"), "-no-color", str(broken)], capture_output=True, text=True)
    assert done.returncode == 1 and "githb" in done.stdout and '"bogus" is not defined' in done.stdout, done.stdout


def test_the_check_job_installs_as_the_readme_and_lints_as_make_lint():
    lines = run_lines("ci.yml", "check")
    readme_setup = re.search(r"```bash\n(pip install [^\n]+)\n", (ROOT / "README.md").read_text()).group(1)
    make_lint = re.search(r"^lint:.*\n((?:\t.+\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert lines[0] == readme_setup
    assert lines[1:-1] == [line.strip() for line in make_lint.splitlines()]
    assert shlex.split(lines[-1]) == ["pytest", "-m", "not slow"]


def test_the_full_job_runs_ci_run_and_its_download_command_works(tmp_path):
    lines = run_lines("ci.yml", "full")
    assert lines[-1].endswith("bash .ci/run") and (ROOT / ".ci" / "run").is_file()
    download = next(line for line in lines if line.startswith("python -c"))
    make_mnist(tmp_path / "data")  # the cache's files: the command checks them and downloads nothing
    done = subprocess.run([sys.executable, *shlex.split(download)[1:]], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_template_sync_runs_copier_update_with_flags_copier_knows_and_the_locked_copier():
    lines = run_lines("template-sync.yml", "update")
    update = next(shlex.split(line) for line in lines if line.startswith("copier update"))
    shown = subprocess.run([str(BIN / "copier"), "update", "--help"], capture_output=True, text=True, check=True)
    for flag in (word for word in update if word.startswith("--")):
        assert re.search(rf"(?<![\w-]){flag}\b", shown.stdout), f"copier update has no {flag}"
    assert re.search(r"^copier==\S+$", (ROOT / "requirements.lock").read_text(), flags=re.M)
    assert all(
        step.get("if") == "hashFiles('.copier-answers.yml') != ''" for step in steps("template-sync.yml", "update")[1:]
    )
