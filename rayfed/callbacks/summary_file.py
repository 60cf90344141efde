"""summary.json: how the run ended, its final and best accuracy, its costs."""
from __future__ import annotations

from pathlib import Path

from rayfed.callbacks.base import Callback, RunView
from rayfed.metrics import SUMMARY, write_json_atomic


class SummaryFile(Callback):
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / SUMMARY

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        if summary is not None:
            write_json_atomic(self.path, summary)
