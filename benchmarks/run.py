"""Benchmark the template against the hand-written PyTorch loop, A/B/A/B in one invocation.

    python benchmarks/run.py            # 5 rounds on the real MNIST ($PATH_DATASETS), writes BENCHMARKS.md
    python benchmarks/run.py --quick    # one short round, about a minute, prints the table only

Variants, each run in its own process so that start-up, memory and threads do not leak between them:
  (a) baseline: benchmarks/baseline_loop.py, the tutorial loop (PIL + 2 workers, fp32, batch 64, Adam).
  (b) template, baseline settings: same data path (pil_data.py), fp32, NCHW, batch 64, Adam 1e-3, no scheduler
      or clipping, so (b)/(a) is the cost of Lightning itself.
  (c) template, configs/default.yaml as shipped.
  (d) configs/fast.yaml: a full fit, then test on the best checkpoint; time to >= 99% test accuracy, the whole
      process's wall time, and the fixed cost from the start of the process to the first training step.
  (e) the baseline loop for one whole epoch: the process wall time that (d)'s whole process is compared with.
Throughput is the median of steady-state training samples/s (the first steps are left out); data wait is the
share of step time spent between the end of one step and the start of the next (fetching the batch).
A shared or throttled machine drifts by 10-30% within minutes, so rounds alternate a/b/c/d and d/c/b/a (a linear
drift cancels out of each pair) and the per-round ratio, (b) over the (a) run next to it, is the figure to trust.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "configs" / "default.yaml")
FAST = str(ROOT / "configs" / "fast.yaml")
BASELINE_SETTINGS = [
    "--data=benchmarks.pil_data.PILMNISTDataModule",  # the baseline's per-image PIL path (pil_data.py)
    "--data.num_workers=2",
    "--data.batch_size=64",
    "--trainer.precision=32-true",
    "--model.channels_last=false",
    "--model.optimizer=torch.optim.Adam",
    "--model.optimizer.init_args.lr=0.001",
    "--model.optimizer.init_args.weight_decay=0",
    "--model.scheduler=null",
    "--trainer.gradient_clip_val=null",
]


def child(result_path: str, warmup: int, test: bool, started: float, cli_args: list[str]) -> None:
    """Run one template configuration in this process and write its figures to ``result_path`` as JSON.

    ``started`` is the parent's ``time.time()`` just before it launched this process (imports included).
    """
    import lightning as L
    import torch

    from project.cli import run

    sys.path.insert(0, str(ROOT))  # (b)'s DataModule, benchmarks.pil_data: ROOT is where `python -m` finds it

    class StepTimer(L.Callback):
        """Timestamps of each training batch's start (after the fetch) and end (after the optimizer step)."""

        def __init__(self) -> None:
            self.starts: list[float] = []
            self.ends: list[float] = []

        def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
            if not self.starts:
                self.first_step_s = time.time() - started  # imports, data, sanity check, set-up
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            self.ends.append(time.perf_counter())

    cli = run(cli_args, subcommand=False)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fit_s = time.perf_counter() - start
    result = {"fit_s": fit_s, "steps": len(timer.ends), "epochs": cli.trainer.current_epoch}
    result["first_step_s"] = timer.first_step_s
    steady = range(warmup + 1, len(timer.ends))
    if len(steady) > 10:
        elapsed = timer.ends[-1] - timer.ends[warmup]
        waited = sum(timer.starts[i] - timer.ends[i - 1] for i in steady)
        # Steps that cross an epoch boundary include validation and checkpointing: leave those out.
        boundary = [i for i in steady if timer.starts[i] - timer.ends[i - 1] > 0.5]
        elapsed -= sum(timer.ends[i] - timer.ends[i - 1] for i in boundary)
        waited -= sum(timer.starts[i] - timer.ends[i - 1] for i in boundary)
        n = len(steady) - len(boundary)
        result.update(samples_per_s=n * cli.datamodule.batch_size / elapsed, data_wait=waited / elapsed)
    if test:
        scores = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)
        result["test_acc"] = scores[0]["test/acc"]
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["threads"] = torch.get_num_threads()
    Path(result_path).write_text(json.dumps(result))


