"""Datasets as numpy arrays: readers for the official MNIST/CIFAR files, for the UCI digits
scikit-learn ships and for LEAF's Shakespeare files (rayfed.data.shakespeare), and FedProx's Synthetic."""
import dataclasses
import functools
from dataclasses import dataclass
import gzip
import math
import pathlib
import pickle
import struct
import zlib

import numpy as np

from rayfed.config import NORMALIZATIONS
from rayfed.data.base import Dataset, register_dataset
from rayfed.data.cifar_pickle import load_cifar_pickle, unwrap
from rayfed.data.packaged import PackagedImages, package_folder, rank_in_class
from rayfed.data.partition import Partition
from rayfed.errors import ConfigError, first_line
from rayfed.seeding import Purpose, numpy_rng

# data.normalize: the torchvision images scaled by their channel statistics, or to [-1, 1] (`half`).

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_UBYTE = 0x08   # the IDX type code of unsigned bytes, the only type MNIST files use
_IDX_IMAGE_SHAPE = (28, 28)
_CIFAR_IMAGE_BYTES = 3 * 32 * 32
# Above any official file (the largest, CIFAR-100's train pickle, is 158 MB): a bigger file, or a
# .gz decompressing to more, is damaged or crafted, and reading it whole could exhaust memory.
MAX_FILE_BYTES = 256 * 2**20
_GUNZIP_CHUNK_BYTES = 2**20
_CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))


@dataclass(frozen=True)
class _ImageSource:
    folder: str               # under root, where torchvision puts the files
    files: tuple[str, ...]
    torchvision_class: str
    num_classes: int
    mean: tuple[float, ...]   # per channel, of x / 255
    std: tuple[float, ...]
    input_shape: tuple[int, ...]
    num_samples: int          # train + test
    default_model: str        # the papers' model for it (GradMA's MLP, LeNet-5 and VGG-11)


_IMAGE_SOURCES = {
    "mnist": _ImageSource("MNIST/raw", _IDX_FILES, "MNIST", 10, (0.1307,), (0.3081,), (1, 28, 28), 70_000, "mlp"),
    "fashion_mnist": _ImageSource("FashionMNIST/raw", _IDX_FILES, "FashionMNIST", 10, (0.2860,), (0.3530,),
                                  (1, 28, 28), 70_000, "mlp"),
    "cifar10": _ImageSource("cifar-10-batches-py", (*_CIFAR10_TRAIN_FILES, "test_batch"), "CIFAR10", 10,
                            (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), (3, 32, 32), 60_000, "lenet5"),
    "cifar100": _ImageSource("cifar-100-python", ("train", "test"), "CIFAR100", 100,
                             (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), (3, 32, 32), 60_000, "vgg11"),
}

SYNTHETIC_DIMENSION = 60
SYNTHETIC_CLASSES = 10
SYNTHETIC_MIN_SAMPLES = 50
SYNTHETIC_TRAIN_FRACTION = 0.9
SYNTHETIC_CHUNK_SAMPLES = 20_000     # samples generated at once: bounds the generator's scratch memory
# FedProx's client sizes: floor(lognormal(4, 2)) + 50 samples.
SYNTHETIC_SIZE_LOG_MEAN, SYNTHETIC_SIZE_LOG_SIGMA = 4.0, 2.0
# x ~ N(v_k, diag(j^-1.2)): the features' standard deviations.
SYNTHETIC_FEATURE_STDS = np.arange(1, SYNTHETIC_DIMENSION + 1, dtype=np.float64) ** -0.6
# <name>_random for each image set above: its shapes, sizes and class count with standard-normal images and uniform
# labels, so that timing and `rayfed sweep --plan` run without the files. Each set's test split has 10,000 images.
RANDOM_SUFFIX = "_random"
RANDOM_TEST_SIZE = 10_000
# digits: the UCI handwritten digits (optdigits' test part) as scikit-learn ships them, one CSV row
# per image: 64 pixel counts in 0..16, then the label.
DIGITS_FILE = pathlib.PurePath("datasets", "data", "digits.csv.gz")   # inside the sklearn package
DIGITS_SAMPLES = 1797
DIGITS_IMAGE_SHAPE = (1, 8, 8)
DIGITS_CLASSES = 10
DIGITS_MAX_PIXEL = 16
# Within each class, in file order, every DIGITS_TEST_EVERY-th image is a test image: a stratified
# split that no seed, RNG or numpy version can change (1,442 train, 355 test).
DIGITS_TEST_EVERY = 5
# Of the training split's pixels, computed once from the file.
DIGITS_MEAN = 4.8822
DIGITS_STD = 6.0185


