"""`rayfed sweep SWEEP.yaml [key=value ...] [--out DIR] [--select METRIC] [--group KEY ...]`: the trials' run
directories under DIR/trials, and with --select the chosen settings in DIR/selection.md and selection.json."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rayfed.config import check_path
from rayfed.errors import ConfigError
from rayfed.input_files import read_text
from rayfed.metrics import read_summary, run_status
from rayfed.report.runs import COMPLETE_STATUSES, ENDED_STATUSES
from rayfed.sweep.select import (check_group_keys, select, selection_document, setting_keys_of,
                                 write_selection)
from rayfed.sweep.pack import DEFAULT_PACK
from rayfed.sweep.spec import read_sweep

SWEEP_FILE = "sweep.yaml"
# A sweep.yaml holds the base config's text (at most a config file's 1 MiB) and the grid.
MAX_SWEEP_FILE_BYTES = 2**24


def sweep_command(items: list[str], out: str | None, metric: str | None, group_keys: list[str],
                  progress: bool, plan: bool = False, pack: int | None = None) -> int:
    """`pack`: trials per pack at most (None: rayfed.sweep.runner.DEFAULT_PACK)."""
    if pack is not None and pack < 1:
        raise ConfigError(f"--pack takes a number of trials of at least 1 (1: no packing), got {pack}")
    pack = DEFAULT_PACK if pack is None else pack
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if len(paths) != 1:
        raise ConfigError(f"rayfed sweep takes one sweep file, got {len(paths)} (overrides look like key=value)")
    if metric:
        check_group_keys(group_keys)
    sweep_dir = Path(out) if out else Path("sweeps") / Path(paths[0]).stem
    check_path("--out", str(sweep_dir))
    with tempfile.TemporaryDirectory() as scratch:
        sweep = read_sweep(paths[0], overrides, Path(scratch) / "base.yaml")
        isas = sorted({trial.config.engine.cpu_isa or "unset" for trial in sweep.trials})
        if len(isas) > 1:
            raise ConfigError(f"engine.cpu_isa is {', '.join(isas)} among the sweep's trials, whose processes share "
                              f"one Ray job's environment: give them one")
        if plan:
            from rayfed.sweep.plan import plan_text
            print(plan_text(sweep, paths[0], Path(scratch) / "base.yaml", _done(sweep_dir, sweep), sweep_dir, pack),
                  end="")
            return 0
    try:
        from rayfed.sweep.runner import run_sweep
    except ImportError as error:
        raise ConfigError(f"rayfed sweep needs Ray Tune ({error}): pip install 'rayfed[tune]'") from None
    _claim(sweep_dir, sweep.describe())
    (sweep_dir / "base.yaml").write_text(sweep.base_text)
    outcomes, times = run_sweep(sweep, sweep_dir, progress, pack)
    (sweep_dir / "status.json").write_text(json.dumps(outcomes, indent=2) + "\n")
    others = [outcome for outcome in outcomes.values() if outcome["status"] not in COMPLETE_STATUSES]
    print(f"rayfed: sweep {sweep_dir}: {len(outcomes) - len(others)} of {len(outcomes)} trials finished")
    if times is not None:
        print(f"  {times.trials} trials run in {times.packs} pack{'s' if times.packs != 1 else ''} (--pack {pack}) "
              f"in {times.wall_s:.1f} s: Ray's start {times.ray_start_s:.1f} s, the first "
              f"trial processes' {times.processes_start_s:.1f} s, runs {times.run_s:.1f} s ({times.slots} at a time, "
              f"{times.processes} processes), start-up {times.startup_per_trial_s:.2f} s per trial")
    for outcome in others:
        print(f"  {outcome['status']}: {outcome['point']}: {outcome.get('reason', '')}".rstrip(": "))
    if metric:
        rows = select(sweep, sweep_dir / "trials", metric, group_keys)
        table = write_selection(sweep_dir, selection_document(rows, metric, group_keys,
                                                              setting_keys_of(sweep.parsed, group_keys)))
        print(table, end="")
    # A trial that diverged is a result of its setting (a learning rate too large), not a failure of the sweep.
    return 1 if any(outcome["status"] not in ENDED_STATUSES for outcome in others) else 0


def _done(sweep_dir: Path, sweep) -> set[str]:
    """The trials the sweep directory holds ended; ConfigError where it holds another sweep."""
    recorded = sweep_dir / SWEEP_FILE
    if not recorded.is_file():
        return set()
    if read_text(recorded, str(recorded), MAX_SWEEP_FILE_BYTES) != sweep.describe():
        raise ConfigError(f"{sweep_dir} holds another sweep (its {SWEEP_FILE} differs); choose another --out")
    return {trial.name for trial in sweep.trials if _status(sweep_dir / "trials" / trial.name) in ENDED_STATUSES}


def _claim(sweep_dir: Path, description: str) -> None:
    """A sweep directory holds one sweep: the same command again continues it."""
    recorded = sweep_dir / SWEEP_FILE
    if recorded.is_file():
        if read_text(recorded, str(recorded), MAX_SWEEP_FILE_BYTES) != description:
            raise ConfigError(f"{sweep_dir} holds another sweep (its {SWEEP_FILE} differs); choose another --out")
        return
    try:
        if sweep_dir.exists() and (not sweep_dir.is_dir() or any(sweep_dir.iterdir())):
            raise ConfigError(f"{sweep_dir} exists and is not a sweep directory; choose another --out")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        recorded.write_text(description)
    except OSError as error:
        raise ConfigError(f"cannot make the sweep directory {sweep_dir} ({error.strerror or error}); "
                          f"choose another --out") from None
    print(f"rayfed: sweep directory {sweep_dir}", file=sys.stderr)


def _status(run_dir: Path) -> str | None:
    summary = read_summary(run_dir)
    return None if summary is None else run_status(summary)
