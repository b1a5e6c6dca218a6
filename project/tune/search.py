"""Hyperparameter search on Optuna: ``python -m project tune --search configs/search.yaml [fit options]``.

Each trial is an in-process ``fit`` (``cli.run``) with the trial's values as overrides of the same configs and
keys ``fit`` takes; its objective is the best validation metric (``val/acc``), never the test set. Hopeless trials
are pruned after an epoch (optuna-integration's ``PyTorchLightningPruningCallback``, a median pruner by default).
The study lives in an Optuna storage: by default a SQLite file under ``logs/``; ``--storage`` takes any Optuna URL
(``postgresql://...``, ``journal:<file>`` for Optuna's journal file). The same command started in several processes
or on several machines against one storage shares one study, and together they stop at ``--trials``
(``within_budget``). Each trial records the process that runs it (host, PID, start time): a trial whose process is
gone on this host is marked failed and retried by the next run of the command at once; one from another host, once
its heartbeat is stale (2 x ``--heartbeat``). Finished trials are never run again. Each process seeds its sampler
anew (or from ``--seed`` and the trials already in the study), and TPE's constant liar keeps parallel processes off
the points the others are running: a restart or a parallel process proposes points of its own (a retry re-runs its
failed trial's values).
Each trial is a TensorBoard run ``<save_dir>/<study>/trial_<n>/``; at the end the trials are printed as a table and
the best trial's values are written as a YAML overlay, ``<save_dir>/<study>/best.yaml``.
"""

import argparse
import json
import logging
import math
import secrets
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from project.errors import UserError

try:
    import optuna
    import psutil
    import sqlalchemy.exc
    from optuna.storages.journal import JournalFileBackend
    from optuna_integration import PyTorchLightningPruningCallback
except ImportError as exc:  # an optional extra
    raise ImportError("`tune` needs Optuna: pip install -e '.[tune]'") from exc

TYPES = ("float", "int", "categorical")
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
RUNNING, WAITING = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING
SKIPPED = "skipped"  # the user attribute of a trial that found the study's --trials taken by lower-numbered ones


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b.c": 1}`` -> ``{"a": {"b": {"c": 1}}}``: dotted keys as the YAML overlay ``fit --config`` reads."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


class SearchSpaceError(UserError, ValueError):
    """A search space entry that is malformed or names a key the CLI does not know."""


def load_search_space(path: str) -> dict[str, dict[str, Any]]:
    """Read and check ``path``: ``{dotted CLI key: {type: float|int|categorical, ...}}``.

    Raises:
        SearchSpaceError: naming the file and the key, for an unknown type, a missing or inverted range, a log range
            that is not positive, or empty choices. (Keys the CLI does not know: ``check_keys``.)
    """
    try:
        space = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SearchSpaceError(f"--search {path}: cannot read it: {exc}") from exc
    if not isinstance(space, dict) or not space:
        raise SearchSpaceError(f"--search {path}: expected a mapping of CLI keys to ranges, e.g. {example()}")
    for key, spec in space.items():
        where = f"--search {path}: {key}"
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            raise SearchSpaceError(f"{where}: give type: float, int or categorical (got {spec!r})")
        if spec["type"] == "categorical":
            if not isinstance(spec.get("choices"), list) or not spec["choices"]:
                raise SearchSpaceError(f"{where}: categorical needs a non-empty list of choices")
            continue
        low, high = spec.get("low"), spec.get("high")
        if (
            not isinstance(low, (int, float))
            or not isinstance(high, (int, float))
            or isinstance(low, bool)
            or isinstance(high, bool)
        ):
            raise SearchSpaceError(f"{where}: {spec['type']} needs numeric low and high (got {low!r}, {high!r})")
        if not low < high:
            raise SearchSpaceError(f"{where}: low ({low}) must be below high ({high})")
        if spec.get("log") and low <= 0:
            raise SearchSpaceError(f"{where}: a log range needs low > 0 (got {low})")
        unknown = set(spec) - {"type", "low", "high", "log", "step"}
        if unknown:
            raise SearchSpaceError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    return space


def example() -> str:
    return "model.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}"


