"""The study's ended trials kept in the repository, so that a study longer than one machine's life goes on elsewhere.

A sweep directory lives on one machine and holds megabytes per trial; the T = 500 study takes about a day of two
cores. `save` writes each ended trial of the sweep directories once, as runs_T500/<sweep>/<trial>.json: its
summary.json as the run wrote it and the metrics.jsonl columns the tables and `rayfed report` read (round,
train_loss, test_loss, test_accuracy), every value as written. `restore` writes them back into sweep
directories (sweep.yaml and base.yaml from the sweep files, each trial's config.yaml from its config), where
`rayfed sweep` counts them as ended and continues with the others, and make_tables.py tabulates them:

    python experiments/gradma/mnist5k/archive.py save sweeps/mnist5k_T500
    python experiments/gradma/mnist5k/archive.py restore sweeps/mnist5k_T500

A restored trial's metrics.jsonl holds those four columns only.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from rayfed.metrics import read_summary, run_status
from rayfed.report.runs import ENDED_STATUSES
from rayfed.sweep.spec import read_sweep

HERE = Path(__file__).parent
ARCHIVE = HERE / "runs_T500"
# run_study.sh's override for the paper's horizon: the sweeps' trials (and names) are those of this override.
OVERRIDES = ["train.rounds=500"]
SWEEPS = [f"{group}_omega{omega}" for omega in ("0.01", "0.1") for group in ("a", "b", "gradma", "feddyn")]
COLUMNS = ("round", "train_loss", "test_loss", "test_accuracy")


def sweep_of(name: str):
    with tempfile.TemporaryDirectory() as scratch:
        return read_sweep(str(HERE / f"sweep_{name}.yaml"), OVERRIDES, Path(scratch) / "base.yaml")


def record(run_dir: Path, summary: dict) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    missing = {key for row in rows for key in COLUMNS if key not in row}
    if missing:
        raise SystemExit(f"{run_dir}: metrics.jsonl rows lack {', '.join(sorted(missing))}")
    return {"summary": summary, "metrics": {key: [row[key] for row in rows] for key in COLUMNS}}


def save(sweeps: Path, archive: Path) -> int:
    written = 0
    for name in SWEEPS:
        trials = sweeps / name / "trials"
        for trial in sweep_of(name).trials if trials.is_dir() else []:
            summary = read_summary(trials / trial.name)
            if summary is None or run_status(summary) not in ENDED_STATUSES:
                continue
            target = archive / name / f"{trial.name}.json"
            text = json.dumps(record(trials / trial.name, summary), separators=(",", ":")) + "\n"
            if target.exists():
                if target.read_text() != text:
                    raise SystemExit(f"{target} holds another result for this trial than {trials / trial.name}")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written += 1
    return written


def restore(archive: Path, sweeps: Path) -> int:
    written = 0
    for name in SWEEPS:
        if not (archive / name).is_dir():
            continue
        sweep = sweep_of(name)
        sweep_dir = sweeps / name
        sweep_dir.mkdir(parents=True, exist_ok=True)
        described = sweep_dir / "sweep.yaml"
        if described.exists() and described.read_text() != sweep.describe():
            raise SystemExit(f"{sweep_dir} holds another sweep than {name} with {' '.join(OVERRIDES)}")
        described.write_text(sweep.describe())
        (sweep_dir / "base.yaml").write_text(sweep.base_text)
        trials = {trial.name: trial for trial in sweep.trials}
        for path in sorted((archive / name).glob("*.json")):
            trial = trials[path.stem]
            run_dir = sweep_dir / "trials" / trial.name
            summary = read_summary(run_dir)
            if summary is not None and run_status(summary) in ENDED_STATUSES:
                continue
            kept = json.loads(path.read_text())
            shutil.rmtree(run_dir, ignore_errors=True)     # an unfinished run's files: `rayfed sweep` restarts it too
            run_dir.mkdir(parents=True)
            (run_dir / "config.yaml").write_text(trial.config.to_yaml())
            columns = kept["metrics"]
            rows = [dict(zip(COLUMNS, values)) for values in zip(*(columns[key] for key in COLUMNS))]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            (run_dir / "summary.json").write_text(json.dumps(kept["summary"], indent=2) + "\n")
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("sweeps", type=Path, help="the directory of the study's sweep directories")
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    args = parser.parse_args()
    if args.action == "save":
        print(f"{save(args.sweeps, args.archive)} trials written to {args.archive}", file=sys.stderr)
    else:
        print(f"{restore(args.archive, args.sweeps)} trials restored into {args.sweeps}", file=sys.stderr)


if __name__ == "__main__":
    main()
