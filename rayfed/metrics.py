"""The run directory's records: metrics.jsonl's lines, summary.json, and reading them back."""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from rayfed.errors import ConfigError
from rayfed.input_files import read_json

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
# A summary holds a few dozen numbers; the bound keeps a file put in its place from filling the memory.
MAX_SUMMARY_BYTES = 2**24
# Keys that measure the machine, not the maths: they differ between identical runs.
WALL_CLOCK_KEYS = ("wall_time_s", "phase_s")


def strict_json(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by null: neither is JSON, and an undefined
    diagnostic or a diverged loss must not make the file unreadable to other tools."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


class MetricsLog:
    """Appends one JSON object per round to metrics.jsonl, flushed so a crash keeps what was done.
    It keeps the SHA-256 of the lines written so far, which a checkpoint records so that a resume
    can tell whether the file still holds the rounds the checkpoint continues from."""

    def __init__(self, path: Path):
        self.path = path
        self.digest = hashlib.sha256(path.read_bytes() if path.exists() else b"")
        self.file = open(path, "ab")

    def append(self, record: dict) -> None:
        """Writes the round's record, which the run keeps as strict JSON (strict_json)."""
        line = (json.dumps(record, allow_nan=False) + "\n").encode()
        self.file.write(line)
        self.file.flush()
        self.digest.update(line)

    def sha256(self) -> str:
        return self.digest.hexdigest()

    def sync(self) -> None:
        """Onto the disk, not only out of this process: a power cut must not lose lines a checkpoint counts."""
        os.fsync(self.file.fileno())

    def rewrite(self, lines: list[bytes]) -> None:
        """Keeps only `lines` (rounds after a checkpoint are about to run again), atomically."""
        self.file.close()
        kept = b"".join(lines)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_bytes(kept)
        os.replace(temporary, self.path)
        self.digest = hashlib.sha256(kept)
        self.file = open(self.path, "ab")

    def close(self) -> None:
        self.file.close()


def write_json_atomic(path: Path, payload: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(strict_json(payload), indent=2, allow_nan=False) + "\n")
    os.replace(temporary, path)


def read_summary(run_dir: Path) -> dict | None:
    """A run's summary.json; None where it has none, or one that cannot be read."""
    try:
        # NaN too: summaries written before rayfed wrote undefined numbers as null hold it.
        summary = read_json(run_dir / SUMMARY, SUMMARY, MAX_SUMMARY_BYTES, constants=True)
    except ConfigError:
        return None
    return summary if isinstance(summary, dict) else None


def run_status(summary: dict) -> str:
    """How the run ended; summaries written before runs recorded it are of finished runs."""
    return str(summary.get("status", "finished"))


def summarize(history: list[dict]) -> dict:
    evaluated = [m for m in history if "test_accuracy" in m]
    best = max(evaluated, key=lambda m: m["test_accuracy"], default=None)
    return {
        "final_test_accuracy": evaluated[-1]["test_accuracy"] if evaluated else math.nan,
        "final_test_loss": evaluated[-1]["test_loss"] if evaluated else math.nan,
        "best_test_accuracy": best["test_accuracy"] if best else math.nan,
        "best_round": best["round"] if best else None,
        "rounds_completed": len(history),
        "bytes_up_total": sum(m["bytes_up"] for m in history),
        "bytes_down_total": sum(m["bytes_down"] for m in history),
    }


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
