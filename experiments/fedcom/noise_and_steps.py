"""FedCOM's Fig. 9 (arXiv:2007.01154, Fig. 9) on a scenario: FedCOMGATE with the 8-bit affine
quantizer (a) at fixed tau with noise added to its zero-point, N_z in {0, 1, 2, 4, 8}, and (b) at a
fixed noise with tau in {1, 5, 10, 20}; each over several seeds.

    python experiments/fedcom/noise_and_steps.py experiments/fedcom/digits.yaml --seeds 3 --out runs/fedcom

Prints, per setting, the seed-mean global training loss (over the seeds that did not diverge) after
10, 50 and all rounds, the first round whose seed-mean loss is at most --loss-target, and the round
each diverging seed stopped at; writes OUT/<scenario>_fig9/table.md and .json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import run_or_read, slug  # noqa: E402  (experiments/runs.py)

from rayfed.report.stats import first_crossing  # noqa: E402

BASE = ["algorithm.name=fedcomgate", "compression.name=affine", "compression.bits=8"]
NOISES = (0, 1, 2, 4, 8)
STEPS = (1, 5, 10, 20)
FIXED_STEPS, FIXED_NOISE = 10, 4


def settings() -> dict[str, list[str]]:
    grid = {f"(a) tau={FIXED_STEPS}, N_z={noise}": [f"train.local_steps={FIXED_STEPS}",
                                                   f"compression.zero_point_noise={noise}"] for noise in NOISES}
    grid.update({f"(b) N_z={FIXED_NOISE}, tau={steps}": [f"train.local_steps={steps}",
                                                        f"compression.zero_point_noise={FIXED_NOISE}"]
                 for steps in STEPS})
    return grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--loss-target", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=Path("runs/fedcom"))
    args = parser.parse_args(argv)
    out = args.out / f"{args.scenario.stem}_fig9"
    rows = []
    for label, overrides in settings().items():
        runs = [run_or_read(args.scenario, [*BASE, *overrides, f"seed={seed}"], out / slug(label) / f"seed{seed}")
                for seed in range(args.seeds)]
        # A diverged run's last round has no finite loss (metrics.jsonl writes null).
        finished = [run for run in runs if run[-1].get("global_train_loss") is not None]
        diverged = [run[-1]["round"] for run in runs if run[-1].get("global_train_loss") is None]
        evaluated = [[m for m in run if "global_train_loss" in m] for run in finished]
        loss = np.mean([[m["global_train_loss"] for m in run] for run in evaluated], axis=0)
        rounds = [m["round"] for m in evaluated[0]]
        hit = first_crossing(loss, args.loss_target, below=True)
        rows.append({"setting": label, "diverged_in_rounds": diverged, "seeds_finished": len(finished),
                     "loss_at": {str(r): float(loss[rounds.index(r)]) for r in (10, 50, rounds[-1]) if r in rounds},
                     "round_to_target": None if hit is None else rounds[hit],
                     "compression_error": float(np.median([m["compression_error"] for run in finished for m in run]))})
        print(f"{label}: done", file=sys.stderr)
    last = rows[0]["loss_at"]
    header = ["| setting | median ‖Q(Δ)−Δ‖²/‖Δ‖² | " + " | ".join(f"loss at round {r}" for r in last) +
              f" | round to loss ≤ {args.loss_target:g} | seeds that diverged (round) |",
              "|---|---|" + "---|" * len(last) + "---|---|"]
    lines = [f"| {row['setting']} | {row['compression_error']:.2e} | " +
             " | ".join(f"{row['loss_at'].get(r, float('nan')):.4f}" for r in last) +
             f" | {row['round_to_target'] or 'never'} | "
             f"{', '.join(map(str, row['diverged_in_rounds'])) or 'none'} |" for row in rows]
    text = "\n".join(header + lines)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "table.json").write_text(json.dumps({"scenario": str(args.scenario), "seeds": args.seeds,
                                                "loss_target": args.loss_target, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
