"""`python -m project tune`: the search space, pruning, shared and resumed studies, a PostgreSQL storage."""

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from project.cli import cli_main
from tests.conftest import ROOT, small_run

optuna = pytest.importorskip("optuna", reason="the tune extra is not installed: pip install -e '.[tune]'")
from project.tune import SearchSpaceError, load_search_space, storage_for  # noqa: E402

# One trial in two: a learning rate that learns the synthetic digits, and one that cannot (pruned once 2 are done).
LEARNS_OR_NOT = "model.optimizer.init_args.lr: {type: categorical, choices: [0.003, 1.0e-9]}\n"


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def tune_args(mnist_dir: Path, logs: Path, search: str, *extra: str) -> list[str]:
    fit = [a for a in small_run(mnist_dir, logs) if not a.startswith(("--trainer.limit_train", "--trainer.max_epochs"))]
    return ["tune", f"--search={search}", *fit, "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false", *extra]


def test_search_space_types_and_errors_naming_the_key(tmp_path):
    space = load_search_space(
        write(
            tmp_path,
            "a.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n"
            "a.n: {type: int, low: 1, high: 4}\n"
            "a.c: {type: categorical, choices: [64, 128]}\n",
        )
    )
    assert [s["type"] for s in space.values()] == ["float", "int", "categorical"]
    for text, words in [
        ("k.x: {type: float, low: 2, high: 1}\n", "k.x: low (2) must be below high (1)"),
        ("k.x: {type: float, low: 0, high: 1, log: true}\n", "k.x: a log range needs low > 0"),
        ("k.x: {type: normal, low: 0, high: 1}\n", "k.x: give type: float, int or categorical"),
        ("k.x: {type: categorical, choices: []}\n", "k.x: categorical needs a non-empty list"),
        ("k.x: {type: int, low: a, high: 3}\n", "k.x: int needs numeric low and high"),
        ("k.x: {type: float, low: 0, high: 1, lgo: true}\n", "k.x: unknown field(s) lgo"),
    ]:
        with pytest.raises(SearchSpaceError, match=re.escape(words)):
            load_search_space(write(tmp_path, text))


def test_the_shipped_search_space_names_keys_fit_accepts():
    from project.tune import check_keys

    search = str(ROOT / "configs" / "search.yaml")
    space = load_search_space(search)
    assert "model.optimizer.init_args.lr" in space and space["data.batch_size"]["type"] == "categorical"
    check_keys(space, ["--config", str(ROOT / "configs" / "default.yaml")], search)  # raises on an unknown key


