"""`python -m project serve`: a real server on 127.0.0.1, its answers, its refusals and its shutdown."""

import base64
import contextlib
import http.client
import io
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from PIL import Image

from project.data import MEAN, STD
from project.images import normalize, prepare_image
from project.module import MNISTClassifier
from tests.conftest import ROOT, assert_help_shows_defaults, free_port, synthetic_digits

pytest.importorskip("litserve", reason="the serve extra is not installed: pip install -e '.[serve]'")
# One pytest-xdist worker runs this file (`--dist loadgroup`), so the module's server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("serve")


def start_server(*args: str, sigint_ignored: bool = False) -> tuple[subprocess.Popen, str]:
    """Start `serve` with ``args`` on a free port; return the process and its URL once /health says ready.

    ``sigint_ignored``: start it as a shell starts a background job, with SIGINT ignored.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "project", "serve", "--port", str(port), "--threads", "1", *args]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    # Its own session: the test can stop the server's whole process tree if the test fails half-way.
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=ignore
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited: {proc.stdout.read().decode()}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:  # not listening yet, or 503 while the worker loads the model
            pass
        time.sleep(0.3)
    stop(proc)
    raise AssertionError("serve did not become ready in 120 s")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and every process of its session, whatever state it is in."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def post(url: str, body: bytes, content_type: str, timeout: float = 30, key: str | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    headers = {"Content-Type": content_type, **({"X-API-Key": key} if key is not None else {})}
    try:
        # A server may answer a too-large body (413) before reading all of it: its answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", "/predict", body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def multipart(data: bytes, filename: str, field: str = "file") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def post_file(url: str, data: bytes, filename: str) -> tuple[int, dict]:
    return post(url, *multipart(data, filename))


def post_json(url: str, data: bytes, name: str | None = None) -> tuple[int, dict]:
    payload = {"image": base64.b64encode(data).decode(), **({"name": name} if name else {})}
    return post(url, json.dumps(payload).encode(), "application/json")


def encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def digit_files(n: int) -> list[tuple[str, bytes]]:
    """``n`` distinct digits as files: MNIST-like PNGs, and enlarged dark-on-light colour JPEGs and PNGs."""
    images, _ = synthetic_digits(n, seed=7)
    files = []
    for i, array in enumerate(images.numpy()):
        image = Image.fromarray(array)
        if i % 3 == 1:  # a photo-like version: 3x larger, RGB, dark ink on light paper
            image = Image.fromarray(255 - array).resize((84, 84)).convert("RGB")
        fmt = "JPEG" if i % 3 == 1 else "PNG"
        files.append((f"digit{i:02d}.{fmt.lower().replace('jpeg', 'jpg')}", encode(image, fmt)))
    return files


def expected(ckpt: Path, files: list[tuple[str, bytes]]) -> dict[str, torch.Tensor]:
    """The probabilities ``predict_step`` gives the same files, prepared by the code ``predict_dir`` uses."""
    model = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True).eval()
    x = normalize(torch.stack([prepare_image(io.BytesIO(data)) for _, data in files]).unsqueeze(1), (MEAN,), (STD,))
    with torch.inference_mode():
        probs = model.predict_step(x, 0)["probs"]
    return {name: p for (name, _), p in zip(files, probs, strict=True)}


@pytest.fixture(scope="module")
def server_process(trained_ckpt) -> Iterator[tuple[subprocess.Popen, str]]:
    """A batching server (long batch_timeout: concurrent requests surely share a batch) with small limits."""
    proc, url = start_server(
        f"--ckpt_path={trained_ckpt}",
        "--max_batch_size=8",
        "--batch_timeout=0.05",
        "--max_body_mb=0.5",
        "--max_pixels=1000000",
    )
    try:
        yield proc, url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def server(server_process) -> str:
    return server_process[1]


def test_answers_equal_predict_step_for_png_and_jpeg_as_multipart_and_base64(server, trained_ckpt):
    files = digit_files(6)
    reference = expected(trained_ckpt, files)
    for name, data in files:
        for status, answer in (post_file(server, data, name), post_json(server, data, name)):
            assert status == 200, answer
            probs = torch.tensor(answer["probs"])
            assert answer["pred"] == int(reference[name].argmax()) == int(probs.argmax())
            assert torch.allclose(probs, reference[name], atol=1e-5)
            assert answer["prob"] == pytest.approx(float(reference[name].max()), abs=1e-5)
            assert answer["file"] == name
    with urllib.request.urlopen(f"{server}/info") as r:
        info = json.load(r)["model"]
    assert info["kind"] == "torch" and info["checkpoint"] == str(trained_ckpt)
    assert len(info["input"]["class_names"]) == 10 and info["input"]["preparation"] == "mnist_digit"


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server, trained_ckpt):
    files = digit_files(24)
    reference = expected(trained_ckpt, files)
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda f: post_file(server, f[1], f[0]), files))
    assert all(status == 200 for status, _ in answers), answers
    for (name, _), (_, answer) in zip(files, answers, strict=True):
        assert answer["file"] == name
        assert torch.allclose(torch.tensor(answer["probs"]), reference[name], atol=1e-5)  # its own digit's answer
    sizes = [answer["batch_size"] for _, answer in answers]
    assert max(sizes) > 1 and max(sizes) <= 8, sizes


def bad_requests() -> list[tuple[str, bytes, str, int, str]]:
    """(what, body, content type, expected status, words the message must hold) for each kind of bad input."""
    good = encode(Image.fromarray(synthetic_digits(1, 0)[0][0].numpy()), "PNG")
    bomb = encode(Image.new("L", (20000, 20000)), "PNG")  # a few KB that decode to 400 Mpx
    blank = encode(Image.new("L", (28, 28), 255), "PNG")
    b64 = lambda data: json.dumps({"image": base64.b64encode(data).decode()}).encode()  # noqa: E731
    return [
        ("empty body", b"", "application/json", 400, "empty body"),
        ("not an image", *multipart(b"just some text, not pixels", "notes.png"), 400, "cannot decode"),
        ("broken base64", b'{"image": "not base64!!"}', "application/json", 400, "not valid base64"),
        ("JSON without image", b'{"picture": "aGVsbG8="}', "application/json", 422, 'no "image" field'),
        ("not JSON", b'{"image": ', "application/json", 400, "not valid JSON"),
        ("truncated PNG", *multipart(good[: len(good) // 2], "cut.png"), 400, "truncated"),
        ("decompression bomb", *multipart(bomb, "bomb.png"), 413, "pixels"),
        ("over the size limit", b64(os.urandom(600_000)), "application/json", 413, "over the limit"),
        ("blank image", *multipart(blank, "blank.png"), 422, "blank image"),
        ("no file field", *multipart(good, "x.png", field="upload"), 422, 'no file field "file"'),
        ("unknown content type", b"hello", "text/plain", 415, "text/plain"),
    ]


@pytest.mark.parametrize("case", bad_requests(), ids=lambda c: c[0])
def test_bad_input_gets_a_4xx_naming_the_problem_and_the_server_keeps_serving(server, case):
    _, body, content_type, status, words = case
    got, answer = post(server, body, content_type)
    assert got == status and words in answer["detail"], answer
    name, data = digit_files(1)[0]
    assert post_file(server, data, name)[0] == 200


def test_a_bad_request_in_a_batch_does_not_fail_the_good_ones(server, trained_ckpt):
    files = digit_files(8)
    reference = expected(trained_ckpt, files)
    bad = [(body, ctype) for _, body, ctype, _, _ in bad_requests()[:4]]
    jobs = [("good", *multipart(data, name)) for name, data in files] + [("bad", body, ct) for body, ct in bad]
    jobs = jobs[::2] + jobs[1::2]  # interleave good and bad
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: post(server, job[1], job[2]), jobs))
    for (kind, _, _), (status, answer) in zip(jobs, answers, strict=True):
        if kind == "bad":
            assert 400 <= status < 500, answer
        else:
            assert status == 200, answer
            assert torch.allclose(torch.tensor(answer["probs"]), reference[answer["file"]], atol=1e-5)


def scrape(url: str, key: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET /metrics``, parsed: {(sample name, sorted labels): value}.

    Parsed here, not with prometheus_client: imported into this process, it would keep an in-process ``serve`` (the
    fork test below, on the same pytest worker) from switching it to its multiprocess mode.
    """
    request = urllib.request.Request(f"{url}/metrics", headers={"X-API-Key": key} if key else {})
    with urllib.request.urlopen(request) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")  # the exposition format
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line).groups()
            pairs = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels or "")))
            samples[(name, pairs)] = float(value)
    return samples


