"""metrics.jsonl, one JSON object per round: the run's record, which checkpoints are tied to."""
from __future__ import annotations

from pathlib import Path

from rayfed.callbacks.base import Callback, RunView
from rayfed.metrics import METRICS, MetricsLog


class MetricsFile(Callback):
    """Writes each round's record into metrics.jsonl, flushed so that a crash keeps what was done.
    A checkpoint records the digest of the lines written (`sha256`), so that a resume can tell
    whether the file still holds the rounds it continues from."""

    def __init__(self, run_dir: Path):
        self.log = MetricsLog(Path(run_dir) / METRICS)

    def on_round_end(self, run: RunView, record: dict) -> None:
        # The run's own strict copy (NaN and infinities as null), made once a round.
        self.log.append(run.history[-1])

    def on_rewind(self, run: RunView, rounds_completed: int) -> None:
        self.log.rewrite(self.log.path.read_bytes().splitlines(keepends=True)[:rounds_completed])

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        self.log.close()

    def sha256(self) -> str:
        return self.log.sha256()

    def sync(self) -> None:
        self.log.sync()
