"""Splitting training-sample indices among clients: natural, iid, Dirichlet and shards."""
from dataclasses import dataclass
import pathlib

import numpy as np

from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng

PARTITIONS = ("natural", "iid", "dirichlet", "shards")
IID_MIN_PER_CLIENT = 1
DIRICHLET_MIN_PER_CLIENT = 2


@dataclass(frozen=True)
class Partition:
    """Client i owns indices[offsets[i]:offsets[i+1]]; one flat array keeps 1000+ clients cheap to ship."""
    indices: np.ndarray
    offsets: np.ndarray

    def client(self, client_id: int) -> np.ndarray:
        return self.indices[self.offsets[client_id]:self.offsets[client_id + 1]]

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, per_client: list[np.ndarray]) -> "Partition":
        sizes = np.array([len(indices) for indices in per_client], dtype=np.int64)
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
        indices = np.concatenate([np.empty(0, dtype=np.int64),
                                  *(np.asarray(part, dtype=np.int64) for part in per_client)])
        return cls(indices=indices, offsets=offsets)


def partition_iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> Partition:
    """A random permutation cut into near-equal parts (the first num_samples % num_clients get one more)."""
    base, remainder = divmod(num_samples, num_clients)
    sizes = np.full(num_clients, base, dtype=np.int64)
    sizes[:remainder] += 1
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
    return Partition(indices=rng.permutation(num_samples).astype(np.int64), offsets=offsets)


def partition_dirichlet(labels: np.ndarray, num_classes: int, num_clients: int, alpha: float,
                        rng: np.random.Generator, min_per_client: int = DIRICHLET_MIN_PER_CLIENT) -> Partition:
    """The authors' strict per-class Dirichlet split, with a minimum of min_per_client samples per client.

    Each class k is shared over clients by q_k ~ Dir(alpha 1_N). Before that, every client is
    handed min_per_client samples of random classes, so no client is left empty even at tiny alpha.
    """
    labels = np.asarray(labels)
    # Generator.dirichlet switches to stick-breaking for small alpha, so rows are exact zeros
    # and ones rather than 0/0 NaN.
    class_shares = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)
    pools = [np.flatnonzero(labels == k).tolist() for k in range(num_classes)]
    per_client: list[list[int]] = [[] for _ in range(num_clients)]

    for _ in range(min_per_client):
        for client_id in range(num_clients):
            class_id = int(rng.integers(num_classes))
            while not pools[class_id]:
                class_id = int(rng.integers(num_classes))
            per_client[client_id].append(pools[class_id].pop())

    for class_id, pool in enumerate(pools):
        shuffled = rng.permutation(np.array(pool, dtype=np.int64))
        cuts = np.floor(np.cumsum(class_shares[class_id])[:-1] * len(shuffled)).astype(np.int64)
        for client_id, chunk in enumerate(np.split(shuffled, cuts)):
            per_client[client_id].extend(chunk.tolist())

    return Partition.from_lists([rng.permutation(np.array(indices, dtype=np.int64)) for indices in per_client])


def partition_shards(labels: np.ndarray, num_clients: int, shards_per_client: int,
                     rng: np.random.Generator) -> Partition:
    """McMahan et al.: label-sorted samples cut into shards, each client gets shards_per_client random ones."""
    by_label = np.argsort(np.asarray(labels), kind="stable").astype(np.int64)
    shards = np.array_split(by_label, num_clients * shards_per_client)
    shard_order = rng.permutation(len(shards))
    return Partition.from_lists([
        np.concatenate([shards[shard_id] for shard_id in shard_order[start:start + shards_per_client]])
        for start in range(0, len(shards), shards_per_client)
    ])


def make_partition(kind: str, labels: np.ndarray, num_classes: int, num_clients: int, seed: int, *,
                   alpha: float = 0.1, shards_per_client: int = 2, natural: Partition | None = None) -> Partition:
    """Check the request is feasible (ConfigError otherwise), then partition with the PARTITION stream."""
    num_samples = len(labels)
    if kind not in PARTITIONS:
        raise ConfigError(f"data.partition={kind!r} is not one of {', '.join(PARTITIONS)}")
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients} must be at least 1")

    if kind == "natural":
        if natural is None:
            raise ConfigError("data.partition=natural is only available for the synthetic dataset")
        if natural.num_clients != num_clients:
            raise ConfigError(f"data.num_clients={num_clients} differs from the {natural.num_clients} clients "
                              "the dataset was generated with; regenerate it with the same number")
        return natural

    rng = numpy_rng(seed, Purpose.PARTITION)
    if kind == "iid":
        _require_samples_per_client(num_samples, num_clients, IID_MIN_PER_CLIENT)
        return partition_iid(num_samples, num_clients, rng)
    if kind == "dirichlet":
        if not alpha > 0:
            raise ConfigError(f"data.alpha={alpha} must be a positive number")
        _require_samples_per_client(num_samples, num_clients, DIRICHLET_MIN_PER_CLIENT)
        return partition_dirichlet(labels, num_classes, num_clients, alpha, rng)

    if shards_per_client < 1:
        raise ConfigError(f"data.shards_per_client={shards_per_client} must be at least 1")
    if num_clients * shards_per_client > num_samples:
        raise ConfigError(f"data.shards_per_client={shards_per_client} with data.num_clients={num_clients} asks for "
                          f"{num_clients * shards_per_client} shards but there are only {num_samples} training "
                          "samples; lower one of them")
    return partition_shards(labels, num_clients, shards_per_client, rng)


def _require_samples_per_client(num_samples: int, num_clients: int, min_per_client: int) -> None:
    if num_samples < num_clients * min_per_client:
        raise ConfigError(f"data.num_clients={num_clients} is too many for {num_samples} training samples "
                          f"(each client needs at least {min_per_client}); use at most "
                          f"{num_samples // min_per_client} clients")


def class_histogram(partition: Partition, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) int64 sample counts."""
    client_of_sample = np.repeat(np.arange(partition.num_clients, dtype=np.int64), partition.sizes)
    flat_cell = client_of_sample * num_classes + np.asarray(labels, dtype=np.int64)[partition.indices]
    counts = np.bincount(flat_cell, minlength=partition.num_clients * num_classes)
    return counts.reshape(partition.num_clients, num_classes).astype(np.int64)


def write_histogram_csv(path: str | pathlib.Path, histogram: np.ndarray) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    num_classes = histogram.shape[1]
    lines = ["client_id,num_samples," + ",".join(f"class_{k}" for k in range(num_classes))]
    for client_id, counts in enumerate(histogram):
        lines.append(",".join(str(int(value)) for value in (client_id, counts.sum(), *counts)))
    path.write_text("\n".join(lines) + "\n")
