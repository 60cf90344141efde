"""Writes the stage-2 sweep files (sweeps/final/SCENARIO_METHOD.yaml) from the stage-1 selections:
each method at the learning rates `rayfed sweep --select best_test_accuracy` picked on seed 0, run
on the held-out seeds 1, 2, 3, with every other hyper-parameter spelled out (FedLALR's paper, arXiv:2309.09719,
Sec. V-A, CIFAR-10 values). From the repository root, after stage 1:
    python experiments/fedlalr/make_final_sweeps.py synthetic /tmp/fedlalr_sweeps
"""
import pathlib
import sys

import yaml

HERE = pathlib.Path(__file__).parent
FAMILIES = ("fedavg", "local_adaptive", "server_adaptive", "lafedopt", "server_adaptive_extra")
# The hyper-parameters that are not tuned (they are the algorithms' defaults too).
FIXED = {
    "fedavg": {},
    "fedlalr": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1.0e-8},
    "local_amsgrad": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1.0e-8},
    "fedadam": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},
    "fedyogi": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},
    "fedadagrad": {"algorithm.beta1": 0.0, "algorithm.tau": 0.01},
    "fedams_v1": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 1.0e-4},
    "fedams_v2": {"algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 1.0e-2},
    "lafedopt": {"algorithm.beta1": 0.8, "algorithm.beta2": 0.999, "algorithm.eps": 1.0e-4},
}
TUNED = ("algorithm.lr_local", "algorithm.lr_global")


def selections(path: pathlib.Path):
    rows = [line.strip("|").split("|") for line in path.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0]]
    for row in rows[2:]:
        yield dict(zip(header, (cell.strip() for cell in row)))


scenario, sweeps = sys.argv[1], pathlib.Path(sys.argv[2])
(HERE / "sweeps" / "final").mkdir(parents=True, exist_ok=True)
for family in FAMILIES:
    selection = sweeps / f"tune_{scenario}_{family}" / "selection.md"
    if not selection.is_file():
        continue
    for row in selections(selection):
        method = row["algorithm.name"]
        tuned = {key: yaml.safe_load(row[key]) for key in TUNED if key in row}
        grid = {"algorithm.name": method, **tuned, **FIXED[method]}
        lines = [f"# Stage 2 of 2: {method} on the {scenario} scenario (experiments/fedlalr/{scenario}.yaml) at the",
                 f"# learning rates stage 1 picked on seed 0 (sweeps/tune/{scenario}_{family}.yaml, --select",
                 "# best_test_accuracy), run on the held-out seeds 1, 2, 3. Written by make_final_sweeps.py. Run:",
                 f"#   rayfed sweep experiments/fedlalr/sweeps/final/{scenario}_{method}.yaml --out "
                 f"/tmp/fedlalr_sweeps/final_{scenario}_{method}",
                 f"base: experiments/fedlalr/{scenario}.yaml", "grid:"]
        lines += [f"  {key}: {yaml.safe_dump([value], default_flow_style=True).strip()}" for key, value in grid.items()]
        lines.append("  seed: [1, 2, 3]")
        out = HERE / "sweeps" / "final" / f"{scenario}_{method}.yaml"
        out.write_text("\n".join(lines) + "\n")
        print(out, tuned)
