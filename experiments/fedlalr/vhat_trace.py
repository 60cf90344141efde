"""Reads the ||v_hat||^2 traces (algorithm.trace_v_hat, `v_hat_sq_norms` in metrics.jsonl) of FedLALR runs and
checks what the paper's Fig. 7 says of them (arXiv:2309.09719, Sec. V-D): at rounds 1, 31, 61 and 91, v_hat grows
during local training, at a different speed in each client. Per run (seed) and round, over every participant:
  non-decreasing   participants whose trace never falls between two local steps
  growth           last / first value of a participant's trace (after its first and its last local step):
                   min, median and max over the participants, and max / min of those
  two clients      the growth of two participants drawn at random (random.Random(seed)), as the paper plots two
    python experiments/fedlalr/vhat_trace.py /tmp/fedlalr_claims/vhat > experiments/fedlalr/results/claims/vhat.md
"""
import json
import pathlib
import random
import statistics
import sys

import yaml

ROUNDS = (1, 31, 61, 91)

print("| seed | round | participants | non-decreasing | growth min / median / max | max / min | two random clients: "
      "growth | ||v_hat||^2 median after step 1 |")
print("|---|---|---|---|---|---|---|---|")
for metrics in sorted(pathlib.Path(sys.argv[1]).rglob("metrics.jsonl")):
    seed = yaml.safe_load((metrics.parent / "config.yaml").read_text())["seed"]
    rows = {row["round"]: row for row in map(json.loads, metrics.read_text().splitlines()) if "round" in row}
    pick = random.Random(seed)
    for round_ in ROUNDS:
        traces = rows[round_]["v_hat_sq_norms"]
        monotone = sum(all(b >= a for a, b in zip(trace, trace[1:])) for trace in traces.values())
        growth = {client: trace[-1] / trace[0] for client, trace in traces.items()}
        ordered = sorted(growth.values())
        two = pick.sample(sorted(traces, key=int), 2)
        print(f"| {seed} | {round_} | {len(traces)} | {monotone}/{len(traces)} | {ordered[0]:.3g} / "
              f"{statistics.median(ordered):.3g} / {ordered[-1]:.3g} | {ordered[-1] / ordered[0]:.3g} | "
              f"{', '.join(f'client {c}: {growth[c]:.3g}' for c in two)} | "
              f"{statistics.median(trace[0] for trace in traces.values()):.3g} |")
