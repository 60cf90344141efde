"""The progress bar on stderr: round, loss, latest test accuracy and seconds per round."""
from __future__ import annotations

import sys

from tqdm import tqdm

from rayfed.callbacks.base import Callback, RunView


class Progress(Callback):
    def __init__(self, total_rounds: int, enabled: bool):
        self.bar = tqdm(total=total_rounds, file=sys.stderr, disable=not enabled, unit="round",
                        dynamic_ncols=True, leave=True)
        self.last_wall = 0.0

    def on_round_end(self, run: RunView, record: dict) -> None:
        postfix = {"loss": f"{record['train_loss']:.3f}"}
        if "test_accuracy" in record:
            postfix["acc"] = f"{record['test_accuracy']:.4f}"
        postfix["s/round"] = f"{record['wall_time_s'] - self.last_wall:.3f}"
        self.last_wall = record["wall_time_s"]
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def on_rewind(self, run: RunView, rounds_completed: int) -> None:
        self.bar.n = rounds_completed
        self.bar.refresh()

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        self.bar.close()
