"""Per-seed values of one metrics.jsonl key at given rounds, per group of runs (--group: comma-separated dotted
config keys; default algorithm.name), over the run directories under the given directories (a sweep's trials).
The last round a run has is "last". For the paper's loss curves (Fig. 6: the adaptive interval's "loss curve ...
descends more rapidly during the initial communication rounds", arXiv:2309.09719, Sec. V-D):
    python experiments/fedlalr/curves.py /tmp/fedlalr_claims/interval --metric train_loss --rounds 1 5 10 30 last \
        --group train.interval,train.interval_k_init,train.interval_k_alpha
"""
import argparse
import collections
import json
import pathlib

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("dirs", nargs="+")
parser.add_argument("--metric", required=True)
parser.add_argument("--rounds", nargs="+", required=True, help="round numbers, or last")
parser.add_argument("--group", default="algorithm.name")
args = parser.parse_args()
keys = args.group.split(",")

runs = collections.defaultdict(list)
for top in args.dirs:
    for metrics in sorted(pathlib.Path(top).rglob("metrics.jsonl")):
        config = yaml.safe_load((metrics.parent / "config.yaml").read_text())
        values = {row["round"]: row[args.metric] for row in map(json.loads, metrics.read_text().splitlines())
                  if row.get(args.metric) is not None}
        group = []
        for dotted in keys:
            value = config
            for part in dotted.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            group.append(str(value))
        runs[" | ".join(group)].append((config["seed"], values))

columns = " | ".join(f"{args.metric} at round {r} per seed" for r in args.rounds)
print(f"| {' | '.join(keys)} | seeds | {columns} |")
print("|---" * (len(keys) + 1 + len(args.rounds)) + "|")
for name in sorted(runs):
    cells = []
    for wanted in args.rounds:
        per_seed = []
        for _, values in sorted(runs[name]):
            round_ = max(values) if wanted == "last" else int(wanted)
            per_seed.append(f"{values[round_]:.4f}" if round_ in values else "–")
        cells.append(", ".join(per_seed))
    print(f"| {name} | {len(runs[name])} | " + " | ".join(cells) + " |")