def _image_files(source: _ImageSource, root: str) -> list[pathlib.Path]:
    """The files the reader needs (MNIST-style files may also be present as .gz)."""
    folder = pathlib.Path(root) / source.folder
    return [folder / file_name for file_name in source.files]


def _existing_variant(path: pathlib.Path) -> pathlib.Path | None:
    if path.is_file():
        return path
    gzipped = path.with_name(path.name + ".gz")
    if path.name in _IDX_FILES and gzipped.is_file():
        return gzipped
    return None


def _missing_image_files(source: _ImageSource, root: str) -> list[pathlib.Path]:
    return [path for path in _image_files(source, root) if _existing_variant(path) is None]


def _sklearn_folder() -> pathlib.Path | None:
    return package_folder("sklearn")


DIGITS = PackagedImages("digits", f"sklearn/{DIGITS_FILE.as_posix()}", "scikit-learn", lambda: _sklearn_folder(),
                        DIGITS_FILE, rows=DIGITS_SAMPLES, image_shape=DIGITS_IMAGE_SHAPE, max_pixel=DIGITS_MAX_PIXEL,
                        num_classes=DIGITS_CLASSES)


def digits_file() -> pathlib.Path:
    return DIGITS.file()


def _read_images(name: str, source: _ImageSource, data) -> Dataset:
    """torchvision's files of `name` under data.root (downloaded with data.download), scaled by the
    channel statistics or, with data.normalize=half, to [-1, 1]."""
    missing = _missing_image_files(source, data.root)
    if missing and data.download:
        _download(name, source, data.root, missing)
        missing = _missing_image_files(source, data.root)
    if missing:
        raise ConfigError(f"{name} files missing under {missing[0].parent}: "
                          f"{', '.join(path.name for path in missing)} "
                          "(put the official files there, or set data.download=true)")

    files = [_existing_variant(path) for path in _image_files(source, data.root)]
    if source.files == _IDX_FILES:
        train_x, train_y, test_x, test_y = _read_idx_dataset(*files, num_classes=source.num_classes)
    else:
        train_x, train_y, test_x, test_y = _read_cifar_dataset(files, name, source.num_classes)

    if data.normalize == "half":
        channels = len(source.mean)
        source = dataclasses.replace(source, mean=(0.5,) * channels, std=(0.5,) * channels)
    return Dataset(name=name, train_x=_normalise(train_x, source), train_y=train_y,
                   test_x=_normalise(test_x, source), test_y=test_y,
                   num_classes=source.num_classes, input_shape=tuple(train_x.shape[1:]))


def _register_image_dataset(name: str, source: _ImageSource) -> None:
    def load(data, seed: int) -> Dataset:
        """The official files as torchvision downloads them (data.download fetches them), under data.root."""
        return _read_images(name, source, data)
    register_dataset(name, input_shape=source.input_shape, num_classes=source.num_classes,
                     default_model=source.default_model, num_samples=source.num_samples,
                     required_files=functools.partial(_image_files, source),
                     missing_files=functools.partial(_missing_image_files, source), normalizable=True)(load)


@register_dataset("synthetic", input_shape=(SYNTHETIC_DIMENSION,), num_classes=SYNTHETIC_CLASSES,
                  default_model="logreg", natural=True,
                  num_samples=lambda data: data.num_clients * data.synthetic_max_samples)
def _synthetic(data, seed: int) -> Dataset:
    """FedProx's Synthetic(alpha, beta) (Li et al., MLSys 2020): one generated client per data.num_clients."""
    return _generate_synthetic(seed, data.num_clients, data.synthetic_alpha, data.synthetic_beta,
                               data.synthetic_max_samples)


for _name, _image_source in _IMAGE_SOURCES.items():
    _register_image_dataset(_name, _image_source)


