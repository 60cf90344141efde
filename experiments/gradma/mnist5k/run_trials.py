"""Runs the trials of rayfed sweep files in a few long-lived processes, into the sweep directories
that `rayfed sweep FILE --out DIR` uses; `rayfed sweep` run afterwards finds every trial finished
(or diverged), starts nothing, and writes status.json and selection.md.

Why not `rayfed sweep` alone: on the shared 2-core machine Ray Tune took about 40 s to start and
6-8 s per trial to start each trial's process, against 3-30 s of training per trial, about 1.5 h
of overhead for the study's 828 trials. Each trial here is the call Tune's trial makes,
`rayfed.run(load_config(DIR/base.yaml, overrides), run_dir=DIR/trials/NAME)`, with the same
overrides and directory names, in one of `--jobs` processes that import rayfed once.

    python experiments/gradma/mnist5k/run_trials.py --jobs 2 \
        experiments/gradma/mnist5k/sweep_a_omega0.01.yaml=sweeps/mnist5k/a_omega0.01 ...
"""
from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import time
from pathlib import Path

# Relative cost of one round of each algorithm (measured on the MLP, fedavg = 1): the longest trials
# go first so that the two processes finish together.
COST = {"gradma": 8.0, "gradma_w": 8.0, "fedmlb": 2.5, "fedmlbm": 2.5, "moon": 2.5, "moonm": 2.5,
        "mimelite": 1.6}
KEPT = ("finished", "diverged")


def prepare(sweep_file: str, sweep_dir: Path) -> list[dict]:
    """The sweep directory as `rayfed sweep` lays it out, and its trials not yet finished."""
    from rayfed.metrics import read_summary, run_status
    from rayfed.sweep.cli import SWEEP_FILE
    from rayfed.sweep.spec import read_sweep

    sweep_dir.mkdir(parents=True, exist_ok=True)
    sweep = read_sweep(sweep_file, [], sweep_dir / "base.yaml")
    recorded = sweep_dir / SWEEP_FILE
    if recorded.is_file() and recorded.read_text() != sweep.describe():
        sys.exit(f"{sweep_dir} holds another sweep")
    recorded.write_text(sweep.describe())
    (sweep_dir / "trials").mkdir(exist_ok=True)
    tasks = []
    for trial in sweep.trials:
        run_dir = sweep_dir / "trials" / trial.name
        summary = read_summary(run_dir)
        if summary is not None and run_status(summary) in KEPT:
            continue
        tasks.append({"base": str(sweep_dir / "base.yaml"), "overrides": list(trial.overrides),
                      "run_dir": str(run_dir), "cost": COST.get(trial.config.algorithm.name, 1.0)})
    return tasks


def run_one(task: dict) -> tuple[str, str, float]:
    """What rayfed.sweep.runner.run_trial does, without Tune."""
    import rayfed
    from rayfed.checkpoint import has_checkpoint
    from rayfed.preflight import load_config
    from rayfed.errors import first_line
    from rayfed.metrics import read_summary, run_status

    started = time.perf_counter()
    run_dir = Path(task["run_dir"])
    failed = run_dir.parent / f"{run_dir.name}.failed"
    try:
        if has_checkpoint(run_dir):
            rayfed.resume(run_dir, progress=False)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            rayfed.run(load_config(task["base"], task["overrides"]), run_dir=run_dir, progress=False)
        failed.unlink(missing_ok=True)
    except rayfed.RunStopped:
        pass        # diverged: summary.json says so, and rayfed sweep keeps it as Tune's trial would
    except Exception as error:      # noqa: BLE001 -- recorded as rayfed sweep records it
        failed.write_text(f"{type(error).__name__}: {first_line(error)}\n")
        return run_dir.name, "failed", time.perf_counter() - started
    summary = read_summary(run_dir)
    return run_dir.name, run_status(summary) if summary else "no summary", time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="+", metavar="SWEEP.yaml=DIR")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    tasks = []
    for pair in args.pairs:
        sweep_file, sweep_dir = pair.split("=", 1)
        tasks += prepare(sweep_file, Path(sweep_dir))
    tasks.sort(key=lambda task: -task["cost"])
    print(f"{len(tasks)} trials to run in {args.jobs} processes", flush=True)
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for done, (name, status, seconds) in enumerate(pool.imap_unordered(run_one, tasks, chunksize=1), 1):
            print(f"[{done}/{len(tasks)} {time.perf_counter() - started:7.0f}s] {status:9s} {seconds:5.1f}s {name}",
                  flush=True)
    print(f"all {len(tasks)} trials in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