def suggest(trial: optuna.Trial, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The trial's value for each key of the search space."""
    values = {}
    for key, spec in space.items():
        if spec["type"] == "categorical":
            values[key] = trial.suggest_categorical(key, spec["choices"])
        elif spec["type"] == "int":
            values[key] = trial.suggest_int(
                key, spec["low"], spec["high"], step=spec.get("step", 1), log=spec.get("log", False)
            )
        else:
            values[key] = trial.suggest_float(
                key, spec["low"], spec["high"], step=spec.get("step"), log=spec.get("log", False)
            )
    return values


def overrides(values: dict[str, Any]) -> list[str]:
    """``--key=value`` options for the CLI; values as JSON, which the CLI reads as YAML: types are kept."""
    return [f"--{key}={json.dumps(value)}" for key, value in values.items()]


def check_fit(space: dict[str, dict[str, Any]], fit_args: list[str], search: str) -> Path:
    """Parse and build ``fit`` once with every search key set to a value of its range, as a trial will.

    Returns:
        The runs' folder, ``<save_dir>`` of the TensorBoard logger the options (``--config`` files too) configure.

    Raises:
        SearchSpaceError: naming the keys the CLI does not accept, with its parser's message.
    """
    from jsonargparse import ArgumentError

    from project.cli import run

    first = {k: (s["choices"][0] if s["type"] == "categorical" else s["low"]) for k, s in space.items()}
    try:
        cli = run([*fit_args, *overrides(first)], subcommand=False, exit_on_error=False)
    except ArgumentError as exc:
        lines = str(exc).strip().splitlines()
        named = [k for k in space if k in str(exc) or k.split(".")[-1] in str(exc)]
        why = lines[-1] if lines else exc
        raise SearchSpaceError(
            f"--search {search}: {', '.join(named) or 'a key'} is not accepted by fit: {why}"
        ) from None
    loggers = cli.trainer.loggers
    return Path(loggers[0].save_dir if loggers and loggers[0].save_dir else "logs")


with warnings.catch_warnings():  # experimental in Optuna 4 and chosen here: not for the user of --help to act on
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    RETRY = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3)


def this_process(trial: int) -> dict[str, Any]:
    """Trial ``trial``'s owner, beyond doubt on its host: a PID is reused, a PID with its start time is not."""
    me = psutil.Process()
    return {"trial": trial, "host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def is_dead(owner: dict[str, Any]) -> bool:
    """Whether the process ``owner`` (a trial's ``process`` attribute) is certainly gone: on this host only."""
    if owner.get("host") != socket.gethostname():
        return False  # another machine's process: only its heartbeat can tell
    try:
        # The same PID started at another time is another process: the owner is gone and its PID reused.
        return abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) > 1.0
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False  # alive, under another user


def fail_dead_trials(study: optuna.Study, storage: Any) -> list[int]:
    """Mark failed, and queue for a retry, the running trials whose process on this host is gone.

    Optuna fails a killed trial only once its heartbeat is stale (the grace period); a restart at once would count
    it as running and stop short. Here the owner's host, PID and start time make the death certain without waiting.

    Returns:
        The numbers of the trials it failed.
    """
    failed = []
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(RUNNING,)):
        owner = trial.user_attrs.get("process")
        # A retry inherits its failed trial's attributes: until its own process writes its own, the owner is unknown.
        if not isinstance(owner, dict) or owner.get("trial") != trial.number or not is_dead(owner):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            changed = storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            changed = False
        if changed:  # False: another restarted process failed it first, and queued its retry
            RETRY(study, storage.get_trial(trial_id))
            failed.append(trial.number)
    if failed:
        print(f"tune: killed trial(s) {failed} failed and queued again (their process on this host is gone)")
    return failed


def live_trials(study: optuna.Study, storage: Any) -> int:
    """Trials finished or running in a live process: a dead local owner's trial and a stale heartbeat's fail first."""
    fail_dead_trials(study, storage)
    optuna.storages.fail_stale_trials(study)  # Optuna runs it as a trial starts (no-op without heartbeats): now too
    return len(study.get_trials(deepcopy=False, states=(*FINISHED, RUNNING)))


class OverBudget(Exception):
    """The trial started after other processes' trials had taken the study's ``--trials``: it runs no fit."""


