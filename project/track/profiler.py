"""A short profiled fit (``configs/profile.yaml``): the trace and the table of the slowest ops in the run folder."""

import torch
from lightning.pytorch.profilers import PyTorchProfiler

from project.runs import is_rank_zero


class StepProfiler(PyTorchProfiler):
    """Lightning's ``PyTorchProfiler`` on a schedule set from the config: skip ``wait`` steps, warm up for
    ``warmup``, record ``active`` steps, ``repeat`` times; the Chrome/Perfetto trace and the table of the slowest ops
    go into the run folder (``dirpath=None``).

    Args:
        wait: Steps skipped before each recording cycle (the first steps are slow: allocation, kernel selection).
        warmup: Steps profiled but discarded, so the recording starts warm.
        active: Steps recorded per cycle.
        repeat: Cycles; 0 repeats until the end of training.
        filename: Stem of the text summary (``<filename>.txt`` per stage) in the run folder.
        row_limit: Rows of the summary table.
        sort_by_key: The summary's sort column: ``cpu_time_total`` (ops with their children), ``cpu_time``, ``count``...
    """

    def __init__(
        self,
        wait: int = 5,
        warmup: int = 5,
        active: int = 20,
        repeat: int = 1,
        filename: str = "profile",
        row_limit: int = 25,
        sort_by_key: str = "cpu_time_total",
    ) -> None:
        schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
        super().__init__(
            filename=filename,
            row_limit=row_limit,
            sort_by_key=sort_by_key,
            export_to_chrome=True,
            schedule=schedule,
            # Lightning runs the validation steps on the same schedule: once they reach its warm-up, torch starts a
            # new cycle and, by default, drops the events of the training cycle already recorded: an empty table
            # (fit-profile.txt of 0 bytes) whenever validation has more than `wait` batches. Keep them.
            acc_events=True,
        )

    def summary(self) -> str:
        text = super().summary()
        if text and is_rank_zero():  # to fit-profile.txt, and the console: what a profiled run is for
            print(text, flush=True)
        return text
