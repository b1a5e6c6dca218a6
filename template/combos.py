"""Generate the template's copies (the core alone, each feature alone, every feature) and check each one.

    python template/combos.py                   # every combination: generate, check, install, its own tests
    python template/combos.py --only core serve # some of them; --no-tests: generate and check only

One more copy is made as the README's set-up makes it, with copier alone installed (``check_bare``). A copy passes
when no file of it names a feature it dropped (the words each feature is known by, below), when
ruff and mypy find nothing, and when its own offline tests (``pytest -m "not slow"``) pass with the copy installed in
the running environment (``pip install --no-deps -e``; the environment has every extra already). `.ci/run` runs it.

The core copy and the copy with every feature run their whole offline suite. A copy with one feature runs the tests
that can differ from the core copy's (``tests_beyond_the_core``): the feature's own test files, the test files with
lines of that feature, and the tests that see which features are present (the command list, the feature hooks, the
pages). The others test the core's code, which is the same in both copies (the core's modules hold no feature's
lines: ``test_layout.py``), so the core copy's run is theirs.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "template"))
from finish import FEATURES, text_files  # noqa: E402 (template/ is not a package)

PACKAGE = "digits"
# What names a feature in a file: a copy without the feature has none of these, in any file.
WORDS = {
    "serve": [r"\bserve\b", r"litserve", r"\bzmq\b", r"reuse_port", r"multipart", r"\bwrk\b"],
    "tune": [r"(?<!fine-)\btune\b", r"optuna", r"search\.yaml", r"postgres", r"psycopg"],
    "export": [
        r"\bexport(?:s|ed)?\b(?! [A-Z][A-Z_]+\b)",  # not the shell's `export PATH_DATASETS`
        *[r"onnx", r"quantiz", r"\[export\]", r"\bexports/", r"\bcompression", r"\.pt2\b"],
    ],
    "elastic": [r"\belastic\b"],
    "folder": [r"imagefolder", r"folder\.(?:yaml|py|md)\b", r"\w/folder\b", r"\.folder\.data\b"],
    "cv": [r"\bcv\b", r"cross-validation", r"k-fold", r"\bkfold\b", r"cv\.(?:md|sbatch)\b"],
    "lr_find": [r"lr_find", r"learning-rate finder", r"range test", r"LearningRateReport", r"TunerExit"],
    "env": [r"-m \w+ env\b", r"\benv(?:/|\.md\b)", r"test_env\b", r"\benv\.report\b"],
    "monitors": [
        r"LayerHistograms",
        r"TensorBoardImages",
        r"worst.misclassified",
        r"ThroughputMonitor",
        r"\.monitors\b",
        r"\bmonitors(?:/|\.md|\.py)",
        r"--histograms",
    ],
    "track": [
        *[r"mlflow", r"wandb", r"weights & biases", r"\bW&B\b", r"\btrack\b"],
        *[r"StepProfiler", r"PyTorchProfiler", r"profiler\.py", r"profile\.yaml"],
    ],
    "notebooks": [r"notebook", r"ipynb", r"nbmake", r"ipykernel", r"nbformat"],
    # The core knows SLURM job IDs (job_identity) and docs/distributed.md shows an sbatch script: the feature is
    # its own scripts.
    "slurm": [r"scripts/slurm", r"\.sbatch\b", r"slurm\.md", r"local_cluster"],
    "github": [r"\.github/", r"actionlint", r"check-jsonschema", r"github\.md", r"template-sync", r"GitHub Actions"],
    "container": [r"containerfile", r"containerignore", r"\bpodman\b", r"mmdebstrap", r"container\.md"],
}
# A feature that works with another may name it in its own files: serve answers for exported ONNX files (and
# reads a folder-trained checkpoint's sizes).
WORKS_WITH = {"serve": ["export", "folder"]}
COMBOS = {"core": [], **{feature: [feature] for feature in FEATURES}, "all": list(FEATURES)}
# The tests that see which features are present: a copy with one feature runs them whatever their text.
SEE_THE_FEATURES = ["tests/test_layout.py", "tests/test_hooks.py", "tests/test_readme.py"]


def generate(destination: Path, features: list[str], package: str = PACKAGE, vcs_ref: str = "HEAD") -> Path:
    """``copier copy`` of this repository (its working tree, uncommitted changes included) into ``destination``."""
    from copier import run_copy

    data = {"package_name": package, "features": features}
    ref = vcs_ref if (ROOT / ".git").exists() else None  # a downloaded archive: the folder as it is
    run_copy(str(ROOT), destination, data=data, defaults=True, unsafe=True, vcs_ref=ref, quiet=True)
    return destination


def mentions(root: Path, features: list[str]) -> list[str]:
    """``path:line: word`` for every word of a dropped feature found under ``root``, file names included."""
    named = {*features, *(other for f in features for other in WORKS_WITH.get(f, []))}
    dropped = [f for f in FEATURES if f not in named]
    patterns = [(f, re.compile(word, re.I)) for f in dropped for word in WORDS[f]]
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if ".git" in relative.parts or "__pycache__" in relative.parts:
            continue
        found += [f"{relative}: named {word.pattern!r} ({f})" for f, word in patterns if word.search(str(relative))]
    for path in text_files(root):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for f, word in patterns:
                if word.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {word.pattern!r} ({f}): {line.strip()[:100]}")
    return found


def run(command: list[str], cwd: Path) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, check=True)


def test_texts(copy: Path) -> dict[str, str]:
    """The text of each test file of ``copy``, by its path inside the copy."""
    return {str(p.relative_to(copy)): p.read_text() for p in sorted((copy / "tests").glob("test_*.py"))}


def tests_beyond_the_core(copy: Path, core: dict[str, str]) -> list[str]:
    """The test files of ``copy`` that are not in the core copy (whose tests are ``core``) or read otherwise there,
    and those that see which features are present."""
    differ = [path for path, text in test_texts(copy).items() if core.get(path) != text]
    return sorted({*differ, *(path for path in SEE_THE_FEATURES if (copy / path).is_file())})


def check(name: str, features: list[str], tests: bool, core: dict[str, str] | None, mypy_cache: Path) -> float:
    """Generate one combination and check it; return its wall time in seconds. With ``core`` (the core copy's test
    files), run only ``tests_beyond_the_core``; else the whole offline suite. ``mypy_cache`` is shared by the copies:
    mypy checks each module's cache entry against its file, and the copies share the core and the libraries, which
    a cold cache would analyse again in each (about 25 s a copy)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"combo-{name}-") as tmp:
        copy = generate(Path(tmp) / PACKAGE, features)
        if found := mentions(copy, features):
            sys.exit(f"{name}: the copy names features it dropped:\n  " + "\n  ".join(found))
        run(["ruff", "check", "--quiet", "."], copy)
        run(["ruff", "format", "--check", "--quiet", "."], copy)
        # the copy's [tool.mypy]: its own package, as its .ci/run checks it
        run([sys.executable, "-m", "mypy", "--cache-dir", str(mypy_cache)], copy)
        if tests:
            pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
            run([*pip, "install", "--no-deps", "-e", "."], copy)
            chosen = tests_beyond_the_core(copy, core) if core is not None else []
            try:
                run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *chosen], copy)
            finally:
                run([*pip, "uninstall", "--yes", PACKAGE], copy)
    return time.perf_counter() - start


