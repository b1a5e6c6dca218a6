"""The recipe table: test accuracy of every shipped recipe over several seeds, with its fit and process times.

    python benchmarks/recipes.py                          # seeds 10 11 12, every recipe; writes docs/recipes.md
    python benchmarks/recipes.py --recipes fast fast-32 --seeds 13 14 15   # some recipes: prints the table only

The seeds default to 10, 11 and 12. A recipe's settings are chosen on seeds of their own (TUNED_ON), and the table
is made on others: a seed a recipe was tuned on is refused, so the table's figures are what a new seed gets. Each
recipe's promise (PROMISES) is checked on the table's seeds and the page says whether it held.

Each run is a fresh process of its own running the `fit` command as `python -m project fit` runs it
(imports, the fit, then `test_after_fit` on the best checkpoint, chosen on val/acc, never on test, and the
process's exit), with a callback that notes the time of the first training step and of the end of the fit.
Rounds alternate the order of the recipes (round 1 in order, round 2 reversed, ...) so that a slow drift of
a shared machine does not favour one recipe. Beside each `fast` run the hand-written loop of
`benchmarks/baseline_loop.py` trains one whole epoch in its own process: `fast`'s promise is a whole
process at most 0.4x as long as that one, measured side by side. `best-12`, the best recipe before weight
averaging, is `best`'s time reference: `best`'s whole process at most 1.1x as long as that one, in the same
rounds. A feature's recipe (FEATURE_RECIPES) gets its own notes below the table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import ROOT, machine

CONFIGS = ROOT / "configs"
# best.yaml as it was before weight averaging: 12 epochs, no average of the weights.
BEST_12 = ["--trainer.max_epochs=12", "--averaging=null"]
RECIPES = {
    "fast": ["--config", str(CONFIGS / "fast.yaml")],
    "fast-32": ["--config", str(CONFIGS / "fast.yaml"), "--trainer.precision=32-true"],
    "default": ["--config", str(CONFIGS / "default.yaml")],
    "best": ["--config", str(CONFIGS / "best.yaml")],
    # The time reference of best (issue 43): the best recipe before weight averaging, rebuilt from best.yaml.
    "best-12": ["--config", str(CONFIGS / "best.yaml"), *BEST_12],
    # >>> folder
    # configs/folder.yaml on the 10,000 MNIST test digits written as PNG files, one folder per class: the recipe
    # holds out 10% of them (data.seed 42) and its test split is that held-out part.
    "folder": ["--config", str(CONFIGS / "folder.yaml")],
    # <<< folder
}
COMMANDS = {
    "fast": "fit --config configs/fast.yaml",
    "fast-32": "fit --config configs/fast.yaml --trainer.precision 32-true",
    "default": "fit --config configs/default.yaml",
    "best": "fit --config configs/best.yaml",
    "best-12": f"fit --config configs/best.yaml {' '.join(BEST_12)}",
    "folder": "fit --config configs/folder.yaml --data.root <MNIST test digits as folders>",  # [folder]
}
# The seeds each recipe's settings were chosen on: the table is made on others (docs/recipes.md names these).
TUNED_ON: dict[str, list[int]] = {
    "fast": [1, 2, 3, 4, 5, 6, 7, 8, 9, 42],  # lr, label smoothing, widths, batch size, an EMA at one epoch
    # 12 epochs: 99.68%, 99.65%; with an EMA of the weights (0.999) 99.60%, 99.69%; label smoothing 0.1 99.67%,
    # 99.63%. 15 epochs: 99.71%, 99.68%; weight decay 0.05 99.31%, 99.63%; with the EMA 99.71%, 99.70%: kept.
    # Within 1.1x best-12's time (Xeon with AMX, bf16-mixed; best-12: 99.63% on seed 7 in 286 s), all with the EMA:
    # batches of 256, 14 epochs: 99.64%, 99.66% (lr 0.003), 99.65%, 99.68% (lr 0.004), early stopping ending some at
    # 12-13; the same without early stopping, 13 epochs, decay 0.998, lr 0.004: 99.65%, 99.65%. None kept.
    # 12 epochs with the EMA as it is now (warm-up 10): 99.71%, 99.64%; plus random scaling of +-10% in the
    # augmentation: 99.63% on seed 8; a cosine floor (min_lr_ratio 0.1) and decay 0.9995: 99.60%, 99.68%. None
    # kept: none raised both seeds. No cheaper epoch either (Xeon with AMX, fit of 2 epochs, seed 7, medians of two
    # alternated rounds): eager bf16-mixed 49 s, channels_last 51 s, 32-true 74 s, width 12 76 s (fewer FLOPs than
    # width 16, yet slower); torch.compile, one run after eager's, 2.2x its time. No wider net in the time either
    # (same CPU and fit, one alternated run): width 16 45 s, 51 s; width 24 89 s, 90 s; width 32 97 s, 102 s.
    # A smooth random warp in the augmentation (Simard et al.'s distortion, sigma 4 px), 12 epochs with the EMA:
    # alpha 34 99.26% on seed 8; alpha 12 99.68%, 99.72%. Alpha 12 in a whole recipes.py run on 19, 20, 21 (Xeon with
    # AMX): 99.62%, 99.64%, 99.62%, at 0.97x the time of best-12 beside it (99.68%, 99.56%, 99.69%). Not kept: no
    # better than best-12 on those seeds, which chose against it, so they count as tuning seeds.
    # No block at 28 pixels (blocks per stage 0, 1, 1): one there took as long as one at 14 and one at 7 together
    # (model step, batch 128, bf16, 2 threads: 45 ms with it, 26 ms without, 35 ms with two at 14), and an epoch takes
    # ~0.75x. With the EMA, no early stopping: 17 epochs 99.67%, 99.71%; 20 epochs 99.71% on seed 7. Two blocks at 14
    # pixels, 15 epochs: 99.71%, 99.67%. (These keep the last epoch: in all six such runs on 7 and 8 it tested at or
    # above the epoch best on val/acc, which 5,000 images pick noisily: +0.00 to +0.06.) A 1,000-image validation
    # split, 12 epochs: 99.71%, 99.49% (seed 8 kept epoch 3). Blocks 0, 1, 1, 18 epochs, the last epoch kept, in a
    # whole recipes.py run on 22, 23, 24 (Xeon with AMX): 99.60%, 99.66%, 99.64%, at 1.13x best-12's time (1.05, 1.19,
    # 1.13) beside it (99.72%, 99.64%, 99.62%). Not kept; those seeds count as tuning seeds.
    "best": [7, 8, 19, 20, 21, 22, 23, 24],
}
# What a recipe promises on seeds it was not tuned on: (test/acc of every seed >=, mean test/acc >=).
PROMISES: dict[str, tuple[float, float | None]] = {
    "fast": (0.9905, 0.9915),
    "default": (0.9910, None),
    "best": (0.9965, 0.9970),
}
FAST_RATIO = 0.40  # fast's whole process / the hand-written loop's one-epoch process, run beside it: at most this
BEST_RATIO = 1.10  # best's whole process / best-12's, run beside it in each round: at most this
# The recipes of a feature: their lines of docs/recipes.md are marked, so a copy without it drops them; their notes.
FEATURE_RECIPES: dict[str, str] = {}
NOTES: dict[str, str] = {}
# >>> folder
FEATURE_RECIPES["folder"] = "folder"
NOTES["folder"] = (
    "`folder` trains on 9,000 of the 10,000 test digits and is tested on the 1,000 it holds out (data.seed 42): a "
    "set a sixth the size of MNIST's training split, so its figure is what a small folder of your own gets, not "
    "comparable to the other rows."
)
# <<< folder


def marked(line: str, recipe: str) -> str:
    """``line`` of docs/recipes.md, marked as its feature's when ``recipe`` belongs to one."""
    feature = FEATURE_RECIPES.get(recipe)
    return f"{line} <!-- [{feature}] -->" if feature else line


