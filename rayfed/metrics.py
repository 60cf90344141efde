"""The run directory's records: metrics.jsonl's lines, summary.json, and reading them back."""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rayfed.errors import ConfigError
from rayfed.input_files import parse_json, read_json

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CLIENTS = "clients.jsonl"
# Where the server's round record carries the round's per-client rows to the driver (logging.client_metrics),
# which takes them out before it keeps the record: they go to clients.jsonl, not metrics.jsonl.
CLIENT_ROWS = "clients"
# A client row's own keys: a metric a client reports under one of these names stays out of its row.
CLIENT_ROW_KEYS = ("round", "client", "num_samples")
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
    """Appends JSON objects, one a line, to a run's file (metrics.jsonl: one per round; clients.jsonl),
    flushed so a crash keeps what was done. It keeps the SHA-256 of the lines written so far, which a
    checkpoint records for metrics.jsonl so that a resume can tell whether the file still holds the
    rounds the checkpoint continues from."""

    def __init__(self, path: Path):
        self.path = path
        self.digest = hashlib.sha256(path.read_bytes() if path.exists() else b"")
        self.file = open(path, "ab")

    def append(self, record: dict) -> None:
        """Writes the round's record, which the run keeps as strict JSON (strict_json)."""
        self.extend([record])

    def extend(self, records: list[dict]) -> None:
        """Writes `records` (strict JSON) with one flush: a round's clients in clients.jsonl."""
        lines = b"".join((json.dumps(record, allow_nan=False) + "\n").encode() for record in records)
        self.file.write(lines)
        self.file.flush()
        self.digest.update(lines)

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


def reported_numbers(reported: dict) -> dict[str, int | float]:
    """The numbers among what a client reported in its upload's metrics, as plain ints and floats:
    flags, text, lists and tensors reach the algorithm's server step only."""
    return {name: int(value) if isinstance(value, numbers.Integral) else float(value)
            for name, value in reported.items()
            if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))}


def client_fields(reported: list[dict]) -> dict[str, int | float]:
    """The round record's view of the clients' metrics: for each number `name` that one of the
    round's counted clients reported, `client_<name>_mean`, `_min` and `_max` over the clients that
    reported it (names in sorted order; a NaN among them makes all three NaN)."""
    columns: dict[str, list] = {}
    for client in reported:
        for name, value in reported_numbers(client).items():
            columns.setdefault(name, []).append(value)
    fields = {}
    for name in sorted(columns):
        values = columns[name]
        undefined = any(isinstance(value, float) and math.isnan(value) for value in values)
        fields[f"client_{name}_mean"] = float(np.mean(values))
        fields[f"client_{name}_min"] = math.nan if undefined else min(values)
        fields[f"client_{name}_max"] = math.nan if undefined else max(values)
    return fields


def client_row(round: int, client: int, num_samples: int, reported: dict) -> dict:
    """One line of clients.jsonl: the 1-based round, the client, its sample count and the numbers it reported."""
    return {"round": round, "client": client, "num_samples": int(num_samples),
            **{name: value for name, value in reported_numbers(reported).items() if name not in CLIENT_ROW_KEYS}}


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


def round_record(line: bytes, number: int) -> dict:
    """metrics.jsonl's line `number` (1-based) as the record of that round; a ConfigError saying which
    it is not (JSON within rayfed's bounds, or that round's record)."""
    try:
        # NaN too: metrics written before rayfed wrote undefined numbers as null hold it.
        record = parse_json(line, f"line {number}", constants=True)
    except ConfigError:
        raise ConfigError(f"line {number} is not JSON") from None
    if not isinstance(record, dict) or record.get("round") != number:
        raise ConfigError(f"line {number} is not the record of round {number}")
    return record


def recorded_rounds(run_dir: Path) -> Iterator[dict]:
    """metrics.jsonl's records of rounds 1, 2, ... up to the first line that is not the next round's."""
    try:
        with open(run_dir / METRICS, "rb") as file:
            for number, line in enumerate(file, start=1):
                try:
                    yield round_record(line, number)
                except ConfigError:
                    return
    except OSError:
        return


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
