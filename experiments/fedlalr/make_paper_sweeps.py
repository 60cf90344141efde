"""Writes sweeps/paper/*.yaml: the paper's experiments E2-E6 as sweep files, one per scenario file (e2_*.yaml ...
e6_*.yaml), each crossing the methods the paper runs there with the paper's hyper-parameters (hparams.py's TABLE,
arXiv:2309.09719, Sec. V-A) and seeds 0, 1, 2 (the paper states no seeds; three are chosen here). E2-E4: the six
methods of Fig. 3 (Fig. 5's are not listed; the same six, chosen here); E5 (Fig. 6) and E6 (Fig. 7): FedLALR. They
need the CIFAR-10/100 or LEAF Shakespeare files and a GPU; see README.md for `--plan`'s estimate. From the
repository root:
    python experiments/fedlalr/make_paper_sweeps.py
"""
import pathlib

import yaml

from hparams import TABLE

HERE = pathlib.Path(__file__).parent
PAPER_METHODS = ("fedavg", "fedadam", "fedams_v1", "fedams_v2", "lafedopt", "fedlalr")
SEEDS = [0, 1, 2]


def dataset(scenario: str) -> str:
    return next(name for name in ("cifar100", "cifar10", "shakespeare") if name in scenario)


(HERE / "sweeps" / "paper").mkdir(parents=True, exist_ok=True)
for scenario in sorted(HERE.glob("e[2-6]_*.yaml")):
    methods = ("fedlalr",) if scenario.name.startswith(("e5_", "e6_")) else PAPER_METHODS
    table = TABLE[dataset(scenario.name)]
    out = HERE / "sweeps" / "paper" / scenario.name
    lines = [f"# {scenario.stem} (see its comments): {', '.join(methods)}",
             "# at hparams.py's values (the paper's, arXiv:2309.09719, Sec. V-A, but for those hparams.py marks [D]),",
             "# seeds 0, 1, 2 (chosen here). Written by make_paper_sweeps.py; needs the dataset files and a GPU. Run:",
             f"#   rayfed sweep experiments/fedlalr/sweeps/paper/{scenario.name} \\",
             f"#       --out sweeps/fedlalr_{scenario.stem}",
             f"base: experiments/fedlalr/{scenario.name}", "grid:", "  algorithm:"]
    for method in methods:
        # e6 fixes FedLALR's values in its algorithm section; the sweep repeats the same values.
        values = {key.split(".", 1)[1]: value for key, value in table[method].items()}
        lines.append(f"    - {yaml.safe_dump(values, default_flow_style=True, sort_keys=False, width=1000).strip()}")
    lines.append(f"  seed: {SEEDS}")
    out.write_text("\n".join(lines) + "\n")
    print(out)
