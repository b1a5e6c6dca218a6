"""Serve a trained model over HTTP with dynamic batching: ``python -m project serve --ckpt_path CKPT``.

Built on LitServe. Processes: the main one (starts and stops the others), ``--api_servers`` HTTP servers (uvicorn,
each on a listening socket of its own: they read the request, decode and prepare the image, so a bad one gets its
4xx there and never reaches a batch), and ``--workers`` inference workers (they gather up to ``--max_batch_size``
prepared images, waiting at most ``--batch_timeout`` seconds for the batch to fill, and run the network once per
batch).

Routes: ``POST /predict`` (multipart ``file``, JSON ``{"image": "<base64>"}`` or the raw image bytes),
``GET /health`` (200 while an inference worker answers: its model loaded, its heartbeat fresh; open to anyone
even with an API key, ``project.serve.auth``),
``GET /info`` (the model, checkpoint and classes served), ``GET /metrics`` (Prometheus:
``project.serve.metrics``) and ``GET /`` (a page to draw a digit on,
``project/serve/page.html``; ``--no-page`` leaves LitServe's own text there).

Images are prepared as the model's input contract says (``project.inputs``: read from the
checkpoint, or from the ONNX file's metadata), with the code ``predict --data.predict_dir`` runs, so a
file gets the same answer from both. SIGTERM (``docker stop``, systemd, Kubernetes) and SIGINT (Ctrl-C,
which the terminal sends to every process of the group) stop accepting, answer what is in flight and
exit 0; only the main process acts on them. Should the main process die without that (SIGKILL), every
other one dies with it (``project.serve.lifetime``).
"""

import argparse
import base64
import binascii
import gc
import io
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np

# Not `from __future__ import annotations`: LitServe hands decode_request's annotation to FastAPI as an object.
from fastapi import Depends, HTTPException, Request
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from project.images import BlankImage, ImageTooLarge
from project.serve.lifetime import AnswerWithin, Heartbeat, end_with_parent, forks_end_with_this_process

try:
    import litserve as ls
    import uvicorn.server
    from litserve.server import api_key_auth, no_auth
except ImportError as exc:  # an optional extra
    raise ImportError("`serve` needs LitServe: pip install -e '.[serve]'") from exc

from project.serve.auth import RequireKey, read_key
from project.serve.litserve_workarounds import server_base
from project.serve.metrics import CountRequests, ModelLoadTime, metrics, metrics_folder, scrape
from project.serve.page import page

JSON_HELP = 'send the image as multipart/form-data (field "file") or as JSON {"image": "<base64 PNG/JPEG>"}'