def test_metrics_count_requests_by_route_and_code_refusals_by_reason_and_batch_sizes(server):
    """Counts before and after a few good and bad requests (the module's server has answered others before)."""
    before = scrape(server)
    files = digit_files(3)
    for name, data in files:
        assert post_file(server, data, name)[0] == 200
    cases = {case[0]: case for case in bad_requests()}
    for what in ("blank image", "blank image", "not JSON", "unknown content type"):
        _, body, content_type, status, _ = cases[what]
        assert post(server, body, content_type)[0] == status
    with urllib.request.urlopen(f"{server}/info") as r:
        assert r.status == 200
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("serve_requests_total", route="/predict", code="200") == 3
    assert grew("serve_requests_total", route="/predict", code="422") == 2
    assert grew("serve_requests_total", route="/predict", code="400") == 1
    assert grew("serve_requests_total", route="/predict", code="415") == 1
    assert grew("serve_requests_total", route="/info", code="200") == 1
    assert grew("serve_requests_total", route="/metrics", code="200") == 1  # the first scrape
    assert grew("serve_refused_images_total", reason="blank_image") == 2
    assert grew("serve_refused_images_total", reason="bad_json") == 1
    assert grew("serve_refused_images_total", reason="content_type") == 1
    assert grew("serve_request_seconds_count", route="/predict") == 7
    assert 0 < grew("serve_request_seconds_sum", route="/predict") < 7 * 5
    assert grew("serve_request_seconds_bucket", route="/predict", le="+Inf") == 7
    # One request at a time: three batches of one image each.
    assert grew("serve_batch_size_count") == 3 and grew("serve_batch_size_sum") == 3
    assert grew("serve_batch_size_bucket", le="1.0") == 3
    assert 0 < after[("serve_model_load_seconds", ())] < 120