def child(result_path: str, started: float, argv: list[str]) -> None:
    """Run the ``fit`` command ``argv`` in this process and write its figures to ``result_path`` as JSON.

    ``started`` is the parent's ``time.time()`` just before it launched this process.
    """
    import lightning as L

    from project.cli import run
    from project.console import skip_teardown

    class Times(L.Callback):
        """When the first training step starts (after imports, parsing, data, set-up) and how long fit takes."""

        first_step_s = float("nan")

        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.fit_started = time.perf_counter()

        def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
            if self.first_step_s != self.first_step_s:  # NaN: not set yet
                self.first_step_s = time.time() - started

        def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.fit_s = time.perf_counter() - self.fit_started

    times = Times()
    cli = run(argv, callbacks=[times])  # fit, then test_after_fit on the best checkpoint
    result = {
        "test_acc": float(cli.trainer.callback_metrics["test/acc"]),
        "epochs": cli.trainer.current_epoch,
        "fit_s": times.fit_s,
        "first_step_s": times.first_step_s,
        "precision": str(cli.trainer.precision),  # what the recipe resolved to on this machine
    }
    Path(result_path).write_text(json.dumps(result))
    skip_teardown()  # as `python -m project` ends


def run_recipe(argv: list[str]) -> dict:
    """Run the ``fit`` command ``argv`` in a fresh process and return its figures, the process's wall time too."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    started = time.perf_counter()
    cmd = [sys.executable, __file__, "--child", str(out), f"--started={time.time()}", "--", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    process_s = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    result = {**json.loads(out.read_text()), "process_s": process_s}
    out.unlink()
    return result


# >>> folder
def write_folders(data_dir: str, folder: Path) -> None:
    """The MNIST test digits as PNG files ``folder/<label>/<i>.png`` (what a user's own image folder looks like)."""
    from PIL import Image

    from project.data import MNISTDataModule

    dm = MNISTDataModule(data_dir=data_dir)
    dm.setup("test")
    split = dm.splits["test"]
    for label in range(10):
        (folder / str(label)).mkdir(parents=True)
    for i, (image, label) in enumerate(zip(split.images, split.labels.tolist(), strict=True)):
        Image.fromarray(image.numpy()).save(folder / str(label) / f"{i}.png")


# <<< folder


def baseline_epoch() -> float:
    """Wall time of a fresh process of the hand-written loop training one whole epoch."""
    started = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "baseline_loop.py"), "--steps=0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"baseline failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def verdict(accs: list[float], promise: tuple[float, float | None] | None) -> str:
    """Whether ``accs`` (one per seed) keep ``promise`` (every seed >=, mean >=): the table's last column."""
    if promise is None:
        return "-"
    least, mean = promise
    missed = [f"min {min(accs):.4f} < {least:.4f}"] if min(accs) < least else []
    if mean is not None and statistics.mean(accs) < mean:
        missed.append(f"mean {statistics.mean(accs):.4f} < {mean:.4f}")
    wanted = f"each >= {least:.4f}" + (f", mean >= {mean:.4f}" if mean is not None else "")
    return f"missed ({'; '.join(missed)})" if missed else f"held ({wanted})"


