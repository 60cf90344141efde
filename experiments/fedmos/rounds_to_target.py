"""FedMoS's Table I protocol (Wang et al., INFOCOM 2023, Sec. V-C) on a scenario: the six methods the paper compares,
each over several seeds, and the rounds each takes to reach the scenario's training-loss and
test-accuracy targets (Table I's; counted here as the first round, 1-based, with loss <= target or accuracy >= target),
with the paper's speed-up factors against FedMoS (UCS) and FedMoS (CACS).

    python experiments/fedmos/rounds_to_target.py experiments/fedmos/synthetic.yaml --seeds 3 --out runs/fedmos

With --grid, each method first runs at every learning rate of the grid on the --tune-seeds (seeds
other than the reported 0..k-1), takes the rate with the fewest rounds to the loss target (median over
the tuning seeds; ties: the lower mean final training loss), and is reported at its own rate:

    python experiments/fedmos/rounds_to_target.py experiments/fedmos/synthetic.yaml --seeds 3 \
        --grid 0.005 0.01 0.02 0.05 0.1 --tune-seeds 3 4 --out runs/fedmos

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

# The paper's methods, all with the same eta (the scenario's algorithm.lr_local). The paper gives no values
# for eta, a, mu or beta; a = 0.1, mu = 0.001, beta = 0.8 (fedmos's defaults) are the authors' run.sh's, and
# FedProx's mu_prox = mu / eta = 0.1 (at eta = 0.01) makes its proximal step FedMoS's (chosen here).
METHODS = {
    "FedMoS (ACS)": ["algorithm.name=fedmos", "selection.selector=acs"],
    "FedMoS (CACS)": ["algorithm.name=fedmos", "selection.selector=cacs"],
    "FedMoS (UCS)": ["algorithm.name=fedmos", "selection.selector=ucs"],
    "FedAvg (UCS)": ["algorithm.name=fedavg", "selection.selector=ucs"],
    "FedProx (UCS)": ["algorithm.name=fedprox", "selection.selector=ucs", "algorithm.mu=0.1"],
    "STEM (UCS)": ["algorithm.name=stem", "selection.selector=ucs"],
    # The control for FedMoS's server step: FedAvg's clients under the same heavy ball. With lr_global = 1,
    # m <- beta m + Delta, x <- x + m is FedMoS's Eq. 4 (m <- beta m + Delta / (eta I), x <- x + eta I m) at a
    # constant eta; only FedMoS's client part (STORM momentum, proximal pull) is left out.
    "FedAvgM β=0.8 (UCS)": ["algorithm.name=fedavgm", "selection.selector=ucs", "algorithm.beta1=0.8"],
}
# Per scenario file: (training-loss target, test-accuracy target): Table I's for MNIST and CIFAR-10, chosen here
# for the two stand-ins.
TARGETS = {"mnist": (0.4, 0.95), "cifar10": (1.2, 0.60), "synthetic": (1.8, 0.45), "digits": (0.4, 0.90)}
PAPER = "FedMoS (UCS)", "FedMoS (CACS)"


def run_method(scenario: Path, method: str, seed: int, overrides: list[str], out: Path,
               lr: str | None = None) -> list[dict]:
    """One run; at the scenario's own rate (lr None) or at `lr`, in a directory of its own."""
    if lr is None:
        return run_or_read(scenario, [*METHODS[method], f"seed={seed}", *overrides],
                           out / slug(method) / f"seed{seed}")
    return run_or_read(scenario, [*METHODS[method], f"seed={seed}", *overrides, f"algorithm.lr_local={lr}"],
                       out / slug(method) / f"lr{lr}" / f"seed{seed}")


