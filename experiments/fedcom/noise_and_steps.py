"""FedCOM's Fig. 9 (arXiv:2007.01154, Fig. 9) on a scenario: FedCOMGATE with the 8-bit affine
quantizer (a) at fixed tau with noise added to its zero-point, N_z in {0, 1, 2, 4, 8}, and (b) at a
fixed noise with tau in {1, 5, 10, 20}; each over several seeds.

    python experiments/fedcom/noise_and_steps.py experiments/fedcom/digits.yaml --seeds 3 --out runs/fedcom

Prints, per setting, each seed's global training loss after 10, 50 and all rounds and its first
round with loss at most --loss-target, or the round it diverged at; means and medians say over how
many seeds they are taken. (a) at N_z = 4 and (b) at tau = 10 are one setting, run once. Writes
OUT/<scenario>_fig9/table.md and .json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import rayfed

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import run_or_read, slug  # noqa: E402  (experiments/runs.py)

from rayfed.report.stats import rounds_to_target  # noqa: E402

BASE = ["algorithm.name=fedcomgate", "compression.name=affine", "compression.bits=8"]
NOISES = (0, 1, 2, 4, 8)
STEPS = (1, 5, 10, 20)
FIXED_STEPS, FIXED_NOISE = 10, 4


def settings() -> dict[str, tuple[int, int]]:
    """Label -> (tau, N_z)."""
    grid = {f"(a) tau={FIXED_STEPS}, N_z={noise}": (FIXED_STEPS, noise) for noise in NOISES}
    grid.update({f"(b) N_z={FIXED_NOISE}, tau={steps}": (steps, FIXED_NOISE) for steps in STEPS})
    return grid


def seed_row(run: list[dict], loss_target: float, at_rounds: tuple[int, ...]) -> dict:
    """One seed: its loss at `at_rounds`, first round at or below the target, and where it diverged."""
    # A diverged run's last round has no finite loss (metrics.jsonl writes null).
    diverged = run[-1]["round"] if run[-1].get("global_train_loss") is None else None
    losses = {m["round"]: m["global_train_loss"] for m in run if m.get("global_train_loss") is not None}
    return {"diverged_at_round": diverged,
            "loss_at": {str(r): losses.get(r) for r in at_rounds},
            "round_to_target": rounds_to_target(run, "global_train_loss", loss_target, below=True),
            "compression_error_median": float(np.median([m["compression_error"] for m in run
                                                         if m.get("compression_error") is not None]))}


def cell(values: list, digits: str) -> str:
    """Per-seed values, then their mean over the seeds that have one and how many those are."""
    shown = [("diverged" if v is None else format(v, digits)) for v in values]
    finite = [v for v in values if v is not None]
    mean = f"mean {np.mean(finite):{digits}} of {len(finite)}" if finite else "no seed"
    return f"{' / '.join(shown)} ({mean})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value for every run (in a directory of their own)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="these settings' labels alone, e.g. '(b) N_z=4, tau=20'")
    parser.add_argument("--loss-target", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=Path("runs/fedcom"))
    args = parser.parse_args(argv)
    out = args.out / "_".join([f"{args.scenario.stem}_fig9", *map(slug, args.overrides)])
    rows = []
    for label, (steps, noise) in settings().items():
        if args.only and label not in args.only:
            continue
        overrides = [*BASE, f"train.local_steps={steps}", f"compression.zero_point_noise={noise}", *args.overrides]
        runs = [run_or_read(args.scenario, [*overrides, f"seed={seed}"], out / f"tau{steps}_nz{noise}" / f"seed{seed}")
                for seed in range(args.seeds)]
        at_rounds = (10, 50, rayfed.load_config(str(args.scenario), overrides).train.rounds)
        rows.append({"setting": label, "tau": steps, "zero_point_noise": noise, "seeds": list(range(args.seeds)),
                     "per_seed": [seed_row(run, args.loss_target, at_rounds) for run in runs]})
        print(f"{label}: done", file=sys.stderr)
    at_rounds = list(rows[0]["per_seed"][0]["loss_at"])
    header = ["| setting | median ‖Q(Δ)−Δ‖²/‖Δ‖² (all seeds' rounds) | " +
              " | ".join(f"loss at round {r}, per seed" for r in at_rounds) +
              f" | first round with loss ≤ {args.loss_target:g}, per seed | diverged |",
              "|---|---|" + "---|" * len(at_rounds) + "---|---|"]
    lines = []
    for row in rows:
        seeds = row["per_seed"]
        diverged = [f"seed {s} at round {r['diverged_at_round']}" for s, r in zip(row["seeds"], seeds)
                    if r["diverged_at_round"] is not None]
        reached = [r["round_to_target"] for r in seeds]
        reached_text = " / ".join("never" if r is None else str(r) for r in reached)
        hit = [r for r in reached if r is not None]
        reached_text += f" (median {np.median(hit):g} of {len(hit)})" if hit else " (no seed)"
        lines.append(f"| {row['setting']} | {np.median([r['compression_error_median'] for r in seeds]):.2e} | " +
                     " | ".join(cell([r["loss_at"][a] for r in seeds], ".4f") for a in at_rounds) +
                     f" | {reached_text} | {', '.join(diverged) or 'none'} |")
    text = "\n".join(header + lines)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "overrides": args.overrides,
                                                "seeds": args.seeds,
                                                "loss_target": args.loss_target, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