def _register_random_dataset(name: str, source: _ImageSource) -> None:
    def load(data, seed: int) -> Dataset:
        """Standard-normal images and uniform labels shaped like the named set, for timing: no files, nothing
        learnable."""
        return _generate_random_images(name + RANDOM_SUFFIX, source, seed)
    register_dataset(name + RANDOM_SUFFIX, input_shape=source.input_shape, num_classes=source.num_classes,
                     default_model=source.default_model, num_samples=source.num_samples)(load)


for _name, _image_source in _IMAGE_SOURCES.items():
    _register_random_dataset(_name, _image_source)


@register_dataset("digits", input_shape=DIGITS_IMAGE_SHAPE, num_classes=DIGITS_CLASSES, default_model="mlp",
                  num_samples=DIGITS_SAMPLES, missing_files=DIGITS.missing)
def _digits(data, seed: int) -> Dataset:
    """The UCI handwritten digits (8x8 images) that scikit-learn ships: offline, no download."""
    return _load_digits()


def _download(name: str, source: _ImageSource, root: str, missing: list[pathlib.Path]) -> None:
    import torchvision.datasets  # only needed here; keeps plain loads free of the torchvision import

    dataset_class = getattr(torchvision.datasets, source.torchvision_class)
    try:
        for train in (True, False):
            dataset_class(root, train=train, download=True)
    except Exception as exc:  # any failure (network, disk, bad archive) means the same to the user
        reason = first_line(exc)[:200]
        raise ConfigError(f"could not download {name} into {root} ({reason}); put the official files at "
                          f"{', '.join(str(path) for path in missing)} or check the network") from exc


def _one_line_error(message: str) -> ConfigError:
    # Paths and exception texts may hold line breaks, and the CLI promises one line.
    return ConfigError(" ".join(message.splitlines()))


def _bad_file(path: pathlib.Path, problem: str) -> ConfigError:
    return _one_line_error(f"{path} {problem}; delete it and rerun with data.download=true, or put the official "
                           "file there")


def _reason(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__)[:200]