def test_an_unknown_key_is_an_error_before_any_trial(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    search = write(tmp_path, "model.net.init_args.dropuot: {type: float, low: 0.0, high: 0.5}\n")
    with pytest.raises(SystemExit) as exit_:
        cli_main(tune_args(mnist_dir, tmp_path / "logs", search))
    assert exit_.value.code == 2
    assert "model.net.init_args.dropuot" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()  # no trial ran, no study was created


def test_a_study_prunes_hopeless_trials_logs_each_trial_and_writes_a_best_overlay(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    study = cli_main(tune_args(mnist_dir, logs, write(tmp_path, LEARNS_OR_NOT), "--trials=4", "--study=s"))
    states = [t.state.name for t in study.trials]
    assert "COMPLETE" in states and "PRUNED" in states, states
    for t in study.trials:  # one TensorBoard run per trial, with its HParams entry
        run = logs / "s" / f"trial_{t.number}"
        assert list(run.glob("events.out.tfevents.*")), run
        assert (run / "hparams.yaml").is_file()
    pruned = next(t for t in study.trials if t.state.name == "PRUNED")
    assert pruned.user_attrs["epochs"] == 1  # stopped after the epoch it was pruned at, of 2
    best = logs / "s" / "best.yaml"
    assert "0.003" in best.read_text() and study.best_value == 1.0
    cli = cli_main(["fit", "--config", str(best), *small_run(mnist_dir, tmp_path / "refit"), "--test_after_fit=false"])
    assert cli.model.hparams.optimizer is not None and cli.trainer.global_step > 0


def tune_process(cwd: Path, mnist_dir: Path, storage: str, study: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "project"]
    cmd += tune_args(mnist_dir, cwd / "logs", write(cwd, LEARNS_OR_NOT), f"--storage={storage}", f"--study={study}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*cmd, *extra], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def check_shared(storage: str, name: str, trials: int) -> None:
    study = optuna.load_study(study_name=name, storage=storage)
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == trials, [t.state.name for t in study.trials]
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))


def run_two_workers(tmp_path: Path, mnist_dir: Path, storage: str, name: str = "shared") -> None:
    procs = [tune_process(tmp_path, mnist_dir, storage, name, "--trials=4") for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs), outputs[0][-2000:] + outputs[1][-2000:]
    check_shared(storage, name, 4)


def test_a_process_that_loses_the_race_to_create_the_schema_opens_the_storage(tmp_path, monkeypatch):
    # Two processes on a fresh storage: both read "no schema version yet", the other one inserts it first. Replayed
    # in one process: the version reads (the check, then the stamp's own) see none once, while the row exists.
    url = f"sqlite:///{tmp_path / 'race.db'}"
    storage_for(url, tmp_path, "race", heartbeat=60)  # the winner
    from alembic.runtime.migration import MigrationContext

    real, told = MigrationContext.get_current_heads, []

    def before_the_winner(self):
        if len(told) < 2:
            told.append(True)
            return ()
        return real(self)

    monkeypatch.setattr(MigrationContext, "get_current_heads", before_the_winner)
    storage = storage_for(url, tmp_path, "race", heartbeat=60)  # without the retry: IntegrityError, UNIQUE constraint
    assert told and optuna.create_study(study_name="race", storage=storage).study_name == "race"


@pytest.mark.slow  # two tune processes: ~40 s
def test_two_processes_share_one_study_in_sqlite(mnist_dir, tmp_path):
    run_two_workers(tmp_path, mnist_dir, f"sqlite:///{tmp_path / 'shared.db'}")


@pytest.mark.slow  # two tune processes against a real PostgreSQL server
def test_two_processes_share_one_study_in_postgresql(mnist_dir, tmp_path):
    url = os.environ.get("PROJECT_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI must set PROJECT_TEST_POSTGRES_URL (.ci/run starts a PostgreSQL server)")
        pytest.skip("PROJECT_TEST_POSTGRES_URL is not set: no PostgreSQL server to test against (CI starts one)")
    name = f"shared-{uuid.uuid4().hex[:8]}"  # the server outlives the test: a study of this run's own
    try:
        run_two_workers(tmp_path, mnist_dir, url, name)
    finally:
        optuna.delete_study(study_name=name, storage=url)


@pytest.mark.slow  # two tune processes, one SIGKILLed mid-trial: ~40 s
def test_a_killed_study_resumes_marks_the_killed_trial_failed_and_retries_it(mnist_dir, tmp_path):
    storage = f"sqlite:///{tmp_path / 'kill.db'}"
    slow = ["--trainer.callbacks+=tests.slow_steps.SlowSteps", f"--trainer.callbacks.folder={tmp_path / 'p'}"]
    slow += ["--trainer.callbacks.seconds=0.3", "--heartbeat=1", "--trials=3"]
    proc = tune_process(tmp_path, mnist_dir, storage, "shared", *slow)
    try:
        deadline = time.monotonic() + 180
        while True:  # one trial finished and the next one running: kill it there
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-2000:]
            try:
                trials = optuna.load_study(study_name="shared", storage=storage).trials
            except KeyError:
                trials = []
            if any(t.state.name == "COMPLETE" for t in trials) and trials[-1].state.name == "RUNNING":
                time.sleep(1.5)  # its heartbeat thread has written at least once: a trial without one is not stale
                break
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
    before = {t.number: t.value for t in trials if t.state.name == "COMPLETE"}
    killed = trials[-1].number
    time.sleep(3)  # past the grace period (2 heartbeats) of the killed trial
    again = tune_process(tmp_path, mnist_dir, storage, "shared", *slow)
    out = again.communicate(timeout=300)[0]
    assert again.returncode == 0, out[-3000:]
    study = optuna.load_study(study_name="shared", storage=storage)
    by_number = {t.number: t for t in study.trials}
    assert by_number[killed].state.name == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert retried and retried[0].params == by_number[killed].params
    for number, value in before.items():  # completed trials are kept, never run again
        assert by_number[number].state.name == "COMPLETE" and by_number[number].value == value
    assert len([t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]) >= 3