def tune(scenario: Path, method: str, grid: list[str], seeds: list[int], overrides: list[str], out: Path,
         loss_target: float) -> tuple[str, dict]:
    """(the picked rate, every rate's tuning numbers): the fewest rounds to the loss target, median over
    `seeds` (never counts as more than any number); ties go to the lower mean final training loss."""
    scores = {}
    for lr in grid:
        runs = [run_method(scenario, method, seed, overrides, out, lr) for seed in seeds]
        rounds = [rounds_to_target(r, "global_train_loss", loss_target, below=True) for r in runs]
        final_loss = statistics.mean(r[-1]["global_train_loss"] for r in runs)
        scores[lr] = {"rounds_per_seed": rounds, "median": _median(rounds), "final_train_loss": final_loss}

    def order(lr):
        median = scores[lr]["median"]
        final = scores[lr]["final_train_loss"]
        return (math.inf if median is None else median, final if math.isfinite(final) else math.inf)
    return min(grid, key=order), scores


def table(results: dict[str, list[dict]], loss_target: float, accuracy_target: float,
          picked: dict[str, str] | None = None) -> tuple[str, dict]:
    """Median over seeds of each seed's rounds to target (never: more than the run's rounds); with
    `picked`, a column of each method's tuned learning rate."""
    picked = picked or {}
    rows, numbers = [], {}
    for method, runs in results.items():
        per_seed = {"loss": [rounds_to_target(r, "global_train_loss", loss_target, below=True) for r in runs],
                    "accuracy": [rounds_to_target(r, "test_accuracy", accuracy_target) for r in runs]}
        numbers[method] = {key: {"per_seed": values, "median": _median(values)} for key, values in per_seed.items()}
        numbers[method]["final_accuracy"] = statistics.mean(r[-1]["test_accuracy"] for r in runs)
        numbers[method]["best_accuracy"] = statistics.mean(max(m.get("test_accuracy", 0) for m in r) for r in runs)
    for method in results:
        cells = [method] + ([picked[method]] if picked else [])
        for key in ("loss", "accuracy"):
            entry = numbers[method][key]
            cells.append(f"{_rounds(entry['median'])} ({', '.join(_rounds(v) for v in entry['per_seed'])})"
                         + _factors(numbers, method, key))
        cells.append(f"{numbers[method]['best_accuracy']:.4f}")
        rows.append("| " + " | ".join(cells) + " |")
    header = [f"| method | {'η (tuned) | ' if picked else ''}rounds to loss ≤ {loss_target:g}: median (per seed) | "
              f"rounds to accuracy ≥ {accuracy_target:g}: median (per seed) | best accuracy (seed mean) |",
              "|---|---|---|---|" + ("---|" if picked else "")]
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
    against = [other for other in against if other in numbers]     # a study without CACS has no second factor
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
    parser.add_argument("--grid", nargs="+", metavar="LR", help="learning rates (algorithm.lr_local) to tune over")
    parser.add_argument("--tune-seeds", nargs="+", type=int, default=[3, 4], metavar="SEED",
                        help="the seeds the rate is picked on (with --grid; default 3 4, not reported)")
    args = parser.parse_args(argv)
    if args.grid and set(args.tune_seeds) & set(range(args.seeds)):
        parser.error(f"--tune-seeds {args.tune_seeds} overlap the reported seeds 0..{args.seeds - 1}")
    loss_target, accuracy_target = TARGETS[args.scenario.stem]
    out = args.out / (args.name or args.scenario.stem)
    results, tuning = {}, {}
    for method in args.methods:
        lr = None
        if args.grid:
            lr, scores = tune(args.scenario, method, args.grid, args.tune_seeds, args.overrides, out, loss_target)
            tuning[method] = {"picked": lr, "grid": scores}
        results[method] = [run_method(args.scenario, method, seed, args.overrides, out, lr)
                           for seed in range(args.seeds)]
        print(f"{method}: done" + (f" (lr_local {lr})" if lr else ""), file=sys.stderr)
    text, numbers = table(results, loss_target, accuracy_target, {m: t["picked"] for m, t in tuning.items()})
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "overrides": args.overrides,
                                                "seeds": args.seeds, "targets": [loss_target, accuracy_target],
                                                "methods": numbers,
                                                **({"grid": args.grid, "tune_seeds": args.tune_seeds,
                                                    "tuning": tuning} if args.grid else {})}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
