import functools
import gzip
import io
import pickle
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torchvision.datasets

from rayfed.data import DATASETS, class_histogram, load_dataset, make_partition, missing_files
from rayfed.preflight import load_config
from rayfed.data import datasets
from rayfed.data import required_files
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng
from rayfed.cli import main
from tests.dataset_files import (HOSTILE_PICKLES, IDX_NAMES, NUM_TEST, NUM_TRAIN, CallOnLoad, cifar_batch_bytes,
                                 flip_middle_bytes, gzip_bomb, idx_bytes, idx_header, malicious_pickles,
                                 with_object_dtype_flags, write_cifar10, write_cifar_batch, write_idx_dataset,
                                 write_python2_cifar_batch)

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


def assert_one_line_naming(raised: pytest.ExceptionInfo, path, fragment: str) -> None:
    message = str(raised.value)
    assert str(path) in message and fragment in message, message
    assert message.splitlines() == [message]


# (file, gzipped, damage applied to the file's valid bytes, what the message says)
IDX_DAMAGE = [
    pytest.param(2, False, lambda valid: idx_header((0, 28, 28)), "holds no images", id="zero_test_images"),
    pytest.param(0, False, lambda valid: idx_header((0, 28, 28)), "holds no images", id="zero_train_images"),
    pytest.param(1, False, lambda valid: idx_header((0,)), "holds no labels", id="zero_train_labels"),
    pytest.param(2, False, lambda valid: idx_header((2**31 - 1, 28, 28)) + bytes(100),
                 "header declares images of shape (2147483647, 28, 28), 1683627179248 bytes, but 100 bytes follow",
                 id="count_2**31-1"),
    pytest.param(2, False, lambda valid: idx_header((2**31 - 1,) * 3) + bytes(100),
                 "9903520300447984150353281023 bytes", id="overflowing_product"),
    pytest.param(2, False, lambda valid: idx_header((-1, 28, 28)) + valid[16:], "negative dimension",
                 id="negative_dims"),
    pytest.param(2, False, lambda valid: idx_header((), num_dims=0) + valid[16:],
                 "declares a dimension count of 0 in its IDX header, not 3 as MNIST images files do",
                 id="zero_dims_count"),
    pytest.param(2, False, lambda valid: idx_header((NUM_TEST, 28, 28), num_dims=200) + valid[16:],
                 "declares a dimension count of 200", id="200_dims_count"),
    pytest.param(2, False, lambda valid: idx_header((NUM_TEST, 28, 28), type_code=0x0D) + valid[16:],
                 "type code 0x0d", id="float_type_code"),
    pytest.param(2, False, lambda valid: b"\x12\x34" + valid[2:], "not an IDX file (it starts with 0x12340803",
                 id="bad_magic"),
    pytest.param(2, False, lambda valid: b"\x00\x00\x08\x01" + valid[4:], "declares a dimension count of 1",
                 id="labels_magic_on_images"),
    pytest.param(2, False, lambda valid: valid[:-100], "is truncated or corrupt", id="truncated"),
    pytest.param(2, False, lambda valid: valid[:10], "ends inside its IDX header", id="truncated_header"),
    pytest.param(2, False, lambda valid: b"", "is too short for an IDX file (0 bytes)", id="empty"),
    pytest.param(2, False, lambda valid: bytes(5 * 2**20), "more than any official file", id="oversized"),
    pytest.param(2, False, lambda valid: idx_bytes(np.zeros((NUM_TEST, 32, 32))),
                 "holds images of shape (32, 32), not (28, 28)", id="32x32_images"),
    pytest.param(3, False, lambda valid: idx_bytes(np.zeros(NUM_TEST - 1)), f"holds {NUM_TEST - 1} labels but",
                 id="label_count_mismatch"),
    pytest.param(3, False, lambda valid: valid[:-1] + b"\x0a", "holds labels outside [0, 10) (from ",
                 id="label_10"),
    pytest.param(2, True, lambda valid: flip_middle_bytes(gzip.compress(valid)), "is not a valid gzip stream",
                 id="corrupt_deflate"),
    pytest.param(2, True, lambda valid: gzip.compress(valid)[:-20], "is not a valid gzip stream (Compressed file ended",
                 id="truncated_gzip"),
    pytest.param(2, True, lambda valid: b"definitely not gzip", "is not a valid gzip stream (Not a gzipped file",
                 id="bad_gzip"),
    pytest.param(2, True, lambda valid: gzip_bomb(8 * 2**20), "decompresses to more than 4194304 bytes",
                 id="gzip_bomb"),
    pytest.param(2, True, lambda valid: gzip.compress(idx_header((0, 28, 28))), "holds no images",
                 id="gzipped_zero_images"),
]