def test_the_page_is_one_self_contained_html_file(server):
    with urllib.request.urlopen(f"{server}/") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        html = r.read().decode()
    assert '<canvas id="pad"' in html and 'call("predict"' in html
    # Nothing from another host: no absolute URL in any src, href, import or fetch (the server may run offline).
    assert not re.search(r"""(src|href|import|fetch)\s*[=(]\s*["']?(https?:)?//""", html), "an external resource"


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")  # Debian's chromium-driver


@contextlib.contextmanager
def browser() -> Iterator:
    """Headless Chromium driven by Selenium, with no download or call out of the machine (no Selenium Manager)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install selenium")
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(f"no {CHROMIUM} or {CHROMEDRIVER}: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=900,700"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    saved = os.environ.get("SE_AVOID_STATS")
    os.environ["SE_AVOID_STATS"] = "true"  # read while the driver starts; this process's own value put back after
    try:
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)
    finally:
        if saved is None:
            del os.environ["SE_AVOID_STATS"]
        else:
            os.environ["SE_AVOID_STATS"] = saved
    try:
        yield driver
    finally:
        driver.quit()


def stroke(driver, points: list[tuple[int, int]], touch: bool = False) -> None:
    """One pointer stroke through ``points`` (canvas pixels from its top left), by mouse or by a finger."""
    from selenium.webdriver.common.actions import interaction
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.actions.pointer_input import PointerInput

    pad = driver.find_element("id", "pad")
    half = pad.size["width"] // 2, pad.size["height"] // 2  # W3C actions measure from the element's centre
    kind = interaction.POINTER_TOUCH if touch else interaction.POINTER_MOUSE
    actions = ActionBuilder(driver, mouse=PointerInput(kind, "finger" if touch else "mouse"))
    actions.pointer_action.move_to(pad, points[0][0] - half[0], points[0][1] - half[1]).pointer_down()
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        for t in (0.25, 0.5, 0.75, 1.0):  # pointermove events along the way, as a hand makes them
            x, y = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
            actions.pointer_action.move_to(pad, round(x) - half[0], round(y) - half[1])
    actions.pointer_action.pointer_up()
    actions.perform()


def shown(driver, answers: int) -> dict:
    """What the page shows once it has had ``answers`` answers in all."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(
        lambda d: d.find_element("tag name", "body").get_attribute("data-answers") == str(answers)
    )
    text = lambda element_id: driver.find_element("id", element_id).text  # noqa: E731
    return {
        "state": driver.find_element("tag name", "body").get_attribute("data-state"),
        "answer": text("answer"),
        "prob": text("prob"),
        "runners": [li.text for li in driver.find_elements("css selector", "#runners li")],
        "message": text("message"),
    }


