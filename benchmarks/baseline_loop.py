"""The yardstick: the plain PyTorch MNIST loop that tutorials teach, with no Lightning and no tricks.

torchvision MNIST with ToTensor + Normalize, DataLoader(batch_size=64, shuffle=True, num_workers=2), the same CNN,
Adam(lr=1e-3), zero_grad / backward / step in fp32. Besides training it records, per step, how long the loop
waited for the next batch, so that ``benchmarks/run.py`` can compare it with the template.

    python benchmarks/baseline_loop.py --steps 300      # prints one JSON line
"""

import argparse
import json
import os
import resource
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from project.net import CNN


def train(data_dir: str, steps: int, warmup: int = 30, epochs: int = 1, seed: int = 0, num_workers: int = 2) -> dict:
    """Train for ``epochs`` (at most ``steps`` steps each when steps > 0) and return throughput figures."""
    torch.manual_seed(seed)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(data_dir, train=True, download=False, transform=transform)
    loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=num_workers)
    model = CNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    model.train()
    step, waited, times = 0, 0.0, []
    for _ in range(epochs):
        end = time.perf_counter()
        for i, (x, y) in enumerate(loader):
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            if step >= warmup:  # steady state only: worker start-up and first-call costs excluded
                waited += start - end
                times.append(now - end)
            end = now
            step += 1
            if 0 < steps <= i + 1:
                break
    elapsed = sum(times)
    return {
        "samples_per_s": len(times) * 64 / elapsed,
        "data_wait": waited / elapsed,
        "steps": step,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_loss": loss.item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("PATH_DATASETS", "data"), help="folder with MNIST/raw/")
    parser.add_argument("--steps", type=int, default=300, help="training steps (0: whole epochs)")
    parser.add_argument("--warmup", type=int, default=30, help="steps left out of the measurement")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers (the tutorial's 2)")
    args = parser.parse_args()
    print(json.dumps(train(args.data_dir, args.steps, args.warmup, num_workers=args.num_workers)))


if __name__ == "__main__":
    main()
