"""The slurm feature on a real SLURM (docs/slurm.md): a 2-task DDP job that trains and tests, a job requeued twice
that resumes its own step in its own run folder while a new job starts a run of its own, arrays of folds and of
search workers; and one model trained over two hosts (two network namespaces).
`.ci/run` starts a single-node SLURM (scripts/slurm/local_cluster.sh) and exports SLURM_CONF; without one these tests
are skipped, except under CI, where they fail."""

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from project.checkpointing import load_checkpoint
from tests.conftest import ROOT, small_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one job at a time: the node has 2 CPUs
FIT = ROOT / "scripts" / "slurm" / "fit.sbatch"


def skip(reason: str) -> None:
    """CI starts every service its tests need: there, a missing one is a failure, not a skip."""
    (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


@pytest.fixture(scope="module")
def slurm() -> None:
    if shutil.which("sbatch") is None:
        skip("no SLURM here: apt-get install slurmctld slurmd slurm-client munge (.ci/run starts one)")
    up = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if up.returncode != 0 or not up.stdout.strip():
        skip(f"no SLURM controller answers (SLURM_CONF={os.environ.get('SLURM_CONF')}): {up.stderr.strip()}")


def submit(script: Path, out: Path, *args: str, options: tuple[str, ...] = ()) -> str:
    """``sbatch`` the script from ``out``'s folder, as a user would from a project of their own; the job id."""
    done = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={out.parent}", f"--output={out}", *options, str(script), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # sbatch passes its environment on: `python -m project` imports
    )
    return done.stdout.strip().split(";")[0]