@pytest.mark.slow  # one epoch on the real MNIST, a server and a browser: ~40 s
def test_the_page_in_a_real_browser_draws_drops_clears_and_shows_the_blank_message(mnist_ckpt, tmp_path):
    from project.mnist_files import load_split

    with browser() as driver:
        proc, url = start_server(f"--ckpt_path={mnist_ckpt}", "--workers=1")
        try:
            with urllib.request.urlopen(f"{url}/info") as r:
                names = json.load(r)["model"]["input"]["class_names"]  # "0 - zero", ...: what the page shows
            driver.get(f"{url}/")
            assert driver.title == "Draw a digit"
            stroke(driver, [(140, 45), (140, 235)])  # a "1", by mouse
            one = shown(driver, 1)
            assert one["state"] == "answered" and one["answer"] == names[1], one
            assert re.fullmatch(r"\d+\.\d%", one["prob"]) and len(one["runners"]) == 3, one
            driver.find_element("id", "clear").click()
            assert (
                shown(driver, 1)["answer"] == ""
                and driver.find_element("tag name", "body").get_attribute("data-state") == "idle"
            )
            stroke(driver, [(70, 55), (210, 55), (125, 240)], touch=True)  # a "7", by a finger, one stroke
            seven = shown(driver, 2)
            assert seven["state"] == "answered" and seven["answer"] == names[7], seven

            driver.find_element("id", "clear").click()
            driver.find_element("id", "predict").click()  # nothing drawn
            blank = shown(driver, 3)
            assert blank["state"] == "refused" and "blank image: no ink found" in blank["message"], blank
            assert blank["answer"] == ""

            # MNIST test digits as PNG files: one chosen in the file input, one dropped on the page.
            images, labels = load_split(Path(os.environ["PATH_DATASETS"]) / "MNIST" / "raw", "t10k")
            files = []
            for i in (0, 1):
                path = tmp_path / f"test{i}.png"
                Image.fromarray(images[i].numpy()).save(path)
                files.append(path)
                status, answer = post_file(url, path.read_bytes(), path.name)
                assert status == 200 and answer["pred"] == int(labels[i]), answer
            driver.find_element("id", "file").send_keys(str(files[0]))
            assert shown(driver, 4)["answer"] == names[labels[0]]
            encoded = base64.b64encode(files[1].read_bytes()).decode()
            driver.execute_script(
                """const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
                const transfer = new DataTransfer();
                transfer.items.add(new File([bytes], "test1.png", { type: "image/png" }));
                for (const type of ["dragover", "drop"])
                  document.dispatchEvent(new DragEvent(type, { dataTransfer: transfer, bubbles: true }));""",
                encoded,
            )
            assert shown(driver, 5)["answer"] == names[labels[1]]

            logs = driver.get_log("browser")
            # The one error a browser logs: the blank canvas's 422, which the page shows as the server's message.
            errors = [e for e in logs if e["level"] == "SEVERE" and "status of 422" not in e["message"]]
            assert not errors, errors
            assert sum("status of 422" in e["message"] for e in logs) == 1  # the console is read: it saw that one
        finally:
            stop(proc)


@pytest.mark.slow  # a server of its own: ~10 s
def test_no_page_leaves_an_api_only_server(trained_ckpt):
    proc, url = start_server(f"--ckpt_path={trained_ckpt}", "--workers=1", "--no-page")
    try:
        with urllib.request.urlopen(f"{url}/") as r:
            assert b"<canvas" not in r.read()  # LitServe's own text
        name, data = digit_files(1)[0]
        assert post_file(url, data, name)[0] == 200
    finally:
        stop(proc)


def test_the_inference_worker_runs_below_the_http_servers_cpu_priority(server_process):
    """The tail at concurrency 64: requests should wait in the worker's queue, not in the HTTP event loops."""
    proc, _ = server_process
    children = descendants(proc.pid)
    cmdline = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children}
    workers = [pid for pid in children if b"spawn_main" in cmdline[pid]]  # spawned; the HTTP servers are forked
    assert len(workers) == 1, cmdline
    # Relative to the niceness the server started with (that of this test run, which may itself be niced).
    base = os.getpriority(os.PRIO_PROCESS, proc.pid)
    assert os.getpriority(os.PRIO_PROCESS, workers[0]) == min(base + 10, 19)  # --worker_nice's default
    assert all(os.getpriority(os.PRIO_PROCESS, pid) == base for pid in children - set(workers))  # HTTP servers