class QuietSkips(logging.Filter):
    """Keeps Optuna's "trial N failed" warnings, with OverBudget's traceback, of a skipped trial off the console:
    a routine event, which ``tune`` says in one line itself. Set on the handlers of the ``optuna`` logger."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], OverBudget):
            return False
        return not any(record.getMessage().startswith(f"Trial {n} failed ") for n in self.skipped)


def within_budget(study: optuna.Study, number: int, trials: int) -> bool:
    """Whether trial ``number`` is one of the study's first ``trials`` live trials, by trial number.

    Checking the count and then starting a trial is a race between processes: two that each see one trial left
    both start one. A number is given out once, so deciding after the trial exists is not: of the trials started
    at once, only those with fewer than ``trials`` finished, running or queued (a killed trial's retry) trials
    numbered below them go on. Failed ones do not count: their retry does.
    """
    before = study.get_trials(deepcopy=False, states=(*FINISHED, RUNNING, WAITING))
    return sum(t.number < number for t in before) < trials


def storage_for(url: str | None, root: Path, study: str, heartbeat: int) -> Any:
    """The Optuna storage: SQLite under ``root`` by default, ``journal:<file>``, or any RDB URL; with heartbeats."""
    if url is not None and url.startswith("journal:"):
        backend = JournalFileBackend(url.removeprefix("journal:"))
        return optuna.storages.JournalStorage(backend)
    if url is None:
        root.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(root / f'{study}.db').resolve()}"

    def open_storage() -> optuna.storages.RDBStorage:
        return optuna.storages.RDBStorage(
            url, heartbeat_interval=heartbeat, grace_period=2 * heartbeat, heartbeat_stale_trial_callback=RETRY
        )

    for attempt in range(4):
        try:
            return open_storage()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError):
            # Optuna creates the schema check-then-create: two processes starting on a fresh storage at once can
            # both create a table or insert its version row (SQLite: UNIQUE constraint failed; PostgreSQL: duplicate
            # key or relation exists), and the loser fails. By the retry the winner's schema is there.
            time.sleep(0.2 * (attempt + 1))
    return open_storage()  # a fifth failure is not a race: let its error reach the user


def build_parser() -> argparse.ArgumentParser:
    """tune's own options; everything else on the command line is a ``fit`` option."""
    parser = argparse.ArgumentParser(
        prog="python -m project tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--search", required=True, help="YAML search space keyed by CLI keys (configs/search.yaml)")
    parser.add_argument(
        "--trials",
        type=int,
        default=12,
        help="trials this study should have completed or pruned (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    parser.add_argument(
        "--study", default="tune", help="study name: its runs go to <save_dir>/<study>/ (default: %(default)s)"
    )
    parser.add_argument("--storage", help="Optuna storage URL (default: sqlite under <save_dir>), or journal:<file>")
    parser.add_argument(
        "--metric", default="val/acc", help="what a trial is judged on, each epoch (default: %(default)s)"
    )
    parser.add_argument("--direction", choices=["maximize", "minimize"], default="maximize")
    parser.add_argument("--pruner", choices=["median", "hyperband", "none"], default="median")
    parser.add_argument(
        "--seed", type=int, help="sampler seed, plus the study's trial count at start (default: a new one per process)"
    )
    parser.add_argument(
        "--heartbeat", type=int, default=60, help="seconds between a running trial's heartbeats (default: %(default)s)"
    )
    return parser


class Tracker(L.Callback):
    """The trial's metric after each epoch's validation (kept in its checkpoints, so a resumed trial keeps its earlier
    epochs), and its HParams entry in TensorBoard, pruned or not.

    Args:
        metric: The logged metric the trial is judged on (``val/acc``).
        direction: ``"maximize"`` or ``"minimize"``: which value is best.
        params: The trial's values, for TensorBoard's HParams tab.
    """

    def __init__(self, metric: str, direction: str, params: dict[str, Any]) -> None:
        self.metric, self.direction, self.params = metric, direction, params
        self.epochs: dict[int, float] = {}  # epoch -> the metric after its validation

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self.metric in trainer.callback_metrics:
            self.epochs[trainer.current_epoch] = float(trainer.callback_metrics[self.metric])

    @property
    def best(self) -> float | None:
        if not self.epochs:
            return None
        return max(self.epochs.values()) if self.direction == "maximize" else min(self.epochs.values())

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = dict(state_dict["epochs"])

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # A pruned trial never reaches the CLI's after_fit, which writes the HParams entry: write it here.
        if isinstance(exception, optuna.TrialPruned) and self.best is not None and trainer.logger is not None:
            trainer.logger.log_hyperparams(self.params, {f"{self.metric}_best": self.best})
            trainer.logger.save()


def report(study: optuna.Study) -> str:
    """The trials as a table: number, state, value, epochs run, params."""
    keys = sorted({k for t in study.trials for k in t.params})
    lines = ["trial | state    | value  | epochs | " + " | ".join(keys)]
    for t in study.trials:
        value = "" if t.value is None else f"{t.value:.4f}"
        if t.value is None and t.intermediate_values:  # pruned: its best value before it was stopped
            value = f"({max(t.intermediate_values.values()):.4f})"
        params = " | ".join(
            f"{t.params[k]:.4g}" if isinstance(t.params.get(k), float) else str(t.params.get(k, "")) for k in keys
        )
        state = "SKIPPED" if t.user_attrs.get(SKIPPED) else t.state.name  # a FAIL that ran nothing
        lines.append(f"{t.number:5} | {state:8} | {value:6} | {t.user_attrs.get('epochs', ''):>6} | {params}")
    return "\n".join(lines)


def tune(args: argparse.Namespace, fit_args: list[str]) -> tuple[optuna.Study, Path]:
    """Run the study until ``args.trials`` trials are complete or pruned (across every process sharing it).

    Returns:
        The study, and its folder ``<save_dir>/<study>/``.
    """
    from project.cli import run

    space = load_search_space(args.search)
    # Before the first trial: a typo costs seconds, not a trial. Its <save_dir>/<study>/ holds the trials' runs, the
    # default SQLite file and best.yaml.
    folder = check_fit(space, fit_args, args.search) / args.study
    storage = storage_for(args.storage, folder, args.study, args.heartbeat)
    pruner = {
        "median": optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        "hyperband": optuna.pruners.HyperbandPruner(),
        "none": optuna.pruners.NopPruner(),
    }[args.pruner]
    study = optuna.create_study(
        study_name=args.study,
        storage=storage,
        load_if_exists=True,  # a second process, a second machine or a re-run joins the study
        direction=args.direction,
        pruner=pruner,
    )
    # One seed for every process would propose, in a restart and in each of several processes, the points the first
    # one tried: each process seeds anew, or from --seed and the trials already there (a lone first run repeats).
    seed = secrets.randbelow(2**31) if args.seed is None else args.seed + len(study.trials)
    # constant_liar: TPE takes the points other processes are running as bad ones, and proposes elsewhere.
    study.sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    print(f"tune: study {args.study!r}, sampler seed {seed}")

    def objective(trial: optuna.Trial) -> float:
        # Before any work: a kill from here on is known for certain at a restart on this host.
        trial.set_user_attr("process", this_process(trial.number))
        if not within_budget(study, trial.number, args.trials):
            trial.set_user_attr(SKIPPED, True)
            quiet.skipped.add(trial.number)
            why = f"other processes started the study's {args.trials} trials first"
            print(f"tune: trial {trial.number} skipped: {why}")
            raise OverBudget(why)
        values = suggest(trial, space)
        tracker = Tracker(args.metric, args.direction, values)
        argv = [
            "fit",
            *fit_args,
            *overrides(values),
            f"--trainer.logger.init_args.name={args.study}",
            f"--trainer.logger.init_args.version=trial_{trial.number}",
            "--test_after_fit=false",  # the objective is validation only: the test set stays unseen
        ]
        try:
            run(argv, callbacks=[tracker, PyTorchLightningPruningCallback(trial, monitor=args.metric)])
        finally:
            trial.set_user_attr("epochs", len(tracker.epochs))
        if tracker.best is None or math.isnan(tracker.best):
            raise RuntimeError(f"trial {trial.number} logged no {args.metric}: is it the name of a logged metric?")
        return tracker.best

    def stop_at_trials(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        # Counting the trials other live processes are running too: together they stop at --trials. Two that look
        # at once may both start one more: within_budget then skips the higher-numbered one before it runs.
        if live_trials(study, storage) >= args.trials:
            study.stop()

    if live_trials(study, storage) < args.trials:
        quiet, handlers = QuietSkips(), logging.getLogger("optuna").handlers
        for handler in handlers:
            handler.addFilter(quiet)
        try:
            study.optimize(
                objective, timeout=args.timeout, callbacks=[stop_at_trials], gc_after_trial=True, catch=(OverBudget,)
            )
        finally:
            for handler in handlers:
                handler.removeFilter(quiet)
    return study, folder


def main(argv: list[str] | None = None) -> optuna.Study:
    parser = build_parser()
    args, fit_args = parser.parse_known_args(argv)
    if args.trials < 1 or args.heartbeat < 1:
        parser.error("--trials and --heartbeat must be >= 1")
    try:
        study, folder = tune(args, fit_args)
    except SearchSpaceError as exc:
        parser.error(str(exc))
    print(report(study))
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    done, running = len(study.get_trials(states=FINISHED)), len(study.get_trials(states=(RUNNING,)))
    if done < args.trials:  # others still running, or a trial failed: say so, the table shows which
        then = f"{running} still running in other processes" if running else "run the command again to finish"
        print(f"{done} of {args.trials} trials complete or pruned so far: {then}.")
    if not complete:
        print("No trial completed: nothing to write.")
        return study
    best = study.best_trial
    out = folder / "best.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# tune study {args.study!r}: trial {best.number}, {args.metric} {best.value:.4f}. Use it as an overlay:\n"
    )
    header += f"#   python -m project fit --config configs/default.yaml --config {out}\n"
    out.write_text(header + yaml.safe_dump(nested(best.params), sort_keys=False))
    print(f"Best: trial {best.number}, {args.metric} {best.value:.4f}; its values: {out}")
    return study