def short_run(steps: int, logs: str) -> list[str]:
    """Options for a throughput run of ``steps`` training steps, logging under ``logs``."""
    quiet = ["--trainer.enable_model_summary=false", f"--trainer.logger.init_args.save_dir={logs}"]
    # A two-batch validation at the end keeps EarlyStopping satisfied; it falls outside the timed steps.
    limits = [f"--trainer.limit_train_batches={steps}", "--trainer.limit_val_batches=2", "--trainer.max_epochs=1"]
    return [*quiet, *limits, "--trainer.num_sanity_val_steps=0"]


def run_template(cli_args: list[str], warmup: int, test: bool = False) -> dict:
    """Run ``fit`` with ``cli_args`` in a fresh process (imports included) and return its figures."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    started = time.perf_counter()
    cmd = [sys.executable, __file__, "--child", out, f"--warmup={warmup}", f"--started={time.time()}"]
    proc = subprocess.run(
        [*cmd, *(["--test"] if test else []), "--", *cli_args], capture_output=True, text=True, cwd=ROOT
    )
    process_s = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{' '.join(cli_args)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(Path(out).read_text())
    result["process_s"] = process_s
    Path(out).unlink()
    return result


def run_variant(name: str, steps: int, warmup: int, logs: str) -> dict:
    """Run variant ``name`` in a fresh process and return its figures."""
    if name in ("a", "e"):  # (e): the whole epoch, for its process time
        cmd = [sys.executable, str(ROOT / "benchmarks" / "baseline_loop.py"), f"--warmup={warmup}"]
        cmd.append(f"--steps={steps if name == 'a' else 0}")
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            raise SystemExit(f"baseline failed:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["process_s"] = time.perf_counter() - started
        return result
    if name == "b":
        return run_template(["--config", DEFAULT, *BASELINE_SETTINGS, *short_run(steps, logs)], warmup)
    if name == "c":
        return run_template(["--config", DEFAULT, *short_run(steps, logs)], warmup)
    # "d": the whole fast recipe, then the test set. An overlay runs alone: the recipe is the CLI default.
    quiet = ["--trainer.enable_model_summary=false", f"--trainer.logger.init_args.save_dir={logs}"]
    return run_template(["--config", FAST, *quiet], warmup, test=True)


def machine() -> str:
    import torch

    from project.hardware import cpu_flags, cpu_has_native_bf16, recommended_precision

    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        model = names[0] if names else model
    # The flags that decide the speed of bf16 and int8 here: the same model name covers CPUs with and without them.
    wanted = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16", "avx512_vnni": "AVX-512 VNNI", "avx2": "AVX2"}
    flags = ", ".join(name for flag, name in wanted.items() if flag in cpu_flags()) or "no AVX2"
    return (
        f"{model} ({flags}), {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, native CPU bf16: {cpu_has_native_bf16()}, "
        f"recommended precision: {recommended_precision()}"
    )


LABELS = {
    "a": "(a) baseline loop (PIL, 2 workers, fp32, Adam, bs 64)",
    "b": "(b) template, baseline settings",
    "c": "(c) template, configs/default.yaml",
    "d": "(d) configs/fast.yaml, full fit",
    "e": "(e) baseline loop, one whole epoch",
}


def table(results: dict[str, list[dict]]) -> str:
    base = statistics.median(r["samples_per_s"] for r in results["a"])
    rows = [
        "| variant | median samples/s | ratio to (a): median of rounds | per-round ratios | ratio of the medians "
        "| data wait | peak RSS (MB) | samples/s per round |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for name in ("a", "b", "c"):
        rs = results.get(name, [])
        if not rs:
            continue
        sps = statistics.median(r["samples_per_s"] for r in rs)
        wait = statistics.median(r["data_wait"] for r in rs)
        rss = max(r["peak_rss_mb"] for r in rs)
        each = ", ".join(f"{r['samples_per_s']:.0f}" for r in rs)
        # Each round runs (a) and (b) back to back: the ratio within a round cancels the machine's slow drifts,
        # which the ratio of two medians taken from different rounds does not.
        ratios = [r["samples_per_s"] / a["samples_per_s"] for r, a in zip(rs, results["a"], strict=True)]
        listed = ", ".join(f"{x:.2f}" for x in ratios)
        rows.append(
            f"| {LABELS[name]} | {sps:.0f} | {statistics.median(ratios):.2f} | {listed} | {sps / base:.2f} "
            f"| {wait:.1%} | {rss:.0f} | {each} |"
        )
    if results.get("d"):
        rows += [
            "",
            "| (d) configs/fast.yaml | fit wall time (s) | test/acc | epochs | reached 99.0% | start to first step (s) "
            "| whole process (s) | (e) baseline epoch process (s) | (d)/(e) process |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        ratios = []
        for i, r in enumerate(results["d"], 1):
            e = results["e"][i - 1]["process_s"] if results.get("e") else float("nan")
            ratios.append(r["process_s"] / e)
            rows.append(
                f"| round {i} | {r['fit_s']:.1f} | {r['test_acc']:.4f} | {r['epochs']} | {r['test_acc'] >= 0.99} "
                f"| {r['first_step_s']:.1f} | {r['process_s']:.1f} | {e:.1f} | {ratios[-1]:.2f} |"
            )
        med = {k: statistics.median(r[k] for r in results["d"]) for k in ("fit_s", "test_acc", "first_step_s")}
        process = statistics.median(r["process_s"] for r in results["d"])
        e_med = statistics.median(r["process_s"] for r in results["e"]) if results.get("e") else float("nan")
        rows.append(
            f"| **median** | **{med['fit_s']:.1f}** | **{med['test_acc']:.4f}** | | | **{med['first_step_s']:.1f}** "
            f"| **{process:.1f}** | **{e_med:.1f}** | **{statistics.median(ratios):.2f}** |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (each runs every variant once)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per throughput run")
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of the throughput figure")
    parser.add_argument("--quick", action="store_true", help="1 round of 200 steps, no (d), no BENCHMARKS.md")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"), help="where to write the table")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one variant, write JSON here
    parser.add_argument("--test", action="store_true", help=argparse.SUPPRESS)  # internal: test after the fit
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)  # internal: when the parent launched it
    args, rest = parser.parse_known_args()
    if args.child:
        child(args.child, args.warmup, args.test, args.started, [a for a in rest if a != "--"])
        return
    if "PATH_DATASETS" not in os.environ:
        raise SystemExit("Set PATH_DATASETS to the folder that holds MNIST/raw/ (the real data).")
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 200, 30
    variants = ["a", "b", "c"] + ([] if args.quick else ["d", "e"])
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as logs:
        for round_ in range(1, args.rounds + 1):
            # ABBA order: (a) and (b) stay neighbours, and which of them runs first alternates.
            for v in variants if round_ % 2 else variants[::-1]:
                started = time.perf_counter()
                results[v].append(run_variant(v, args.steps, args.warmup, logs))
                took = time.perf_counter() - started
                print(f"round {round_} {LABELS[v]}: {json.dumps(results[v][-1])} ({took:.0f} s)", flush=True)
    report = table(results)
    print(report)
    if args.quick:
        return
    command = " ".join(["python benchmarks/run.py", *sys.argv[1:]])
    # This run's section is the page's head, up to the first "## " section: the other benchmarks' sections stay.
    output = Path(args.output)
    old = output.read_text() if output.is_file() else ""
    others = old[old.index("\n## ") + 1 :] if "\n## " in old else ""
    output.write_text(
        "# Benchmarks\n\n"
        f"Machine: {machine()}.\n\n"
        f"Command: `PATH_DATASETS=<data> {command}` ({args.rounds} rounds, variants in the order a/b/c/d/e, "
        f"then e/d/c/b/a, alternating, {args.steps} training steps per throughput run, the first {args.warmup} "
        "left out).\n\n"
        f"{report}\n\n"
        "Variants: (a) `benchmarks/baseline_loop.py`; "
        "(b) `python -m project fit --config configs/default.yaml "
        f"{' '.join(BASELINE_SETTINGS)}`; (c) `python -m project fit --config configs/default.yaml`; "
        "(d) `python -m project fit --config configs/fast.yaml`, then `test` on the best checkpoint; (e) "
        "`benchmarks/baseline_loop.py --steps 0` (one whole epoch). Ratios are medians of one run of this script; "
        "compare ratios, not absolute times, "
        "across machines.\n" + (f"\n{others}" if others else "")
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
