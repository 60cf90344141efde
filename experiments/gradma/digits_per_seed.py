"""Per-seed values of the digits sweeps' selected settings, which the committed reports give only as
mean ± std: each selected (algorithm, setting) of `digits_results/selection.json` and
`digits_methods_results/selection.json` is run again for its seeds, in one process, and its per-seed
best and final test accuracy, and the rounds its seed-mean curve takes to reach the target, are written
to `per_seed.md` beside each selection.json. The seed mean of the best accuracy is checked against the sweep's
recorded mean, so the table says whether the rerun gave the sweep's numbers on this machine.

    python experiments/gradma/digits_per_seed.py [--sweeps digits_sweep.yaml ...]    # 36 runs
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import rayfed
from rayfed.preflight import load_config

HERE = Path(__file__).parent
SWEEPS = (("digits_sweep.yaml", HERE / "digits_results" / "selection.json"),
          ("digits_methods_sweep.yaml", HERE / "digits_methods_results" / "selection.json"))
BASE = HERE / "digits.yaml"
TARGET = 0.9
# The sweeps' means are printed to 4 decimals in their reports; a rerun on another machine may differ by more.
AGREE = 5e-5


def seed_runs(name: str, setting: dict, seeds: list[int], scratch: Path):
    """The setting's runs, one per seed, in fresh directories under `scratch`."""
    overrides = [f"algorithm.name={name}"] + [f"{key}={value}" for key, value in setting.items() if value is not None]
    results = []
    for seed in seeds:
        config = load_config(BASE, [*overrides, f"seed={seed}"])
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-{seed}-", dir=scratch))
        results.append(rayfed.run(config, run_dir=run_dir / "run", progress=False))
    return overrides[1:], results


def curve(result) -> tuple[np.ndarray, np.ndarray]:
    rows = [row for row in result.history if "test_accuracy" in row]
    return np.array([row["round"] for row in rows]), np.array([row["test_accuracy"] for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", nargs="+", default=[sweep for sweep, _ in SWEEPS],
                        choices=[sweep for sweep, _ in SWEEPS])
    args = parser.parse_args()
    for sweep_file, selection in SWEEPS:
        if sweep_file in args.sweeps:
            write_table(sweep_file, selection)


def write_table(sweep_file: str, selection: Path) -> None:
    lines = [f"# {sweep_file}: per-seed values of the selected settings", "",
             f"Rerun of each selected setting of {selection.parent.name}/selection.json for its seeds "
             f"(`{Path(__file__).name}`). Best: the seed's highest evaluated test accuracy; final: its last; rounds "
             f"to {TARGET}: first evaluated round whose seed-mean test accuracy is ≥ it. Sweep's mean: the mean best "
             "test accuracy that `rayfed sweep --select` recorded in selection.json; same: whether the rerun's mean "
             "equals it to the printed digits.", "",
             "| sweep | algorithm | setting | best per seed | best mean | sweep's mean | same | final per seed | "
             f"final mean | rounds to {TARGET} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for group in json.loads(selection.read_text())["groups"]:
            name = group["group"]["algorithm.name"]
            setting, results = seed_runs(name, group["setting"], group["seed_values"], Path(scratch))
            best = np.array([r.summary["best_test_accuracy"] for r in results])
            final = np.array([r.summary["final_test_accuracy"] for r in results])
            rounds, accuracy = zip(*(curve(r) for r in results))
            mean_curve = np.mean(accuracy, axis=0)
            hits = np.flatnonzero(mean_curve >= TARGET)
            reached = str(int(rounds[0][hits[0]])) if len(hits) else "never"
            recorded = group["mean_best_test_accuracy"]
            same = "yes" if abs(best.mean() - recorded) < AGREE else "no"
            lines.append(f"| {sweep_file} | {name} | {' '.join(setting)} | "
                         f"{', '.join(f'{b:.4f}' for b in best)} | {best.mean():.4f} | {recorded:.4f} | {same} | "
                         f"{', '.join(f'{f:.4f}' for f in final)} | {final.mean():.4f} | {reached} |")
            print(lines[-1], flush=True)
    (selection.parent / "per_seed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