def check_bare() -> float:
    """The README's `pip install copier` and nothing else: a fresh environment with copier alone, no ruff on PATH,
    an empty cache. The task fetches the locked ruff with pip, and the copy (every feature, the longest name
    allowed) is lint-clean. Returns the wall time in seconds."""
    from finish import MAX_NAME

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="combo-bare-") as tmp:
        venv, copy = Path(tmp) / "venv", Path(tmp) / "copy"
        run([sys.executable, "-m", "venv", str(venv)], Path(tmp))
        locked = re.search(r"^copier==\S+", (ROOT / "requirements.lock").read_text(), flags=re.M)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--quiet", "--disable-pip-version-check"]
        run([*pip, "install", locked.group(0) if locked else "copier"], Path(tmp))
        env = {**os.environ, "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PROJECT_TEMPLATE_CACHE": str(Path(tmp) / "c")}
        data = ["--data", f"package_name={'n' * MAX_NAME}", "--data", f"features=[{','.join(FEATURES)}]"]
        command = [str(venv / "bin" / "copier"), "copy", "--trust", "--defaults", "--vcs-ref", "HEAD", *data]
        print("+", " ".join(command), flush=True)
        subprocess.run([*command, str(ROOT), str(copy)], env=env, check=True, stdout=subprocess.DEVNULL)
        run(["ruff", "check", "--quiet", "."], copy)
        run(["ruff", "format", "--check", "--quiet", "."], copy)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(COMBOS), help="the combinations to check (default: all)")
    parser.add_argument("--no-tests", dest="tests", action="store_false", help="generate and check, run no tests")
    parser.add_argument("--no-bare", dest="bare", action="store_false", help="skip the copy made with copier alone")
    args = parser.parse_args(argv)
    core = None
    if any(len(COMBOS[name]) == 1 for name in args.only or COMBOS):
        with tempfile.TemporaryDirectory(prefix="combo-tests-") as tmp:
            core = test_texts(generate(Path(tmp) / PACKAGE, []))
    with tempfile.TemporaryDirectory(prefix="combo-mypy-") as mypy_cache:
        times = {
            name: check(name, COMBOS[name], args.tests, core if len(COMBOS[name]) == 1 else None, Path(mypy_cache))
            for name in args.only or COMBOS
        }
    bare = check_bare() if args.bare else None
    for name, seconds in times.items():
        print(f"{name:10s} features={','.join(COMBOS[name]) or '-':50s} passed in {seconds:5.0f} s")
    if bare is not None:
        print(f"bare       copier alone, the locked ruff fetched by the task: lint-clean in {bare:5.0f} s")


if __name__ == "__main__":
    main()
