"""FedMoS's Table I protocol (Wang et al., INFOCOM 2023, Sec. V-C) on a scenario: the six methods the paper compares,
each over several seeds, and the rounds each takes to reach the scenario's training-loss and
test-accuracy targets (§7.5: the first round, 1-based, with loss <= target or accuracy >= target),
with the paper's speed-up factors against FedMoS (UCS) and FedMoS (CACS).

    python experiments/fedmos/rounds_to_target.py experiments/fedmos/synthetic.yaml --seeds 3 --out runs/fedmos

Runs go to OUT/<scenario>/<method>/seed<k>/ (a finished one is read back, not rerun); the table is
printed and written to OUT/<scenario>/table.md and table.json. Extra key=value arguments override
the scenario for every method (e.g. systems.availability=bernoulli).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import run_or_read, slug  # noqa: E402  (experiments/runs.py, beside this script's folder)

from rayfed.report.stats import rounds_to_target  # noqa: E402

# The paper's methods, all with the same eta (the scenario's algorithm.lr_local) and §7.4's values:
# a = 0.1, mu = 0.001, beta = 0.8 are fedmos's defaults; FedProx's mu_prox = mu / eta (§5.2).
METHODS = {
    "FedMoS (ACS)": ["algorithm.name=fedmos", "selection.selector=acs"],
    "FedMoS (CACS)": ["algorithm.name=fedmos", "selection.selector=cacs"],
    "FedMoS (UCS)": ["algorithm.name=fedmos", "selection.selector=ucs"],
    "FedAvg (UCS)": ["algorithm.name=fedavg", "selection.selector=ucs"],
    "FedProx (UCS)": ["algorithm.name=fedprox", "selection.selector=ucs", "algorithm.mu=0.1"],
    "STEM (UCS)": ["algorithm.name=stem", "selection.selector=ucs"],
}
# Per scenario file: (training-loss target, test-accuracy target), §7.5 for the paper's datasets.
TARGETS = {"mnist": (0.4, 0.95), "cifar10": (1.2, 0.60), "synthetic": (1.8, 0.45), "digits": (0.4, 0.90)}
PAPER = "FedMoS (UCS)", "FedMoS (CACS)"


def run_method(scenario: Path, method: str, seed: int, overrides: list[str], out: Path) -> list[dict]:
    return run_or_read(scenario, [*METHODS[method], f"seed={seed}", *overrides], out / slug(method) / f"seed{seed}")


def table(results: dict[str, list[dict]], loss_target: float, accuracy_target: float) -> tuple[str, dict]:
    """Median over seeds of each seed's rounds to target (never: more than the run's rounds)."""
    rows, numbers = [], {}
    for method, runs in results.items():
        per_seed = {"loss": [rounds_to_target(r, "global_train_loss", loss_target, below=True) for r in runs],
                    "accuracy": [rounds_to_target(r, "test_accuracy", accuracy_target) for r in runs]}
        numbers[method] = {key: {"per_seed": values, "median": _median(values)} for key, values in per_seed.items()}
        numbers[method]["final_accuracy"] = statistics.mean(r[-1]["test_accuracy"] for r in runs)
        numbers[method]["best_accuracy"] = statistics.mean(max(m.get("test_accuracy", 0) for m in r) for r in runs)
    for method in results:
        cells = [method]
        for key in ("loss", "accuracy"):
            entry = numbers[method][key]
            cells.append(f"{_rounds(entry['median'])} ({', '.join(_rounds(v) for v in entry['per_seed'])})"
                         + _factors(numbers, method, key))
        cells.append(f"{numbers[method]['best_accuracy']:.4f}")
        rows.append("| " + " | ".join(cells) + " |")
    header = [f"| method | rounds to loss ≤ {loss_target:g}: median (per seed) | "
              f"rounds to accuracy ≥ {accuracy_target:g}: median (per seed) | best accuracy (seed mean) |",
              "|---|---|---|---|"]
    return "\n".join(header + rows), numbers


def _median(values: list[int | None]) -> float | None:
    """Median with 'never' (None) above every number: None when the median run never got there."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    low, high = ordered[half - 1], ordered[half]
    return None if low is None or high is None else (low + high) / 2


def _rounds(value) -> str:
    return "never" if value is None else f"{value:g}"


def _factors(numbers: dict, method: str, key: str) -> str:
    """Table I's brackets: baselines (a x, b x) against FedMoS (UCS) and (CACS); FedMoS (UCS) (c x) against CACS."""
    mine = numbers[method][key]["median"]
    against = [PAPER[0], PAPER[1]] if "FedMoS" not in method else [PAPER[1]] if method == PAPER[0] else []
    factors = []
    for other in against:
        theirs = numbers.get(other, {}).get(key, {}).get("median")
        factors.append("—" if mine is None or not theirs else f"{mine / theirs:.1f}×")
    return f" ({', '.join(factors)})" if factors else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value for every method's config")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    parser.add_argument("--out", type=Path, default=Path("runs/fedmos"))
    parser.add_argument("--name", help="the results' directory under --out (default: the scenario's name)")
    args = parser.parse_args(argv)
    loss_target, accuracy_target = TARGETS[args.scenario.stem]
    out = args.out / (args.name or args.scenario.stem)
    results = {}
    for method in args.methods:
        results[method] = [run_method(args.scenario, method, seed, args.overrides, out) for seed in range(args.seeds)]
        print(f"{method}: done", file=sys.stderr)
    text, numbers = table(results, loss_target, accuracy_target)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "overrides": args.overrides,
                                                "seeds": args.seeds, "targets": [loss_target, accuracy_target],
                                                "methods": numbers}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
