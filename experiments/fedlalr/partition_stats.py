"""E1 (the paper's Fig. 2, arXiv:2309.09719, Sec. V-A and V-D "Heterogeneity"): how many labels a client has
under data.partition=feddyn with concentration 0.6 and 0.3, 100 clients, on label vectors with CIFAR-10's and
CIFAR-100's class counts (5,000 x 10 and 500 x 100, shuffled; the partition reads only the labels, so the files
are not needed). The paper: a lower concentration means "the data assigned to each client may encompass fewer
labels". Per case and seed, over the 100 clients: the median number of classes a client has at all, and the
median number of its largest classes that make up 90% of its samples.
    python experiments/fedlalr/partition_stats.py > experiments/fedlalr/results/claims/partition.md
"""
import statistics

import numpy as np

from rayfed.data.partition import make_partition

SEEDS = (0, 1, 2)

print("| labels | concentration | seed | classes a client has, median (min-max) | classes for 90% of a client, median "
      "(min-max) |")
print("|---|---|---|---|---|")
for name, classes, per_class in (("CIFAR-10's", 10, 5000), ("CIFAR-100's", 100, 500)):
    for alpha in (0.6, 0.3):
        for seed in SEEDS:
            labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))
            partition = make_partition("feddyn", labels, classes, 100, seed, alpha=alpha)
            held, cover = [], []
            for client in range(partition.num_clients):
                counts = np.sort(np.bincount(labels[partition.client(client)], minlength=classes))[::-1]
                held.append(int((counts > 0).sum()))
                cover.append(int(np.searchsorted(np.cumsum(counts), 0.9 * counts.sum()) + 1))
            print(f"| {name} | {alpha} | {seed} | {statistics.median(held):g} ({min(held)}-{max(held)}) "
                  f"| {statistics.median(cover):g} ({min(cover)}-{max(cover)}) |")