def listening(pid: int, port: int) -> set[str]:
    """The sockets (``socket:[inode]``) that process ``pid`` holds listening on ``port``."""
    import psutil

    conns = psutil.Process(pid).net_connections("tcp")
    return {
        os.readlink(f"/proc/{pid}/fd/{c.fd}") for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_each_http_server_listens_on_a_socket_of_its_own_and_connections_reach_both(server_process):
    """LitServe's one shared socket let a client's connections opened at once all land on one HTTP server."""
    import psutil

    proc, url = server_process
    port = int(url.rsplit(":", 1)[1])
    held = {pid: listening(pid, port) for pid in {proc.pid, *descendants(proc.pid)}}
    servers = {pid: sockets for pid, sockets in held.items() if sockets}  # a shared socket: in every process
    assert len(servers) == 2 and all(len(s) == 1 for s in servers.values()), held  # --api_servers 2
    assert len(set.union(*servers.values())) == 2, servers  # two sockets, not one shared

    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(16)]
    try:
        for c in connections:
            c.connect()  # all at once, as a proxy or wrk opens its keep-alive connections
        for c in connections:
            c.request("GET", "/health")
            response = c.getresponse()
            assert response.status == 200, response.read()
            response.read()  # the connection stays open for the next request (keep-alive)
        per_server = {
            pid: sum(
                c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
                for c in psutil.Process(pid).net_connections("tcp")
            )
            for pid in servers
        }
        # The kernel spreads them by a hash of the client's port: all 16 on one of 2 sockets has odds 2 in 65536.
        assert sum(per_server.values()) == 16 and min(per_server.values()) > 0, per_server
    finally:
        for c in connections:
            c.close()


def test_an_unsafe_checkpoint_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    from project.serve.server import main

    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": print}, evil)  # pickles a callable: the safe loader refuses it
    with pytest.raises(SystemExit) as exit_:
        main([f"--ckpt_path={evil}", f"--port={free_port()}"])
    assert exit_.value.code == 2 and "was refused" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [evil]  # nothing written (LitServe would write a client.py)


def test_the_workers_own_load_refuses_a_pickle_payload_too(trained_ckpt, tmp_path):
    """Each worker loads the model again, after the server's check: that load is the safe one as well."""
    import pickle

    from project.serve.server import load_predictor
    from tests.test_checkpointing import evil_checkpoint

    evil, marker = evil_checkpoint(trained_ckpt, tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_predictor({"kind": "torch", "path": str(evil), "input": None}, "cpu", 1)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--worker_nice=-1", "--worker_nice must be 0-19, got -1"),
        ("--worker_nice=20", "--worker_nice must be 0-19, got 20"),
        ("--port=80", "--port must be 1024-65535, got 80"),
        ("--max_batch_size=0", "--max_batch_size, --workers, --threads and --api_servers must be >= 1"),
        ("--batch_timeout=-0.5", "--batch_timeout >= 0"),
        ("--timeout=0", "--timeout must be > 0 seconds, got 0"),
    ],
)
def test_an_option_out_of_range_is_refused_by_name_before_anything_starts(tmp_path, capsys, option, message):
    from project.serve.server import main

    with pytest.raises(SystemExit) as exit_:
        main([f"--ckpt_path={tmp_path / 'never-read.ckpt'}", option])  # refused before the checkpoint is read
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_fast_queue_keeps_requests_and_answers_out_of_the_manager_and_loses_no_first_answer():
    """LitServe 0.2.19's fast_queue never took effect; forced, its first answers could vanish or end consumer 0."""
    import asyncio
    import multiprocessing.queues
    import pickle

    from project.serve.litserve_workarounds import ZMQAnswers
    from project.serve.server import DigitAPI, DigitServer

    server = DigitServer(DigitAPI({}), fast_queue=True)
    manager = server._init_manager(2)
    try:
        assert isinstance(server._transport, ZMQAnswers)
        assert all(type(q) is multiprocessing.queues.Queue for q in server.litapi_request_queues.values())

        async def first_answers() -> list:
            # Copies as the processes get them; the HTTP servers subscribe before any worker answers.
            servers = [pickle.loads(pickle.dumps(server._transport)) for _ in range(2)]
            received = [asyncio.create_task(t.areceive(consumer_id=i, timeout=20)) for i, t in enumerate(servers)]
            await asyncio.sleep(0)  # the tasks subscribe

            def worker() -> None:  # its producer waits for both subscriptions, then answers at once
                producer = pickle.loads(pickle.dumps(server._transport))
                producer.send(("uid-0", "answer for server 0"), consumer_id=0)
                producer.send(("uid-1", "answer for server 1"), consumer_id=1)
                producer.close()

            await asyncio.to_thread(worker)
            try:
                return await asyncio.gather(*received)
            finally:
                for t in servers:
                    t.close()

        assert asyncio.run(first_answers()) == [("uid-0", "answer for server 0"), ("uid-1", "answer for server 1")]
        server._transport.close()  # the main process's copy, never set up: LitServe's raised here
    finally:
        manager.shutdown()


