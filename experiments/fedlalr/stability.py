"""Stability and speed columns that `rayfed report` does not compute, per group of runs (default:
per algorithm; --group takes comma-separated dotted config keys) over the run directories found
under the given directories (a sweep's trials):
  last-10 mean   mean test accuracy over the last 10 evaluated rounds (seed mean ± sample std)
  largest drop   the largest fall of the test accuracy below its running best, after round 10
                 (the paper's "accuracy drops during training"; seed mean ± sample std, and the
                 worst seed with the round at which its drop was largest)
  drop per seed  the largest drop of each seed (seeds in increasing order)
  best / final   per seed, to compare methods within a seed
  early          per seed, the mean test accuracy over rounds 1-10 (the paper's "in the early period")
  rounds to X    per seed, the first round with test accuracy >= X
    python experiments/fedlalr/stability.py --target 0.9 --target 0.95 /tmp/fedlalr_sweeps/final_digits_* > OUT.md
"""
import argparse
import collections
import json
import pathlib
import statistics

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("dirs", nargs="+")
parser.add_argument("--target", type=float, action="append", required=True, help="repeatable")
parser.add_argument("--group", default="algorithm.name", help="comma-separated dotted config keys")
args = parser.parse_args()
args.group = args.group.split(",")

runs = collections.defaultdict(list)
for top in args.dirs:
    for metrics in sorted(pathlib.Path(top).rglob("metrics.jsonl")):
        config = yaml.safe_load((metrics.parent / "config.yaml").read_text())
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        curve = [(row["round"], row["test_accuracy"]) for row in rows if row.get("test_accuracy") is not None]
        key = []
        for dotted in args.group:
            value = config
            for part in dotted.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            key.append(str(value))
        runs[" | ".join(key)].append((config["seed"], curve))


def mean_std(values):
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


targets = " | ".join(f"rounds to {target} per seed" for target in args.target)
print(f"| {' | '.join(args.group)} | seeds | last-10 mean | largest drop after round 10 | worst drop (seed, round) "
      f"| drop per seed | best per seed | final per seed | early per seed | {targets} |")
print("|---" * len(args.group) + "|---|---|---|---|---|---|---|---|" + "---|" * len(args.target))
for name in sorted(runs):
    last10, drops, worst, bests, finals, earlies = [], [], (0.0, None, None), [], [], []
    reach = {target: [] for target in args.target}
    for seed, curve in sorted(runs[name]):
        accs = [acc for _, acc in curve]
        last10.append(statistics.mean(accs[-10:]))
        best, drop, at = 0.0, 0.0, None
        for round_, acc in curve:
            if round_ > 10 and best - acc > drop:
                drop, at = best - acc, round_
            best = max(best, acc)
        drops.append(drop)
        if drop >= worst[0]:
            worst = (drop, seed, at)
        bests.append(f"{max(accs):.3f}")
        finals.append(f"{accs[-1]:.3f}")
        earlies.append(f"{statistics.mean(acc for round_, acc in curve if round_ <= 10):.3f}")
        for target in args.target:
            reach[target].append(next((str(r) for r, acc in curve if acc >= target), "never"))
    print(f"| {name} | {len(runs[name])} | {mean_std(last10)} | {mean_std(drops)} "
          f"| {worst[0]:.4f} (seed {worst[1]}, "
          f"round {worst[2]}) | {', '.join(f'{drop:.3f}' for drop in drops)} | {', '.join(bests)} "
          f"| {', '.join(finals)} | {', '.join(earlies)} | "
          + " | ".join(", ".join(reach[t]) for t in args.target) + " |")
