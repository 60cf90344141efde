import csv

import numpy as np
import pytest

from rayfed.data.partition import (Partition, class_histogram, make_partition, partition_dirichlet, partition_iid,
                                   partition_shards, write_histogram_csv)
from rayfed.errors import ConfigError

NUM_CLASSES = 10
NUM_CLIENTS = 100


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """10 classes x 600 samples, in shuffled order like a real training set."""
    return np.random.default_rng(0).permutation(np.repeat(np.arange(NUM_CLASSES), 600))


def largest_share_per_class(partition: Partition, labels: np.ndarray) -> np.ndarray:
    histogram = class_histogram(partition, labels, NUM_CLASSES)
    return (histogram / histogram.sum(axis=0)).max(axis=0)


def assert_exact_cover(partition: Partition, num_samples: int, num_clients: int) -> None:
    assert partition.indices.dtype == np.int64 and partition.offsets.dtype == np.int64
    assert partition.num_clients == num_clients
    assert partition.offsets[0] == 0 and partition.offsets[-1] == len(partition.indices)
    assert np.all(np.diff(partition.offsets) >= 0)
    np.testing.assert_array_equal(partition.sizes, np.diff(partition.offsets))
    np.testing.assert_array_equal(np.sort(partition.indices), np.arange(num_samples))
    pieces = [partition.client(client_id) for client_id in range(num_clients)]
    np.testing.assert_array_equal(np.concatenate(pieces), partition.indices)
    # exact cover of arange plus per-client sets pairwise disjoint: each client holds no duplicate either
    assert sum(len(set(piece.tolist())) for piece in pieces) == num_samples


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_every_sample_assigned_exactly_once(kind, labels):
    partition = make_partition(kind, labels, NUM_CLASSES, NUM_CLIENTS, seed=3, alpha=0.1, shards_per_client=2)
    assert_exact_cover(partition, len(labels), NUM_CLIENTS)


def test_client_is_a_view_and_from_lists_keeps_order():
    partition = Partition.from_lists([np.array([4, 1]), np.array([], dtype=np.int64), np.array([0, 2, 3])])
    np.testing.assert_array_equal(partition.offsets, [0, 2, 2, 5])
    np.testing.assert_array_equal(partition.sizes, [2, 0, 3])
    np.testing.assert_array_equal(partition.client(2), [0, 2, 3])
    assert partition.client(1).size == 0
    assert np.shares_memory(partition.client(0), partition.indices)


def test_iid_sizes_are_near_equal():
    partition = partition_iid(1003, 10, np.random.default_rng(1))
    np.testing.assert_array_equal(partition.sizes, [101] * 3 + [100] * 7)
    assert_exact_cover(partition, 1003, 10)


@pytest.mark.parametrize("alpha", [1e-4, 0.01, 0.1, 1.0])
def test_dirichlet_gives_every_client_at_least_two_samples(alpha, labels):
    partition = make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed=7, alpha=alpha)
    assert partition.sizes.min() >= 2
    assert_exact_cover(partition, len(labels), NUM_CLIENTS)


def test_dirichlet_with_absent_classes_and_barely_enough_samples():
    labels = np.array([0, 0, 3, 3, 3, 7, 7, 7])   # classes 1, 2, 4.. are empty; exactly 2 per client
    partition = partition_dirichlet(labels, NUM_CLASSES, 4, 0.01, np.random.default_rng(5))
    np.testing.assert_array_equal(partition.sizes, [2, 2, 2, 2])
    assert_exact_cover(partition, len(labels), 4)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_same_seed_same_partition_other_seed_differs(kind, labels):
    first, again, other = (make_partition(kind, labels, NUM_CLASSES, NUM_CLIENTS, seed=seed) for seed in (11, 11, 12))
    np.testing.assert_array_equal(first.indices, again.indices)
    np.testing.assert_array_equal(first.offsets, again.offsets)
    assert not np.array_equal(first.indices, other.indices)


def test_heterogeneity_grows_as_alpha_shrinks(labels):
    alphas = [0.01, 0.1, 1.0, 1e4]
    mean_largest_share = [
        np.mean([largest_share_per_class(make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed,
                                                        alpha=alpha), labels).mean() for seed in range(5)])
        for alpha in alphas]
    assert all(larger > smaller for larger, smaller in zip(mean_largest_share, mean_largest_share[1:]))
    # near-uniform: 1/N is 6 of 600 samples; 2/N leaves room for rounding and the 2-per-client guarantee
    near_uniform = make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed=0, alpha=1e4)
    assert largest_share_per_class(near_uniform, labels).max() < 2 / NUM_CLIENTS


