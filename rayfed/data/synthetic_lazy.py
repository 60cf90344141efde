"""FedProx's Synthetic(alpha, beta) with clients made on demand (rayfed.data.lazy): `synthetic_lazy`."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from rayfed.data.base import register_dataset
from rayfed.data.datasets import (SYNTHETIC_CLASSES, SYNTHETIC_DIMENSION, SYNTHETIC_FEATURE_STDS,
                                  SYNTHETIC_MIN_SAMPLES, SYNTHETIC_SIZE_LOG_MEAN, SYNTHETIC_SIZE_LOG_SIGMA,
                                  check_synthetic, synthetic_train_sizes)
from rayfed.data.lazy import LazyDataset
from rayfed.seeding import Purpose, derive_seed, numpy_rng
from rayfed.systems.counter_random import uniform

# Sub-streams of (seed, SYNTHETIC_DATA, *, client): each client's model and samples, and the test clients' draw.
CLIENT_STREAM = 1
TEST_CLIENTS_STREAM = 2
# Sizes are computed this many clients at a time: bounds the temporaries at any N.
SIZE_CHUNK = 1 << 16


@functools.lru_cache(maxsize=8)
def size_thresholds(max_samples: int) -> np.ndarray:
    """t_m = P(floor(lognormal(4, 2)) <= m) for m = 0 .. max_samples - 51: a uniform u gives the
    client floor(lognormal) = m, the number of t_m <= u, capped (as data.synthetic_max_samples caps
    it) where the table ends. Entries that round to 1 can never be reached and are left out."""
    thresholds = []
    for m in range(max(0, max_samples - SYNTHETIC_MIN_SAMPLES)):
        z = (math.log(m + 1) - SYNTHETIC_SIZE_LOG_MEAN) / SYNTHETIC_SIZE_LOG_SIGMA
        threshold = 0.5 * math.erfc(-z / math.sqrt(2))
        if threshold >= 1.0:
            break
        thresholds.append(threshold)
    return np.array(thresholds, dtype=np.float64)


@dataclass(frozen=True)
class SyntheticClients:
    """Synthetic(alpha, beta) clients, each made from its own streams: its size from a counter-based
    uniform of (seed, client), its model and samples from numpy_rng(seed, SYNTHETIC_DATA, 1, client).
    A few numbers, so the source costs nothing to ship; `client(k)` needs no other client."""

    seed: int
    num_clients: int
    alpha: float
    beta: float
    max_samples: int

    def total_sizes(self, client_ids: np.ndarray) -> np.ndarray:
        """Train + test samples of `client_ids` (int64), elementwise: the same for one client as for all."""
        thresholds = size_thresholds(self.max_samples)
        if self.max_samples <= SYNTHETIC_MIN_SAMPLES:
            return np.full(len(client_ids), self.max_samples, dtype=np.int64)
        draws = uniform(_size_key(self.seed), 0, np.asarray(client_ids, dtype=np.uint64), 0)
        return SYNTHETIC_MIN_SAMPLES + np.searchsorted(thresholds, draws, side="right").astype(np.int64)

    def sizes(self) -> np.ndarray:
        """Training samples of every client, as int32 (at N = 10^7: 40 MB)."""
        sizes = np.empty(self.num_clients, dtype=np.int32)
        for first in range(0, self.num_clients, SIZE_CHUNK):
            ids = np.arange(first, min(first + SIZE_CHUNK, self.num_clients), dtype=np.uint64)
            sizes[first:first + len(ids)] = synthetic_train_sizes(self.total_sizes(ids))
        return sizes

    def samples(self, client_id: int, size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All of the client's samples, train then test: FedProx's per-client maths (see the dataset's
        docstring) with draws in its order: u_k, B_k, v_k, then W_k, b_k and the samples' noise.
        `size`: its total_sizes, when already known."""
        if size is None:
            size = int(self.total_sizes(np.array([client_id]))[0])
        rng = numpy_rng(self.seed, Purpose.SYNTHETIC_DATA, CLIENT_STREAM, client_id)
        weight_mean = rng.normal(0, self.alpha)
        feature_mean = rng.normal(rng.normal(0, self.beta), 1, SYNTHETIC_DIMENSION)
        model_draws = SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES + SYNTHETIC_CLASSES
        standard = rng.standard_normal(model_draws + SYNTHETIC_DIMENSION * size)
        model = standard[:model_draws] + weight_mean
        weights = model[:SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES].reshape(SYNTHETIC_DIMENSION, SYNTHETIC_CLASSES)
        bias = model[SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES:]
        features = feature_mean + standard[model_draws:].reshape(size, SYNTHETIC_DIMENSION) * SYNTHETIC_FEATURE_STDS
        # softmax is monotone, so FedProx's argmax(softmax(.)) is the argmax of the logits
        labels = np.argmax(features @ weights + bias, axis=1)
        return features.astype(np.float32), labels.astype(np.int64)

    def client(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The client's training samples: the first 90% of them."""
        features, labels = self.samples(client_id)
        train = int(synthetic_train_sizes(np.array([len(labels)]))[0])
        return features[:train], labels[:train]

    def test_clients(self, count: int) -> np.ndarray:
        """The clients whose test samples form the test set: `count` of them drawn once, in id order."""
        rng = numpy_rng(self.seed, Purpose.SYNTHETIC_DATA, TEST_CLIENTS_STREAM)
        return np.sort(rng.choice(self.num_clients, min(count, self.num_clients), replace=False))

    def test_set(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        clients = self.test_clients(count)
        sizes = self.total_sizes(clients)
        xs, ys = [], []
        for client_id, size, train in zip(clients.tolist(), sizes.tolist(), synthetic_train_sizes(sizes).tolist()):
            features, labels = self.samples(client_id, size)
            xs.append(features[train:])
            ys.append(labels[train:])
        return np.concatenate(xs), np.concatenate(ys)


@functools.lru_cache(maxsize=8)
def _size_key(seed: int) -> int:
    """The key of the sizes' counter-based uniforms: the stream (seed, SYNTHETIC_DATA)."""
    return derive_seed(seed, Purpose.SYNTHETIC_DATA)


@register_dataset("synthetic_lazy", input_shape=(SYNTHETIC_DIMENSION,), num_classes=SYNTHETIC_CLASSES,
                  default_model="logreg", natural=True, lazy=True,
                  num_samples=lambda data: data.num_clients * data.synthetic_max_samples,
                  resident_samples=lambda data: (min(data.num_clients, data.synthetic_test_clients)
                                                 * data.synthetic_max_samples))
def _synthetic_lazy(data, seed: int) -> LazyDataset:
    """FedProx's Synthetic(alpha, beta) (Li et al., MLSys 2020) with each client made from its own
    random stream when it trains, so memory and start-up do not grow with data.num_clients (10^7
    clients run on a laptop). Same maths as `synthetic`, other numbers: per-client streams, and a
    test set of data.synthetic_test_clients clients' last 10%.

    Client k has u_k ~ N(0, alpha), B_k ~ N(0, beta), W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1),
    v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)), y = argmax(x W_k + b_k), and floor(lognormal(4, 2)) + 50
    samples capped at data.synthetic_max_samples, the first 90% training, as in `synthetic`. It differs
    from `synthetic` in three ways:

    - random streams: `synthetic` draws all clients from one stream, so client k's samples depend on
      every client before it (numpy's normals take a data-dependent number of raw draws, so no client
      can be skipped to); here client k draws from its own stream (seed, k), and its size from a
      counter-based uniform of (seed, k) through the log-normal's exact quantiles;
    - the test set: `synthetic` tests on every client's last 10%; here on the last 10% of
      data.synthetic_test_clients clients drawn once (all of them when N is smaller), so evaluation
      stays bounded at any N;
    - train.eval_train_loss, which evaluates every client's samples, is refused beyond 10,000 clients
      (rayfed.data.lazy.TRAIN_LOSS_MAX_CLIENTS), and partition.csv holds sizes only (no class counts),
      and only up to 100,000 clients.
    """
    check_synthetic(data.num_clients, data.synthetic_alpha, data.synthetic_beta)
    source = SyntheticClients(seed, data.num_clients, data.synthetic_alpha, data.synthetic_beta,
                              data.synthetic_max_samples)
    test_x, test_y = source.test_set(data.synthetic_test_clients)
    return LazyDataset("synthetic_lazy", source, test_x, test_y, SYNTHETIC_CLASSES, (SYNTHETIC_DIMENSION,))
