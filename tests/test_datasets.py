import pickle

import numpy as np
import pytest
import torchvision.datasets

from rayfed.data import DATASETS, class_histogram, load_dataset, make_partition, missing_files
from rayfed.config import load_config
from rayfed.data import datasets
from rayfed.data.datasets import required_files
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng
from tests.dataset_files import (IDX_NAMES, NUM_TEST, NUM_TRAIN, write_cifar10, write_cifar_batch,
                                 write_idx_dataset)

def assert_normalised(loaded: np.ndarray, raw: np.ndarray, index: tuple[int, ...], mean: float, std: float) -> None:
    assert loaded[index] == pytest.approx((raw[index] / 255.0 - mean) / std, abs=1e-5)


@pytest.mark.parametrize("name, folder, mean, std, gz", [
    ("mnist", "MNIST/raw", 0.1307, 0.3081, False),
    ("mnist", "MNIST/raw", 0.1307, 0.3081, True),
    ("fashion_mnist", "FashionMNIST/raw", 0.2860, 0.3530, False),
])
def test_idx_datasets_load(tmp_path, name, folder, mean, std, gz):
    arrays = write_idx_dataset(tmp_path / folder, np.random.default_rng(0), gz=gz)
    dataset = load_dataset(name, root=str(tmp_path))
    assert dataset.name == name and dataset.num_classes == 10 and dataset.input_shape == (1, 28, 28)
    assert dataset.train_x.shape == (NUM_TRAIN, 1, 28, 28) and dataset.test_x.shape == (NUM_TEST, 1, 28, 28)
    assert dataset.train_x.dtype == np.float32 and dataset.train_y.dtype == np.int64
    assert dataset.natural_partition is None
    np.testing.assert_array_equal(dataset.train_y, arrays[IDX_NAMES[1]])
    np.testing.assert_array_equal(dataset.test_y, arrays[IDX_NAMES[3]])
    assert_normalised(dataset.train_x[:, 0], arrays[IDX_NAMES[0]], (7, 3, 19), mean, std)
    assert_normalised(dataset.test_x[:, 0], arrays[IDX_NAMES[2]], (19, 27, 0), mean, std)


def test_cifar10_loads(tmp_path):
    train_x, train_y, test_x, test_y = write_cifar10(tmp_path, np.random.default_rng(1))
    dataset = load_dataset("cifar10", root=str(tmp_path))
    assert dataset.input_shape == (3, 32, 32) and dataset.num_classes == 10
    assert dataset.train_x.shape == (NUM_TRAIN, 3, 32, 32) and dataset.test_x.shape == (NUM_TEST, 3, 32, 32)
    assert dataset.train_x.dtype == np.float32 and dataset.test_y.dtype == np.int64
    np.testing.assert_array_equal(dataset.train_y, train_y)
    np.testing.assert_array_equal(dataset.test_y, test_y)
    assert_normalised(dataset.train_x, train_x, (41, 2, 5, 30), 0.4465, 0.2010)
    assert_normalised(dataset.test_x, test_x, (3, 0, 31, 1), 0.4914, 0.2023)


def test_cifar100_loads_with_fine_labels_and_bytes_keys(tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train_x = rng.integers(0, 256, (NUM_TRAIN, 3, 32, 32), dtype=np.uint8)
    train_y = rng.integers(0, 100, NUM_TRAIN)
    test_x = rng.integers(0, 256, (NUM_TEST, 3, 32, 32), dtype=np.uint8)
    test_y = rng.integers(0, 100, NUM_TEST)
    write_cifar_batch(folder / "train", train_x, train_y, "fine_labels")
    write_cifar_batch(folder / "test", test_x, test_y, "fine_labels", bytes_keys=True)
    dataset = load_dataset("cifar100", root=str(tmp_path))
    assert dataset.num_classes == 100 and dataset.input_shape == (3, 32, 32)
    np.testing.assert_array_equal(dataset.train_y, train_y)
    np.testing.assert_array_equal(dataset.test_y, test_y)
    assert_normalised(dataset.train_x, train_x, (0, 1, 16, 16), 0.4865, 0.2564)
    assert_normalised(dataset.test_x, test_x, (19, 2, 0, 0), 0.4409, 0.2762)


def test_unknown_dataset_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match="data.dataset") as raised:
        load_dataset("imagenet")
    assert all(name in str(raised.value) for name in DATASETS)


def test_missing_files_without_download_name_directory_and_file(tmp_path):
    folder = tmp_path / "MNIST" / "raw"
    assert missing_files("mnist", str(tmp_path)) == required_files("mnist", str(tmp_path))
    assert [path.name for path in required_files("mnist", str(tmp_path))] == list(IDX_NAMES)
    assert required_files("synthetic", str(tmp_path)) == missing_files("synthetic", str(tmp_path)) == []

    folder.mkdir(parents=True)
    (folder / IDX_NAMES[0]).write_bytes(b"")
    (folder / f"{IDX_NAMES[3]}.gz").write_bytes(b"")
    assert missing_files("mnist", str(tmp_path)) == [folder / IDX_NAMES[1], folder / IDX_NAMES[2]]

    with pytest.raises(ConfigError) as raised:
        load_dataset("mnist", root=str(tmp_path))
    message = str(raised.value)
    assert str(folder) in message and IDX_NAMES[1] in message and IDX_NAMES[0] not in message
    assert "data.download" in message and "\n" not in message