@pytest.mark.parametrize("alpha, expected", [(0.01, 0.63), (0.1, 0.21), (1.0, 0.05)])
def test_largest_class_share_matches_the_spec(alpha, expected, labels):
    """The raw Dir(alpha 1_100) max is 0.63 / 0.21 / 0.05; the 2-per-client guarantee takes ~3% of each
    class first, so alpha=0.01 lands near 0.60. 40 seeds keep the seed noise (sd ~0.01) well inside 0.05."""
    largest = [largest_share_per_class(make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed,
                                                      alpha=alpha), labels).mean() for seed in range(40)]
    assert abs(np.mean(largest) - expected) <= 0.05


def test_shards_give_each_client_few_classes_and_equal_sizes(labels):
    # 200 shards of 30 samples, 20 per class: no shard straddles two classes
    partition = partition_shards(labels, NUM_CLIENTS, 2, np.random.default_rng(2))
    histogram = class_histogram(partition, labels, NUM_CLASSES)
    assert (np.count_nonzero(histogram, axis=1) <= 2).all()
    assert (np.count_nonzero(histogram, axis=1) == 1).sum() < NUM_CLIENTS   # shards really are mixed
    np.testing.assert_array_equal(partition.sizes, np.full(NUM_CLIENTS, 60))
    assert_exact_cover(partition, len(labels), NUM_CLIENTS)


@pytest.mark.parametrize("kind, num_clients, shards_per_client, key", [
    ("iid", 6001, 2, "data.num_clients"),
    ("dirichlet", 3001, 2, "data.num_clients"),
    ("shards", 1000, 7, "data.shards_per_client"),
    ("shards", 10, 0, "data.shards_per_client"),
    ("iid", 0, 2, "data.num_clients"),
    ("natural", 10, 2, "data.partition=natural"),
    ("labels", 10, 2, "data.partition"),
])
def test_infeasible_requests_raise_config_error_naming_the_key(kind, num_clients, shards_per_client, key, labels):
    with pytest.raises(ConfigError) as raised:
        make_partition(kind, labels, NUM_CLASSES, num_clients, seed=0, shards_per_client=shards_per_client)
    message = str(raised.value)
    assert key in message and "\n" not in message


def test_feasibility_bounds_are_tight(labels):
    assert make_partition("iid", labels, NUM_CLASSES, 6000, seed=0).sizes.min() == 1
    assert make_partition("dirichlet", labels, NUM_CLASSES, 3000, seed=0).sizes.min() == 2
    assert make_partition("shards", labels, NUM_CLASSES, 1000, seed=0, shards_per_client=6).sizes.min() == 6


def test_dirichlet_rejects_non_positive_alpha(labels):
    with pytest.raises(ConfigError, match="data.alpha"):
        make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed=0, alpha=0.0)


def test_natural_partition_is_passed_through_when_client_counts_match(labels):
    natural = Partition.from_lists([np.arange(0, 4000), np.arange(4000, 6000)])
    assert make_partition("natural", labels, NUM_CLASSES, 2, seed=0, natural=natural) is natural
    with pytest.raises(ConfigError, match="data.num_clients"):
        make_partition("natural", labels, NUM_CLASSES, 3, seed=0, natural=natural)


def test_class_histogram_counts(labels):
    partition = make_partition("dirichlet", labels, NUM_CLASSES, NUM_CLIENTS, seed=4, alpha=0.5)
    histogram = class_histogram(partition, labels, NUM_CLASSES)
    assert histogram.shape == (NUM_CLIENTS, NUM_CLASSES) and histogram.dtype == np.int64
    np.testing.assert_array_equal(histogram.sum(axis=1), partition.sizes)
    np.testing.assert_array_equal(histogram.sum(axis=0), np.bincount(labels, minlength=NUM_CLASSES))
    np.testing.assert_array_equal(histogram[17], np.bincount(labels[partition.client(17)], minlength=NUM_CLASSES))


def test_histogram_csv_round_trips(tmp_path, labels):
    partition = make_partition("shards", labels, NUM_CLASSES, 20, seed=1)
    histogram = class_histogram(partition, labels, NUM_CLASSES)
    path = tmp_path / "out" / "histogram.csv"
    write_histogram_csv(path, histogram)
    with path.open(newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["client_id", "num_samples"] + [f"class_{k}" for k in range(NUM_CLASSES)]
    table = np.array(rows[1:], dtype=np.int64)
    np.testing.assert_array_equal(table[:, 0], np.arange(20))
    np.testing.assert_array_equal(table[:, 1], partition.sizes)
    np.testing.assert_array_equal(table[:, 2:], histogram)
