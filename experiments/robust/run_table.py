"""The mimic-attack table of Karimireddy, He, Jaggi (ICLR 2022, arXiv:2006.09365) on mnist_5k, and its
no-attack control: every (rule, split, bucketing, seed) run of mnist5k_mimic.yaml, two at a time, each
kept once it has written its summary.json (run again, the script continues); then results/mnist5k_mimic.md.

A cell is, as in the authors' exp2.py, each seed's mean test accuracy over its last 5 evaluations (every 30
rounds: rounds 480-600), then mean and sample standard deviation over the seeds. The rules take the
authors' parameters: Krum f = 5, RFA (geometric_median) 8 Weiszfeld steps with nu = 0.1, centered clipping
3 iterations with tau = 10, both in units of gradients: rayfed's rules see model changes, -lr x gradient
(lr_local = 0.01, one step), so nu = 0.001 and tau = 0.1 here (Krum and the median are scale-free);
bucketing s = 2.

    python experiments/robust/run_table.py [--seeds 0 1 2] [--out sweeps/robust] [--workers 2]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from runs import spread, study_main  # noqa: E402  (experiments/runs.py)

BASE = HERE / "mnist5k_mimic.yaml"
RULES = {
    "mean": [],
    "krum": ["aggregation.rule=krum", "aggregation.num_byzantine=5"],
    "median": ["aggregation.rule=median"],
    "geometric_median": ["aggregation.rule=geometric_median", "aggregation.iterations=8", "aggregation.smoothing=0.001",
                         "aggregation.tolerance=0"],
    "centered_clipping": ["aggregation.rule=centered_clipping", "aggregation.clip_radius=0.1",
                          "aggregation.iterations=3"],
}
SPLITS = {"noniid": [], "iid": ["data.partition=iid"]}
# The authors' numbers (outputs/exp2/all/output/exp2.tex and exp2_bucketing.tex of
# github.com/epfml/byzantine-robust-noniid-optimizer): (split, bucketing) -> rule -> (mean, std) over 3 seeds.
PAPER = {
    ("iid", 1): {"mean": (93.20, 0.21), "krum": (90.36, 0.25), "median": (90.80, 0.12),
                 "geometric_median": (92.92, 0.25), "centered_clipping": (93.16, 0.22)},
    ("noniid", 1): {"mean": (92.73, 0.32), "krum": (37.33, 6.78), "median": (64.27, 3.70),
                    "geometric_median": (78.93, 9.27), "centered_clipping": (91.53, 0.06)},
    ("iid", 2): {"mean": (93.17, 0.23), "krum": (91.64, 0.30), "median": (91.91, 0.24),
                 "geometric_median": (93.00, 0.23), "centered_clipping": (93.17, 0.23)},
    ("noniid", 2): {"mean": (92.67, 0.27), "krum": (53.15, 3.96), "median": (78.60, 3.15),
                    "geometric_median": (91.17, 0.51), "centered_clipping": (92.56, 0.21)},
}
NAMES = {"mean": "Avg (mean)", "krum": "Krum", "median": "CM (median)", "geometric_median": "RFA (geometric_median)",
         "centered_clipping": "CClip (centered_clipping)"}


def runs(seeds: list[int]) -> list[tuple[str, list[str]]]:
    """(name, overrides) of every run: the table's cells under attack, and without adversaries (control)."""
    found = []
    # Non-IID first, under attack and without (the control), then IID under attack.
    for attacked, split in ((True, "noniid"), (False, "noniid"), (True, "iid")):
        for bucket in (1, 2):
            for rule, keys in RULES.items():
                if bucket > 1 and rule == "mean":
                    continue            # the mean of bucket means is the mean (rayfed refuses it)
                for seed in seeds:
                    name = f"{'mimic' if attacked else 'none'}/{split}/s{bucket}/{rule}/seed{seed}"
                    found.append((name, [*keys, *SPLITS[split], f"seed={seed}",
                                         *([f"aggregation.bucket_size={bucket}"] if bucket > 1 else []),
                                         *([] if attacked else ["adversary.attack=none", "adversary.clients=[]"])]))
    return found


def cell(out: Path, name: str) -> float | None:
    """The seed's mean test accuracy (%) over its last 5 evaluations."""
    path = out / name / "metrics.jsonl"
    if not (out / name / "summary.json").exists():
        return None
    evaluated = [json.loads(line)["test_accuracy"] for line in path.read_text().splitlines()
                 if "test_accuracy" in json.loads(line)]
    return 100 * statistics.fmean(evaluated[-5:])


def table(out: Path, seeds: list[int]) -> str:
    lines = []
    for attacked in ("mimic", "none"):
        for split in SPLITS:
            if attacked == "none" and split == "iid":
                continue
            for bucket in (1, 2):
                title = (f"{'mimic attack, f = 5 of n = 25' if attacked == 'mimic' else 'no attack (control), n = 25'}"
                         f", {'IID' if split == 'iid' else 'non-IID'}, {'no bucketing' if bucket == 1 else 'bucketing s = 2'}")
                lines += ["", f"### {title}", "", "| rule | paper (MNIST, CNN) | here (mnist_5k, MLP) | per seed "
                          f"({', '.join(map(str, seeds))}) |", "|---|---|---|---|"]
                for rule in RULES:
                    if bucket > 1 and rule == "mean":
                        continue
                    values = [cell(out, f"{attacked}/{split}/s{bucket}/{rule}/seed{seed}") for seed in seeds]
                    done = [value for value in values if value is not None]
                    ours = spread(done) if done else "not run"
                    paper = PAPER[(split, bucket)][rule] if attacked == "mimic" else None
                    lines.append(f"| {NAMES[rule]} | {'—' if paper is None else f'{paper[0]:.2f} ± {paper[1]:.2f}'} "
                                 f"| {ours} | {', '.join('—' if v is None else f'{v:.2f}' for v in values)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return study_main(__doc__.splitlines()[0], BASE, runs, table, Path("sweeps/robust"), 2,
                      HERE / "results" / "mnist5k_mimic.md", argv)


if __name__ == "__main__":
    sys.exit(main())
