"""LEAF's FEMNIST, partitioned by writer (as FedCOM, arXiv:2007.01154, runs it): 28x28 handwritten characters,
read from the JSON files LEAF's preprocess.sh writes (rayfed.data.leaf), kept to the ten digits as
the FedCOM authors' code does (the paper does not say), one client a writer. Natural: `num_clients` writers drawn at
random among those with digits in both splits; the test set is the union of their test samples.
IID: the same writers' training samples pooled, for make_partition's iid split to deal out."""
from __future__ import annotations

import pathlib

import numpy as np

from rayfed.data import leaf
from rayfed.data.base import Dataset, register_dataset
from rayfed.data.partition import Partition
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng

FOLDER = "femnist"              # under data.root, one subfolder per split
IMAGE_SHAPE = (1, 28, 28)
LEAF_CLASSES = 62               # digits 0-9, then upper- and lower-case letters
NUM_CLASSES = 10                # the digits
LEAF_COMMAND = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"
_REBUILD = "rebuild it with LEAF's data/femnist/preprocess.sh"

Samples = tuple[np.ndarray, np.ndarray]      # (n, 1, 28, 28) float32 images and their (n,) labels


def folders(root: str) -> dict[str, pathlib.Path]:
    return leaf.split_folders(root, FOLDER)


def required_files(root: str) -> list[pathlib.Path]:
    """The folders of LEAF's .json files, one per split."""
    return list(folders(root).values())


def check_files(root: str, download: bool = False) -> None:
    leaf.check_files(root, FOLDER, LEAF_COMMAND, "NIST's writer data", download)


def load_clients(root: str, *, seed: int, num_clients: int,
                 iid: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Partition | None]:
    """(train_x, train_y, test_x, test_y, natural partition): client i is the i-th writer drawn."""
    train, test = (read_split(folder) for folder in folders(root).values())
    eligible = sorted(writer for writer in train if len(train[writer][1]) and len(test.get(writer, ((), ()))[1]))
    if len(eligible) < num_clients:
        raise ConfigError(f"data.num_clients={num_clients} exceeds the {len(eligible)} FEMNIST writers with digits "
                          f"in both LEAF splits under {folders(root)['train'].parent}; lower data.num_clients")
    writers = [eligible[i] for i in numpy_rng(seed, Purpose.FEMNIST_WRITERS).permutation(len(eligible))[:num_clients]]
    train_x = np.concatenate([train[writer][0] for writer in writers])
    train_y = np.concatenate([train[writer][1] for writer in writers])
    test_x = np.concatenate([test[writer][0] for writer in writers])
    test_y = np.concatenate([test[writer][1] for writer in writers])
    if iid:
        return train_x, train_y, test_x, test_y, None
    offsets = np.concatenate([[0], np.cumsum([len(train[writer][1]) for writer in writers])]).astype(np.int64)
    return train_x, train_y, test_x, test_y, Partition(np.arange(len(train_y), dtype=np.int64), offsets)


def read_split(folder: pathlib.Path) -> dict[str, Samples]:
    """Every writer's digit samples in the folder's .json files."""
    return leaf.read_split(folder, _writer_samples, _REBUILD)


def _writer_samples(path: pathlib.Path, user: str, entry, count: int) -> Samples:
    inputs, targets = leaf.user_arrays(path, user, entry, count, _REBUILD)
    if not all(type(label) is int for label in targets):
        raise leaf.bad_file(path, f"user {user!r} has a label (y) that is not an integer", _REBUILD)
    try:
        labels = np.asarray(targets, dtype=np.int64)
    except OverflowError:
        raise leaf.bad_file(path, f"user {user!r} has a label (y) too large for an integer", _REBUILD) from None
    if labels.size and (labels.min() < 0 or labels.max() >= LEAF_CLASSES):
        raise leaf.bad_file(path, f"user {user!r} has label {int(labels[(labels < 0) | (labels >= LEAF_CLASSES)][0])}, "
                                  f"outside LEAF's 0..{LEAF_CLASSES - 1}", _REBUILD)
    size = int(np.prod(IMAGE_SHAPE))
    try:
        images = np.asarray(inputs, dtype=np.float32)
    except (ValueError, TypeError):
        raise leaf.bad_file(path, f"user {user!r} has an image (x) that is not {size} numbers", _REBUILD) from None
    except OverflowError:
        raise leaf.bad_file(path, f"user {user!r} has an image (x) with a number too large for a float",
                            _REBUILD) from None
    if not len(labels):
        images = np.zeros((0, size), dtype=np.float32)
    elif images.shape != (len(labels), size):
        raise leaf.bad_file(path, f"user {user!r} has images (x) of shape {images.shape[1:]}, not {size} numbers",
                            _REBUILD)
    if not np.isfinite(images).all():
        raise leaf.bad_file(path, f"user {user!r} has an image (x) with a NaN or infinite value", _REBUILD)
    digits = labels < NUM_CLASSES
    return images[digits].reshape(-1, *IMAGE_SHAPE), labels[digits]


# Far above LEAF's FEMNIST writers' digit samples (about 100 on average, train and test): a bound for the memory check.
SAMPLES_PER_WRITER = 500


def _missing(root: str) -> list[pathlib.Path]:
    """LEAF's files are beyond data.download's reach: their absence is the line saying how to make them."""
    check_files(root)
    return []


@register_dataset("femnist", input_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES, default_model="relu_mlp", natural=True,
                  partitions=("natural", "iid"), required_files=required_files, missing_files=_missing,
                  num_samples=lambda data: data.num_clients * SAMPLES_PER_WRITER)
def _femnist(data, seed: int) -> Dataset:
    """LEAF's FEMNIST digits (Caldas et al., 2018), one client per writer."""
    check_files(data.root, data.download)
    *arrays, natural = load_clients(data.root, seed=seed, num_clients=data.num_clients, iid=data.partition == "iid")
    return Dataset("femnist", *arrays, num_classes=NUM_CLASSES, input_shape=IMAGE_SHAPE, natural_partition=natural)
