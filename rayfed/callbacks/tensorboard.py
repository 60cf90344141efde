"""TensorBoard event files in the run directory (`logging.tensorboard`): every numeric field of each
round's metrics.jsonl record as a scalar at step = the record's `round`, so that
`tensorboard --logdir runs/` shows runs side by side, one run directory per TensorBoard run; and
at the end of the run its config as hyperparameters (dotted keys, so the HParams tab groups them
by section) with its final and best test accuracy as their metrics, so that a sweep's trials can
be compared in the HParams tab.

Written with torch's SummaryWriter: torch is already a dependency, and it has `purge_step`, which
tensorboard's own (experimental) `tensorboard.summary.Writer` lacks. Flushed every round, so a
killed run keeps the events of the rounds metrics.jsonl keeps. When rounds run again (a resume, a recreated
server), the next event file starts with a purge marker at the first of them: TensorBoard's readers
then discard the older events from that step on, and every step keeps one value.
"""
from __future__ import annotations

import math
import numbers
import time
from pathlib import Path

import yaml

from rayfed.callbacks.base import Callback, RunView

EVENT_FILES = "events.out.tfevents.*"


def scalars(metrics: dict, prefix: str = "") -> dict[str, float]:
    """The scalars of a metrics record: its numeric fields, nested dicts flattened with "/"
    (`phase_s/train`). Left out: `round` (it is the step), strings, lists, null and non-finite
    values (strict JSON writes those as null), and booleans: flags, not series (`model_finite`
    appears only as false, in the round that diverged)."""
    found = {}
    for key, value in metrics.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(scalars(value, f"{tag}/"))
        elif (isinstance(value, numbers.Real) and not isinstance(value, bool) and tag != "round"
              and math.isfinite(value)):
            found[tag] = float(value)
    return found


# The summary's figures that the HParams tab shows beside each run's hyperparameters.
HPARAM_METRICS = ("final_test_accuracy", "best_test_accuracy", "final_test_loss")


class TensorBoard(Callback):
    def __init__(self, run_dir: Path):
        self.log = TensorBoardLog(run_dir)

    def on_round_end(self, run: RunView, record: dict) -> None:
        self.log.append(record)

    def on_rewind(self, run: RunView, rounds_completed: int) -> None:
        self.log.rewind(rounds_completed)

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        if summary is not None and self.log.writer is not None:
            self.log.hparams(hparams_of(run.config.to_dict()),
                             {f"summary/{key}": summary[key] for key in HPARAM_METRICS
                              if isinstance(summary.get(key), float) and math.isfinite(summary[key])},
                             step=summary["rounds_completed"])
        self.log.close()


def hparams_of(config: dict, prefix: str = "") -> dict[str, int | float | str]:
    """The config's leaves under their dotted keys, as the HParams plugin takes them: numbers and
    text as they are, anything else (flags, lists, null) as its YAML text, since the plugin would
    show a flag as 1.0."""
    found = {}
    for key, value in config.items():
        if isinstance(value, dict):
            found.update(hparams_of(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            found[f"{prefix}{key}"] = value
        else:
            found[f"{prefix}{key}"] = yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    return found


class TensorBoardLog:
    """The run's event files. A file is opened with the first round it records (so a resume that
    is refused, or a run that fails before its first round, leaves none), and a new one after
    `rewind`, with the purge marker."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.writer = None
        self.purge_step: int | None = None

    def append(self, metrics: dict) -> None:
        if self.writer is None:
            self._open()
        step = int(metrics["round"])
        for tag, value in scalars(metrics).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def hparams(self, hparams: dict, metrics: dict[str, float], step: int) -> None:
        """The run's hyperparameters and `metrics` (scalars at `step`) for the HParams tab, in the
        run's own event file, so that the tab has one row per run directory."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries
        for summary in hparams_summaries(hparams, metrics):
            self.writer.file_writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def rewind(self, rounds_completed: int) -> None:
        """The rounds after `rounds_completed` run again: their events so far are to be discarded."""
        self.close()
        self.purge_step = rounds_completed + 1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter   # imported only by runs that write events
        _wait_to_sort_last(self.run_dir)
        self.writer = SummaryWriter(str(self.run_dir), purge_step=self.purge_step)
        self.purge_step = None


def _wait_to_sort_last(run_dir: Path) -> None:
    """TensorBoard reads a run's event files in name order, and a name begins with the second the
    file was opened, then host, process id and a counter: a file opened within the second of an
    earlier one may sort before it, and the events it replaces would be read after it. So a new
    file waits (at most a second) for a later second than any file already there. A file from more
    than a second ahead (a clock set back) is not waited for."""
    opened = []
    for path in run_dir.glob(EVENT_FILES):
        try:
            opened.append(int(path.name.split(".")[3]))
        except (IndexError, ValueError):
            continue
    wait = max(opened, default=-1) + 1 - time.time()
    if 0 < wait <= 2:
        time.sleep(wait)