@pytest.mark.parametrize("name, expected_class", [("mnist", "MNIST"), ("cifar100", "CIFAR100")])
def test_failed_download_becomes_config_error(tmp_path, monkeypatch, name, expected_class):
    calls = []

    class Offline:
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            raise RuntimeError("Error downloading archive:\n<urlopen error [Errno -3] Temporary failure>")

    monkeypatch.setattr(torchvision.datasets, expected_class, Offline)
    with pytest.raises(ConfigError) as raised:
        load_dataset(name, root=str(tmp_path), download=True)
    message = str(raised.value)
    assert calls == [(str(tmp_path), True, True)]
    assert f"could not download {name} into {tmp_path}" in message
    assert "Error downloading archive" in message and str(required_files(name, str(tmp_path))[0]) in message
    assert "\n" not in message


def test_successful_download_is_read_with_our_reader(tmp_path, monkeypatch):
    calls = []
    written = {}

    class FakeFashionMNIST:
        def __init__(self, root, train, download):
            calls.append(train)
            if not written:
                written.update(write_idx_dataset(tmp_path / "FashionMNIST" / "raw", np.random.default_rng(3)))

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    dataset = load_dataset("fashion_mnist", root=str(tmp_path), download=True)
    assert calls == [True, False]
    np.testing.assert_array_equal(dataset.train_y, written[IDX_NAMES[1]])
    # files now present: a second load must not download again
    load_dataset("fashion_mnist", root=str(tmp_path), download=True)
    assert calls == [True, False]


@pytest.mark.parametrize("corruption", ["truncated", "bad_magic", "bad_gzip"])
def test_corrupt_idx_file_names_the_file(tmp_path, corruption):
    folder = tmp_path / "MNIST" / "raw"
    write_idx_dataset(folder, np.random.default_rng(4))
    target = folder / IDX_NAMES[2]
    if corruption == "truncated":
        target.write_bytes(target.read_bytes()[:-100])
    elif corruption == "bad_magic":
        target.write_bytes(b"\x00\x00\x08\x01" + target.read_bytes()[4:])
    else:
        target.unlink()
        target = folder / f"{IDX_NAMES[2]}.gz"
        target.write_bytes(b"definitely not gzip")
    with pytest.raises(ConfigError) as raised:
        load_dataset("mnist", root=str(tmp_path))
    assert str(target) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("content", [b"garbage that is no pickle", pickle.dumps({"data": np.zeros((3, 10))})])
def test_corrupt_cifar_file_names_the_file(tmp_path, content):
    write_cifar10(tmp_path, np.random.default_rng(5))
    target = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    target.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        load_dataset("cifar10", root=str(tmp_path))
    assert str(target) in str(raised.value)


def test_out_of_range_labels_are_rejected(tmp_path):
    write_cifar10(tmp_path, np.random.default_rng(6))
    images = np.zeros((NUM_TEST, 3, 32, 32), dtype=np.uint8)
    write_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch", images, np.full(NUM_TEST, 10), "labels")
    with pytest.raises(ConfigError, match="outside"):
        load_dataset("cifar10", root=str(tmp_path))


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("synthetic", seed=5, num_clients=40)


def test_synthetic_shapes_and_natural_partition(synthetic):
    assert synthetic.input_shape == (60,) and synthetic.num_classes == 10
    assert synthetic.train_x.dtype == np.float32 and synthetic.train_y.dtype == np.int64
    assert synthetic.train_x.shape == (len(synthetic.train_y), 60)
    assert synthetic.test_x.shape == (len(synthetic.test_y), 60)
    partition = synthetic.natural_partition
    assert partition.num_clients == 40
    assert partition.sizes.min() >= int(0.9 * 50) and partition.sizes.max() <= 900
    np.testing.assert_array_equal(np.sort(partition.indices), np.arange(len(synthetic.train_y)))
    # a client keeping t = int(0.9 n) of its n samples tests on n - t, which lies in [t / 9, t / 9 + 1 / 0.9)
    train_total = int(partition.sizes.sum())
    assert train_total / 9 <= len(synthetic.test_y) < train_total / 9 + 40 / 0.9
    labels = np.concatenate([synthetic.train_y, synthetic.test_y])
    assert labels.min() >= 0 and labels.max() < 10
    assert make_partition("natural", synthetic.train_y, 10, 40, seed=0, natural=partition) is partition


