"""Finding run directories and reading what a run wrote (config.yaml, metrics.jsonl, summary.json)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from rayfed.errors import ConfigError
from rayfed.metrics import METRICS, SUMMARY, read_summary, run_status


@dataclass
class Run:
    path: Path
    config: dict            # dotted key -> value, as config.yaml holds it
    summary: dict | None    # None: the run wrote no summary.json (it was cut off)
    rounds: np.ndarray      # 1-based round numbers, one per metrics.jsonl line
    train_loss: np.ndarray  # NaN where undefined
    virtual_time_s: np.ndarray
    cumulative_bytes: np.ndarray    # bytes_up + bytes_down up to and including each round
    evaluated: np.ndarray   # indices into `rounds` of the rounds with a test_accuracy
    test_accuracy: np.ndarray       # at `evaluated`

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def status(self) -> str:
        if self.summary is None:
            return "incomplete"
        return run_status(self.summary)

    @property
    def wall_time_s(self) -> float:
        value = (self.summary or {}).get("wall_time_s")
        return float(value) if isinstance(value, (int, float)) else math.nan


@dataclass
class Unusable:
    """A run directory that cannot enter an average, and why."""
    path: Path
    reason: str


def find_run_dirs(dirs: list[str]) -> list[Path]:
    """The run directories in or under `dirs`, sorted. A run directory holds config.yaml and
    metrics.jsonl or summary.json, so that a run whose metrics were lost is still found and reported."""
    found = set()
    for name in dirs:
        top = Path(name)
        if not top.is_dir():
            raise ConfigError(f"{name!r} is not a directory")
        for parent, children, files in os.walk(top):
            if "config.yaml" in files and (METRICS in files or SUMMARY in files):
                found.add(Path(parent))
                children.clear()    # a run directory's subfolders (TensorBoard events) hold no runs
            children.sort()
    if not found:
        raise ConfigError(f"no run directories (config.yaml with metrics.jsonl) in {', '.join(map(repr, dirs))}")
    return sorted(found)


def read_config(path: Path) -> dict | Unusable:
    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return Unusable(path, "config.yaml is not readable YAML")
    if not isinstance(config, dict):
        return Unusable(path, "config.yaml is not a mapping of keys")
    return flatten(config)


def flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_run(path: Path, config: dict) -> Run | Unusable:
    metrics_path = path / METRICS
    if not metrics_path.is_file():
        return Unusable(path, "no metrics.jsonl")
    try:
        lines = metrics_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return Unusable(path, "metrics.jsonl is not readable UTF-8")
    records = []
    for number, line in enumerate(lines, start=1):
        record = _strict_json(line)
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            return Unusable(path, f"metrics.jsonl line {number} is not a JSON object with a round")
        records.append(record)
    if not records:
        return Unusable(path, "metrics.jsonl is empty")
    evaluated = [i for i, record in enumerate(records) if "test_accuracy" in record]
    if not evaluated:
        return Unusable(path, "metrics.jsonl has no test_accuracy")
    return Run(
        path=path, config=config, summary=read_summary(path),
        rounds=np.array([record["round"] for record in records]),
        train_loss=_column(records, "train_loss"),
        virtual_time_s=_column(records, "virtual_time_s"),
        cumulative_bytes=np.cumsum(_column(records, "bytes_up") + _column(records, "bytes_down")),
        evaluated=np.array(evaluated),
        test_accuracy=_column([records[i] for i in evaluated], "test_accuracy"),
    )


def _strict_json(line: str):
    """The parsed line, or None where it is not strict JSON (rayfed writes NaN as null, so a NaN
    literal means the file was not written by it or was damaged)."""
    try:
        return json.loads(line, parse_constant=_reject)
    except ValueError:
        return None


def _reject(constant: str):
    raise ValueError(constant)


def _column(records: list[dict], key: str) -> np.ndarray:
    """Null (an undefined value) and a missing key both read as NaN."""
    values = [record.get(key) for record in records]
    return np.array([float(v) if isinstance(v, (int, float)) else math.nan for v in values])
