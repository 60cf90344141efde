"""Splitting training-sample indices among clients: natural, iid, three Dirichlet schemes, shards and FedMoS's."""
from dataclasses import dataclass
import pathlib

import numpy as np

from rayfed.errors import ConfigError
from rayfed.registry import PARTITIONERS
from rayfed.seeding import Purpose, numpy_rng

IID_MIN_PER_CLIENT = 1
DIRICHLET_MIN_PER_CLIENT = 2
MOON_MIN_PER_CLIENT = 10   # MOON's min_require_size
MOON_MAX_ATTEMPTS = 1000
# FedMoS (Wang et al., INFOCOM 2023, Sec. V-A, and the authors' sampling code). Two-class rule (MNIST and other 10-class
# data): D_i in [10, 50] samples, n_1 in [2, D_i - 1] of the first class, the rest of the second.
FEDMOS_CLASSES = 10
FEDMOS_MIN_SIZE, FEDMOS_MAX_SIZE = 10, 50
FEDMOS_MIN_FIRST_CLASS = 2
# CIFAR rule: fixed client sizes (count x size, clients in this order), D_i / 5 from each of 5 classes.
# cifar10_random stands in for CIFAR-10 in timing runs, so it gets the same clients.
FEDMOS_CIFAR_DATASETS = ("cifar10", "cifar10_random")
FEDMOS_CIFAR_SIZES = ((50, 200), (100, 150), (150, 100), (150, 50), (50, 20))
FEDMOS_CIFAR_CLIENTS = sum(count for count, _ in FEDMOS_CIFAR_SIZES)   # 500, holding 48,500 samples
FEDMOS_CIFAR_CLASSES_PER_CLIENT = 5


@dataclass(frozen=True)
class Partition:
    """Client i owns indices[offsets[i]:offsets[i+1]]; one flat array keeps 1000+ clients cheap to ship."""
    indices: np.ndarray
    """Every client's training-sample indices, client after client (int64)."""
    offsets: np.ndarray
    """N + 1 positions in `indices`: client i's start, and the end (int64, from 0)."""

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


def partition_feddyn(labels: np.ndarray, num_classes: int, num_clients: int, alpha: float,
                     rng: np.random.Generator) -> Partition:
    """FedDyn's balanced Dirichlet split (as FedLALR, arXiv:2309.09719, Sec. V-A, uses it): every client gets floor(n / N) samples.

    Each client i has a label prior prior_i ~ Dir(alpha 1_C). Sequentially, a uniformly random client
    that is not yet full receives one unused sample of a class drawn from its prior, redrawn while
    that class is exhausted. The n - N floor(n / N) leftover samples go to nobody, as in FedDyn.
    """
    labels = np.asarray(labels)
    per_client = len(labels) // num_clients
    priors = rng.dirichlet(np.full(num_classes, alpha), size=num_clients)
    # Samples of each class are handed out in this random order.
    class_pools = [rng.permutation(np.flatnonzero(labels == k)).astype(np.int64) for k in range(num_classes)]
    class_left = np.array([len(pool) for pool in class_pools], dtype=np.int64)
    clients, classes = feddyn_handouts(priors, class_left, per_client, rng)

    # The r-th handout of class k is the r-th sample of that class's shuffled pool.
    by_class = np.argsort(classes, kind="stable")
    class_starts = np.concatenate([[0], np.cumsum(np.bincount(classes, minlength=num_classes))])
    rank = np.empty(len(classes), dtype=np.int64)
    rank[by_class] = np.arange(len(classes)) - class_starts[classes[by_class]]
    flat_pools = np.concatenate([np.empty(0, dtype=np.int64), *class_pools])
    pool_starts = np.concatenate([[0], np.cumsum([len(pool) for pool in class_pools])])
    samples = flat_pools[pool_starts[classes] + rank]

    by_client = np.argsort(clients, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(clients, minlength=num_clients))]).astype(np.int64)
    return Partition(indices=samples[by_client], offsets=offsets)


