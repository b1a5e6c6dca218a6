"""Does dynamic batching pay? `python -m project serve` under a bounded load on 127.0.0.1, against FastAPI.

    python benchmarks/serve.py --ckpt_path CKPT           # real MNIST ($PATH_DATASETS): the table in BENCHMARKS.md
    python benchmarks/serve.py --ckpt_path CKPT --quick   # one small round: checks that every setting runs

Each setting sends a fixed number of requests (--requests, after --warmup unmeasured ones) with `wrk`, Debian's C
load generator (a Python client would use more CPU than the server it measures), from one thread and --timeout per
request; nothing but 127.0.0.1 is ever addressed. The requests are real MNIST test digits as PNG files, posted as
multipart uploads (`curl -F file=@digit.png`); the answer names its file, so every answer is checked against the
label and against the offline prediction of the same PNG by the same model: `python -m project predict
--data.predict_dir` (32-true) for the checkpoint, onnxruntime on the same prepared images for ONNX.

Settings: the checkpoint, ONNX fp32 and ONNX int8 (static; both written and verified by `python -m project
export`) served with max_batch_size 1, 8 and 32, and the baseline: one FastAPI + uvicorn process that
decodes and runs the same network once per request, the way tutorials do (--baseline_processes 1 2: also
two, as `uvicorn --workers 2`); each at concurrency 1, 8 and 64. One torch / onnxruntime thread per process
for all of them. Rounds alternate the order of the servers and of the concurrencies; the table gives
medians over rounds. Client and server CPU are given in cores (1.0 = one core busy for the whole
measurement), and the server's CPU per answered request is split into its HTTP servers' and its inference
worker's.
"""

import argparse
import contextlib
import csv
import io
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(1, str(ROOT))  # tests.conftest: free_port
from run import machine  # noqa: E402  (the CPU line every benchmark of this folder prints)

from tests.conftest import free_port  # noqa: E402  (one definition, the suite's)

LUA = r"""
-- Posts the bodies in order (bodies[i] names its file d<i>.png) and checks each answer; stops after `quota`.
local bodies, labels, refs = BODIES, LABELS, REFS
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  quota = tonumber(args[1]); sent = 0; answered = 0; ok = 0; correct = 0; agree = 0; bad = 0; batch_sum = 0
  headers = {["Content-Type"] = "multipart/form-data; boundary=BOUNDARY"}
end
function request()
  sent = sent + 1
  return wrk.format("POST", "/predict", headers, bodies[(sent - 1) % #bodies + 1])
end
function response(status, headers, body)
  answered = answered + 1
  if status == 200 then
    local i = tonumber(body:match('"file":%s*"d(%d+)%.png"'))
    local pred = tonumber(body:match('"pred":%s*(%d+)'))
    local batch = tonumber(body:match('"batch_size":%s*(%d+)')) or 1
    if i and pred then
      ok = ok + 1; batch_sum = batch_sum + batch
      if pred == labels[i + 1] then correct = correct + 1 end
      if pred == refs[i + 1] then agree = agree + 1 end
    else bad = bad + 1 end
  else bad = bad + 1 end
  if answered == quota then io.write("QUOTA\n"); io.flush(); wrk.thread:stop() end  -- the caller stops wrk
end
function done(summary, latency, requests)
  local t = {ok = 0, correct = 0, agree = 0, bad = 0, batch_sum = 0}
  for _, thread in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + thread:get(k) end
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "seconds": %.6f, "ok": %d, "correct": %d, "agree": %d, "bad": %d, "batch_sum": %d, ' ..
    '"socket_errors": %d, "p50_ms": %.3f, "p90_ms": %.3f, "p99_ms": %.3f}\n',
    summary.requests, summary.duration / 1e6, t.ok, t.correct, t.agree, t.bad, t.batch_sum,
    e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3))
end
"""


