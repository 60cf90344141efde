"""E1 (the paper's Fig. 2): how a partition spreads each class over the clients, drawn from the
partition.csv files that runs write (one panel per file, a dot per client and class, its area
proportional to the client's sample count of that class).

    rayfed run experiments/fedlalr/e2_cifar10_dir0.6.yaml train.rounds=1 --out runs/e1_06
    rayfed run experiments/fedlalr/e2_cifar10_dir0.3.yaml train.rounds=1 --out runs/e1_03
    python experiments/fedlalr/plot_partition.py runs/e1_06/partition.csv runs/e1_03/partition.csv \\
        --titles "Dir 0.6" "Dir 0.3" --out fig2.png
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# The largest dot's area in points^2; the others scale with their counts.
LARGEST_DOT = 60.0


def read_histogram(path: Path) -> np.ndarray:
    """The (clients, classes) sample counts of a partition.csv."""
    with path.open(newline="") as file:
        rows = list(csv.reader(file))
    header, body = rows[0], rows[1:]
    if header[:2] != ["client_id", "num_samples"] or not body:
        raise ValueError(f"{path} is not a rayfed partition.csv (client_id,num_samples,class_0,...)")
    return np.array([[int(value) for value in row[2:]] for row in body])


def plot(histograms: list[np.ndarray], titles: list[str], out: Path) -> None:
    figure, axes = plt.subplots(1, len(histograms), figsize=(6 * len(histograms), 4), squeeze=False)
    largest = max(int(histogram.max()) for histogram in histograms)
    for axis, histogram, title in zip(axes[0], histograms, titles):
        clients, classes = np.nonzero(histogram)
        axis.scatter(clients, classes, s=LARGEST_DOT * histogram[clients, classes] / largest, color="tab:red")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("client")
        axis.set_ylabel("class")
        axis.set_title(title)
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", type=Path, help="partition.csv files of runs")
    parser.add_argument("--titles", nargs="+", help="one panel title per file (default: the file's folder)")
    parser.add_argument("--out", type=Path, default=Path("partition.png"))
    args = parser.parse_args(argv)
    titles = args.titles or [path.parent.name for path in args.csv]
    if len(titles) != len(args.csv):
        print(f"plot_partition: {len(titles)} titles for {len(args.csv)} files", file=sys.stderr)
        return 2
    try:
        histograms = [read_histogram(path) for path in args.csv]
    except (OSError, ValueError) as error:
        print(f"plot_partition: {error}", file=sys.stderr)
        return 2
    plot(histograms, titles, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
