"""The images of the Containerfile, built and run with podman (docs/container.md): `fit` trains on mounted MNIST into
a mounted folder as its non-root user.
`serve` answers a real test digit behind its API key, stays healthy for a probe without the key  # [serve]
and stops on SIGTERM within its drain time, exit 0.  # [serve]

Build options come from the environment, for machines that reach no container registry (.ci/run sets them):
``PROJECT_TEST_BASE_IMAGE`` (the BASE_IMAGE build argument) and ``PROJECT_TEST_BUILD_OPTIONS`` (more `podman build`
options, e.g. the folders of a local package mirror mounted into the build).
"""

import io  # [serve]
import json
import os
import shlex
import shutil
import subprocess
import time
import urllib.error  # [serve]
import urllib.request  # [serve]
import uuid
from collections.abc import Iterator
from pathlib import Path  # [serve]

import pytest
from PIL import Image  # [serve]

from tests.conftest import (
    ROOT,
    free_port,  # [serve]
)

# heavy: left out of plain pytest, run apart (pytest -m heavy; .ci/run does). One worker builds the images, once.
pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.xdist_group("container")]

PODMAN = shutil.which("podman") or "podman"
TARGETS = ["fit"]
TARGETS.append("serve")  # [serve]
USER_ID = 10001  # the Containerfile's user `app`
GRACE = 10  # serve's --grace: how long SIGTERM waits for requests in flight  # [serve]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    """Each target, tagged for this test session only, removed afterwards: {"fit": tag, ...}."""
    if shutil.which("podman") is None:
        message = "podman is not installed (apt-get install podman runc)"
        if os.environ.get("CI"):  # .ci/run installs it: a missing podman fails there, it never skips
            pytest.fail(f"{message}; .ci/run installs it before the tests")
        pytest.skip(message)
    name = f"localhost/project-test-{uuid.uuid4().hex[:8]}"
    tags = {target: f"{name}:{target}" for target in TARGETS}
    options = shlex.split(os.environ.get("PROJECT_TEST_BUILD_OPTIONS", ""))
    if base := os.environ.get("PROJECT_TEST_BASE_IMAGE"):
        options += ["--build-arg", f"BASE_IMAGE={base}"]
    try:
        for target, tag in tags.items():  # each builds on the layers of the one before
            started = time.monotonic()
            # --format docker: OCI images have no HEALTHCHECK
            podman("build", "--format", "docker", "--target", target, "-t", tag, *options, str(ROOT), timeout=1800)
            size = json.loads(podman("image", "inspect", tag).stdout)[0]["Size"]
            print(f"{target} image: built in {time.monotonic() - started:.0f} s, {size / 1e9:.2f} GB")
        yield tags
    finally:
        podman("rmi", "--force", *tags.values(), check=False)


# >>> serve
def request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers or {}), timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError):  # not listening yet (0: no answer)
        return 0, b""


def test_container_serve_answers_a_test_digit_behind_its_key_stays_healthy_and_stops_on_sigterm(images, mnist_ckpt):
    from project.mnist_files import load_split

    images_, labels = load_split(Path(os.environ["PATH_DATASETS"]) / "MNIST" / "raw", "t10k")
    png = io.BytesIO()
    Image.fromarray(images_[0].numpy()).save(png, format="PNG")
    port, name = free_port(), f"serve-test-{uuid.uuid4().hex[:8]}"
    ckpt = f"{mnist_ckpt}:/model/model.ckpt:ro"
    podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", ckpt, "-e", "LIT_SERVER_API_KEY=k3y",
           images["serve"])  # fmt: skip
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while request(f"{url}/health")[0] != 200:  # no key: the probe's view
            assert time.monotonic() < deadline, podman("logs", name).stdout
            time.sleep(0.5)
        assert podman("healthcheck", "run", name, check=False).returncode == 0  # the image's HEALTHCHECK
        assert podman("exec", name, "id", "-u").stdout.strip() == str(USER_ID)
        body, kind = png.getvalue(), {"Content-Type": "image/png"}
        assert request(f"{url}/predict", body, kind)[0] == 401
        status, answer = request(f"{url}/predict", body, {**kind, "X-API-Key": "k3y"})
        assert status == 200 and json.loads(answer)["pred"] == int(labels[0]), answer
        started = time.monotonic()
        podman("stop", "--time", str(GRACE + 10), name)  # SIGTERM; SIGKILL after that
        stopped_in = time.monotonic() - started
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0 and stopped_in < GRACE, (stopped_in, podman("logs", name).stdout)
        assert "Server stopped." in podman("logs", name).stdout
    finally:
        podman("rm", "--force", name, check=False)


# <<< serve


def test_container_fit_trains_on_mounted_mnist_into_a_mounted_folder_as_its_own_user(images, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chown(logs, USER_ID, USER_ID)  # what docs/container.md says to do: the image's user writes there
    data = f"{os.environ['PATH_DATASETS']}:/data:ro"
    limits = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=30", "--trainer.limit_val_batches=5"]
    done = podman("run", "--rm", "-v", data, "-v", f"{logs}:/app/logs", images["fit"], "fit", *limits,
                  "--trainer.limit_test_batches=5", timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = logs / "mnist" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()
    assert {p.stat().st_uid for p in run.rglob("*")} == {USER_ID}
    assert "test/acc" in done.stdout


def test_container_image_holds_the_locked_torch_and_no_test_tools(images):
    shown = podman("run", "--rm", "--entrypoint", "python", images["fit"], "-c",
                   "import torch, importlib.util as u; print(torch.__version__, u.find_spec('pytest'))")  # fmt: skip
    version, pytest_spec = shown.stdout.split()
    locked = next(line for line in (ROOT / "requirements.lock").read_text().splitlines() if line.startswith("torch=="))
    assert version.split("+")[0] == locked.split("==")[1].split()[0] and pytest_spec == "None"
