"""Datasets as normalised numpy arrays: readers for the official MNIST/CIFAR files, and FedProx's Synthetic."""
from dataclasses import dataclass
import gzip
import pathlib
import pickle

import numpy as np

from rayfed.data.partition import Partition
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng

DATASETS = ("synthetic", "mnist", "fashion_mnist", "cifar10", "cifar100", "cifar10_random")

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801
_IDX_IMAGE_SHAPE = (28, 28)
_CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))


@dataclass(frozen=True)
class _ImageSource:
    folder: str               # under root, where torchvision puts the files
    files: tuple[str, ...]
    torchvision_class: str
    num_classes: int
    mean: tuple[float, ...]   # per channel, of x / 255
    std: tuple[float, ...]


_IMAGE_SOURCES = {
    "mnist": _ImageSource("MNIST/raw", _IDX_FILES, "MNIST", 10, (0.1307,), (0.3081,)),
    "fashion_mnist": _ImageSource("FashionMNIST/raw", _IDX_FILES, "FashionMNIST", 10, (0.2860,), (0.3530,)),
    "cifar10": _ImageSource("cifar-10-batches-py", (*_CIFAR10_TRAIN_FILES, "test_batch"), "CIFAR10", 10,
                            (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": _ImageSource("cifar-100-python", ("train", "test"), "CIFAR100", 100,
                             (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

SYNTHETIC_DIMENSION = 60
SYNTHETIC_CLASSES = 10
SYNTHETIC_MIN_SAMPLES = 50
SYNTHETIC_TRAIN_FRACTION = 0.9
SYNTHETIC_CHUNK_SAMPLES = 20_000     # samples generated at once: bounds the generator's scratch memory
# cifar10_random: CIFAR-10's shapes and sizes, for timing without the files.
RANDOM_TRAIN_SIZE = 50_000
RANDOM_TEST_SIZE = 10_000
RANDOM_IMAGE_SHAPE = (3, 32, 32)
RANDOM_CLASSES = 10


@dataclass
class Dataset:
    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    natural_partition: Partition | None = None   # synthetic only: the training rows each generated client owns


def _source(name: str) -> _ImageSource | None:
    if name in ("synthetic", "cifar10_random"):
        return None
    if name not in _IMAGE_SOURCES:
        raise ConfigError(f"data.dataset={name!r} is not one of {', '.join(DATASETS)}")
    return _IMAGE_SOURCES[name]


def required_files(name: str, root: str) -> list[pathlib.Path]:
    """The files the reader needs (MNIST-style files may also be present as .gz); [] for generated data."""
    source = _source(name)
    if source is None:
        return []
    folder = pathlib.Path(root) / source.folder
    return [folder / file_name for file_name in source.files]


def _existing_variant(path: pathlib.Path) -> pathlib.Path | None:
    if path.is_file():
        return path
    gzipped = path.with_name(path.name + ".gz")
    if path.name in _IDX_FILES and gzipped.is_file():
        return gzipped
    return None


def missing_files(name: str, root: str) -> list[pathlib.Path]:
    return [path for path in required_files(name, root) if _existing_variant(path) is None]


def load_dataset(name: str, *, root: str = "./data", download: bool = False, seed: int = 0,
                 num_clients: int = 100, synthetic_alpha: float = 1.0, synthetic_beta: float = 1.0,
                 synthetic_max_samples: int = 1000) -> Dataset:
    if name == "cifar10_random":
        return _generate_random_images(seed)
    source = _source(name)
    if source is None:
        return _generate_synthetic(seed, num_clients, synthetic_alpha, synthetic_beta, synthetic_max_samples)

    missing = missing_files(name, root)
    if missing and download:
        _download(name, source, root, missing)
        missing = missing_files(name, root)
    if missing:
        raise ConfigError(f"{name} files missing under {missing[0].parent}: "
                          f"{', '.join(path.name for path in missing)} "
                          "(put the official files there, or set data.download=true)")

    files = [_existing_variant(path) for path in required_files(name, root)]
    if source.files == _IDX_FILES:
        train_x, train_y, test_x, test_y = _read_idx_dataset(*files)
    else:
        train_x, train_y, test_x, test_y = _read_cifar_dataset(files, name)

    _check_labels(np.concatenate([train_y, test_y]), source.num_classes, files[0].parent)
    return Dataset(name=name, train_x=_normalise(train_x, source), train_y=train_y,
                   test_x=_normalise(test_x, source), test_y=test_y,
                   num_classes=source.num_classes, input_shape=tuple(train_x.shape[1:]))


def _download(name: str, source: _ImageSource, root: str, missing: list[pathlib.Path]) -> None:
    import torchvision.datasets  # only needed here; keeps plain loads free of the torchvision import

    dataset_class = getattr(torchvision.datasets, source.torchvision_class)
    try:
        for train in (True, False):
            dataset_class(root, train=train, download=True)
    except Exception as exc:  # any failure (network, disk, bad archive) means the same to the user
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"could not download {name} into {root} ({reason}); put the official files at "
                          f"{', '.join(str(path) for path in missing)} or check the network") from exc


def _read_idx_dataset(train_images: pathlib.Path, train_labels: pathlib.Path, test_images: pathlib.Path,
                      test_labels: pathlib.Path) -> tuple[np.ndarray, ...]:
    arrays = []
    for images_path, labels_path in ((train_images, train_labels), (test_images, test_labels)):
        images = _read_idx(images_path, _IDX_IMAGES_MAGIC)
        if images.shape[1:] != _IDX_IMAGE_SHAPE:
            raise ConfigError(f"{images_path} holds images of shape {images.shape[1:]}, not {_IDX_IMAGE_SHAPE}; "
                              "replace it with the official file")
        labels = _read_idx(labels_path, _IDX_LABELS_MAGIC)
        if len(images) != len(labels):
            raise ConfigError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} "
                              "images; replace them with the official files")
        arrays += [images[:, np.newaxis], labels.astype(np.int64)]
    return tuple(arrays)


def _read_idx(path: pathlib.Path, expected_magic: int) -> np.ndarray:
    """An IDX file: big-endian magic (uint8 type, number of dims), big-endian int32 dims, then uint8 data."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read {path} ({exc}); replace it with the official file") from exc
    num_dims = expected_magic & 0xFF
    header_size = 4 + 4 * num_dims
    if len(raw) < header_size or int.from_bytes(raw[:4], "big") != expected_magic:
        raise ConfigError(f"{path} is not an IDX file of the expected kind (bad header); "
                          "replace it with the official file")
    shape = tuple(int(dim) for dim in np.frombuffer(raw, dtype=">i4", count=num_dims, offset=4))
    if len(raw) != header_size + int(np.prod(shape)):
        raise ConfigError(f"{path} is truncated or corrupt (header says {shape}, data has "
                          f"{len(raw) - header_size} bytes); replace it with the official file")
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape)


def _read_cifar_dataset(files: list[pathlib.Path], name: str) -> tuple[np.ndarray, ...]:
    label_key = "fine_labels" if name == "cifar100" else "labels"
    batches = [_read_cifar_batch(path, label_key) for path in files]
    train_x = np.concatenate([images for images, _ in batches[:-1]])
    train_y = np.concatenate([labels for _, labels in batches[:-1]])
    test_x, test_y = batches[-1]
    return train_x, train_y, test_x, test_y


def _read_cifar_batch(path: pathlib.Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR python pickle: dict with 'data' (N x 3072 uint8, channel-major) and the label list."""
    try:
        with path.open("rb") as file:
            batch = pickle.load(file, encoding="latin1")
        batch = {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}
        images = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch[label_key], dtype=np.int64)
    except Exception as exc:  # unpickling garbage can fail in many ways; all mean a bad file
        raise ConfigError(f"cannot read {path} as a CIFAR batch ({type(exc).__name__}: {exc}); "
                          "replace it with the official file") from exc
    if images.ndim != 2 or images.shape[1] != 3 * 32 * 32 or labels.shape != (len(images),):
        raise ConfigError(f"{path} is corrupt (data shape {images.shape}, {labels.size} labels); "
                          "replace it with the official file")
    return images.reshape(-1, 3, 32, 32), labels