@pytest.mark.parametrize("file_index, gz, damage, fragment", IDX_DAMAGE)
def test_damaged_idx_file_gets_one_line_naming_it(tmp_path, monkeypatch, file_index, gz, damage, fragment):
    monkeypatch.setattr(datasets, "MAX_FILE_BYTES", 4 * 2**20)   # keeps the oversized files small
    folder = tmp_path / "MNIST" / "raw"
    write_idx_dataset(folder, np.random.default_rng(4))
    target = folder / IDX_NAMES[file_index]
    valid = target.read_bytes()
    if gz:
        target.unlink()
        target = target.with_name(target.name + ".gz")
    target.write_bytes(damage(valid))
    with pytest.raises(ConfigError) as raised:
        load_dataset("mnist", root=str(tmp_path))
    assert_one_line_naming(raised, target, fragment)


def test_file_cap_exceeds_every_official_file():
    assert datasets.MAX_FILE_BYTES > 158_000_000   # CIFAR-100's train pickle, the largest


def test_python2_cifar_pickles_load(tmp_path):
    """The official CIFAR batches are Python 2 pickles naming numpy.core.multiarray._reconstruct."""
    rng = np.random.default_rng(7)
    write_cifar10(tmp_path, rng)
    folder = tmp_path / "cifar-10-batches-py"
    train_x, test_x = (rng.integers(0, 256, (size, 3, 32, 32), dtype=np.uint8) for size in (NUM_TRAIN, NUM_TEST))
    train_y, test_y = rng.integers(0, 10, NUM_TRAIN), rng.integers(0, 10, NUM_TEST)
    for batch_id, rows in enumerate(np.array_split(np.arange(NUM_TRAIN), 5), start=1):
        write_python2_cifar_batch(folder / f"data_batch_{batch_id}", train_x[rows], train_y[rows], "labels")
    write_python2_cifar_batch(folder / "test_batch", test_x, test_y, "labels")
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in (folder / "test_batch").read_bytes()
    dataset = load_dataset("cifar10", root=str(tmp_path))
    np.testing.assert_array_equal(dataset.train_y, train_y)
    np.testing.assert_array_equal(dataset.test_y, test_y)
    assert_normalised(dataset.train_x, train_x, (41, 2, 5, 30), 0.4465, 0.2010)
    assert_normalised(dataset.test_x, test_x, (3, 0, 31, 1), 0.4914, 0.2023)


def valid_batch(**changes) -> bytes:
    batch = {"data": np.zeros((NUM_TEST, 3072), np.uint8), "labels": [1] * NUM_TEST, **changes}
    return pickle.dumps(batch, protocol=2)