def _read_file(path: pathlib.Path) -> bytes | bytearray:
    try:
        return _gunzip(path) if path.suffix == ".gz" else _read_plain(path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise _bad_file(path, f"is not a valid gzip stream ({_reason(exc)})") from exc
    except (OSError, MemoryError) as exc:
        raise _bad_file(path, f"cannot be read ({_reason(exc)})") from exc


def _read_plain(path: pathlib.Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _bad_file(path, f"is {size} bytes, more than any official file")
    return path.read_bytes()


def _gunzip(path: pathlib.Path) -> bytearray:
    """Decompressed in chunks, so that a decompression bomb stops at MAX_FILE_BYTES."""
    data = bytearray()
    with gzip.open(path, "rb") as file:
        while chunk := file.read(_GUNZIP_CHUNK_BYTES):
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                raise _bad_file(path, f"decompresses to more than {MAX_FILE_BYTES} bytes, "
                                      "more than any official file")
    return data


@dataclass(frozen=True)
class _IdxKind:
    noun: str
    item_shape: tuple[int, ...]


_IDX_IMAGES = _IdxKind("images", _IDX_IMAGE_SHAPE)
_IDX_LABELS = _IdxKind("labels", ())


def _read_idx_dataset(train_images: pathlib.Path, train_labels: pathlib.Path, test_images: pathlib.Path,
                      test_labels: pathlib.Path, num_classes: int) -> tuple[np.ndarray, ...]:
    arrays = []
    for images_path, labels_path in ((train_images, train_labels), (test_images, test_labels)):
        images = _read_idx(images_path, _IDX_IMAGES)
        labels = _read_idx(labels_path, _IDX_LABELS)
        if len(images) != len(labels):
            raise _bad_file(labels_path, f"holds {len(labels)} labels but {images_path} holds {len(images)} images")
        _check_label_range(int(labels.min()), int(labels.max()), num_classes, labels_path)
        arrays += [images[:, np.newaxis], labels.astype(np.int64)]
    return tuple(arrays)


def _read_idx(path: pathlib.Path, kind: _IdxKind) -> np.ndarray:
    """An IDX file: magic 0x0000 <type code> <number of dims>, big-endian int32 dims, then the data."""
    raw = _read_file(path)
    shape = _idx_shape(raw, path, kind)
    if shape[1:] != kind.item_shape:
        raise _bad_file(path, f"holds {kind.noun} of shape {shape[1:]}, not {kind.item_shape}")
    if shape[0] == 0:
        raise _bad_file(path, f"holds no {kind.noun} (its IDX header counts 0)")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(shape)).reshape(shape)


def _idx_shape(raw: bytes | bytearray, path: pathlib.Path, kind: _IdxKind) -> tuple[int, ...]:
    """The shape the header declares, once it is known to match the data that follows; checked
    before any array exists, so an absurd header cannot make the reader allocate."""
    if len(raw) < 4:
        raise _bad_file(path, f"is too short for an IDX file ({len(raw)} bytes)")
    if raw[:2] != b"\0\0":
        raise _bad_file(path, f"is not an IDX file (it starts with 0x{bytes(raw[:4]).hex()}, not 0x0000)")
    type_code, num_dims = raw[2], raw[3]
    if type_code != _IDX_UBYTE:
        raise _bad_file(path, f"holds IDX data of type code 0x{type_code:02x}, "
                              f"not unsigned bytes (0x{_IDX_UBYTE:02x}) as MNIST files do")
    expected_dims = 1 + len(kind.item_shape)
    if num_dims != expected_dims:
        raise _bad_file(path, f"declares a dimension count of {num_dims} in its IDX header, "
                              f"not {expected_dims} as MNIST {kind.noun} files do")
    header_size = 4 + 4 * num_dims
    if len(raw) < header_size:
        raise _bad_file(path, f"ends inside its IDX header ({len(raw)} bytes)")
    shape = struct.unpack(f">{num_dims}i", raw[4:header_size])
    if min(shape) < 0:
        raise _bad_file(path, f"declares a negative dimension in its IDX header {shape}")
    if math.prod(shape) != len(raw) - header_size:
        raise _bad_file(path, f"is truncated or corrupt: its IDX header declares {kind.noun} of shape {shape}, "
                              f"{math.prod(shape)} bytes, but {len(raw) - header_size} bytes follow it")
    return shape


def _read_cifar_dataset(files: list[pathlib.Path], name: str, num_classes: int) -> tuple[np.ndarray, ...]:
    label_key = "fine_labels" if name == "cifar100" else "labels"
    batches = [_read_cifar_batch(path, label_key, num_classes) for path in files]
    train_x = np.concatenate([images for images, _ in batches[:-1]])
    train_y = np.concatenate([labels for _, labels in batches[:-1]])
    test_x, test_y = batches[-1]
    return train_x, train_y, test_x, test_y


def _read_cifar_batch(path: pathlib.Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR python pickle: dict with 'data' (N x 3072 uint8, channel-major) and the label list."""
    batch = _unpickle_batch(path)
    for key in ("data", label_key):
        if key not in batch:
            raise _bad_file(path, f"is not a CIFAR batch of this dataset (it has no {key!r} entry)")
    images = _cifar_images(unwrap(batch["data"]), path)
    labels = _cifar_labels(unwrap(batch[label_key]), label_key, path)
    if len(labels) != len(images):
        raise _bad_file(path, f"holds {len(images)} images but {len(labels)} labels")
    _check_label_range(int(labels.min()), int(labels.max()), num_classes, path)
    return images.reshape(-1, 3, 32, 32), labels


def _cifar_images(images, path: pathlib.Path) -> np.ndarray:
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 2
            and images.shape[1] == _CIFAR_IMAGE_BYTES):
        raise _bad_file(path, f"holds {_describe(images)} as 'data', not N x {_CIFAR_IMAGE_BYTES} unsigned bytes")
    if len(images) == 0:
        raise _bad_file(path, "holds no images")
    return images


def _cifar_labels(labels, label_key: str, path: pathlib.Path) -> np.ndarray:
    if not isinstance(labels, list):
        raise _bad_file(path, f"holds {_describe(labels)} as {label_key!r}, not a list of integers")
    if not all(type(label) is int and -2**63 <= label < 2**63 for label in labels):
        raise _bad_file(path, f"has entries in {label_key!r} that are not 64-bit integers")
    return np.array(labels, dtype=np.int64)


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}, shape {value.shape},"
    return f"a value of type {type(value).__name__}"


def _unpickle_batch(path: pathlib.Path) -> dict:
    """The batch's dict, with str keys."""
    raw = _read_file(path)
    try:
        batch = load_cifar_pickle(raw)
    # What a damaged or crafted pickle makes load() raise; find_class keeps it from calling our code.
    except (pickle.UnpicklingError, EOFError, struct.error, ValueError, TypeError, AttributeError, IndexError,
            OverflowError, MemoryError) as exc:
        raise _bad_file(path, f"is not a readable CIFAR batch pickle ({_reason(exc)})") from exc
    if not isinstance(batch, dict):
        raise _bad_file(path, f"holds a pickled {type(batch).__name__}, not the dict of a CIFAR batch")
    return {key.decode("latin-1") if isinstance(key, bytes) else key: value for key, value in batch.items()}


def _check_label_range(low: int, high: int, num_classes: int, path: pathlib.Path) -> None:
    if low < 0 or high >= num_classes:
        raise _bad_file(path, f"holds labels outside [0, {num_classes}) (from {low} to {high})")


def _normalise(images: np.ndarray, source: _ImageSource) -> np.ndarray:
    channel_shape = (1, len(source.mean), 1, 1)
    normalised = images.astype(np.float32)
    normalised /= 255.0
    normalised -= np.asarray(source.mean, dtype=np.float32).reshape(channel_shape)
    normalised /= np.asarray(source.std, dtype=np.float32).reshape(channel_shape)
    return normalised


def _load_digits() -> Dataset:
    pixels, labels = DIGITS.read()
    images = pixels.astype(np.float32)
    images -= DIGITS_MEAN
    images /= DIGITS_STD
    is_test = rank_in_class(labels) % DIGITS_TEST_EVERY == DIGITS_TEST_EVERY - 1
    return Dataset("digits", images[~is_test], labels[~is_test], images[is_test], labels[is_test],
                   num_classes=DIGITS_CLASSES, input_shape=DIGITS_IMAGE_SHAPE)


def _generate_random_images(name: str, source: _ImageSource, seed: int) -> Dataset:
    """Standard-normal images and uniform labels shaped like the normalised image set: a compute-bound
    workload for benchmarks (nothing in it is learnable)."""
    rng = numpy_rng(seed, Purpose.SYNTHETIC_DATA)
    arrays = []
    for size in (source.num_samples - RANDOM_TEST_SIZE, RANDOM_TEST_SIZE):
        arrays += [rng.standard_normal((size, *source.input_shape), dtype=np.float32),
                   rng.integers(0, source.num_classes, size, dtype=np.int64)]
    return Dataset(name, *arrays, num_classes=source.num_classes, input_shape=source.input_shape)


def check_synthetic(num_clients: int, alpha: float, beta: float) -> None:
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients} must be at least 1")
    if alpha < 0 or beta < 0:
        raise ConfigError(f"data.synthetic_alpha={alpha} and data.synthetic_beta={beta} must both be >= 0")


def synthetic_train_sizes(sizes: np.ndarray) -> np.ndarray:
    """A client's first 90% of samples train, the rest (at least one) test."""
    return (SYNTHETIC_TRAIN_FRACTION * np.asarray(sizes, dtype=np.int64)).astype(np.int64)


def _generate_synthetic(seed: int, num_clients: int, alpha: float, beta: float, max_samples: int = 1000) -> Dataset:
    """Synthetic(alpha, beta) as generated by FedProx's generate_synthetic.py.

    Like FedProx's code, alpha and beta are passed to normal() as standard deviations
    (the paper writes N(0, alpha)). Client k: u_k ~ N(0, alpha), B_k ~ N(0, beta),
    W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)),
    y = argmax(x W_k + b_k). The first 90% of a client's samples train, the rest test.
    FedProx does not cap client sizes; we cap them at `max_samples` (data.synthetic_max_samples),
    or the log-normal tail would make runs of many thousand clients too big for memory.
    """
    check_synthetic(num_clients, alpha, beta)
    rng = numpy_rng(seed, Purpose.SYNTHETIC_DATA)
    sizes = (rng.lognormal(SYNTHETIC_SIZE_LOG_MEAN, SYNTHETIC_SIZE_LOG_SIGMA, num_clients).astype(np.int64)
             + SYNTHETIC_MIN_SAMPLES)
    sizes = np.minimum(sizes, max_samples)
    weight_means = rng.normal(0, alpha, num_clients)
    feature_mean_centres = rng.normal(0, beta, num_clients)
    feature_means = rng.normal(feature_mean_centres[:, np.newaxis], 1, (num_clients, SYNTHETIC_DIMENSION))
    train_sizes = synthetic_train_sizes(sizes)
    train_offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(train_sizes)])
    test_offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes - train_sizes)])
    # Filled in place, a chunk of clients at a time: per-client float64 blocks would take several
    # times the final arrays' memory, and one random draw per client too long at 100k of them.
    train_x = np.empty((train_offsets[-1], SYNTHETIC_DIMENSION), dtype=np.float32)
    train_y = np.empty(train_offsets[-1], dtype=np.int64)
    test_x = np.empty((test_offsets[-1], SYNTHETIC_DIMENSION), dtype=np.float32)
    test_y = np.empty(test_offsets[-1], dtype=np.int64)
    model_draws = SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES + SYNTHETIC_CLASSES
    sample_offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
    first = 0
    while first < num_clients:
        stop = max(first + 1, int(np.searchsorted(sample_offsets, sample_offsets[first] + SYNTHETIC_CHUNK_SAMPLES,
                                                  side="right")) - 1)
        stop = min(stop, num_clients)
        chunk = slice(first, stop)
        # One draw per chunk, in the order FedProx's per-client loop draws: client k's weights,
        # bias, then its samples' noise, then client k + 1's.
        draws = model_draws + SYNTHETIC_DIMENSION * sizes[chunk]
        draw_starts = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(draws)])
        standard = rng.standard_normal(draw_starts[-1])
        model_positions = draw_starts[:-1, np.newaxis] + np.arange(model_draws)
        models = standard[model_positions] + weight_means[chunk, np.newaxis]
        weights = models[:, :SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES].reshape(-1, SYNTHETIC_DIMENSION,
                                                                              SYNTHETIC_CLASSES)
        bias = models[:, SYNTHETIC_DIMENSION * SYNTHETIC_CLASSES:]
        is_noise = np.ones(len(standard), dtype=bool)
        is_noise[model_positions.ravel()] = False
        owner = np.repeat(np.arange(stop - first), sizes[chunk])
        noise = standard[is_noise].reshape(-1, SYNTHETIC_DIMENSION)
        features = feature_means[chunk][owner] + noise * SYNTHETIC_FEATURE_STDS
        # softmax is monotone, so FedProx's argmax(softmax(.)) is the argmax of the logits
        # One product per client, as FedProx computes it: the same BLAS call shapes, so the same bits.
        logits = np.empty((len(owner), SYNTHETIC_CLASSES))
        for client, rows in enumerate(zip(sample_offsets[chunk] - sample_offsets[first],
                                          sample_offsets[first + 1:stop + 1] - sample_offsets[first])):
            np.matmul(features[slice(*rows)], weights[client], out=logits[slice(*rows)])
        labels = np.argmax(logits + bias[owner], axis=1)
        is_train = np.arange(len(owner)) - (sample_offsets[chunk][owner] - sample_offsets[first]) < train_sizes[chunk][owner]
        train_rows = slice(train_offsets[first], train_offsets[stop])
        test_rows = slice(test_offsets[first], test_offsets[stop])
        train_x[train_rows], train_y[train_rows] = features[is_train], labels[is_train]
        test_x[test_rows], test_y[test_rows] = features[~is_train], labels[~is_train]
        first = stop

    natural_partition = Partition(indices=np.arange(train_offsets[-1], dtype=np.int64), offsets=train_offsets)
    return Dataset(name="synthetic", train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   num_classes=SYNTHETIC_CLASSES, input_shape=(SYNTHETIC_DIMENSION,),
                   natural_partition=natural_partition)
