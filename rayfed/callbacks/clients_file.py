"""clients.jsonl (`logging.client_metrics`): one JSON object per round and counted client, with its
sample count and every number it reported, beside metrics.jsonl's aggregates of them."""
from __future__ import annotations

import json
from pathlib import Path

from rayfed.callbacks.base import Callback, RunView
from rayfed.metrics import CLIENTS, MetricsLog, strict_json


class ClientsFile(Callback):
    """Writes each round's per-client rows (RunView.round_clients) as strict JSON, flushed with the
    round. When rounds run again (a resume, a recreated server) their rows go, as their lines in
    metrics.jsonl do."""

    def __init__(self, run_dir: Path):
        self.log = MetricsLog(Path(run_dir) / CLIENTS)

    def on_round_end(self, run: RunView, record: dict) -> None:
        self.log.extend([strict_json(row) for row in run.round_clients])

    def on_rewind(self, run: RunView, rounds_completed: int) -> None:
        self.log.rewrite(rows_through(self.log.path.read_bytes().splitlines(keepends=True), rounds_completed))

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        self.log.close()


def rows_through(lines: list[bytes], rounds_completed: int) -> list[bytes]:
    """The leading `lines` of rounds 1 to `rounds_completed`: rounds are written in order, so the
    first line of a later round, or one a crash cut short, ends them."""
    for index, line in enumerate(lines):
        try:
            round = json.loads(line)["round"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            return lines[:index]
        if not isinstance(round, int) or round > rounds_completed:
            return lines[:index]
    return lines