def _check_labels(labels: np.ndarray, num_classes: int, folder: pathlib.Path) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(f"labels in {folder} fall outside [0, {num_classes}); "
                          "replace the files there with the official ones")


def _normalise(images: np.ndarray, source: _ImageSource) -> np.ndarray:
    channel_shape = (1, len(source.mean), 1, 1)
    normalised = images.astype(np.float32)
    normalised /= 255.0
    normalised -= np.asarray(source.mean, dtype=np.float32).reshape(channel_shape)
    normalised /= np.asarray(source.std, dtype=np.float32).reshape(channel_shape)
    return normalised


def _generate_random_images(seed: int) -> Dataset:
    """Standard-normal images and uniform labels shaped like normalised CIFAR-10: a compute-bound
    workload for benchmarks (nothing in it is learnable)."""
    rng = numpy_rng(seed, Purpose.SYNTHETIC_DATA)
    arrays = []
    for size in (RANDOM_TRAIN_SIZE, RANDOM_TEST_SIZE):
        arrays += [rng.standard_normal((size, *RANDOM_IMAGE_SHAPE), dtype=np.float32),
                   rng.integers(0, RANDOM_CLASSES, size, dtype=np.int64)]
    return Dataset("cifar10_random", *arrays, num_classes=RANDOM_CLASSES, input_shape=RANDOM_IMAGE_SHAPE)


def _generate_synthetic(seed: int, num_clients: int, alpha: float, beta: float, max_samples: int = 1000) -> Dataset:
    """Synthetic(alpha, beta) as generated by FedProx's generate_synthetic.py.

    Like FedProx's code, alpha and beta are passed to normal() as standard deviations
    (the paper writes N(0, alpha)). Client k: u_k ~ N(0, alpha), B_k ~ N(0, beta),
    W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)),
    y = argmax(x W_k + b_k). The first 90% of a client's samples train, the rest test.
    FedProx does not cap client sizes; we cap them at `max_samples` (data.synthetic_max_samples),
    or the log-normal tail would make runs of many thousand clients too big for memory.
    """
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients} must be at least 1")
    if alpha < 0 or beta < 0:
        raise ConfigError(f"data.synthetic_alpha={alpha} and data.synthetic_beta={beta} must both be >= 0")
    rng = numpy_rng(seed, Purpose.SYNTHETIC_DATA)
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + SYNTHETIC_MIN_SAMPLES
    sizes = np.minimum(sizes, max_samples)
    weight_means = rng.normal(0, alpha, num_clients)
    feature_mean_centres = rng.normal(0, beta, num_clients)
    feature_means = rng.normal(feature_mean_centres[:, np.newaxis], 1, (num_clients, SYNTHETIC_DIMENSION))
    feature_stds = np.arange(1, SYNTHETIC_DIMENSION + 1, dtype=np.float64) ** -0.6   # sqrt of j^-1.2

    train_sizes = (SYNTHETIC_TRAIN_FRACTION * sizes).astype(np.int64)
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
        features = feature_means[chunk][owner] + standard[is_noise].reshape(-1, SYNTHETIC_DIMENSION) * feature_stds
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