def lua_string(data: bytes) -> str:
    """``data`` as a Lua string literal (decimal escapes: any byte, LuaJIT-safe)."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}" for b in data) + '"'


def write_digits(data_dir: str | None, n: int, folder: Path) -> list[int]:
    """The first ``n`` MNIST test digits as PNG files ``folder/d<i>.png``; returns their labels."""
    from PIL import Image

    from project.data import MNISTDataModule

    dm = MNISTDataModule(data_dir=data_dir)
    dm.setup("test")
    split = dm.splits["test"]
    folder.mkdir(parents=True)
    for i in range(n):
        Image.fromarray(split.images[i].numpy()).save(folder / f"d{i}.png")
    return [int(label) for label in split.labels[:n]]


def csv_predictions(ckpt: Path, folder: Path) -> dict[int, int]:
    """``python -m project predict --data.predict_dir folder`` for the checkpoint: {digit index: pred}.

    ``ckpt`` is a copy in the benchmark's folder: predict writes its CSV beside the checkpoint's run.
    """
    from project.__main__ import cli_main
    from project.writer import CSVPredictionWriter

    cli = cli_main(
        [
            "predict",
            f"--ckpt_path={ckpt}",
            f"--data.predict_dir={folder}",
            "--trainer.precision=32-true",  # the server runs fp32
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={ckpt.parents[2]}",
        ]
    )
    writer = next(cb for cb in cli.trainer.callbacks if isinstance(cb, CSVPredictionWriter))
    with writer.written.open() as f:
        return {int(re.search(r"d(\d+)\.png", row["path"]).group(1)): int(row["pred"]) for row in csv.DictReader(f)}


# >>> export
def onnx_predictions(model: Path, folder: Path) -> dict[int, int]:
    """The ONNX model's predictions of the PNG files, prepared as `serve` and `predict` prepare them."""
    from project.data import MEAN, STD
    from project.export.convert import run_onnx
    from project.images import load_folder, normalize

    files, images, _ = load_folder(folder)
    preds = run_onnx(model, normalize(images.unsqueeze(1), (MEAN,), (STD,))).argmax(1)
    return {int(re.search(r"d(\d+)", p.name).group(1)): int(y) for p, y in zip(files, preds.tolist(), strict=True)}


# <<< export


def write_lua(folder: Path, labels: list[int], refs: dict[int, int], path: Path) -> None:
    boundary = "benchmarkboundary7MA4YWxkTrZu0gW"
    bodies = []
    for i in range(len(labels)):
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d{i}.png"\r\n'
        head += "Content-Type: image/png\r\n\r\n"
        bodies.append(head.encode() + (folder / f"d{i}.png").read_bytes() + f"\r\n--{boundary}--\r\n".encode())
    script = LUA.replace("BODIES", "{" + ",\n".join(map(lua_string, bodies)) + "}")
    script = script.replace("LABELS", "{" + ",".join(map(str, labels)) + "}")
    script = script.replace("REFS", "{" + ",".join(str(refs[i]) for i in range(len(labels))) + "}")
    path.write_text(script.replace("BOUNDARY", boundary))


def tree_cpu(pid: int, litserve: bool) -> dict[str, float]:
    """CPU seconds used so far by ``pid``'s process tree, by role: ``http``, ``worker`` and ``other``.

    LitServe spawns its inference workers (``multiprocessing.spawn`` in the command line) and forks its HTTP servers
    (and its idle Manager) from the main process, which holds the ZeroMQ broker thread (``other``, as is the
    resource tracker). The baseline (``litserve`` False) is all ``http``: its processes do everything themselves.
    """
    import psutil

    cpu = {"http": 0.0, "worker": 0.0, "other": 0.0}
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
        for p in [root, *children]:
            try:
                t = p.cpu_times()
                cmdline = " ".join(p.cmdline())
            except psutil.NoSuchProcess:
                continue
            if not litserve:
                role = "http"
            elif p.pid == root.pid:
                role = "other"
            elif "multiprocessing.spawn" in cmdline:
                role = "worker"
            elif "resource_tracker" in cmdline:
                role = "other"
            else:
                role = "http"
            cpu[role] += t.user + t.system
    except psutil.NoSuchProcess:
        pass
    return cpu