def state(job: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    found = re.search(r"JobState=(\w+)", shown)
    return found.group(1) if found else "GONE"


def wait(job: str, timeout: float) -> str:
    """The job's final state; cancels it (and fails) when it is still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = state(job)
        if now not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING"):
            return now
        time.sleep(0.5)
    subprocess.run(["scancel", job], check=False)
    pytest.fail(f"SLURM job {job} still {state(job)} after {timeout} s: cancelled")


def test_a_two_task_ddp_job_trains_and_tests_in_one_run_folder(slurm, mnist_dir, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "fit.out"
    job = submit(FIT, out, *small_run(mnist_dir, logs), "--trainer.max_epochs=1", "--test_after_fit=true")
    try:
        assert wait(job, 300) == "COMPLETED", out.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", job], check=False)
    log = out.read_text()
    assert f"job {job} (restart 0) on" in log and "1 node(s) x 2 task(s)" in log
    assert "test/acc" in log and "[rank: 1]" in log  # two ranks trained
    assert [p.name for p in (logs / "mnist").iterdir()] == ["version_0"]


def interrupt_and_release(job: str, out: Path, last: Path, how: list[str], restart: int) -> None:
    """Wait until the job's restart ``restart`` has written a last.ckpt newer than the one before, then interrupt it
    with ``how`` and release the requeued job (SLURM holds one back about two minutes before it may start)."""
    before = last.stat().st_mtime if last.exists() else 0.0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        # slurmd creates the output file when the batch script starts, which may come after RUNNING is reported
        running = state(job) == "RUNNING" and out.exists() and f"(restart {restart})" in out.read_text()
        if running and last.exists() and last.stat().st_mtime > before:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"restart {restart} wrote no new last.ckpt: {out.read_text()[-3000:]}")
    subprocess.run(how, check=True)
    while state(job) in ("RUNNING", "COMPLETING"):
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)


def adam_steps(checkpoint: Path) -> set[int]:
    """AdamW's step count of every parameter: equal to the global step only if no resume reset the optimizer."""
    states = load_checkpoint(checkpoint)["optimizer_states"][0]["state"].values()
    return {int(s["step"]) for s in states}


def test_a_requeued_job_resumes_its_own_step_and_a_new_job_leaves_it_alone(slurm, mnist_dir, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "fit.out"
    args = [*small_run(mnist_dir, logs), "--trainer.max_epochs=12", "--trainer.limit_train_batches=40"]
    job = submit(FIT, out, *args)
    last = logs / "mnist" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        # A preemption or an operator's requeue (SIGTERM to every task), then the time limit's warning (SIGUSR1 to
        # the batch script, which requeues the job itself).
        interrupt_and_release(job, out, last, ["scontrol", "requeue", job], restart=0)
        interrupt_and_release(job, out, last, ["scancel", "--signal=USR1", "--batch", job], restart=1)
        assert wait(job, 300) == "COMPLETED", out.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", job], check=False)
    log = out.read_text()
    saved = re.findall(r"SIGTERM: stopped at epoch (\d+), global step (\d+)\. Checkpoint saved to (\S+)\.", log)
    resumed = re.findall(r"Resuming (\S+) \(last\.ckpt, epoch (\d+), global step (\d+)\)", log)
    assert len(saved) == 2 and len(resumed) == 2, log[-3000:]
    for (_, step, path), (run, _, resumed_step) in zip(saved, resumed, strict=True):
        assert step == resumed_step and int(step) > 0  # the same step, not step 0
        assert Path(path) == last and Path(run) == last.parents[1]
    assert int(saved[0][1]) < int(saved[1][1])
    assert f"job {job}: time limit near, requeued" in log and f"job {job} (restart 2) on" in log
    assert "auto-requeue" not in log and "test/acc" in log.split("Resuming")[-1]
    assert [p.name for p in (logs / "mnist").iterdir()] == ["version_0"]
    final = load_checkpoint(last)["global_step"]
    assert final > int(saved[1][1]) and adam_steps(last) == {final}  # the optimizer state came along
    # A new job (another id) starts a run of its own and leaves the requeued job's run alone.
    other_out = tmp_path / "other.out"
    other = submit(FIT, other_out, *small_run(mnist_dir, logs), "--trainer.max_epochs=1")
    try:
        assert wait(other, 300) == "COMPLETED", other_out.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", other], check=False)
    assert f"version_0 was written by slurm:{job}, not by this job (slurm:{other}): left alone" in other_out.read_text()
    assert sorted(p.name for p in (logs / "mnist").iterdir()) == ["version_0", "version_1"]


# >>> cv
def test_a_cv_array_runs_one_fold_per_task_and_its_summary_job_waits_for_them(slurm, mnist_dir, tmp_path):
    import json

    from project.cv.command import summarize

    logs = tmp_path / "logs"
    args = ["--folds=3", *small_run(mnist_dir, logs)]
    array = submit(ROOT / "scripts" / "slurm" / "cv.sbatch", tmp_path / "cv-%a.out", *args, options=("--array=0-2",))
    summary_job = None
    try:
        for task in range(3):
            assert wait(f"{array}_{task}", 300) == "COMPLETED", (tmp_path / f"cv-{task}.out").read_text()[-3000:]
        summary_job = re.search(r"Submitted batch job (\d+)", (tmp_path / "cv-0.out").read_text()).group(1)
        summary_out = tmp_path / f"cv-summary-{array}.out"
        assert wait(summary_job, 120) == "COMPLETED", summary_out.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", array, *([summary_job] if summary_job else [])], check=False)
    folder = logs / "mnist" / "cv_0"
    assert sorted(p.name for p in (logs / "mnist").iterdir() if not p.name.startswith(".")) == ["cv_0"]
    summary = json.loads((folder / "summary.json").read_text())
    assert [f["fold"] for f in summary["folds"]] == [0, 1, 2] and summary["command"]["folds"] == 3
    assert summary == {"command": summary["command"], **summarize(summary["folds"])}  # what `cv` itself writes
    assert all(Path(f["checkpoint"]).parent == folder / f"fold_{f['fold']}" / "checkpoints" for f in summary["folds"])
    assert "cv: fold 0 of 3" in (tmp_path / "cv-0.out").read_text()


# <<< cv


# >>> tune
def test_a_tune_array_of_two_workers_shares_one_study_with_no_repeated_values(slurm, mnist_dir, tmp_path):
    pytest.importorskip("project.tune", reason="the tune feature is not in this copy")
    from tests.test_tune import CONTINUOUS, check_shared, tune_args, write

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = tune_args(mnist_dir, tmp_path / "logs", write(tmp_path, CONTINUOUS), f"--storage={storage}", "--trials=4")
    array = submit(
        ROOT / "scripts" / "slurm" / "tune.sbatch", tmp_path / "tune-%a.out", *args[1:], options=("--array=0-1",)
    )
    try:
        for task in range(2):
            assert wait(f"{array}_{task}", 300) == "COMPLETED", (tmp_path / f"tune-{task}.out").read_text()[-3000:]
    finally:
        subprocess.run(["scancel", array], check=False)
    check_shared(storage, "tune", trials=4)  # 4 trials in all, none repeated
    logs = [(tmp_path / f"tune-{task}.out").read_text() for task in range(2)]
    assert all("tune: study 'tune'" in log and "Best: trial" in log for log in logs)  # both joined the one study
    assert sum("Using an existing study with `study_name='tune'`" in log for log in logs) == 1


# <<< tune
@pytest.fixture
def two_hosts() -> Iterator[list[tuple[str, str, str]]]:
    """Two network namespaces joined by a veth pair, 10.213.0.1 and .2, no route out: (namespace, address,
    interface) of each "host". Removed afterwards (with them the veth pair and whatever listened inside)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        skip("two simulated hosts need root and iproute2's `ip netns`")
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"pt{tag}a", "10.213.0.1", f"pt{tag}a"), (f"pt{tag}b", "10.213.0.2", f"pt{tag}b")]
    try:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2]], check=True)
        for ns, address, interface in hosts:
            subprocess.run(["ip", "link", "set", interface, "netns", ns], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", interface], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", interface, "up"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_two_hosts_train_one_model_over_their_network(two_hosts, mnist_dir, tmp_path):
    """torchrun on each of two hosts, c10d rendezvous at the first one's address, gloo over the veth pair only: one
    model trained over both, tested as well as the same job on one host."""

    def fit(logs: Path, nodes: int, devices: int) -> list[str]:
        return [
            *("-m", "project", "fit", *small_run(mnist_dir, logs), "--trainer.limit_train_batches=20"),
            *("--trainer.max_epochs=2", "--trainer.accelerator=cpu", "--trainer.strategy=ddp"),
            *(f"--trainer.num_nodes={nodes}", f"--trainer.devices={devices}", "--trainer.enable_progress_bar=false"),
        ]

    endpoint = f"{two_hosts[0][1]}:29400"
    procs = []
    try:
        for ns, address, interface in two_hosts:
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes=2"]
            cmd += ["--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=two-hosts"]
            # torchrun finds the host of the rendezvous by its hostname, and both "hosts" here have this machine's.
            cmd += [f"--rdzv-conf=is_host={str(address == two_hosts[0][1]).lower()}", f"--local-addr={address}"]
            # What a real cluster sets too: gloo's (and NCCL's) traffic on the interface between the hosts.
            env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": interface}
            out = subprocess.PIPE
            procs.append(
                subprocess.Popen(
                    [*cmd, *fit(tmp_path / "logs", 2, 1)],
                    cwd=tmp_path,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[0] + outputs[1]
    two = float(re.search(r"test/acc\s*\S?\s*([0-9.]+)", outputs[0] + outputs[1]).group(1))
    # The same job on one host: two processes over loopback.
    one_host = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*one_host, *fit(tmp_path / "one", 1, 2)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    one = float(re.search(r"test/acc\s*\S?\s*([0-9.]+)", done.stdout + done.stderr).group(1))
    print(f"test/acc: two hosts {two:.4f}, one host {one:.4f}")
    assert two > 0.5 and abs(two - one) < 0.05, (two, one)
