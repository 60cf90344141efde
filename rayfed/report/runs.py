"""Finding run directories and reading what a run wrote (config.yaml, metrics.jsonl, summary.json)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfed.errors import ConfigError
from rayfed.input_files import parse_json, read_text, read_yaml
from rayfed.metrics import METRICS, SUMMARY, read_summary, run_status


# Statuses (summary.json) of runs that ran as their config asked: to train.rounds, until
# train.target_accuracy / train.target_loss was reached, or until train.target_epsilon allowed.
COMPLETE_STATUSES = ("finished", "reached_target", "privacy_budget_spent")
REACHED_TARGET = "reached_target"
# A round's line is a few hundred bytes: a million rounds' worth.
MAX_METRICS_BYTES = 2**30
# ...and of runs that ended by themselves, a callback's stop and a divergence too: a sweep keeps
# them as they are when run again, and counts them as its trials' results, not as failures.
ENDED_STATUSES = (*COMPLETE_STATUSES, "stopped", "diverged")


@dataclass
class Run:
    path: Path
    config: dict            # dotted key -> value, as config.yaml holds it
    summary: dict | None    # None: the run wrote no summary.json (it was cut off)
    rounds: np.ndarray      # 1-based round numbers, one per metrics.jsonl line
    columns: dict[str, np.ndarray]  # every numeric metrics.jsonl key: a value per round, NaN where null or absent
    logged: dict[str, np.ndarray]   # the same keys: whether each round's record has the key

    def column(self, key: str) -> np.ndarray:
        return self.columns.get(key, np.full(len(self.rounds), math.nan))

    def logged_at(self, key: str) -> np.ndarray:
        return self.logged.get(key, np.zeros(len(self.rounds), dtype=bool))

    @property
    def evaluated(self) -> np.ndarray:
        """Indices into `rounds` of the rounds with a test_accuracy."""
        return np.flatnonzero(self.logged_at("test_accuracy"))

    @property
    def test_accuracy(self) -> np.ndarray:
        return self.column("test_accuracy")[self.evaluated]

    @property
    def train_loss(self) -> np.ndarray:
        return self.column("train_loss")

    @property
    def virtual_time_s(self) -> np.ndarray:
        return self.column("virtual_time_s")

    @property
    def cumulative_bytes(self) -> np.ndarray:
        """bytes_up + bytes_down up to and including each round (inf past a double's range)."""
        with np.errstate(over="ignore"):
            return np.cumsum(self.column("bytes_up") + self.column("bytes_down"))

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def status(self) -> str:
        if self.summary is None:
            return "incomplete"
        return run_status(self.summary)

    @property
    def stopped_at_target(self) -> bool:
        """Its metrics.jsonl ends at the round that reached its own target, before train.rounds."""
        return self.status == REACHED_TARGET

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
        config = read_yaml(path / "config.yaml", "config.yaml")
    except ConfigError as error:
        return Unusable(path, str(error))
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
    if not metrics_path.exists():
        return Unusable(path, "no metrics.jsonl")
    records = []
    try:
        for number, line in enumerate(read_text(metrics_path, METRICS, MAX_METRICS_BYTES).splitlines(), start=1):
            # Strict: rayfed writes NaN as null, so a NaN literal means another writer or damage.
            record = parse_json(line, f"{METRICS} line {number}")
            if not isinstance(record, dict) or not isinstance(record.get("round"), int):
                return Unusable(path, f"{METRICS} line {number} is not a JSON object with a round")
            records.append(record)
    except ConfigError as error:
        return Unusable(path, str(error))
    if not records:
        return Unusable(path, "metrics.jsonl is empty")
    if not any("test_accuracy" in record for record in records):
        return Unusable(path, "metrics.jsonl has no test_accuracy")
    summary = read_summary(path)
    if summary is not None and run_status(summary) == REACHED_TARGET:
        problem = _target_problem(config, summary, records)
        if problem:
            return Unusable(path, problem)
    keys = {key for record in records for key, value in record.items()
            if key != "round" and (value is None or _is_number(value))}
    return Run(path=path, config=config, summary=summary,
               rounds=np.array([record["round"] for record in records]),
               columns={key: _column(records, key) for key in keys},
               logged={key: np.array([key in record for record in records]) for key in keys})


def _target_problem(config: dict, summary: dict, records: list[dict]) -> str | None:
    """Why a run that says it reached its target does not show it, or None where it does: its
    target_round must be the first evaluated round that meets its train.target_accuracy (and
    train.target_loss, where set), and its metrics.jsonl must end there."""
    accuracy, loss = config.get("train.target_accuracy"), config.get("train.target_loss")
    if accuracy is None and loss is None:
        return "summary.json says reached_target, but config.yaml sets no train.target_accuracy or train.target_loss"
    if not all(value is None or _is_number(value) for value in (accuracy, loss)):
        return "config.yaml's train.target_accuracy or train.target_loss is not a number"
    target_round = summary.get("target_round")
    if isinstance(target_round, bool) or not isinstance(target_round, int):
        return "summary.json says reached_target without an integer target_round"

    def meets(record: dict) -> bool:
        value, test_loss = record.get("test_accuracy"), record.get("test_loss")
        return ("test_accuracy" in record
                and (accuracy is None or (_is_number(value) and value >= accuracy))
                and (loss is None or (_is_number(test_loss) and test_loss <= loss)))

    first = next((record["round"] for record in records if meets(record)), None)
    targets = " and ".join(f"train.{name}={value}" for name, value in
                           (("target_accuracy", accuracy), ("target_loss", loss)) if value is not None)
    if first != target_round:
        where = "no round" if first is None else f"round {first}"
        return (f"summary.json's target_round {target_round} disagrees with metrics.jsonl, where {where} "
                f"first meets {targets}")
    if records[-1]["round"] != target_round:
        return f"metrics.jsonl goes on to round {records[-1]['round']} after target_round {target_round}"
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _column(records: list[dict], key: str) -> np.ndarray:
    """Null (an undefined value) and a missing key both read as NaN."""
    return np.array([float(record[key]) if _is_number(record.get(key)) else math.nan for record in records])