# damage applied to test_batch's valid bytes, and what the message says
CIFAR_DAMAGE = [
    pytest.param(lambda valid: b"garbage that is no pickle", "is not a readable CIFAR batch pickle (",
                 id="not_a_pickle"),
    pytest.param(lambda valid: valid[:len(valid) // 2], "is not a readable CIFAR batch pickle", id="truncated"),
    pytest.param(lambda valid: b"", "is not a readable CIFAR batch pickle (EOFError)", id="empty"),
    pytest.param(lambda valid: pickle.dumps([1, 2, 3], protocol=2), "holds a pickled list, not the dict",
                 id="not_a_dict"),
    pytest.param(lambda valid: pickle.dumps({"data": np.zeros((3, 10))}), "has no 'labels' entry", id="no_labels"),
    pytest.param(lambda valid: valid_batch(data=np.zeros((NUM_TEST, 3, 16, 16), np.uint8).reshape(NUM_TEST, -1)),
                 "holds an array of uint8, shape (20, 768), as 'data'", id="16x16_images"),
    pytest.param(lambda valid: valid_batch(data=np.zeros((NUM_TEST, 3072))),
                 "holds an array of float64, shape (20, 3072), as 'data'", id="float_images"),
    pytest.param(lambda valid: valid_batch(data=[[0] * 3072] * NUM_TEST), "holds a value of type list as 'data'",
                 id="images_as_lists"),
    pytest.param(lambda valid: cifar_batch_bytes(np.zeros((0, 3, 32, 32), np.uint8), np.zeros(0, int), "labels"),
                 "holds no images", id="zero_test_images"),
    pytest.param(lambda valid: valid_batch(labels=[1] * (NUM_TEST + 1)), f"holds {NUM_TEST} images but 21 labels",
                 id="label_count_mismatch"),
    pytest.param(lambda valid: valid_batch(labels=["cat"] * NUM_TEST),
                 "has entries in 'labels' that are not 64-bit integers", id="string_labels"),
    pytest.param(lambda valid: valid_batch(labels=np.ones(NUM_TEST, np.int64)),
                 "holds an array of int64, shape (20,), as 'labels', not a list of integers", id="labels_as_array"),
    pytest.param(lambda valid: valid_batch(labels=[10] * NUM_TEST), "holds labels outside [0, 10) (from 10 to 10)",
                 id="label_10"),
    pytest.param(lambda valid: valid_batch(labels=[-1, 9] * (NUM_TEST // 2)),
                 "holds labels outside [0, 10) (from -1 to 9)", id="label_-1"),
    pytest.param(lambda valid: valid_batch(labels=[10**5000] * NUM_TEST), "has entries in 'labels' that are not 64-bit",
                 id="5000_digit_labels"),
    pytest.param(lambda valid: pickle.dumps({"data": np.zeros((NUM_TEST, 3072), np.uint8)}, protocol=5),
                 "it names numpy._core.numeric._frombuffer, which no CIFAR batch holds; refused", id="protocol_5"),
    pytest.param(lambda valid: pickle.dumps(CallOnLoad(np.ndarray, (10**6, 3072)), protocol=2),
                 "'object' object is not callable", id="bare_ndarray_call"),
    pytest.param(lambda valid: pickle.dumps(CallOnLoad(np.ndarray.__reduce__(np.zeros(0))[0], np.ndarray,
                                                       (10**6, 3072), b"B"), protocol=2),
                 "it holds an array in a form numpy never pickles", id="reconstruct_with_a_shape"),
]


@pytest.mark.parametrize("damage, fragment", CIFAR_DAMAGE)
def test_damaged_cifar_file_gets_one_line_naming_it(tmp_path, damage, fragment):
    write_cifar10(tmp_path, np.random.default_rng(5))
    target = tmp_path / "cifar-10-batches-py" / "test_batch"
    target.write_bytes(damage(target.read_bytes()))
    with pytest.raises(ConfigError) as raised:
        load_dataset("cifar10", root=str(tmp_path))
    assert_one_line_naming(raised, target, fragment)


@pytest.mark.parametrize("payload", ["exec", "os.system", "eval_in_labels"])
def test_malicious_cifar_pickle_is_refused_without_running(tmp_path, payload):
    marker = tmp_path / "marker"
    crafted = malicious_pickles(marker)[payload]
    pickle.loads(crafted)
    assert marker.exists()   # what plain pickle.load does with it
    marker.unlink()

    write_cifar10(tmp_path, np.random.default_rng(8))
    target = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    target.write_bytes(crafted)
    with pytest.raises(ConfigError) as raised:
        load_dataset("cifar10", root=str(tmp_path))
    assert_one_line_naming(raised, target, "which no CIFAR batch holds; refused")
    assert not marker.exists()


@pytest.mark.parametrize("name, fragment", [
    ("memo_index_2**31", "holds a pickled list, not the dict of a CIFAR batch"),
    ("bytearray8_1TiB", "it holds 0x96 where a pickle opcode of a CIFAR batch belongs"),
    ("tuple_a_million_deep", "it makes more than 1000 containers, more than any CIFAR batch"),
    ("state_of_a_function", "it sets the state of a function, which takes none"),
])
def test_hostile_pickle_is_refused_without_allocating(tmp_path, name, fragment):
    write_cifar10(tmp_path, np.random.default_rng(12))
    target = tmp_path / "cifar-10-batches-py" / "test_batch"
    target.write_bytes(HOSTILE_PICKLES[name])
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as raised:
            load_dataset("cifar10", root=str(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_line_naming(raised, target, fragment)
    assert peak < 64 * 2**20


def test_pickled_dtype_flags_never_reach_numpy(tmp_path):
    rng = np.random.default_rng(13)
    write_cifar10(tmp_path, rng)
    target = tmp_path / "cifar-10-batches-py" / "test_batch"
    test_x, test_y = rng.integers(0, 256, (NUM_TEST, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, NUM_TEST)
    write_python2_cifar_batch(target, test_x, test_y, "labels")
    target.write_bytes(with_object_dtype_flags(target.read_bytes()))
    dataset = load_dataset("cifar10", root=str(tmp_path))
    np.testing.assert_array_equal(dataset.test_y, test_y)
    assert_normalised(dataset.test_x, test_x, (3, 0, 31, 1), 0.4914, 0.2023)


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_every_flipped_byte_loads_or_gets_one_line(tmp_path, dataset):
    """Damage anywhere in a file's structure (a pickle's opcodes, an IDX header, a gzip stream)
    gives the one-line error or, where it only changes pixel values, a dataset: never a traceback."""
    rng = np.random.default_rng(9)
    if dataset == "mnist":
        write_idx_dataset(tmp_path / "MNIST" / "raw", rng, gz=True)
        target = tmp_path / "MNIST" / "raw" / f"{IDX_NAMES[3]}.gz"
    else:
        write_cifar10(tmp_path, rng, num_train=5, num_test=3)
        target = tmp_path / "cifar-10-batches-py" / "test_batch"
        write_python2_cifar_batch(target, rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8), np.arange(3), "labels")
    valid = target.read_bytes()
    structure = [*range(min(len(valid), 320)), *range(max(0, len(valid) - 160), len(valid))]
    for position in sorted(set(structure)):
        for flip in (0x01, 0x80, 0xFF):
            target.write_bytes(valid[:position] + bytes([valid[position] ^ flip]) + valid[position + 1:])
            try:
                load_dataset(dataset, root=str(tmp_path))
            except ConfigError as error:
                assert str(target) in str(error) and "\n" not in str(error)


def test_line_breaks_in_paths_and_reasons_stay_on_one_line(tmp_path):
    root = tmp_path / "two\nlines"
    write_cifar10(root, np.random.default_rng(10))
    # protocol 4: SHORT_BINUNICODE "os\r\nsys", SHORT_BINUNICODE "tem\u2028", STACK_GLOBAL
    crafted = b"\x80\x04\x8c\x07os\r\nsys\x8c\x06tem\xe2\x80\xa8\x93."
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(crafted)
    with pytest.raises(ConfigError) as raised:
        load_dataset("cifar10", root=str(root))
    message = str(raised.value)
    assert message.splitlines() == [message] and "which no CIFAR batch holds; refused" in message


def test_damaged_file_fails_rayfed_run_with_one_line_and_no_run_directory(tmp_path, capsys):
    root = tmp_path / "data"
    write_idx_dataset(root / "MNIST" / "raw", np.random.default_rng(11), gz=True)
    target = root / "MNIST" / "raw" / f"{IDX_NAMES[2]}.gz"
    target.write_bytes(flip_middle_bytes(target.read_bytes()))
    out = tmp_path / "out"
    code = main(["run", "data.dataset=mnist", f"data.root={root}", "engine.backend=local", "train.rounds=1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"rayfed: error: {target} is not a valid gzip stream (")
    assert line.endswith("); delete it and rerun with data.download=true, or put the official file there")
    assert not out.exists()


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


@pytest.mark.parametrize("name, train_shape, classes", [
    ("cifar10", (50_000, 3, 32, 32), 10), ("mnist", (60_000, 1, 28, 28), 10),
    ("fashion_mnist", (60_000, 1, 28, 28), 10), ("cifar100", (50_000, 3, 32, 32), 100)])
def test_random_stand_in_is_shaped_like_its_set(name, train_shape, classes):
    dataset = load_dataset(f"{name}_random", seed=0)
    assert dataset.train_x.shape == train_shape and dataset.test_x.shape == (10_000, *train_shape[1:])
    assert dataset.train_x.dtype == np.float32 and set(np.unique(dataset.train_y)) == set(range(classes))
    assert abs(float(dataset.train_x[:1000].std()) - 1.0) < 0.01
    real, stand_in = DATASETS.get(name), DATASETS.get(f"{name}_random")
    assert (stand_in.input_shape, stand_in.num_classes, stand_in.default_model) == \
        (real.input_shape, real.num_classes, real.default_model)


# ---- digits: the UCI handwritten digits scikit-learn ships ----

@functools.cache
def digits_table() -> np.ndarray:
    """The real file, read independently of the loader."""
    with gzip.open(datasets.digits_file(), "rt") as file:
        table = np.array([[int(value) for value in line.split(",")] for line in file])
    table.flags.writeable = False
    return table


def test_digits_loads_with_its_shapes_counts_and_labels():
    dataset = load_dataset("digits")
    assert dataset.name == "digits" and dataset.num_classes == 10 and dataset.input_shape == (1, 8, 8)
    assert dataset.train_x.shape == (1442, 1, 8, 8) and dataset.test_x.shape == (355, 1, 8, 8)
    assert dataset.train_x.dtype == np.float32 and dataset.train_y.dtype == dataset.test_y.dtype == np.int64
    assert dataset.natural_partition is None
    for labels in (dataset.train_y, dataset.test_y):
        assert set(np.unique(labels)) == set(range(10))


def test_digits_split_is_fixed_and_stratified():
    table = digits_table()
    labels = table[:, -1]
    rank_in_class = np.array([np.sum(labels[:row] == label) for row, label in enumerate(labels)])
    is_test = rank_in_class % 5 == 4
    datasets_by_seed = [load_dataset("digits", seed=seed) for seed in (0, 1, 2**63 - 1)]
    for dataset in datasets_by_seed:
        np.testing.assert_array_equal(dataset.train_y, labels[~is_test])
        np.testing.assert_array_equal(dataset.test_y, labels[is_test])
        np.testing.assert_array_equal(dataset.train_x, datasets_by_seed[0].train_x)
    test_counts, all_counts = np.bincount(labels[is_test]), np.bincount(labels)
    np.testing.assert_array_equal(test_counts, all_counts // 5)     # every class a fifth, to the image
    raw_pixel = table[~is_test][100, 8 * 3 + 5]
    assert datasets_by_seed[0].train_x[100, 0, 3, 5] == pytest.approx((raw_pixel - 4.8822) / 6.0185, abs=1e-6)


def test_digits_training_inputs_are_standardised():
    dataset = load_dataset("digits")
    assert abs(float(dataset.train_x.mean())) < 1e-3 and abs(float(dataset.train_x.std()) - 1) < 1e-3
    assert abs(float(dataset.test_x.mean())) < 0.1 and abs(float(dataset.test_x.std()) - 1) < 0.1


def test_digits_load_fast_without_importing_sklearn():
    script = ("import sys, time; from rayfed.data import load_dataset; started = time.perf_counter(); "
              "load_dataset('digits'); print(time.perf_counter() - started, 'sklearn' in sys.modules)")
    seconds, imported = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                       text=True).stdout.split()
    assert float(seconds) < 0.5 and imported == "False"


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_every_partitioner_covers_digits_exactly(kind):
    dataset = load_dataset("digits")
    partition = make_partition(kind, dataset.train_y, 10, 20, seed=3, alpha=0.1, shards_per_client=2)
    assert partition.num_clients == 20 and partition.sizes.min() >= 1
    np.testing.assert_array_equal(np.sort(partition.indices), np.arange(len(dataset.train_y)))


def test_digits_config_resolves_to_dirichlet_and_mlp_and_refuses_natural():
    config = load_config(None, ["data.dataset=digits"])
    assert config.data.partition == "dirichlet" and config.model.name == "mlp"
    with pytest.raises(ConfigError, match="data.partition=natural is only available for data.dataset=synthetic"):
        load_config(None, ["data.dataset=digits", "data.partition=natural"])


def test_missing_digits_file_names_it_at_config_time(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "_sklearn_folder", lambda: tmp_path)
    target = tmp_path / "datasets" / "data" / "digits.csv.gz"
    for load in (lambda: load_dataset("digits"), lambda: load_config(None, ["data.dataset=digits"])):
        with pytest.raises(ConfigError) as raised:
            load()
        assert_one_line_naming(raised, target, "is missing from the installed scikit-learn; "
                                               "reinstall it with pip install --force-reinstall scikit-learn")


def test_digits_without_scikit_learn_says_to_install_it(monkeypatch):
    monkeypatch.setattr(datasets, "_sklearn_folder", lambda: None)
    with pytest.raises(ConfigError) as raised:
        load_dataset("digits")
    assert_one_line_naming(raised, "sklearn/datasets/data/digits.csv.gz", "which is not installed; pip install scikit-learn")


def csv_bytes(table: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savetxt(buffer, table, fmt="%d", delimiter=",")
    return buffer.getvalue()


def gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)     # the default level takes a quarter second here


def with_cell(table: np.ndarray, row: int, column: int, value: int) -> np.ndarray:
    changed = table.copy()
    changed[row, column] = value
    return changed


# damage applied to the valid table, as the bytes of the gzipped file, and what the message says
DIGITS_DAMAGE = [
    pytest.param(lambda table: b"not gzip at all", "is not a valid gzip stream (Not a gzipped file", id="not_gzip"),
    pytest.param(lambda table: gz(csv_bytes(table))[:-20], "is not a valid gzip stream", id="truncated_gzip"),
    pytest.param(lambda table: gz(b""), "holds no rows", id="empty"),
    pytest.param(lambda table: gz(csv_bytes(table[:1000])),
                 "holds 1000 rows of 65 values, not the 1797 rows of 64 pixels and a label", id="truncated_rows"),
    pytest.param(lambda table: gz(csv_bytes(table[:, 1:])), "holds 1797 rows of 64 values",
                 id="missing_column"),
    pytest.param(lambda table: gz(csv_bytes(table) + b"1,2,3\n"),
                 "is not a CSV table of integers (the number of columns changed from 65 to 3", id="ragged"),
    pytest.param(lambda table: gz(csv_bytes(table).replace(b"\n", b".5\n", 1)),
                 "is not a CSV table of integers (could not convert string '0.5'", id="float"),
    pytest.param(lambda table: gz(b"\xff\xfe" + csv_bytes(table)), "is not a CSV table of integers",
                 id="binary"),
    pytest.param(lambda table: gz(csv_bytes(with_cell(table, 5, 10, 17))),
                 "holds pixel values outside [0, 16] (from 0 to 17)", id="pixel_17"),
    pytest.param(lambda table: gz(csv_bytes(with_cell(table, 5, 64, 10))),
                 "holds labels outside [0, 10) (from 0 to 10)", id="label_10"),
    pytest.param(lambda table: gz(csv_bytes(with_cell(table, 5, 64, -1))),
                 "holds labels outside [0, 10) (from -1 to 9)", id="label_-1"),
]


@pytest.mark.parametrize("damage, fragment", DIGITS_DAMAGE)
def test_damaged_digits_file_gets_one_line_naming_it(tmp_path, monkeypatch, damage, fragment):
    table = digits_table()
    monkeypatch.setattr(datasets, "_sklearn_folder", lambda: tmp_path)
    target = tmp_path / "datasets" / "data" / "digits.csv.gz"
    target.parent.mkdir(parents=True)
    target.write_bytes(gz(csv_bytes(table)))
    assert len(load_dataset("digits").test_y) == 355       # rewritten intact, it loads: the damage is the cause
    target.write_bytes(damage(table))
    with pytest.raises(ConfigError) as raised:
        load_dataset("digits")
    assert_one_line_naming(raised, target, fragment)
    assert str(raised.value).endswith("; reinstall scikit-learn with pip install --force-reinstall scikit-learn")
