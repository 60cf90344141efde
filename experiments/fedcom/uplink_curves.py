"""FedCOM's comparison (arXiv:2007.01154): training loss and test accuracy against the megabytes
clients uploaded, for FedAvg, FedPAQ, SCAFFOLD, FedGATE and FedCOMGATE (8-bit affine, and top-k at
C_r = 0.1 with memory), each over several seeds.

    python experiments/fedcom/uplink_curves.py experiments/fedcom/digits.yaml --seeds 3 --out runs/fedcom

Runs go to OUT/<scenario>[_<overrides>]/<method>/seed<k>/ (a finished one is read back); that folder gets
table.md and table.json (each seed's final loss and accuracy, and the round and uplink at which
it first reaches --target; medians over the seeds that do) and curves.png (seed means; the paper
plots uplink, the downlink being negligible: arXiv:2007.01154, Sec. B.1). Extra key=value
arguments override the scenario for every method.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import run_or_read, slug  # noqa: E402  (experiments/runs.py)

from rayfed.report.stats import rounds_to_target  # noqa: E402

AFFINE_8 = ["compression.name=affine", "compression.bits=8"]
METHODS = {
    "FedAvg": ["algorithm.name=fedavg"],
    "FedPAQ (8-bit)": ["algorithm.name=fedpaq", *AFFINE_8],
    "SCAFFOLD": ["algorithm.name=scaffold"],
    "FedGATE": ["algorithm.name=fedgate"],
    "FedCOMGATE (8-bit)": ["algorithm.name=fedcomgate", *AFFINE_8],
    "FedCOMGATE (top-k 0.1, memory)": ["algorithm.name=fedcomgate", "compression.name=top_k",
                                       "compression.ratio=0.1", "algorithm.memory=true"],
}
MEGABYTE_BITS = 8e6


def curves(runs: list[list[dict]]) -> dict[str, np.ndarray]:
    """Seed means at the evaluated rounds: cumulative uplink MB, global training loss, test accuracy."""
    evaluated = [[m for m in run if "test_accuracy" in m] for run in runs]
    return {"round": np.array([m["round"] for m in evaluated[0]]),
            "uplink_mb": np.mean([[m["bits_up_total"] / MEGABYTE_BITS for m in run] for run in evaluated], axis=0),
            "train_loss": np.mean([[m["global_train_loss"] for m in run] for run in evaluated], axis=0),
            "test_accuracy": np.mean([[m["test_accuracy"] for m in run] for run in evaluated], axis=0)}


def per_seed(run: list[dict], target: float) -> dict:
    """One seed's final training loss and test accuracy, and its first round with test accuracy at
    least `target` with the uplink MB spent by then (None: never, or the run diverged first)."""
    reached = rounds_to_target(run, "test_accuracy", target)
    by_round = {m["round"]: m for m in run}
    return {"final_train_loss": run[-1].get("global_train_loss"), "final_accuracy": run[-1].get("test_accuracy"),
            "rounds": run[-1]["round"], "round_to_target": reached,
            "uplink_mb_to_target": None if reached is None else by_round[reached]["bits_up_total"] / MEGABYTE_BITS}


def summarize(method: str, runs: list[list[dict]], target: float) -> dict:
    return {"method": method, "uplink_mb_per_round": runs[0][-1]["bits_up_total"] / MEGABYTE_BITS / len(runs[0]),
            "seeds": [per_seed(run, target) for run in runs]}


def values(seeds: list[dict], key: str, digits: str) -> str:
    """Each seed's value ("never" where it has none), then the median over the seeds that have one."""
    shown = ["never" if s[key] is None else format(s[key], digits) for s in seeds]
    have = [s[key] for s in seeds if s[key] is not None]
    median = f"median {np.median(have):{digits}} of {len(have)}" if have else "no seed"
    return f"{' / '.join(shown)} ({median})"


def render(rows: list[dict], target: float) -> str:
    lines = [f"| method | uplink MB a round | final training loss, per seed | final test accuracy, per seed | "
             f"round to {target:g}, per seed | uplink MB to {target:g}, per seed |", "|---|---|---|---|---|---|"]
    for row in rows:
        seeds = row["seeds"]
        lines.append(f"| {row['method']} | {row['uplink_mb_per_round']:.3f} | "
                     f"{values(seeds, 'final_train_loss', '.4f')} | {values(seeds, 'final_accuracy', '.4f')} | "
                     f"{values(seeds, 'round_to_target', 'g')} | "
                     f"{values(seeds, 'uplink_mb_to_target', '.2f')} |")
    return "\n".join(lines)


def plot(all_curves: dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for method, curve in all_curves.items():
        loss_axis.plot(curve["uplink_mb"], curve["train_loss"], label=method)
        accuracy_axis.plot(curve["uplink_mb"], curve["test_accuracy"], label=method)
    for axis, label in ((loss_axis, "global training loss"), (accuracy_axis, "test accuracy")):
        axis.set_xscale("log")
        axis.set_xlabel("uplink MB (cumulative, seed mean)")
        axis.set_ylabel(label)
    loss_axis.set_yscale("log")
    accuracy_axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value for every method's config")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy whose uplink cost is reported")
    parser.add_argument("--out", type=Path, default=Path("runs/fedcom"))
    args = parser.parse_args(argv)
    out = args.out / "_".join([args.scenario.stem, *map(slug, args.overrides)])
    rows, all_curves = [], {}
    for method, method_overrides in METHODS.items():
        runs = [run_or_read(args.scenario, [*method_overrides, f"seed={seed}", *args.overrides],
                            out / slug(method) / f"seed{seed}") for seed in range(args.seeds)]
        rows.append(summarize(method, runs, args.target))
        all_curves[method] = curves(runs)
        print(f"{method}: done", file=sys.stderr)
    text = render(rows, args.target)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "overrides": args.overrides,
                                                "seeds": args.seeds, "target": args.target, "methods": rows},
                                               indent=1) + "\n")
    plot(all_curves, out / "curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
