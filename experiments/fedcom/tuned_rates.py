"""The control for uplink_curves.py's comparisons (arXiv:2007.01154, Figs. 6 and 8 plot loss and
accuracy against uplink): each method at its own local rate eta from one grid, picked on a seed
that is not reported, then run on the reported seeds.

    python experiments/fedcom/tuned_rates.py experiments/fedcom/digits.yaml --rounds 30 --target 0.9 \\
        --out runs/fedcom

A method's rate is the grid's eta with the least uplink to --target test accuracy on the selection
seed (a seed that never reaches it, or diverges first, ranks last; ties go to the lower final
training loss). Runs are --rounds long and go to OUT/<scenario>_tuned/<method>/eta<eta>/seed<k>/;
at the scenario's own eta, rounds 1..--rounds of uplink_curves.py's runs in OUT/<scenario>/ (or
OUT/<scenario>_train_rounds_<R>/, its runs with train.rounds=R) are read instead where they exist
(nothing in a run depends on its number of rounds, so its first rounds are those of a shorter run).
Writes OUT/<scenario>_tuned/table.md and table.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import rayfed

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from runs import run_or_read, slug  # noqa: E402  (experiments/runs.py)
from uplink_curves import MEGABYTE_BITS, METHODS, values  # noqa: E402

from rayfed.metrics import read_summary  # noqa: E402
from rayfed.report.stats import rounds_to_target  # noqa: E402

RATES = (0.03, 0.1, 0.3)


def outcome(run: list[dict], target: float) -> dict:
    """Uplink MB at the first round with test accuracy >= target (None: never), and the final loss."""
    reached = rounds_to_target(run, "test_accuracy", target)
    by_round = {m["round"]: m for m in run}
    return {"round_to_target": reached,
            "uplink_mb_to_target": None if reached is None else by_round[reached]["bits_up_total"] / MEGABYTE_BITS,
            "final_train_loss": run[-1].get("global_train_loss"), "diverged": run[-1].get("global_train_loss") is None}


def rank_key(result: dict) -> tuple[float, float]:
    loss = result["final_train_loss"]
    return (math.inf if result["uplink_mb_to_target"] is None else result["uplink_mb_to_target"],
            math.inf if loss is None else loss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--select-seed", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3, help="reported seeds 0..k-1")
    parser.add_argument("--out", type=Path, default=Path("runs/fedcom"))
    args = parser.parse_args(argv)
    if args.select_seed < args.seeds:
        parser.error(f"--select-seed {args.select_seed} is one of the reported seeds 0..{args.seeds - 1}")
    own_rate = rayfed.load_config(str(args.scenario)).algorithm.lr_local
    out = args.out / f"{args.scenario.stem}_tuned"

    def run(method: str, rate: float, seed: int) -> list[dict]:
        if math.isclose(rate, own_rate):
            for folder in (args.scenario.stem, f"{args.scenario.stem}_{slug(f'train.rounds={args.rounds}')}"):
                full = args.out / folder / slug(method) / f"seed{seed}"
                summary = read_summary(full)
                if summary is not None and summary.get("status") == "finished" and \
                        summary["rounds_completed"] >= args.rounds:
                    lines = (full / "metrics.jsonl").read_text().splitlines()
                    return [json.loads(line) for line in lines][:args.rounds]
        return run_or_read(args.scenario, [*METHODS[method], f"algorithm.lr_local={rate}", f"seed={seed}",
                                           f"train.rounds={args.rounds}"],
                           out / slug(method) / f"eta{rate:g}" / f"seed{seed}")

    rows = []
    for method in METHODS:
        selection = {rate: outcome(run(method, rate, args.select_seed), args.target) for rate in RATES}
        picked = min(RATES, key=lambda rate: rank_key(selection[rate]))
        reported = [outcome(run(method, picked, seed), args.target) for seed in range(args.seeds)]
        rows.append({"method": method, "selection_seed": args.select_seed,
                     "selection": {f"{rate:g}": result for rate, result in selection.items()},
                     "eta": picked, "seeds": reported})
        print(f"{method}: eta {picked:g}", file=sys.stderr)
    lines = [f"| method | uplink MB to {args.target:g} on seed {args.select_seed}, eta = "
             f"{' / '.join(f'{r:g}' for r in RATES)} | eta picked | uplink MB to {args.target:g} at it, seeds "
             f"0-{args.seeds - 1} | round to {args.target:g}, seeds 0-{args.seeds - 1} |", "|---|---|---|---|---|"]
    for row in rows:
        selection = " / ".join("diverged" if r["diverged"] else "never" if r["uplink_mb_to_target"] is None
                               else f"{r['uplink_mb_to_target']:.2f}" for r in row["selection"].values())
        lines.append(f"| {row['method']} | {selection} | {row['eta']:g} | "
                     f"{values(row['seeds'], 'uplink_mb_to_target', '.2f')} | "
                     f"{values(row['seeds'], 'round_to_target', 'g')} |")
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "rounds": args.rounds,
                                                "target": args.target, "rates": RATES, "methods": rows},
                                               indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
