"""What seeing inside a run costs: the default recipe with and without its monitors, and with a tracker beside it.

    python benchmarks/monitors.py             # 3 alternating rounds on the real MNIST ($PATH_DATASETS)

Variants (each one process, 400 training steps of configs/default.yaml, as (c) in benchmarks/run.py):
  none:     default.yaml with --histograms null --throughput null (LayerHistograms and Throughput off)
  default:  default.yaml as shipped (both on)
  and each tracker overlay of the variants below
Figures: steady-state training samples/s (epoch-boundary steps left out) and the whole fit's wall time, which
includes the once-per-epoch work (histograms, artifact upload). Rounds alternate the order of the variants.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine, run_template, short_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    if "PATH_DATASETS" not in os.environ:
        raise SystemExit("Set PATH_DATASETS to the folder that holds MNIST/raw/ (the real data).")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        variants = {
            "none": ["--histograms", "null", "--throughput", "null"],  # the monitors feature's keys, off
            "default": [],
            # >>> track
            # default.yaml + configs/mlflow.yaml (a SQLite tracking store, checkpoints as artifacts)
            "mlflow": [
                "--config",
                str(Path(__file__).resolve().parents[1] / "configs" / "mlflow.yaml"),
                f"--trainer.logger.init_args.tracking_uri=sqlite:///{folder / 'mlflow.db'}",
                f"--trainer.logger.init_args.artifact_location={folder / 'artifacts'}",
            ],
            # <<< track
        }
        results: dict[str, list[dict]] = {name: [] for name in variants}
        for round_ in range(1, args.rounds + 1):
            order = list(variants) if round_ % 2 else list(variants)[::-1]
            for name in order:
                logs = str(folder / "logs")
                cli_args = [*variants[name], *short_run(args.steps, logs)]
                # >>> track
                if name == "mlflow":  # a logger list: the TensorBoard save_dir is set in the list itself
                    cli_args = [a for a in cli_args if not a.startswith("--trainer.logger.init_args.save_dir")]
                # <<< track
                results[name].append(run_template(cli_args, args.warmup))
                r = results[name][-1]
                print(f"round {round_} {name}: {r['samples_per_s']:.0f} samples/s, fit {r['fit_s']:.2f} s", flush=True)
    base = results["none"]
    print(f"\nMachine: {machine()}. {args.rounds} rounds, {args.steps} steps each.\n")
    print("| variant | median samples/s | ratio to none (median of rounds) | median fit (s) | fit ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in results.items():
        ratio = statistics.median(r["samples_per_s"] / b["samples_per_s"] for r, b in zip(rs, base, strict=True))
        fit_ratio = statistics.median(r["fit_s"] / b["fit_s"] for r, b in zip(rs, base, strict=True))
        sps = statistics.median(r["samples_per_s"] for r in rs)
        fit = statistics.median(r["fit_s"] for r in rs)
        print(f"| {name} | {sps:.0f} | {ratio:.3f} | {fit:.2f} | {fit_ratio:.3f} |")


if __name__ == "__main__":
    main()
