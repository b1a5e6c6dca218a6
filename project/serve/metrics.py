"""``GET /metrics`` in Prometheus's text format: requests, latency, batch sizes, refused images, model load time.

The HTTP servers and the inference workers are processes of their own, so the metrics use prometheus_client's
multiprocess mode: each process adds to files of its own in one folder and ``/metrics`` sums them. prometheus_client
picks that mode when it is imported, from ``PROMETHEUS_MULTIPROC_DIR``: ``serve`` sets it (``metrics_folder``)
before anything imports prometheus_client, in the main process, which the HTTP servers fork from and the inference
workers inherit it from.
"""

import contextlib
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import litserve as ls

ROUTES = ("/", "/predict", "/health", "/info", "/metrics")  # others count as "other": no label per scanned URL
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@contextlib.contextmanager
def metrics_folder() -> Iterator[str]:
    """A fresh folder for this server's metric files, named by ``PROMETHEUS_MULTIPROC_DIR`` while it runs.

    Raises:
        RuntimeError: prometheus_client was imported before, so it would keep each process's metrics to itself.
    """
    if "prometheus_client" in sys.modules and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        raise RuntimeError("prometheus_client was imported before metrics_folder(): its metrics would not be shared")
    folder = tempfile.mkdtemp(prefix="serve-metrics-")
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    try:
        yield folder
    finally:
        if previous is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


class Metrics:
    """The server's metrics, one set per process (``metrics()``): two objects of one name would overwrite each other."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        # registry=None: in multiprocess mode /metrics reads the files of every process, not a registry.
        self.requests = Counter(
            "serve_requests", "HTTP requests answered, by route and status code", ["route", "code"], registry=None
        )
        self.latency = Histogram(
            "serve_request_seconds",
            "Seconds from a request's arrival to the end of its answer, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.batch_size = Histogram(
            "serve_batch_size", "Requests run through the model together", buckets=BATCH_BUCKETS, registry=None
        )
        self.refused = Counter(
            "serve_refused_images", "Images refused before they reached a batch, by reason", ["reason"], registry=None
        )
        self.model_load = Gauge(
            "serve_model_load_seconds",
            "Seconds an inference worker took to load its model (the slowest worker's)",
            multiprocess_mode="max",
            registry=None,
        )


@functools.cache
def metrics() -> Metrics:
    """This process's metrics, made on first use (in the main process before the HTTP servers fork from it)."""
    return Metrics()


def scrape(request: Any) -> Any:
    """``GET /metrics``: every process's metrics, summed (histograms and counters) or the maximum (load time)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
    from starlette.responses import Response

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class CountRequests:
    """ASGI middleware: count each HTTP request by route and status code, and time it to the end of its answer.

    Args:
        app: The ASGI application to wrap (outermost, so that the 504s of ``AnswerWithin`` are counted too).
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, code, counted = time.perf_counter(), 500, False
        route = scope["path"] if scope["path"] in ROUTES else "other"

        def count() -> None:
            nonlocal counted
            counted = True
            m = metrics()
            m.requests.labels(route, str(code)).inc()
            m.latency.labels(route).observe(time.perf_counter() - started)

        async def tracked(message: dict) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                count()  # before the last byte leaves: a client that reads /metrics next sees its request counted
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        finally:
            if not counted:  # an exception before the answer ended, or a client gone: counted as what it got
                count()


class ModelLoadTime(ls.Callback):
    """LitServe's setup hooks, run in each inference worker: how long ``LitAPI.setup`` (the model's load) took."""

    def on_before_setup(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_after_setup(self, *args: Any, **kwargs: Any) -> None:
        metrics().model_load.set(time.perf_counter() - self.started)