def test_the_litserve_workarounds_apply_only_to_the_versions_they_were_tested_with(monkeypatch):
    import litserve

    from project.serve import litserve_workarounds as workarounds

    assert litserve.__version__ in workarounds.TESTED, "a new LitServe: test the workarounds with it, then list it"
    assert workarounds.server_base() is workarounds.LitServerWorkarounds
    monkeypatch.setattr(litserve, "__version__", "9.9.9")
    with pytest.warns(UserWarning, match=r"LitServe 9\.9\.9 is not one the serve workarounds were tested with"):
        assert workarounds.server_base() is litserve.LitServer


def test_no_thread_hop_per_request_and_the_key_is_left_to_require_key_but_an_authorize_of_yours_is_kept(monkeypatch):
    import inspect

    import litserve.server

    from project.serve.server import DigitAPI, DigitServer

    server = DigitServer(DigitAPI({}))
    assert inspect.iscoroutinefunction(server.setup_auth())  # FastAPI runs it in the event loop, not a thread pool
    monkeypatch.setattr(litserve.server, "LIT_SERVER_API_KEY", "secret")
    assert litserve.LitServer(DigitAPI({})).setup_auth() is litserve.server.api_key_auth  # LitServe's: /health too
    assert inspect.iscoroutinefunction(server.setup_auth())  # ours: project.serve.auth.RequireKey checks the key

    class Mine(DigitAPI):
        def authorize(self) -> None:
            pass

    mine = Mine({})
    assert DigitServer(mine).setup_auth(mine) == mine.authorize