def ratio_against(ratios: list[float], limit: float) -> str:
    """Time ratios measured side by side, one per round, against the promise ``limit``: their median decides."""
    ratio = statistics.median(ratios)
    held = "held" if ratio <= limit else "missed"
    return f"median **{ratio:.2f}** ({', '.join(f'{x:.2f}' for x in ratios)}; the promise, <= {limit:.2f}: {held})"


def table(results: dict[str, list[dict]], seeds: list[int], baseline: list[float]) -> str:
    """One row per recipe: accuracy over the seeds (mean, min, max, each), epochs, medians of the times, and
    whether its promise held on these seeds."""
    rows = [
        "| recipe | precision | test/acc mean | min | max | per seed | epochs | fit (s) | start to first step (s) "
        "| whole process (s) | promise |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for name, rs in results.items():
        accs = [r["test_acc"] for r in rs]
        epochs = sorted({r["epochs"] for r in rs})
        med = {k: statistics.median(r[k] for r in rs) for k in ("fit_s", "first_step_s", "process_s")}
        row = (
            f"| `{name}` | {rs[0]['precision']} | {statistics.mean(accs):.4f} | {min(accs):.4f} | {max(accs):.4f} "
            f"| {', '.join(f'{a:.4f}' for a in accs)} | {'-'.join(map(str, epochs))} | {med['fit_s']:.1f} "
            f"| {med['first_step_s']:.1f} | {med['process_s']:.1f} | {verdict(accs, PROMISES.get(name))} |"
        )
        rows.append(marked(row, name))
    if baseline and "fast" in results:
        ratios = [r["process_s"] / b for r, b in zip(results["fast"], baseline, strict=True)]
        rows += [
            "",
            f"Hand-written loop, one whole epoch, whole process: median {statistics.median(baseline):.1f} s "
            f"({', '.join(f'{b:.1f}' for b in baseline)}); `fast` whole process / that, run beside it: "
            f"{ratio_against(ratios, FAST_RATIO)}.",
        ]
    if "best" in results and "best-12" in results:
        ratios = [r["process_s"] / b["process_s"] for r, b in zip(results["best"], results["best-12"], strict=True)]
        rows += [
            "",
            f"`best` whole process / `best-12`'s (the best recipe before weight averaging), run beside it in each "
            f"round: {ratio_against(ratios, BEST_RATIO)}.",
        ]
    rows += ["", f"Seeds (`--seed_everything`): {', '.join(map(str, seeds))}, in this order for every recipe."]
    return "\n".join(rows)


def page(report: str) -> str:
    """docs/recipes.md: the table of one run, what it measured and what each recipe promises."""
    commands = "\n".join(
        marked(f"- `{name}`: `python -m project {command}`", name) for name, command in COMMANDS.items()
    )
    notes = "".join(marked(note, name) + "\n\n" for name, note in NOTES.items())
    promised = "; ".join(
        f"`{name}` every seed >= {least:.2%}" + (f" and the mean >= {mean:.2%}" if mean is not None else "")
        for name, (least, mean) in PROMISES.items()
    )
    tuned = "; ".join(f"`{name}` {', '.join(map(str, seeds))}" for name, seeds in TUNED_ON.items())
    return (
        "# Recipes over seeds\n\n"
        "Each shipped recipe trained from scratch on the real MNIST with several seeds; test accuracy of the "
        "checkpoint chosen on val/acc. Made by one run of `PATH_DATASETS=<data> python benchmarks/recipes.py`: "
        "every figure below comes from that run, on this machine.\n\n"
        f"Machine: {machine()}.\n\n"
        f"{report}\n\n"
        "Times are medians over the seeds. *Whole process* is the wall time of the fresh process: imports, data, "
        "fit, then test of the best checkpoint, and its exit; *start to first step* is the part of it before the "
        "first training step. Compare ratios, not absolute times, across machines.\n\n"
        f"What the recipes promise on a seed they were not tuned on (the table's last column says whether it held "
        f"here): {promised}; `fast` in one epoch, its whole process at most {FAST_RATIO}x the hand-written loop's "
        f"one-epoch process; `best` at most {BEST_RATIO}x the whole process of `best-12`, the best recipe before "
        f"weight averaging. The seeds each recipe was tuned on, none of them in the table: {tuned}.\n\n"
        f"{notes}"
        f"Commands (each with `--seed_everything S`):\n\n{commands}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES), help="which recipes")
    parser.add_argument("--seeds", nargs="+", type=int, default=[10, 11, 12], help="seed_everything of each round")
    parser.add_argument("--output", default=str(ROOT / "docs" / "recipes.md"), help="the page the table goes to")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one fit, write its JSON here
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)  # internal: when the parent launched it
    args, rest = parser.parse_known_args()
    if args.child:
        child(args.child, args.started, [a for a in rest if a != "--"])
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if "PATH_DATASETS" not in os.environ:
        raise SystemExit("Set PATH_DATASETS to the folder that holds MNIST/raw/ (the real data).")
    if len(args.seeds) < 3:
        raise SystemExit(
            f"--seeds: {args.seeds} holds {len(args.seeds)} seed(s); a promise over seeds needs 3 or more."
        )
    if seen := sorted({s for name in args.recipes for s in TUNED_ON.get(name, []) if s in args.seeds}):
        raise SystemExit(
            f"--seeds: {', '.join(map(str, seen))} tuned a recipe run here (TUNED_ON): its figures would flatter it. "
            "Give seeds no recipe was tuned on."
        )
    full = args.recipes == list(RECIPES)
    results: dict[str, list[dict]] = {name: [] for name in args.recipes}
    baseline: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        logs, folders = Path(tmp) / "logs", Path(tmp) / "digits"
        # >>> folder
        if "folder" in args.recipes:
            write_folders(os.environ["PATH_DATASETS"], folders)
        # <<< folder
        for round_, seed in enumerate(args.seeds):
            for name in args.recipes if round_ % 2 == 0 else args.recipes[::-1]:
                extra = ["--data.root", str(folders)] if name == "folder" else []
                logs_at = f"--trainer.logger.init_args.save_dir={logs}"  # the rest as the user's command runs
                argv = ["fit", *RECIPES[name], *extra, logs_at, f"--seed_everything={seed}"]
                results[name].append(run_recipe(argv))
                r = results[name][-1]
                print(
                    f"seed {seed} {name}: test/acc {r['test_acc']:.4f}, {r['epochs']} epochs, "
                    f"fit {r['fit_s']:.1f} s, process {r['process_s']:.1f} s",
                    flush=True,
                )
                if name == "fast":
                    baseline.append(baseline_epoch())
                    print(f"seed {seed} hand-written loop, one epoch: process {baseline[-1]:.1f} s", flush=True)
    report = table(results, args.seeds, baseline)
    print(report)
    if not full:
        return
    Path(args.output).parent.mkdir(exist_ok=True)
    Path(args.output).write_text(page(report))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