def describe(ckpt_path: str | None = None, model_path: str | None = None) -> dict[str, Any]:
    """What will be served, checked before any process starts: its kind, file, network and input contract.

    Raises:
        CheckpointError: the checkpoint is missing, foreign, unsafe, or records no input contract.
        ValueError: the ONNX file is missing, not a model onnxruntime opens, or carries no input contract.
    """
    from project.inputs import InputContract, read_contract

    if ckpt_path is not None:
        from project.checkpointing import load_checkpoint

        checkpoint = load_checkpoint(ckpt_path)  # refuses a missing, foreign or pickled-code file, loading nothing
        return {
            "kind": "torch",
            "path": str(Path(ckpt_path).resolve()),
            "checkpoint": str(ckpt_path),
            "input": read_contract(checkpoint, ckpt_path),
            "net": checkpoint.get("hyper_parameters", {}).get("net"),
        }
    import onnxruntime as ort

    if model_path is None:
        raise ValueError("give a checkpoint (--ckpt_path) or an ONNX file (--model) to serve.")
    path = Path(model_path)
    if not path.is_file():
        raise ValueError(f"--model {path}: no such file. Give an .onnx file written by `python -m project export`.")
    try:
        meta = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    except Exception as exc:
        raise ValueError(f"--model {path} is not an ONNX model onnxruntime can open: {exc}") from exc
    try:
        contract = InputContract.from_dict(json.loads(meta["input"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(
            f"--model {path}: its metadata has no valid input contract ('input': {exc}). Export it again with "
            "`python -m project export`, which writes one."
        ) from None
    return {
        "kind": "onnx",
        "path": str(path.resolve()),
        "checkpoint": meta.get("checkpoint"),  # export writes it into the file's metadata
        "input": contract,
        "net": json.loads(meta["net"]) if "net" in meta else None,
    }


async def read_image_request(request: Request) -> dict[str, Any]:
    """Read one ``/predict`` request and prepare its image, in the HTTP server, before it can join a batch.

    Returns:
        ``{"image": the prepared uint8 pixels (channels, size, size of the input contract) as bytes, "name": the
        uploaded file's name or JSON "name", else None}``.

    Raises:
        HTTPException: 413 for a body or image over the limits, 415 for a content type this route does not take,
            400 for an empty body, bad JSON, bad base64 or bytes that are not an image, 422 for a missing field or
            an image without a digit. The message names the problem.
    """
    limits = request.app.state.limits
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits["max_body_bytes"]:
        max_body = limits["max_body_bytes"]
        raise refuse(413, "body_too_large", f"body is {int(declared):,} bytes, over the limit of {max_body:,}")
    try:
        body = await request.body()  # LitServe's MaxSizeMiddleware stops a chunked body at the same limit
    except ClientDisconnect:  # nobody is left to read the answer; without this uvicorn logs a traceback
        raise refuse(400, "client_disconnected", "the client disconnected before the whole body arrived") from None
    if not body:
        raise refuse(400, "empty_body", f"empty body: {JSON_HELP}")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    name = None
    if content_type == "multipart/form-data":
        form = await request.form()  # parses the body read above
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            fields = ", ".join(form.keys()) or "none"
            detail = f'multipart body has no file field "file" (fields: {fields}): {JSON_HELP}'
            raise refuse(422, "no_file_field", detail)
        data, name = await upload.read(), upload.filename
    elif content_type == "application/json":
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise refuse(400, "bad_json", f"body is not valid JSON ({exc}): {JSON_HELP}") from None
        if not isinstance(payload, dict) or "image" not in payload:
            raise refuse(422, "no_image_field", f'JSON has no "image" field: {JSON_HELP}')
        if not isinstance(payload["image"], str):
            kind = type(payload["image"]).__name__
            raise refuse(422, "image_not_a_string", f'"image" must be a base64 string, got {kind}')
        encoded = payload["image"].split(",", 1)[1] if payload["image"].startswith("data:") else payload["image"]
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise refuse(400, "bad_base64", f'"image" is not valid base64 ({exc})') from None
        name = payload.get("name") if isinstance(payload.get("name"), str) else None
    elif content_type.startswith("image/") or content_type == "application/octet-stream":
        data = body
    else:
        raise refuse(415, "content_type", f"content type {content_type or 'none'!r} is not accepted: {JSON_HELP}")
    what = f"file {name!r}" if name else "image"
    if not data:
        raise refuse(400, "empty_image", f"{what} is empty")
    try:
        pixels = request.app.state.contract.prepare(io.BytesIO(data), max_pixels=limits["max_pixels"])
    except ImageTooLarge as exc:
        raise refuse(413, "image_too_large", f"{what}: {exc}") from None
    except BlankImage as exc:
        raise refuse(422, "blank_image", f"{what}: {exc}") from None
    except ValueError as exc:
        raise refuse(400, "not_an_image", f"{what}: {exc}") from None
    # Bytes, not an array: LitServe formats each request into a debug message (even with debug logging off), and
    # numpy's repr of an image array costs milliseconds; its bytes cost microseconds, and pickle as compactly.
    return {"image": pixels.numpy().tobytes(), "name": name}


def refuse(status: int, reason: str, detail: str) -> HTTPException:
    """The 4xx answer to a bad request, counted in ``/metrics`` under ``reason``; raise what it returns."""
    metrics().refused.labels(reason).inc()
    return HTTPException(status, detail)


def load_predictor(served: dict[str, Any], device: str, threads: int) -> Any:
    """``images (B, C, S, S) uint8 -> probabilities (B, classes) float32`` for the served model, on ``device``."""
    import torch

    torch.set_num_threads(threads)
    contract = served["input"]
    if served["kind"] == "torch":
        from project.module import MNISTClassifier

        model = MNISTClassifier.load_from_checkpoint(served["path"], map_location=device, weights_only=True)
        model.eval()

        def predict_torch(images: np.ndarray) -> np.ndarray:
            x = contract.normalize(torch.from_numpy(images).to(device))
            with torch.inference_mode():
                return model.predict_step(x, 0)["probs"].cpu().numpy()  # what `predict` writes to its CSV

        return predict_torch
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else None
    session = ort.InferenceSession(served["path"], options, providers=providers or ["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def predict_onnx(images: np.ndarray) -> np.ndarray:
        x = contract.normalize(torch.from_numpy(images)).numpy()  # the arithmetic training and `predict` use
        logits = session.run(None, {input_name: x})[0]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return predict_onnx


class DigitAPI(ls.LitAPI):
    """Batches of prepared digits through the served model; each answer says how many ran together.

    Args:
        served: What ``describe`` returned: the model file, its kind, classes and input normalisation.
        threads: torch / onnxruntime threads of each inference worker.
        max_batch_size: Most requests run through the model at once.
        batch_timeout: Seconds a worker waits for a batch to fill before it runs what it has.
        nice: How far below the HTTP servers' CPU priority the worker runs (added by ``os.nice``, 0-19).
    """

    def __init__(
        self,
        served: dict[str, Any],
        threads: int = 1,
        max_batch_size: int = 1,
        batch_timeout: float = 0.0,
        nice: int = 10,
    ):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.served, self.threads, self.nice = served, threads, nice
        self.main_pid = os.getpid()  # made in the main process; setup runs in the inference worker
        self.heartbeat = Heartbeat()

    def setup(self, device: str) -> None:
        end_with_parent(self.main_pid)
        # When the worker and the HTTP servers want the same cores, the one the kernel runs first decides where
        # requests wait. Run the HTTP servers first and they wait in the worker's queue, first come first served,
        # and go through in fuller batches; run the worker first and they wait in the HTTP servers' event loops,
        # in no fair order (a request's task, then its answer's, each queue behind whatever the loop holds). Set
        # before the model loads: torch's and onnxruntime's threads inherit it.
        os.nice(self.nice)
        self.predict_probs = load_predictor(self.served, device, self.threads)
        gc.freeze()  # what the imports and the model made, out of the collector's sight: see serve() below
        self.heartbeat.start()

    def health(self) -> bool:
        # Run by /health in the HTTP server: 503 once no inference worker has beaten for 3 s (stopped, hung, gone).
        return self.heartbeat.alive()

    # The annotation makes FastAPI run read_image_request in the HTTP server: decoding and validation happen
    # there, per request, so only good images are queued and batched.
    def decode_request(self, request: Annotated[dict, Depends(read_image_request)]) -> dict:
        return request

    def batch(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def predict(self, x: dict | list[dict]) -> dict | list[dict]:
        items = x if isinstance(x, list) else [x]  # max_batch_size 1: one request, not a list
        pixels = bytearray(b"".join(item["image"] for item in items))  # writable, as torch.from_numpy wants
        images = np.frombuffer(pixels, np.uint8).reshape(len(items), *self.served["input"].shape)
        probs = self.predict_probs(images)  # (B, C)
        metrics().batch_size.observe(len(items))
        out = [
            {"probs": p, "name": item["name"], "batch_size": len(items)} for p, item in zip(probs, items, strict=True)
        ]
        return out if isinstance(x, list) else out[0]

    def encode_response(self, output: dict) -> dict:
        probs = output["probs"]
        pred = int(probs.argmax())
        answer = {
            "pred": pred,
            "pred_name": self.served["input"].class_names[pred],
            "prob": round(float(probs[pred]), 6),
            "probs": [round(float(p), 6) for p in probs],
            "batch_size": output["batch_size"],  # how many requests ran through the model together
        }
        if output["name"]:
            answer["file"] = output["name"]  # the uploaded file's name: match answers to files
        return answer


async def allow_all() -> None:
    """No authentication (LitServe's default without an API key), run in the event loop."""


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT end ``LitServer.run`` the way LitServe's Ctrl-C path does: drained, all stopped, exit 0.

    By default SIGTERM kills the main process at once and leaves its HTTP servers and inference workers running.
    As KeyboardInterrupt, it takes LitServe's own shutdown path: the HTTP servers stop accepting and answer the
    requests in flight (uvicorn's graceful shutdown), then the inference workers stop. SIGINT takes the same path,
    whether the parent left it at its default (a terminal's Ctrl-C) or ignored it (a shell's background job): a
    terminal sends it to every process of the group, so the children must leave it to the main process, which stops
    them in order. The inference workers are started with SIGINT ignored (``DigitServer.launch_inference_worker``);
    the HTTP servers are forked with this handler, which ignores SIGINT outside the main process, and uvicorn is
    told to handle only SIGTERM (it would otherwise close its socket on a Ctrl-C and leave the rest running).
    """

    main_pid = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != main_pid:  # a forked HTTP server inherits this handler
            if signum == signal.SIGINT:
                return  # the main process stops this one with SIGTERM, after the requests in flight
            raise SystemExit(0)  # SIGTERM: uvicorn re-raises it once it has shut down gracefully; then it is done
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not interrupt the shutdown
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    # uvicorn installs its own SIGINT and SIGTERM handlers in each HTTP server, whatever was there before; it reads
    # this module constant when it does (uvicorn 0.29 and later; 0.55 tested). SIGTERM only: SIGINT is for main.
    uvicorn.server.HANDLED_SIGNALS = (signal.SIGTERM,)  # type: ignore[assignment]  # typed as the pair it replaces


class DigitServer(server_base()):  # type: ignore[misc]  # the base is picked at import
    """LitServe's server (with ``project.serve.litserve_workarounds`` on the versions they were tested
    with), whose route dependencies leave API keys to ``project.serve.auth`` and run in the event loop,
    and whose inference workers ignore Ctrl-C."""

    def setup_auth(self, lit_api: ls.LitAPI | None = None) -> Callable:
        auth = super().setup_auth(lit_api)
        # LitServe's key check (LIT_SERVER_API_KEY) would guard /health too and leave /metrics open:
        # project.serve.auth.RequireKey checks the key instead. LitServe's no-op is a plain function,
        # which FastAPI runs in a thread pool (a hand-off to a thread and back, per request, while the event
        # loop holds the GIL); the same no-op as a coroutine runs in the loop. A LitAPI.authorize of yours is
        # kept as it is.
        return allow_all if auth in (no_auth, api_key_auth) else auth

    def launch_inference_worker(self, lit_api: ls.LitAPI) -> list:
        # Spawned with SIGINT ignored, which stays ignored across exec (Python then installs no KeyboardInterrupt
        # handler): a Ctrl-C reaches the whole process group, and the main process stops the workers with SIGTERM.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return super().launch_inference_worker(lit_api)
        finally:
            signal.signal(signal.SIGINT, previous)


def serve(args: argparse.Namespace) -> None:
    """Describe the model, start LitServe and block until SIGTERM or Ctrl-C."""
    key = read_key(args.api_key_file)
    served = describe(args.ckpt_path, args.model)
    with metrics_folder():  # before anything imports prometheus_client: see project.serve.metrics
        metrics()  # made here, so that each HTTP server forks with it
        run(args, served, key)
    print("Server stopped.", flush=True)


def run(args: argparse.Namespace, served: dict[str, Any], key: str | None = None) -> None:
    """Start LitServe on the described model and block until SIGTERM or Ctrl-C; with ``key``, only callers that
    send it get past ``/health`` and the page."""
    api = DigitAPI(served, args.threads, args.max_batch_size, args.batch_timeout, args.worker_nice)
    max_body_bytes = int(args.max_body_mb * 1024 * 1024)
    server = DigitServer(
        api,
        accelerator=args.device,
        workers_per_device=args.workers,
        timeout=args.timeout,
        max_payload_size=max_body_bytes,
        fast_queue=args.fast_queue,
        callbacks=[ModelLoadTime()],
        model_metadata={
            **{k: served[k] for k in ("kind", "path", "checkpoint", "net")},
            "input": served["input"].to_dict(),
            "max_batch_size": args.max_batch_size,
            "batch_timeout": args.batch_timeout,
            "threads_per_worker": args.threads,
            "worker_nice": args.worker_nice,
        },
    )
    server.app.state.limits = {"max_body_bytes": max_body_bytes, "max_pixels": args.max_pixels}
    server.app.state.contract = served["input"]  # how an HTTP server prepares an image: as the checkpoint says
    server.app.add_middleware(AnswerWithin, seconds=args.timeout)
    if key is not None:
        server.app.add_middleware(RequireKey, key=key, open_paths=("/health", "/") if args.page else ("/health",))
    server.app.add_middleware(CountRequests)  # outermost: it counts AnswerWithin's 504s and the key's 401/403 too
    server.app.add_route("/metrics", scrape, methods=["GET"])
    if args.page:  # in front of LitServe's own "/" (a "litserve running" text): Starlette takes the first match
        server.app.router.routes.insert(0, Route("/", page, methods=["GET"]))
    server.uvicorn_graceful_timeout = args.grace  # how long SIGTERM waits for requests in flight
    what = f"{served['kind']} model {served['path']}"
    print(
        f"Serving the {what} on http://{args.host}:{args.port}: {'GET / (a page to draw on), ' if args.page else ''}"
        "POST /predict, GET /health, GET /info, GET /metrics "
        f"(max_batch_size {args.max_batch_size}, batch_timeout {args.batch_timeout} s, {args.workers} worker(s))"
        + ("; every route but /health and the page needs the API key (X-API-Key)." if key else "."),
        flush=True,
    )
    stop_on_signals()
    forks_end_with_this_process()  # the HTTP servers and LitServe's Manager: no orphans if this process is killed
    # The HTTP servers fork from this process with the objects of torch, Lightning and FastAPI, and Python's full
    # collection walks all of them with the event loop stopped: the p99 tail (docs/benchmarks.md). Frozen, a full
    # collection sees only what was made since. The inference worker freezes after its setup.
    gc.freeze()
    try:
        server.run(
            host=args.host,
            port=args.port,
            num_api_servers=args.api_servers,
            log_level=args.log_level,
            generate_client_file=False,  # it would write client.py into the user's working directory
        )
    except KeyboardInterrupt:  # a signal before LitServe's own handling of it (the workers still loading)
        pass  # stopped all the same, below: no traceback
    finally:
        # What LitServe's shutdown missed (e.g. a signal while the workers were still loading): stop it here,
        # or multiprocessing would wait for it at exit.
        for child in multiprocessing.active_children():
            child.kill()
            child.join(5)


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also what the README test parses its documented commands with)."""
    parser = argparse.ArgumentParser(
        prog="python -m project serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt_path", help="checkpoint written by fit (loaded with the safe loader)")
    source.add_argument("--model", help="ONNX file written by `python -m project export` (fp32 or int8)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="127.0.0.1 (this machine only), 0.0.0.0 or :: (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port, 1024-65535 (default: %(default)s)")
    parser.add_argument(
        "--max_batch_size",
        type=int,
        default=8,
        help="most requests run through the model at once (measured: 8 and 32 close) (default: %(default)s)",
    )
    parser.add_argument(
        "--batch_timeout",
        type=float,
        default=0.001,
        help="seconds a worker waits for a batch to fill (measured) (default: %(default)s)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="inference worker processes per device (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch / onnxruntime threads per inference worker (default: %(default)s)"
    )
    parser.add_argument(
        "--worker_nice",
        type=int,
        default=10,
        help="inference workers run this much below the HTTP servers' CPU priority, 0-19 (measured: 10 cuts the "
        "tail) (default: %(default)s)",
    )
    parser.add_argument(
        "--api_servers",
        type=int,
        default=2,
        help="HTTP server processes: they decode the images (measured: 2) (default: %(default)s)",
    )
    parser.add_argument(
        "--fast_queue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="requests over a pipe, answers over ZeroMQ, not LitServe's Manager queues (measured: 1.3-1.6x req/s) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the model runs (default: %(default)s)"
    )
    parser.add_argument(
        "--max_body_mb",
        type=float,
        default=10,
        help="refuse request bodies larger than this (413) (default: %(default)s)",
    )
    parser.add_argument(
        "--max_pixels",
        type=int,
        default=25_000_000,
        help="refuse images with more pixels (decompression bombs, 413) (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30,
        help="seconds a request may wait for its answer (504) (default: %(default)s)",
    )
    parser.add_argument(
        "--grace", type=float, default=10, help="seconds SIGTERM waits for requests in flight (default: %(default)s)"
    )
    parser.add_argument(
        "--page",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GET / answers a page to draw a digit on (--no-page: an API-only server) (default: %(default)s)",
    )
    parser.add_argument(
        "--api_key_file",
        help="a file whose first line is the key callers must send as X-API-Key (default: $LIT_SERVER_API_KEY; "
        "unset: no key); /health and the page stay open",
    )
    parser.add_argument(
        "--log_level", default="warning", help="uvicorn's: info also logs every request (default: %(default)s)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.max_batch_size, args.workers, args.threads, args.api_servers) < 1 or args.batch_timeout < 0:
        parser.error("--max_batch_size, --workers, --threads and --api_servers must be >= 1, --batch_timeout >= 0")
    if not 0 <= args.worker_nice <= 19:  # below 0 needs root; 19 is the lowest priority
        parser.error(f"--worker_nice must be 0-19, got {args.worker_nice}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if not 1024 <= args.port <= 65535:
        parser.error(f"--port must be 1024-65535, got {args.port}")
    try:
        serve(args)
    except ValueError as exc:  # what describe() found wrong (CheckpointError is one), before anything started
        parser.error(str(exc))


if __name__ == "__main__":
    main(sys.argv[1:])
