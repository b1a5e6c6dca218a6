"""`python -m project tune`: search space, pruning, shared and resumed studies, PostgreSQL, dashboard."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from project.__main__ import cli_main
from tests.conftest import ROOT, assert_help_shows_defaults, small_run

optuna = pytest.importorskip("optuna", reason="the tune extra is not installed: pip install -e '.[tune]'")
from project.tune.search import SearchSpaceError, fail_dead_trials, load_search_space, storage_for  # noqa: E402

# One trial in two: a learning rate that learns the synthetic digits, and one that cannot (pruned once 2 are done).
LEARNS_OR_NOT = "model.optimizer.init_args.lr: {type: categorical, choices: [0.003, 1.0e-9]}\n"
# A space where two trials share values only if the sampler proposed the same point twice.
CONTINUOUS = (
    "model.optimizer.init_args.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n"
    "model.net.init_args.dropout: {type: float, low: 0.0, high: 0.5}\n"
)


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


def test_the_shipped_search_space_names_keys_fit_accepts(tmp_path):
    from project.tune.search import check_fit

    search = str(ROOT / "configs" / "search.yaml")
    space = load_search_space(search)
    assert "model.optimizer.init_args.lr" in space and space["data.batch_size"]["type"] == "categorical"
    default = ["--config", str(ROOT / "configs" / "default.yaml")]
    assert check_fit(space, default, search) == Path("logs")  # raises on an unknown key
    # The runs' folder as the CLI resolves it: from a --config file too, not only from the command line.
    overlay = write(tmp_path, "trainer:\n  logger:\n    init_args:\n      save_dir: elsewhere\n")
    assert check_fit(space, [*default, "--config", overlay], search) == Path("elsewhere")


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
    space = write(tmp_path, LEARNS_OR_NOT)
    study = cli_main(tune_args(mnist_dir, logs, space, "--trials=4", "--study=s", "--seed=0"))  # seed 0: both values
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


def test_two_processes_that_start_a_trial_at_once_with_one_left_run_one_the_other_is_skipped(
    mnist_dir, tmp_path, monkeypatch, capsys, caplog
):
    # --trials=2 with one complete: this process sees one left and asks for a trial, and another process asks for
    # one at the same moment, first. Both looked before either trial existed: the count alone would run both.
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'race.db'}"
    lr = optuna.distributions.CategoricalDistribution([0.003, 1.0e-9])
    study = optuna.create_study(study_name="race", storage=storage, direction="maximize")
    done = optuna.trial.create_trial(
        params={"model.optimizer.init_args.lr": 0.003}, distributions={"model.optimizer.init_args.lr": lr}, value=0.5
    )
    study.add_trial(done)
    elsewhere = {"trial": 1, "host": "another-host", "pid": 1, "started": 0.0}  # alive as far as this host can tell
    ask = optuna.study.Study.ask

    def another_process_first(self, *args, **kwargs):
        if len(self.trials) == 1:
            self.add_trial(
                optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs={"process": elsewhere})
            )
        return ask(self, *args, **kwargs)

    monkeypatch.setattr(optuna.study.Study, "ask", another_process_first)
    logs = tmp_path / "logs"
    space = write(tmp_path, LEARNS_OR_NOT)
    study = cli_main(tune_args(mnist_dir, logs, space, "--trials=2", "--study=race", f"--storage={storage}"))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "RUNNING", "FAIL"], states
    assert study.trials[2].user_attrs["skipped"] and not study.trials[2].params  # nothing sampled
    assert not (logs / "race" / "trial_2").exists()  # and no fit run
    out = capsys.readouterr().out
    assert "tune: trial 2 skipped: other processes started the study's 2 trials first" in out
    assert "    2 | SKIPPED  |" in out
    # A routine event, not a failure: none of Optuna's "Trial 2 failed" warnings, nor OverBudget's traceback.
    assert not [r for r in caplog.records if r.getMessage().startswith("Trial 2 failed") or r.exc_info], caplog.text


def tune_process(cwd: Path, mnist_dir: Path, storage: str, study: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "project"]
    cmd += tune_args(mnist_dir, cwd / "logs", write(cwd, CONTINUOUS), f"--storage={storage}", f"--study={study}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*cmd, *extra], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def check_shared(storage: str, name: str, trials: int) -> optuna.Study:
    """Exactly ``trials`` finished, none left running, and no point proposed twice (a retry re-runs its own)."""
    study = optuna.load_study(study_name=name, storage=storage)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == trials and "RUNNING" not in states, states
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))
    proposed = [tuple(sorted(t.params.items())) for t in study.trials if "failed_trial" not in t.system_attrs]
    assert len(proposed) == len(set(proposed)), proposed
    return study


def run_two_workers(tmp_path: Path, mnist_dir: Path, storage: str, name: str = "shared", trials: int = 4) -> None:
    procs = [tune_process(tmp_path, mnist_dir, storage, name, f"--trials={trials}") for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs), outputs[0][-2000:] + outputs[1][-2000:]
    check_shared(storage, name, trials)


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
        run_two_workers(tmp_path, mnist_dir, url, name, trials=6)
    finally:
        optuna.delete_study(study_name=name, storage=url)


def test_a_trial_whose_process_died_on_this_host_is_failed_and_queued_again_at_once(tmp_path):
    storage = storage_for(None, tmp_path, "dead", heartbeat=60)  # a grace period of 120 s: not what finds it here
    study = optuna.create_study(study_name="dead", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import psutil

    me, host = psutil.Process(), socket.gethostname()
    owners = {
        "dead": {"host": host, "pid": dead.pid, "started": time.time() - 5},
        "reused pid": {"host": host, "pid": me.pid, "started": me.create_time() - 100},
        "alive": {"host": host, "pid": me.pid, "started": me.create_time()},
        "other host": {"host": host + "-elsewhere", "pid": dead.pid, "started": 0.0},
    }
    numbers = {}
    for name, owner in owners.items():
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        trial.set_user_attr("process", {"trial": trial.number, **owner})
        numbers[name] = trial.number
    assert fail_dead_trials(study, storage) == [numbers["dead"], numbers["reused pid"]]
    state = {t.number: t.state.name for t in study.trials}
    assert [state[numbers[n]] for n in owners] == ["FAIL", "FAIL", "RUNNING", "RUNNING"]
    retries = [t for t in study.trials if t.state.name == "WAITING"]
    assert sorted(t.system_attrs["failed_trial"] for t in retries) == [numbers["dead"], numbers["reused pid"]]
    assert retries[0].params == study.trials[retries[0].system_attrs["failed_trial"]].params
    # The retry inherits the dead owner's attribute, for another trial number: not taken for a dead owner of its own.
    assert fail_dead_trials(study, storage) == []


def test_the_dashboard_serves_a_study_s_trials_over_http(tmp_path):
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    study = optuna.create_study(study_name="dash", storage=url, direction="maximize")
    study.optimize(lambda t: t.suggest_float("model.optimizer.init_args.lr", 1e-4, 1e-2, log=True), n_trials=3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [Path(sys.executable).with_name("optuna-dashboard"), url, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)[0][-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    studies = json.load(r)["study_summaries"]
                break
            except OSError:
                time.sleep(0.3)
        (summary,) = [s for s in studies if s["study_name"] == "dash"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}", timeout=5) as r:
            trials = json.load(r)["trials"]
        assert [t["state"] for t in trials] == ["Complete"] * 3
        assert [t["values"][0] for t in trials] == [t.value for t in study.trials]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # two tune processes started together, one SIGKILLed mid-trial and started again at once: ~60 s
def test_a_killed_study_restarted_at_once_retries_the_killed_trial_and_never_repeats_a_point(mnist_dir, tmp_path):
    storage = f"sqlite:///{tmp_path / 'kill.db'}"

    def slow(folder: str) -> list[str]:  # the default heartbeat: stale only after 120 s
        steps = ["--trainer.callbacks+=tests.slow_steps.SlowSteps", f"--trainer.callbacks.folder={tmp_path / folder}"]
        return [*steps, "--trainer.callbacks.seconds=0.3", "--trials=5"]

    victim = tune_process(tmp_path, mnist_dir, storage, "shared", *slow("victim"))
    other = tune_process(tmp_path, mnist_dir, storage, "shared", *slow("other"))
    progress = tmp_path / "victim" / "rank0.txt"  # "<pid> <global step>" after each step of the victim's trial
    try:
        deadline = time.monotonic() + 180
        while True:  # one trial finished and the victim early in the next one: kill it there
            assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()[0][-2000:]
            # Steps 1-2 of 4 in its first epoch: >= 0.9 s of sleeps before the trial can report, be pruned or end,
            # so it is still running when the SIGKILL lands (later, a loaded machine could see it finish first).
            step = int(progress.read_text().split()[1]) if progress.exists() else 0
            if step not in (1, 2):
                time.sleep(0.05)
                continue
            try:
                trials = optuna.load_study(study_name="shared", storage=storage).trials
            except KeyError:
                trials = []
            running = [t for t in trials if t.state.name == "RUNNING" and t.user_attrs.get("process", {}).get("pid")]
            mine = [t for t in running if t.user_attrs["process"]["pid"] == victim.pid]
            if any(t.state.name == "COMPLETE" for t in trials) and mine:
                break
            time.sleep(0.2)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed = mine[0].number
        before = {t.number: t.value for t in trials if t.state.name == "COMPLETE"}
        again = tune_process(tmp_path, mnist_dir, storage, "shared", *slow("again"))  # at once, as a scheduler would
        out = again.communicate(timeout=300)[0]
        assert again.returncode == 0, out[-3000:]
        other_out = other.communicate(timeout=300)[0]
        assert other.returncode == 0, other_out[-3000:]
        # Whichever of the two looked first (the restart as it starts, the other after its trial) retried it.
        assert f"killed trial(s) [{killed}] failed and queued again" in out + other_out, out[-3000:]
    finally:
        for p in (victim, other):
            p.kill()
            p.wait()
    study = check_shared(storage, "shared", 5)
    by_number = {t.number: t for t in study.trials}
    assert by_number[killed].state.name == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert retried and retried[0].params == by_number[killed].params
    assert retried[0].state.name in ("COMPLETE", "PRUNED")  # long before the 120 s grace period of a heartbeat
    for number, value in before.items():  # completed trials are kept, never run again
        assert by_number[number].state.name == "COMPLETE" and by_number[number].value == value


def test_the_tune_help_shows_the_defaults(capsys):
    assert_help_shows_defaults("tune", "(default: 12)", capsys)
