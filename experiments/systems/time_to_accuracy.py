"""Time-to-accuracy in virtual seconds of the round policies, for FedAvg, MIFA and GradMA-S.

    python experiments/systems/time_to_accuracy.py [--target 0.7] [--seed 0] [--out runs/systems]

Runs n1000_lognormal.yaml under each policy and algorithm and prints the virtual time (and round)
at which the test accuracy first reaches the target, the final accuracy and the straggler share.
"""
import argparse
from pathlib import Path

import rayfed

CONFIG = Path(__file__).with_name("n1000_lognormal.yaml")
POLICIES = {
    "sync": ["train.round_policy=sync"],
    "deadline 0.5 s": ["train.round_policy=deadline", "train.deadline_s=0.5"],
    "overcommit 30%": ["train.round_policy=overcommit", "train.overcommit=0.3"],
    "async_buffered": ["train.round_policy=async_buffered", "train.buffer_size=50", "train.concurrency=100"],
}
ALGORITHMS = {
    "FedAvg": ["algorithm.name=fedavg"],
    "MIFA": ["algorithm.name=mifa"],
    "GradMA-S": ["algorithm.name=gradma_s", "algorithm.memory_size=100"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/systems")
    args = parser.parse_args()
    print(f"| algorithm | policy | virtual s to {args.target:.0%} | round | final accuracy | stragglers | "
          f"virtual s for all rounds |")
    print("|---|---|---|---|---|---|---|")
    for algorithm, algorithm_overrides in ALGORITHMS.items():
        for policy, policy_overrides in POLICIES.items():
            config = rayfed.load_config(CONFIG, [*algorithm_overrides, *policy_overrides, f"seed={args.seed}"])
            run_dir = Path(args.out) / f"{algorithm}-{policy.split()[0]}-seed{args.seed}"
            history = rayfed.run(config, run_dir=run_dir, progress=False).history
            reached = next((m for m in history if m.get("test_accuracy", 0) >= args.target), None)
            stragglers = sum(m.get("num_stragglers", 0) for m in history) / sum(m["num_sampled"] for m in history)
            time_to_target = f"{reached['virtual_time_s']:.1f}" if reached else "—"
            print(f"| {algorithm} | {policy} | {time_to_target} | {reached['round'] if reached else '—'} | "
                  f"{history[-1]['test_accuracy']:.4f} | {stragglers:.0%} | {history[-1]['virtual_time_s']:.1f} |")


if __name__ == "__main__":
    main()
