"""DP-FedAvg's accuracy against epsilon on mnist_5k (mnist5k_dpfedavg.yaml), at N = 100 and N = 1,000 clients
with the same sampling rate q = 0.1 (10 and 100 clients a round): target epsilon 16, 4 and 1 at delta = 1e-5
over the 100 rounds (z solved by dp-accounting's RDP accountant), and two controls, FedAvg without privacy and
clipping alone (z = 0), which separate clipping's effect from the noise's. Each run is kept once it wrote its
summary.json (run again, the script continues); then results/mnist5k_dpfedavg.md.

    python experiments/privacy/run_study.py [--seeds 0 1 2] [--out sweeps/privacy] [--workers 1]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from runs import spread, study_main  # noqa: E402  (experiments/runs.py)

BASE = HERE / "mnist5k_dpfedavg.yaml"
POPULATIONS = {100: ["data.num_clients=100", "train.clients_per_round=10"],
               1000: ["data.num_clients=1000", "train.clients_per_round=100"]}
SETTINGS = {"no privacy": ["privacy.mechanism=none", "privacy.clip_norm=null", "privacy.delta=null",
                           "privacy.target_epsilon=null"],
            "clipping only (z = 0)": ["privacy.target_epsilon=null", "privacy.noise_multiplier=0"],
            "epsilon 16": ["privacy.target_epsilon=16"],
            "epsilon 4": ["privacy.target_epsilon=4"],
            "epsilon 1": ["privacy.target_epsilon=1"]}


def slug(setting: str) -> str:
    return setting.split(" (")[0].replace(" ", "_")


def runs(seeds: list[int]) -> list[tuple[str, list[str]]]:
    return [(f"N{n}/{slug(setting)}/seed{seed}", [*population, *keys, f"seed={seed}"])
            for n, population in POPULATIONS.items() for setting, keys in SETTINGS.items() for seed in seeds]


def outcome(out: Path, name: str) -> tuple[float, float | None, float | None] | None:
    """(final test accuracy %, the epsilon spent, z) of a finished run."""
    if not (out / name / "summary.json").exists():
        return None
    summary = json.loads((out / name / "summary.json").read_text())
    z = yaml.safe_load((out / name / "config.yaml").read_text())["privacy"]["noise_multiplier"]
    return 100 * summary["final_test_accuracy"], summary.get("privacy", {}).get("epsilon"), z


def table(out: Path, seeds: list[int]) -> str:
    lines = []
    for n in POPULATIONS:
        lines += ["", f"### N = {n} clients, q = 0.1 ({n // 10} a round on average), T = 100, delta = 1e-5", "",
                  f"| setting | z | epsilon spent | final test accuracy (%), mean ± std | per seed "
                  f"({', '.join(map(str, seeds))}) |", "|---|---|---|---|---|"]
        for setting in SETTINGS:
            found = [outcome(out, f"N{n}/{slug(setting)}/seed{seed}") for seed in seeds]
            done = [f for f in found if f is not None]
            if not done:
                lines.append(f"| {setting} | — | — | not run | — |")
                continue
            accuracies = [f[0] for f in done]
            epsilon, z = done[0][1], done[0][2]
            # summary.json writes an infinite epsilon (no noise) as null
            epsilon = "—" if z is None else ("∞" if epsilon is None or epsilon == float("inf") else f"{epsilon:.3f}")
            z = "—" if z is None else f"{z:g}"
            lines.append(f"| {setting} | {z} | {epsilon} | {spread(accuracies)} | "
                         f"{', '.join('—' if f is None else f'{f[0]:.2f}' for f in found)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return study_main(__doc__.splitlines()[0], BASE, runs, table, Path("sweeps/privacy"), 1,
                      HERE / "results" / "mnist5k_dpfedavg.md", argv)


if __name__ == "__main__":
    sys.exit(main())