def test_require_key_refuses_without_the_key_401_or_with_a_wrong_one_403_and_leaves_health_open(monkeypatch, tmp_path):
    import asyncio

    import httpx
    from fastapi import FastAPI

    from project.serve.auth import RequireKey, read_key

    app = FastAPI()
    for route in ("/health", "/predict", "/metrics"):
        app.add_api_route(route, lambda: {"ok": True}, methods=["GET"])
    app.add_middleware(RequireKey, key="s3cret", open_paths=("/health",))

    async def answers() -> dict[tuple[str, str | None], httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client:
            return {
                (route, key): await client.get(route, headers={"X-API-Key": key} if key else {})
                for route in ("/health", "/predict", "/metrics")
                for key in (None, "wrong", "s3cret")
            }

    got = asyncio.run(answers())
    assert [got[("/health", key)].status_code for key in (None, "wrong", "s3cret")] == [200, 200, 200]
    for route in ("/predict", "/metrics"):
        refused = got[(route, None)]
        assert refused.status_code == 401 and "X-API-Key" in refused.json()["detail"]
        assert refused.headers["WWW-Authenticate"] == "X-API-Key"
        assert got[(route, "wrong")].status_code == 403
        assert got[(route, "s3cret")].json() == {"ok": True}
    # Where the key comes from: the file's first line, else LitServe's variable, else none.
    monkeypatch.delenv("LIT_SERVER_API_KEY", raising=False)
    assert read_key(None) is None
    monkeypatch.setenv("LIT_SERVER_API_KEY", "from-env")
    assert read_key(None) == "from-env"
    (tmp_path / "key").write_text("  from-file \nsecond line\n")
    assert read_key(str(tmp_path / "key")) == "from-file"


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read it"), ("\n\n", "the file is empty")])
def test_a_key_file_that_holds_no_key_is_refused_by_name_before_anything_starts(tmp_path, capsys, content, message):
    from project.serve.server import main

    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        main([f"--ckpt_path={tmp_path / 'never-read.ckpt'}", f"--api_key_file={key_file}"])
    assert exit_.value.code == 2 and f"--api_key_file {key_file}: {message}" in capsys.readouterr().err


@pytest.mark.slow  # a server of its own: ~10 s
def test_with_an_api_key_only_health_and_the_page_answer_without_it_and_refusals_are_counted(trained_ckpt, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    proc, url = start_server(f"--ckpt_path={trained_ckpt}", f"--api_key_file={key_file}")  # polls /health: no key
    try:
        assert status_of(f"{url}/") == 200  # the page, which asks for the key when /predict refuses it
        for route in ("/info", "/metrics"):
            assert status_of(f"{url}{route}") == 401
        name, data = digit_files(1)[0]
        assert post(url, *multipart(data, name))[0] == 401
        assert post(url, *multipart(data, name), key="wrong")[0] == 403
        status, answer = post(url, *multipart(data, name), key="s3cret")
        assert status == 200 and answer["pred"] == int(expected(trained_ckpt, [(name, data)])[name].argmax())
        counted = scrape(url, key="s3cret")
        for code, n in (("401", 1), ("403", 1), ("200", 1)):
            assert counted[("serve_requests_total", (("code", code), ("route", "/predict")))] == n
        assert counted[("serve_requests_total", (("code", "401"), ("route", "/metrics")))] == 1
    finally:
        stop(proc)


def test_the_http_servers_fork_with_the_objects_frozen(trained_ckpt, monkeypatch):
    """A full collection over torch's objects stopped each HTTP server's event loop for ~250 ms (the p99 tail)."""
    import gc

    import project.serve.server as serve

    frozen = []
    monkeypatch.setattr(serve, "stop_on_signals", lambda: None)  # not this test process's signal handlers
    monkeypatch.setattr(serve.DigitServer, "run", lambda self, **kwargs: frozen.append(gc.get_freeze_count()))
    try:
        serve.serve(serve.build_parser().parse_args(["--ckpt_path", str(trained_ckpt)]))
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 100_000, frozen  # torch alone is hundreds of thousands


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from /proc (children of children included)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


# >>> export
@pytest.mark.slow  # a second server, an export, a shutdown: ~20 s
def test_onnx_model_gives_the_checkpoints_answers_and_sigterm_drains_and_stops_everything(trained_ckpt, tmp_path):
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    from project.export.convert import export

    onnx = tmp_path / "model.onnx"
    export(str(trained_ckpt), "onnx", str(onnx))
    # A long batch_timeout: the burst below is still queued, in flight, when SIGTERM arrives.
    proc, url = start_server(f"--model={onnx}", "--max_batch_size=64", "--batch_timeout=1.0", "--workers=1")
    try:
        with urllib.request.urlopen(f"{url}/info") as r:
            info = json.load(r)["model"]
        assert info["kind"] == "onnx" and info["checkpoint"] == str(trained_ckpt)  # from the file's metadata
        files = digit_files(12)
        reference = expected(trained_ckpt, files)
        for name, data in files[:3]:
            status, answer = post_file(url, data, name)
            assert status == 200 and answer["pred"] == int(reference[name].argmax())
        children = descendants(proc.pid)
        assert len(children) >= 2  # at least the HTTP server and the inference worker
        with ThreadPoolExecutor(len(files)) as pool:
            burst = [pool.submit(post_file, url, data, name) for name, data in files]
            time.sleep(0.5)  # every request sent and waiting for its batch
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            answers = [f.result(timeout=30) for f in burst]
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - start
        for (name, _), (status, answer) in zip(files, answers, strict=True):
            assert status == 200 and answer["pred"] == int(reference[name].argmax()), answer
        assert took < 15, f"SIGTERM took {took:.1f} s"
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if alive(pid)], "processes of the server outlived it"
        assert b"Server stopped." in proc.stdout.read()
    finally:
        stop(proc)


# <<< export


@pytest.mark.slow  # a server of its own per case: ~15 s each
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_to_the_process_group_stops_every_process_with_one_line_and_exit_0(trained_ckpt, sigint):
    """A terminal's Ctrl-C (SIGINT to the whole group), or SIGINT to a background job's group (ignored there)."""
    proc, url = start_server(f"--ckpt_path={trained_ckpt}", "--workers=1", sigint_ignored=sigint == "ignored")
    try:
        files = digit_files(2)
        assert post_file(url, files[0][1], files[0][0])[0] == 200
        children = descendants(proc.pid)
        assert len(children) >= 3  # the HTTP servers and the inference worker at least
        os.killpg(proc.pid, signal.SIGINT)  # the server leads its group (its own session), as in a terminal
        assert proc.wait(timeout=30) == 0
        out = proc.stdout.read().decode()
        lines = out.strip().splitlines()
        assert lines[0].startswith("Serving the torch model") and lines[1:] == ["Server stopped."], out
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if alive(pid)], "processes of the server outlived it"
    finally:
        stop(proc)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow  # a server of its own: ~20 s