def start(cmd: list[str], port: int) -> subprocess.Popen:
    import urllib.request

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
    stop(proc)
    raise RuntimeError(f"{' '.join(cmd)} did not become ready in 120 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left
    proc.wait()


def wrk(port: int, script: Path, connections: int, requests: int, timeout: float, limit: float) -> dict[str, Any]:
    """One bounded wrk run: ``requests`` answers (or ``limit`` seconds), at most ``timeout`` s per request."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{int(limit)}s", f"--timeout={int(timeout)}s", "-s", str(script)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen([*cmd, f"http://127.0.0.1:{port}", "--", str(requests)], stdout=subprocess.PIPE)
    # wrk runs for -d seconds even once its threads stop; SIGINT ends it there and it reports as usual.
    for raw in proc.stdout:
        if raw.startswith(b"QUOTA"):
            proc.send_signal(signal.SIGINT)
            break
    stdout = proc.communicate()[0].decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result: {stdout[-3000:]}")
    result = json.loads(line[len("RESULT ") :])
    result["client_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result


def measure(
    proc: subprocess.Popen, port: int, script: Path, c: int, args: argparse.Namespace, litserve: bool
) -> dict[str, Any]:
    wrk(port, script, c, args.warmup, args.timeout, args.limit)
    cpu0, t0 = tree_cpu(proc.pid, litserve), time.monotonic()
    r = wrk(port, script, c, args.requests, args.timeout, args.limit)
    wall = time.monotonic() - t0
    cpu = {role: seconds - cpu0[role] for role, seconds in tree_cpu(proc.pid, litserve).items()}
    r["server_cores"] = sum(cpu.values()) / wall
    # Where one request's CPU goes: the HTTP servers (read, parse, prepare, answer) vs the inference worker.
    r["http_ms"] = 1e3 * cpu["http"] / r["requests"]
    r["worker_ms"] = 1e3 * cpu["worker"] / r["requests"] if litserve else None  # the baseline has no worker
    r["client_cores"] = r["client_cpu_s"] / wall
    r["rps"] = r["requests"] / r["seconds"]
    return r


def baseline_app(ckpt: str) -> Any:
    """The tutorial server: FastAPI + uvicorn, one request at a time through the network, in the event loop."""
    import torch
    from fastapi import FastAPI, File, UploadFile

    from project.data import MEAN, STD
    from project.images import normalize, prepare_image
    from project.module import MNISTClassifier

    torch.set_num_threads(1)
    model = MNISTClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True).eval()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/predict")
    async def predict(file: UploadFile = File(...)) -> dict:  # noqa: B008 (FastAPI's documented form)
        x = normalize(prepare_image(io.BytesIO(await file.read()))[None, None], (MEAN,), (STD,))
        with torch.inference_mode():
            probs = model.predict_step(x, 0)["probs"][0]
        pred = int(probs.argmax())
        return {"pred": pred, "prob": float(probs[pred]), "probs": probs.tolist(), "file": file.filename}

    return app


def baseline_from_env() -> Any:
    """``baseline_app`` for the checkpoint in $SERVE_BENCH_CKPT: what each of uvicorn's worker processes imports."""
    return baseline_app(os.environ["SERVE_BENCH_CKPT"])


def table(results: dict[tuple[str, int], list[dict[str, Any]]], n: int) -> str:
    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    lines = [
        "| server | concurrency | req/s | p50 ms | p90 ms | p99 ms | p99/p50 | mean batch | errors | "
        "= offline predict | accuracy | client cores | server cores | HTTP CPU ms/req | worker CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, c), runs in results.items():
        ok = sum(r["ok"] for r in runs)
        errors = sum(r["bad"] + r["socket_errors"] for r in runs)
        lines.append(
            f"| {name} | {c} | {med(runs, 'rps'):.0f} | {med(runs, 'p50_ms'):.2f} | {med(runs, 'p90_ms'):.2f} | "
            f"{med(runs, 'p99_ms'):.2f} | {med(runs, 'p99_ms') / med(runs, 'p50_ms'):.1f} | "
            f"{sum(r['batch_sum'] for r in runs) / max(ok, 1):.1f} | {errors} | "
            f"{100 * sum(r['agree'] for r in runs) / max(ok, 1):.2f}% | "
            f"{100 * sum(r['correct'] for r in runs) / max(ok, 1):.2f}% | "
            f"{med(runs, 'client_cores'):.2f} | {med(runs, 'server_cores'):.2f} | {med(runs, 'http_ms'):.2f} | "
            + (f"{med(runs, 'worker_ms'):.2f} |" if runs[0]["worker_ms"] is not None else "- |")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit (the default recipe's)")
    parser.add_argument("--data_dir", help="folder holding MNIST/raw/ (default: $PATH_DATASETS)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per setting and round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured requests before each setting")
    parser.add_argument("--digits", type=int, default=1000, help="distinct test digits the requests cycle through")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8, 32], help="serve --max_batch_size")
    parser.add_argument("--batch_timeout", type=float, default=0.001, help="serve --batch_timeout (seconds)")
    parser.add_argument("--worker_nice", type=int, nargs="+", default=[10], help="serve --worker_nice (each value)")
    models = ["torch"]
    models += ["onnx", "onnx-int8"]  # [export]
    parser.add_argument("--models", nargs="+", choices=models, default=models)
    parser.add_argument("--timeout", type=float, default=10, help="seconds one request may take")
    parser.add_argument("--limit", type=float, default=120, help="seconds one setting may take")
    parser.add_argument("--quick", action="store_true", help="1 round, 100 requests, 200 digits")
    parser.add_argument("--output", help="also write the table (Markdown) to this file")
    parser.add_argument(
        "--baseline_processes",
        type=int,
        nargs="+",
        default=[1],
        help="uvicorn processes of the FastAPI baseline (each value; `uvicorn --workers`, as tutorials scale it)",
    )
    parser.add_argument("--baseline_port", type=int, help=argparse.SUPPRESS)  # run the baseline server itself
    args = parser.parse_args(argv)
    if args.baseline_port:  # the baseline server's own process: args.baseline_processes holds one value
        import uvicorn

        processes, where = args.baseline_processes[0], {"host": "127.0.0.1", "port": args.baseline_port}
        if processes == 1:
            uvicorn.run(baseline_app(args.ckpt_path), **where, log_level="warning")
        else:  # uvicorn's supervisor spawns the processes; each imports the app (this file is on sys.path)
            os.environ["SERVE_BENCH_CKPT"] = args.ckpt_path
            uvicorn.run("serve:baseline_from_env", factory=True, workers=processes, **where, log_level="warning")
        return ""
    if shutil.which("wrk") is None:
        parser.error("needs wrk, the load generator: apt-get install wrk")
    if args.quick:
        args.rounds, args.requests, args.warmup, args.digits = 1, 100, 20, 200

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        work = Path(tmp)
        labels = write_digits(args.data_dir, args.digits, work / "digits")
        files = {"torch": None, "onnx": work / "model.onnx", "onnx-int8": work / "model.int8.onnx"}
        # >>> export
        from project.export.convert import export

        for model in args.models:
            if model != "torch":
                quantize = "static" if model == "onnx-int8" else None
                export(
                    args.ckpt_path,
                    "onnx",
                    str(files[model]),
                    quantize=quantize,
                    data={"data_dir": args.data_dir} if args.data_dir else None,
                )
        # <<< export
        copy = work / "logs" / "run" / "checkpoints" / "model.ckpt"
        copy.parent.mkdir(parents=True)
        shutil.copy(args.ckpt_path, copy)
        refs = {"torch": csv_predictions(copy, work / "digits")}
        refs.update({m: onnx_predictions(files[m], work / "digits") for m in args.models if m != "torch"})  # [export]
        scripts = {}
        for name, ref in refs.items():
            scripts[name] = work / f"{name}.lua"
            write_lua(work / "digits", labels, ref, scripts[name])
        scripts["fastapi"] = scripts["torch"]

        servers: dict[str, tuple[str, list[str]]] = {}
        for model in args.models:
            source = f"--ckpt_path={args.ckpt_path}" if model == "torch" else f"--model={files[model]}"
            for b in args.batch_sizes:
                for nice in args.worker_nice:
                    cmd = ["-m", "project", "serve", source, f"--max_batch_size={b}"]
                    cmd += [f"--batch_timeout={args.batch_timeout}", f"--worker_nice={nice}"]
                    name = f"LitServe {model}, max_batch_size {b}"
                    servers[name + (f", worker_nice {nice}" if len(args.worker_nice) > 1 else "")] = (model, cmd)
        for n in args.baseline_processes:
            name = "FastAPI baseline (torch, batch 1)" + (f", {n} processes" if n > 1 else "")
            servers[name] = ("fastapi", [__file__, f"--ckpt_path={args.ckpt_path}", f"--baseline_processes={n}"])
        results: dict[tuple[str, int], list[dict[str, Any]]] = {(s, c): [] for s in servers for c in args.concurrency}
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(servers)[::-1]
            for name in order:
                model, cmd = servers[name]
                port = free_port()
                flag = "--baseline_port" if model == "fastapi" else "--port"
                proc = start([sys.executable, *cmd, f"{flag}={port}"], port)
                try:
                    for c in args.concurrency if round_ % 2 else args.concurrency[::-1]:
                        r = measure(proc, port, scripts[model], c, args, litserve=model != "fastapi")
                        results[(name, c)].append(r)
                        print(f"round {round_} {name} c={c}: {r['rps']:.0f} req/s, p50 {r['p50_ms']:.2f} ms, "
                              f"p99 {r['p99_ms']:.2f} ms, ok {r['ok']}/{r['requests']}", flush=True)  # fmt: skip
                finally:
                    stop(proc)
    report = (
        f"Machine: {machine()}. {args.rounds} round(s) x {args.requests} requests per setting (after {args.warmup} "
        f"warm-up), {args.digits} distinct MNIST test digits as PNG, batch_timeout {args.batch_timeout} s, "
        f"worker_nice {' / '.join(map(str, args.worker_nice))}.\n\n" + table(results, args.requests)
    )
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return report


if __name__ == "__main__":
    main()
