"""What the experiment scripts share: a run directory's metrics, running the run first if it has
not ended (a finished or diverged one is read back, so a study can be rerun to add seeds or methods)."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import rayfed
from rayfed.errors import RunStopped
from rayfed.metrics import read_summary


def run_or_read(scenario: Path, overrides: list[str], run_dir: Path) -> list[dict]:
    """metrics.jsonl of `rayfed run scenario overrides...` in `run_dir`; a run that diverged keeps the
    rounds before it stopped (its summary.json says `diverged`)."""
    summary = read_summary(run_dir)
    if summary is None or summary.get("status") not in ("finished", "diverged"):
        config = rayfed.load_config(str(scenario), overrides)
        if run_dir.exists():
            for path in sorted(run_dir.iterdir()):
                path.unlink()
        try:
            rayfed.run(config, run_dir=run_dir, progress=False)
        except RunStopped as stopped:
            if stopped.status != "diverged":
                raise
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def slug(label: str) -> str:
    """A label ("FedMoS (ACS)", "(a) tau=10, N_z=0") as a directory name."""
    return "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")


def run_each(base: Path, runs: list[tuple[str, list[str]]], out: Path, workers: int) -> None:
    """`rayfed run base overrides...` for each (name, overrides) into out/name, `workers` processes at a
    time; a run that wrote its summary.json is kept (run again, a study continues). Prints a line a run."""
    def run(name: str, overrides: list[str]) -> str:
        if (out / name / "summary.json").exists():
            return f"{name}: kept"
        result = subprocess.run(["rayfed", "run", str(base), *overrides, "--out", str(out / name), "--quiet"],
                                capture_output=True, text=True)
        return f"{name}: exit {result.returncode} {result.stderr.strip()[-300:]}"
    with ThreadPoolExecutor(workers) as pool:
        for line in pool.map(lambda item: run(*item), runs):
            print(line, flush=True)


def spread(values: list[float]) -> str:
    """Mean ± standard deviation (ddof = 1) to two decimals, or the one value."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def study_main(description: str, base: Path, runs, table, out: Path, workers: int, result: Path,
               argv: list[str] | None) -> int:
    """A study script's command line: runs(seeds) through run_each (unless --table-only), then table(out,
    seeds) written to `result` and printed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.table_only:
        run_each(base, runs(args.seeds), args.out, args.workers)
    result.parent.mkdir(exist_ok=True)
    text = table(args.out, args.seeds)
    result.write_text(text)
    print(text)
    return 0