def feddyn_handouts(priors: np.ndarray, class_counts: np.ndarray, per_client: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(client, class) of each handout of FedDyn's sequential loop, in order.

    Rather than one Python step per sample, steps are drawn in chunks from the state at the start of
    the chunk, and the chunk is accepted up to and including the first step that fills a client or
    exhausts a class. Until that step the state the pseudocode consults (which clients are full,
    which classes are left) is the chunk's starting state, so each accepted step has exactly the
    pseudocode's law: picking a uniform client and skipping full ones is a uniform pick among the
    non-full, and redrawing c ~ prior_i until c is left is a draw from prior_i restricted to the
    classes left. The discarded tail is fresh randomness, so dropping it biases nothing. Each chunk
    ends at a client filling or a class running out, hence at most N + C chunks.
    """
    num_clients, num_classes = priors.shape
    class_left = np.array(class_counts, dtype=np.int64)
    room = np.full(num_clients, per_client, dtype=np.int64)
    given_clients, given_classes = [], []
    while room.sum() > 0:
        open_clients = np.flatnonzero(room > 0)
        weights = priors * (class_left > 0)
        # Where a prior puts no mass on the classes left (exact zeros from Generator.dirichlet's
        # stick-breaking at small alpha), the pseudocode would redraw forever; any class left is
        # taken uniformly instead.
        stuck = weights.sum(axis=1) == 0
        weights[stuck] = class_left > 0
        clients = open_clients[rng.integers(len(open_clients), size=int(room.sum()))]
        classes = _categorical_rows(weights, clients, rng)

        ends = [_position_of_nth(clients, room, num_clients), _position_of_nth(classes, class_left, num_classes)]
        accepted = min(end for end in ends if end is not None) + 1
        clients, classes = clients[:accepted], classes[:accepted]
        room -= np.bincount(clients, minlength=num_clients)
        class_left -= np.bincount(classes, minlength=num_classes)
        given_clients.append(clients)
        given_classes.append(classes)
    return (np.concatenate([np.empty(0, dtype=np.int64), *given_clients]),
            np.concatenate([np.empty(0, dtype=np.int64), *given_classes]))


def _categorical_rows(weights: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw from Categorical(weights[r] / weights[r].sum()) for each r in rows, all in one search.

    Row r's normalised CDF, shifted by r, makes one increasing array over all rows.
    """
    num_rows, width = weights.shape
    cumulative = np.cumsum(weights, axis=1)
    cumulative /= cumulative[:, -1:]
    shifted = (cumulative + np.arange(num_rows)[:, None]).ravel()
    found = np.searchsorted(shifted, rows + rng.random(len(rows)), side="right") - rows * width
    # r + u can round up to r + 1 (u within 2^-53 of 1 for r >= 1); keep such a draw on a class
    # with mass rather than spilling into the next row.
    last_with_mass = width - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
    return np.minimum(found, last_with_mass[rows])


def _position_of_nth(values: np.ndarray, nth: np.ndarray, num_values: int) -> int | None:
    """Smallest position at which some value v occurs for the nth[v]-th time (nth[v] >= 1); None if none does."""
    counts = np.bincount(values, minlength=num_values)
    reached = np.flatnonzero((counts >= nth) & (nth > 0))
    if reached.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return int(order[starts[reached] + nth[reached] - 1].min())


def partition_moon(labels: np.ndarray, num_classes: int, num_clients: int, alpha: float,
                   rng: np.random.Generator) -> Partition | None:
    """MOON's per-class Dirichlet split with rebalancing; None if no draw gave every client 10 samples.

    For each class, p ~ Dir(alpha 1_N) is zeroed for clients already holding n / N or more samples,
    renormalised, and the shuffled class is cut at (cumsum(p) * size).astype(int)[:-1], as MOON's
    code does. The whole split is redrawn until every client has at least MOON_MIN_PER_CLIENT
    samples, at most MOON_MAX_ATTEMPTS times. Every training sample goes to exactly one client.
    """
    labels = np.asarray(labels)
    class_members = [np.flatnonzero(labels == k).astype(np.int64) for k in range(num_classes)]
    for _ in range(MOON_MAX_ATTEMPTS):
        drawn = _moon_attempt(class_members, num_clients, len(labels) / num_clients, alpha, rng)
        if drawn is not None and drawn[2].min() >= MOON_MIN_PER_CLIENT:
            samples, clients, sizes = drawn
            # MOON shuffles each client's samples, which would otherwise come grouped by class.
            order = np.lexsort((rng.random(len(samples)), clients))
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            return Partition(indices=samples[order], offsets=offsets)
    return None


def _moon_attempt(class_members: list[np.ndarray], num_clients: int, fair_share: float, alpha: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """One pass of MOON's split: (samples, their clients, client sizes), or None for a degenerate draw."""
    sizes = np.zeros(num_clients, dtype=np.int64)
    shuffled, owners = [], []
    for members in class_members:
        members = rng.permutation(members)
        shares = rng.dirichlet(np.full(num_clients, alpha)) * (sizes < fair_share)
        # MOON divides by zero here (and cuts at NaN) when the shares of every client with room
        # underflow to 0; such a draw is redrawn instead.
        if not shares.sum() > 0:
            return None
        shares /= shares.sum()
        cuts = (np.cumsum(shares) * len(members)).astype(np.int64)[:-1]
        counts = np.diff(np.concatenate([[0], cuts, [len(members)]]))
        sizes += counts
        shuffled.append(members)
        owners.append(np.repeat(np.arange(num_clients, dtype=np.int64), counts))
    return (np.concatenate([np.empty(0, dtype=np.int64), *shuffled]),
            np.concatenate([np.empty(0, dtype=np.int64), *owners]), sizes)


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


def partition_fedmos(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                     cifar: bool = False) -> Partition | int:
    """FedMoS's disjoint label-skewed split (Sec. V-A); the number of clients served if the data ran out.

    Client by client, in order, classes are chosen without replacement with probability proportional
    to their remaining pools (2 for the two-class rule, 5 for the CIFAR rule) and the client takes its
    share of each from that pool. Two-class rule: D_i ~ UniformInt[10, 50], n_1 ~ UniformInt[2, D_i - 1]
    of the first class chosen, n_2 = D_i - n_1 of the second. CIFAR rule: D_i from FEDMOS_CIFAR_SIZES,
    D_i / 5 of each class. Each class pool is shuffled once and handed out front to back, which draws
    without replacement from what is left. Samples not handed out go to nobody. A client's samples
    come grouped by class, first class first.
    """
    labels = np.asarray(labels)
    pools = [rng.permutation(np.flatnonzero(labels == k)).astype(np.int64) for k in range(FEDMOS_CLASSES)]
    pool_sizes = np.array([len(pool) for pool in pools], dtype=np.int64)
    remaining = pool_sizes.copy()
    if cifar:
        sizes = np.repeat([size for _, size in FEDMOS_CIFAR_SIZES], [count for count, _ in FEDMOS_CIFAR_SIZES])
        per_class = np.repeat(sizes[:, None] // FEDMOS_CIFAR_CLASSES_PER_CLIENT, FEDMOS_CIFAR_CLASSES_PER_CLIENT,
                              axis=1)
    else:
        # The sizes and splits do not depend on the pools, so all are drawn up front.
        sizes = rng.integers(FEDMOS_MIN_SIZE, FEDMOS_MAX_SIZE + 1, size=num_clients)
        first = rng.integers(FEDMOS_MIN_FIRST_CLASS, sizes)   # high is exclusive: n_1 <= D_i - 1
        per_class = np.stack([first, sizes - first], axis=1)
    classes_per_client = per_class.shape[1]

    chosen = np.empty((num_clients, classes_per_client), dtype=np.int64)
    taken_before = np.empty((num_clients, classes_per_client), dtype=np.int64)
    for client_id in range(num_clients):
        if np.count_nonzero(remaining) < classes_per_client:
            return client_id
        classes = rng.choice(FEDMOS_CLASSES, classes_per_client, replace=False, p=remaining / remaining.sum())
        if (remaining[classes] < per_class[client_id]).any():
            return client_id
        chosen[client_id] = classes
        taken_before[client_id] = pool_sizes[classes] - remaining[classes]
        remaining[classes] -= per_class[client_id]

    # Piece (client, j) is per_class[client, j] consecutive samples of chosen[client, j]'s shuffled pool.
    flat_pools = np.concatenate(pools)
    pool_starts = np.cumsum(pool_sizes) - pool_sizes
    counts = per_class.ravel()
    piece_starts = (pool_starts[chosen] + taken_before).ravel()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    position = np.arange(offsets[-1], dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return Partition(indices=flat_pools[np.repeat(piece_starts, counts) + position], offsets=offsets)


def check_fedmos_clients(dataset: str | None, num_clients: int) -> None:
    """The CIFAR rule's fixed size list is for exactly FEDMOS_CIFAR_CLIENTS clients."""
    if dataset in FEDMOS_CIFAR_DATASETS and num_clients != FEDMOS_CIFAR_CLIENTS:
        sizes = ", ".join(f"{count} x {size}" for count, size in FEDMOS_CIFAR_SIZES)
        raise ConfigError(f"data.partition=fedmos on data.dataset={dataset} gives {FEDMOS_CIFAR_CLIENTS} clients "
                          f"fixed sizes ({sizes}); set data.num_clients={FEDMOS_CIFAR_CLIENTS}, not {num_clients}")


@dataclass(frozen=True)
class PartitionRequest:
    """What a partitioner splits, and with what."""

    labels: np.ndarray
    """The training samples' labels, the samples to split."""
    num_classes: int
    """The dataset's classes."""
    num_clients: int
    """N (data.num_clients)."""
    rng: np.random.Generator
    """The stream to draw from: (seed, PARTITION)."""
    alpha: float = 0.1
    """data.alpha (the Dirichlet concentration)."""
    shards_per_client: int = 2
    """data.shards_per_client."""
    natural: Partition | None = None
    """The dataset's own split into clients; None where it has none."""
    dataset: str | None = None
    """The dataset's name (data.dataset)."""

    @property
    def num_samples(self) -> int:
        return len(self.labels)


def register_partitioner(name: str, *, check=None):
    """Registers a partitioner `(PartitionRequest) -> Partition` under `name` (rayfed.register_partitioner):
    data.partition then uses it. `check(data)`, given the config's data section, refuses a request it
    cannot satisfy before anything is loaded (ConfigError)."""
    def decorate(partitioner):
        if not callable(partitioner):
            raise ConfigError(f"register_partitioner({name!r}) takes a function (PartitionRequest) -> Partition")
        return PARTITIONERS.register(name, check=check)(partitioner)
    return decorate


def make_partition(kind: str, labels: np.ndarray, num_classes: int, num_clients: int, seed: int, *,
                   alpha: float = 0.1, shards_per_client: int = 2, natural: Partition | None = None,
                   dataset: str | None = None) -> Partition:
    """Check the request is feasible (ConfigError otherwise), then partition with the PARTITION stream.

    `dataset` (data.dataset) only matters to fedmos, whose rule for CIFAR-10 differs."""
    partitioner = PARTITIONERS.get(kind).target
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients} must be at least 1")
    return partitioner(PartitionRequest(labels, num_classes, num_clients, numpy_rng(seed, Purpose.PARTITION), alpha,
                                        shards_per_client, natural, dataset))


@register_partitioner("natural")
def _natural(request: PartitionRequest) -> Partition:
    """The dataset's own clients (Synthetic's generated ones, LEAF's roles and writers)."""
    if request.natural is None:
        raise ConfigError("data.partition=natural is only available for the synthetic dataset")
    if request.natural.num_clients != request.num_clients:
        raise ConfigError(f"data.num_clients={request.num_clients} differs from the {request.natural.num_clients} "
                          "clients the dataset was generated with; regenerate it with the same number")
    return request.natural


@register_partitioner("iid")
def _iid(request: PartitionRequest) -> Partition:
    _require_samples_per_client(request.num_samples, request.num_clients, IID_MIN_PER_CLIENT)
    return partition_iid(request.num_samples, request.num_clients, request.rng)


def _require_alpha(request: PartitionRequest) -> None:
    if not request.alpha > 0:
        raise ConfigError(f"data.alpha={request.alpha} must be a positive number")


@register_partitioner("dirichlet")
def _dirichlet(request: PartitionRequest) -> Partition:
    _require_alpha(request)
    _require_samples_per_client(request.num_samples, request.num_clients, DIRICHLET_MIN_PER_CLIENT)
    return partition_dirichlet(request.labels, request.num_classes, request.num_clients, request.alpha, request.rng)


@register_partitioner("feddyn")
def _feddyn(request: PartitionRequest) -> Partition:
    _require_alpha(request)
    _require_samples_per_client(request.num_samples, request.num_clients, 1)
    return partition_feddyn(request.labels, request.num_classes, request.num_clients, request.alpha, request.rng)


@register_partitioner("moon")
def _moon(request: PartitionRequest) -> Partition:
    _require_alpha(request)
    num_samples, num_clients, alpha = request.num_samples, request.num_clients, request.alpha
    if num_samples < num_clients * MOON_MIN_PER_CLIENT:
        raise ConfigError(f"data.num_clients={num_clients} is too many for {num_samples} training samples with "
                          f"data.partition=moon (each client needs at least {MOON_MIN_PER_CLIENT}, whatever "
                          f"data.alpha); use at most {num_samples // MOON_MIN_PER_CLIENT} clients")
    partition = partition_moon(request.labels, request.num_classes, num_clients, alpha, request.rng)
    if partition is None:
        raise ConfigError(f"data.partition=moon found no split giving each of data.num_clients={num_clients} "
                          f"clients at least {MOON_MIN_PER_CLIENT} samples in {MOON_MAX_ATTEMPTS} draws at "
                          f"data.alpha={alpha}; use fewer clients or a larger data.alpha")
    return partition


@register_partitioner("shards")
def _shards(request: PartitionRequest) -> Partition:
    num_samples, num_clients, shards_per_client = request.num_samples, request.num_clients, request.shards_per_client
    if shards_per_client < 1:
        raise ConfigError(f"data.shards_per_client={shards_per_client} must be at least 1")
    if num_clients * shards_per_client > num_samples:
        raise ConfigError(f"data.shards_per_client={shards_per_client} with data.num_clients={num_clients} asks for "
                          f"{num_clients * shards_per_client} shards but there are only {num_samples} training "
                          "samples; lower one of them")
    return partition_shards(request.labels, num_clients, shards_per_client, request.rng)


@register_partitioner("fedmos", check=lambda data: check_fedmos_clients(data.dataset, data.num_clients))
def _fedmos(request: PartitionRequest) -> Partition:
    """FedMoS's sampling (Wang et al., INFOCOM 2023, Section VII): two classes a client, or CIFAR's size list."""
    dataset, num_clients = request.dataset, request.num_clients
    if request.num_classes != FEDMOS_CLASSES:
        raise ConfigError(f"data.partition=fedmos is defined for 10-class datasets, not {request.num_classes} classes"
                          + (f" (data.dataset={dataset})" if dataset else "") + "; use dirichlet or shards")
    check_fedmos_clients(dataset, num_clients)
    partition = partition_fedmos(request.labels, num_clients, request.rng, cifar=dataset in FEDMOS_CIFAR_DATASETS)
    if isinstance(partition, int):
        raise ConfigError(f"data.partition=fedmos: the {request.num_samples} samples run out after client {partition} "
                          f"of {num_clients}; lower data.num_clients")
    return partition


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
