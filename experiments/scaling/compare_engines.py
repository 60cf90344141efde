"""Rounds per second of the local engine and the ray engine on one config, measured in one run.

    python experiments/scaling/compare_engines.py [CONFIG] [--rounds 60] [--repeats 3] [--workers 2]

Runs alternate local / ray so that machine noise hits both alike. A run's round time is the
median of its per-round wall times after a 5-round warm-up; the table gives the median over
repeats. Both engines compute the same bits, which the script checks too.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

import torch

import rayfed

WARM_UP_ROUNDS = 5


def median_round_time(history: list[dict]) -> float:
    times = [b["wall_time_s"] - a["wall_time_s"] for a, b in zip(history, history[1:])]
    return statistics.median(times[WARM_UP_ROUNDS:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(Path(__file__).with_name("n1000.yaml")))
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    engines = {"local": ["engine.backend=local"],
               f"ray, {args.workers} workers": ["engine.backend=ray", f"engine.num_workers={args.workers}"]}
    round_times = {name: [] for name in engines}
    startup_times = {name: [] for name in engines}
    final_params = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for name, overrides in engines.items():
                config = rayfed.load_config(args.config, [f"train.rounds={args.rounds}", *overrides])
                result = rayfed.run(config, run_dir=Path(scratch) / f"{repeat}-{len(final_params)}-{name[:3]}",
                                    progress=False)
                round_times[name].append(median_round_time(result.history))
                startup_times[name].append(result.summary["startup_time_s"])
                final_params.setdefault(name, result.params)
    reference = statistics.median(round_times["local"])
    print(f"{args.config}: {args.rounds} rounds x {args.repeats} repeats, medians")
    print(f"{'engine':<18} {'s/round':>9} {'rounds/s':>9} {'vs local':>9} {'startup s':>10}")
    for name in engines:
        seconds = statistics.median(round_times[name])
        print(f"{name:<18} {seconds:>9.4f} {1 / seconds:>9.1f} {reference / seconds:>8.2f}x "
              f"{statistics.median(startup_times[name]):>10.1f}")
    identical = all(torch.equal(p, final_params["local"]) for p in final_params.values())
    print(f"final models bitwise identical across engines: {identical}")


if __name__ == "__main__":
    main()