def test_a_stuck_worker_fails_health_and_times_out_requests_and_sigkill_of_main_leaves_no_process(trained_ckpt):
    proc, url = start_server(f"--ckpt_path={trained_ckpt}", "--workers=1", "--timeout=2")
    port = int(url.rsplit(":", 1)[1])
    try:
        children = descendants(proc.pid)
        assert len(children) >= 3  # the HTTP servers, the Manager and the inference worker at least
        cmdline = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children}
        (worker,) = [pid for pid in children if b"spawn_main" in cmdline[pid]]
        name, data = digit_files(1)[0]
        os.kill(worker, signal.SIGSTOP)  # a worker that no longer answers, as a hung or swapped-out one
        try:
            start = time.monotonic()
            status, answer = post_file(url, data, name)
            assert status == 504 and "--timeout 2" in answer["detail"], answer
            assert 1.9 < time.monotonic() - start < 10
            deadline = time.monotonic() + 10
            while status_of(f"{url}/health") == 200 and time.monotonic() < deadline:
                time.sleep(0.3)
            assert status_of(f"{url}/health") == 503
        finally:
            os.kill(worker, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while status_of(f"{url}/health") != 200 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert status_of(f"{url}/health") == 200 and post_file(url, data, name)[0] == 200  # answering again

        proc.kill()  # SIGKILL: no shutdown runs in the main process
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if alive(pid)], "processes of the server outlived its main process"
        with pytest.raises(ConnectionRefusedError):  # the port is free: nobody listens on it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        stop(proc)


def test_the_serve_help_shows_the_defaults(capsys):
    assert_help_shows_defaults("serve", "--port PORT           TCP port, 1024-65535 (default: 8000)", capsys)


# >>> folder
@pytest.mark.slow  # a server of its own and a predict: ~25 s
def test_a_folder_model_is_served_with_the_answers_predict_gives_for_the_same_files(rgb_folder_ckpt, tmp_path):
    """RGB 32x32 from an image folder: the server prepares and normalises as the checkpoint's contract says, so each
    file gets the answer `predict --data.predict_dir` writes for it (both in fp32)."""
    import shutil

    from tests.conftest import new_images, predict_folder

    ckpt, root = rgb_folder_ckpt
    copy = tmp_path / "model.ckpt"  # predict writes beside its checkpoint's run: not into the shared fixture's
    shutil.copy(ckpt, copy)
    new = new_images(root, tmp_path / "new_images", per_class=3)
    _, written = predict_folder(root, new, tmp_path / "logs", copy, "--trainer.precision=32-true")  # as the server
    rows = {Path(r["path"]).name: r for r in written}
    assert len(rows) == 9
    proc, url = start_server(f"--ckpt_path={ckpt}")
    try:
        with urllib.request.urlopen(f"{url}/info") as r:
            assert json.load(r)["model"]["input"] == torch.load(ckpt, weights_only=True)["input"]
        for path in sorted(new.iterdir()):
            status, answer = post_file(url, path.read_bytes(), path.name)
            row = rows[path.name]
            assert status == 200, answer
            assert answer["pred"] == int(row["pred"]) and answer["pred_name"] == row["pred_name"], (answer, row)
            assert answer["probs"] == pytest.approx([float(row[f"prob_{c}"]) for c in range(3)], abs=2e-6)
    finally:
        stop(proc)


# <<< folder
