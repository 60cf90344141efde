"""FedCOM's heterogeneity heatmap (arXiv:2007.01154, Sec. B.2, eq. (7), Fig. 7): the cosine
similarity d_ij = g_i.g_j / (|g_i| |g_j|) between the full-batch gradients g_i of clients i and j,
all taken at one shared model, for a heterogeneous split (the scenario's own: 2 label-sorted
shards a client in digits.yaml) against an IID one.

    python experiments/fedcom/similarity.py experiments/fedcom/digits.yaml --seeds 3 --rounds 0 10 \\
        --out runs/fedcom --results experiments/fedcom/results

The shared models are the global models of a FedAvg run of the scenario after each of --rounds
(round 0: the initial model); the paper does not say which model it used. Each client's gradient
is that of its mean cross-entropy over all its training samples, the data and split being the
run's own (rayfed.api.load_data). Writes RESULTS/<scenario>_similarity.json (every matrix),
.md (per seed: the mean off-diagonal d_ij, each client's count of others above --high and below 0)
and .png (seed 0's heatmaps).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import rayfed
from rayfed.api import load_data

PARTITIONS = ("shards", "iid")


class GlobalModels(rayfed.Callback):
    """The global model at the start (round 0) and after each of `rounds`; stops after the last."""

    def __init__(self, rounds: list[int]):
        self.rounds = sorted(rounds)
        self.models: dict[int, torch.nn.Module] = {}

    def on_run_start(self, run):
        if 0 in self.rounds:
            self.models[0] = run.global_model()

    def on_round_end(self, run, record):
        if record["round"] in self.rounds:
            self.models[record["round"]] = run.global_model()
        if len(self.models) == len(self.rounds):
            return rayfed.Stop(f"global models of rounds {self.rounds} taken")
        return None


def full_gradient(model: torch.nn.Module, inputs: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    model.zero_grad()
    loss = F.cross_entropy(model(torch.from_numpy(inputs)), torch.from_numpy(labels).long())
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()


def cosines(gradients: torch.Tensor) -> np.ndarray:
    unit = gradients / gradients.norm(dim=1, keepdim=True)
    return (unit @ unit.T).numpy()


def describe(matrix: np.ndarray, high: float) -> dict:
    off = ~np.eye(len(matrix), dtype=bool)
    above = [(row[mask] >= high).sum() for row, mask in zip(matrix, off)]
    negative = [(row[mask] < 0).sum() for row, mask in zip(matrix, off)]
    return {"mean_off_diagonal": float(matrix[off].mean()), "min_off_diagonal": float(matrix[off].min()),
            "fraction_negative": float((matrix[off] < 0).mean()),
            "others_at_least_high": [int(a) for a in above], "others_negative": [int(n) for n in negative]}


def shared_classes(partition, labels: np.ndarray) -> list[int]:
    """For each client, how many other clients hold a class it holds."""
    classes = [set(np.unique(labels[partition.client(i)]).tolist()) for i in range(partition.num_clients)]
    return [sum(1 for j, other in enumerate(classes) if j != i and mine & other) for i, mine in enumerate(classes)]


def plot(matrices: dict, rounds: list[int], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(len(PARTITIONS), len(rounds), figsize=(4.2 * len(rounds), 3.8 * len(PARTITIONS)),
                                squeeze=False)
    for row, partition in enumerate(PARTITIONS):
        for column, round_ in enumerate(rounds):
            image = axes[row][column].imshow(matrices[partition][round_], vmin=-1, vmax=1, cmap="RdBu_r")
            axes[row][column].set_title(f"{partition}, model after round {round_}", fontsize=9)
            axes[row][column].set_xlabel("client j")
            axes[row][column].set_ylabel("client i")
            figure.colorbar(image, ax=axes[row][column], fraction=0.046)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, nargs="+", default=[0, 10])
    parser.add_argument("--high", type=float, default=0.5, help="d_ij counted as a high correlation")
    parser.add_argument("--out", type=Path, default=Path("runs/fedcom"))
    parser.add_argument("--results", type=Path, default=Path("experiments/fedcom/results"))
    args = parser.parse_args(argv)
    rows, seed0 = [], {}
    for partition in PARTITIONS:
        for seed in range(args.seeds):
            config = rayfed.load_config(str(args.scenario), ["algorithm.name=fedavg", f"data.partition={partition}",
                                                             f"seed={seed}", "train.eval_train_loss=false"])
            dataset, split = load_data(config)
            taken = GlobalModels(args.rounds)
            run_dir = args.out / f"{args.scenario.stem}_similarity" / partition / f"seed{seed}"
            if run_dir.exists():
                for path in sorted(run_dir.iterdir()):
                    path.unlink()
            rayfed.run(config, run_dir=run_dir, progress=False, callbacks=[taken])
            for round_, model in sorted(taken.models.items()):
                gradients = torch.stack([full_gradient(model, dataset.train_x[split.client(i)],
                                                       dataset.train_y[split.client(i)])
                                         for i in range(split.num_clients)])
                matrix = cosines(gradients)
                rows.append({"partition": partition, "seed": seed, "round": round_,
                             "clients_sharing_a_class": shared_classes(split, dataset.train_y),
                             **describe(matrix, args.high), "matrix": matrix.round(6).tolist()})
                if seed == 0:
                    seed0.setdefault(partition, {})[round_] = matrix
            print(f"{partition} seed {seed}: done", file=sys.stderr)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"{args.scenario.stem}_similarity"
    plot(seed0, sorted(args.rounds), stem.with_suffix(".png"))
    lines = [f"| split | seed | model after round | mean d_ij (i ≠ j) | min d_ij | share of d_ij < 0 | "
             f"per client: others with d_ij ≥ {args.high:g}, max / median | per client: others with d_ij < 0, "
             f"median | per client: others sharing a class, max |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['partition']} | {row['seed']} | {row['round']} | {row['mean_off_diagonal']:.3f} | "
                     f"{row['min_off_diagonal']:.3f} | {row['fraction_negative']:.2f} | "
                     f"{max(row['others_at_least_high'])} / {np.median(row['others_at_least_high']):g} | "
                     f"{np.median(row['others_negative']):g} | {max(row['clients_sharing_a_class'])} |")
    text = "\n".join(lines)
    print(text)
    stem.with_suffix(".md").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"scenario": str(args.scenario), "seeds": args.seeds,
                                                     "rounds": args.rounds, "high": args.high, "rows": rows},
                                                    indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