def test_synthetic_is_deterministic_per_seed(synthetic):
    again = load_dataset("synthetic", seed=5, num_clients=40)
    np.testing.assert_array_equal(again.train_x, synthetic.train_x)
    np.testing.assert_array_equal(again.test_y, synthetic.test_y)
    np.testing.assert_array_equal(again.natural_partition.offsets, synthetic.natural_partition.offsets)
    other = load_dataset("synthetic", seed=6, num_clients=40)
    assert not np.array_equal(other.natural_partition.offsets, synthetic.natural_partition.offsets)
    assert not np.allclose(other.train_x[:45], synthetic.train_x[:45])


def test_synthetic_num_clients_and_clipped_sizes():
    dataset = load_dataset("synthetic", seed=0, num_clients=300)
    sizes = dataset.natural_partition.sizes
    assert dataset.natural_partition.num_clients == 300
    # lognormal(4, 2) + 50 exceeds 1000 for about 7% of clients; those are clipped to 1000 (900 train)
    assert sizes.max() == 900 and sizes.min() >= 45


def test_synthetic_clients_are_heterogeneous(synthetic):
    """Each client has its own model and feature mean: its label mix is far from the pooled one,
    much further than the same data split iid."""
    def mean_distance_to_pooled(partition):
        histogram = class_histogram(partition, synthetic.train_y, 10)
        shares = histogram / histogram.sum(axis=1, keepdims=True)
        pooled = np.bincount(synthetic.train_y, minlength=10) / len(synthetic.train_y)
        return 0.5 * np.abs(shares - pooled).sum(axis=1).mean()

    natural = mean_distance_to_pooled(synthetic.natural_partition)
    iid = mean_distance_to_pooled(make_partition("iid", synthetic.train_y, 10, 40, seed=0))
    assert natural > 0.4 and natural > 2 * iid
    dominant_classes = class_histogram(synthetic.natural_partition, synthetic.train_y, 10).argmax(axis=1)
    assert len(set(dominant_classes.tolist())) >= 3


@pytest.mark.parametrize("kwargs, key", [({"num_clients": 0}, "data.num_clients"),
                                         ({"synthetic_alpha": -1.0}, "data.synthetic_alpha")])
def test_synthetic_rejects_bad_parameters(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        load_dataset("synthetic", **kwargs)


def fedprox_per_client_loop(seed, num_clients, max_samples):
    """Synthetic as FedProx's generate_synthetic.py draws it, one client after another: the
    reference the chunked generator must reproduce bit for bit."""
    rng = numpy_rng(seed, Purpose.SYNTHETIC_DATA)
    sizes = np.minimum(rng.lognormal(4, 2, num_clients).astype(np.int64) + 50, max_samples)
    weight_means = rng.normal(0, 1.0, num_clients)
    centres = rng.normal(0, 1.0, num_clients)
    feature_means = rng.normal(centres[:, np.newaxis], 1, (num_clients, 60))
    stds = np.arange(1, 61, dtype=np.float64) ** -0.6
    train_x, train_y, test_x, test_y = [], [], [], []
    for client in range(num_clients):
        weights = rng.normal(weight_means[client], 1, (60, 10))
        bias = rng.normal(weight_means[client], 1, 10)
        features = feature_means[client] + rng.standard_normal((sizes[client], 60)) * stds
        labels = np.argmax(features @ weights + bias, axis=1)
        cut = int(0.9 * sizes[client])
        train_x.append(features[:cut]), train_y.append(labels[:cut])
        test_x.append(features[cut:]), test_y.append(labels[cut:])
    return [np.concatenate(arrays) for arrays in (train_x, train_y, test_x, test_y)]


@pytest.mark.parametrize("chunk_samples", [1, 500, 20_000])
def test_chunked_synthetic_draws_what_the_per_client_loop_draws(monkeypatch, chunk_samples):
    monkeypatch.setattr(datasets, "SYNTHETIC_CHUNK_SAMPLES", chunk_samples)
    dataset = load_dataset("synthetic", seed=3, num_clients=25, synthetic_max_samples=300)
    train_x, train_y, test_x, test_y = fedprox_per_client_loop(3, 25, 300)
    np.testing.assert_array_equal(dataset.train_x, train_x.astype(np.float32))
    np.testing.assert_array_equal(dataset.train_y, train_y)
    np.testing.assert_array_equal(dataset.test_x, test_x.astype(np.float32))
    np.testing.assert_array_equal(dataset.test_y, test_y)
    assert dataset.natural_partition.sizes.max() == int(0.9 * 300)


def test_synthetic_max_samples_is_validated():
    with pytest.raises(ConfigError, match="data.synthetic_max_samples=1 must be >= 2"):
        load_config(None, ["data.synthetic_max_samples=1"])


def test_cifar10_random_is_shaped_like_cifar10():
    dataset = load_dataset("cifar10_random", seed=0)
    assert dataset.train_x.shape == (50_000, 3, 32, 32) and dataset.test_x.shape == (10_000, 3, 32, 32)
    assert dataset.train_x.dtype == np.float32 and set(np.unique(dataset.train_y)) == set(range(10))
    assert abs(float(dataset.train_x[:1000].std()) - 1.0) < 0.01
