"""Tiny-ImageNet (Le and Yang, "Tiny ImageNet Visual Recognition Challenge", Stanford CS231n, 2015):
200 ImageNet classes of 64x64 RGB images, 500 training and 50 validation images each, read from the
official archive's tiny-imagenet-200/ folder under data.root. The test set's labels were never
released, so the official validation set is the test set, as is usual. GradMA (Luo et al., CVPR
2023) trains ResNet-20 on it. The JPEGs are decoded once into a cache of uint8 pixels beside them."""
from __future__ import annotations

import collections
import hashlib
import os
import pathlib
import re
import sys
import uuid
import zipfile

import numpy as np

from rayfed.data.base import Dataset, register_dataset
from rayfed.errors import ConfigError

NAME = "tiny_imagenet"
FOLDER = "tiny-imagenet-200"            # under data.root, as the official archive unzips
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
IMAGE_SIDE = 64
IMAGE_SHAPE = (3, IMAGE_SIDE, IMAGE_SIDE)
NUM_CLASSES = 200
NUM_SAMPLES = 110_000                   # 100,000 training and 10,000 validation images
# ImageNet's training-set channel statistics, which torchvision's ImageNet models are trained with.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIX = ".JPEG"
WNID = re.compile(r"n[0-9]{8}")         # a WordNet noun id, the class names of ImageNet
# The official wnids.txt is 2 KB and val_annotations.txt 0.4 MB: a bigger file is damaged or
# crafted, and reading it whole could exhaust memory.
MAX_TEXT_BYTES = 16 * 2**20
CACHE = "rayfed_cache.npz"
# Part of the cache's fingerprint: a change to what the cache holds makes old caches stale.
CACHE_VERSION = 1
# The data.partition values that apply: fedmos is defined for 10-class datasets only.
PARTITIONS = ("iid", "dirichlet", "feddyn", "moon", "shards")
_RESTORE = f"restore it from the official archive {URL}"


class _Listing:
    """What the folder holds: the classes in wnids.txt's order, the training JPEGs of each (sorted
    by name) and the validation JPEGs in val_annotations.txt's order, with their labels."""

    def __init__(self, base: pathlib.Path):
        self.wnids = _wnids(base / "wnids.txt")
        self.train, self.train_y = _train_files(base / "train", self.wnids)
        self.test, self.test_y = _val_files(base / "val", self.wnids)

    def fingerprint(self) -> str:
        """Changes when the classes, the training images' names or the validation labels do."""
        lines = [f"rayfed {NAME} cache {CACHE_VERSION}", *self.wnids]
        lines += [f"{label}/{path.name}" for path, label in zip(self.train, self.train_y)]
        lines += [f"val/{label}/{path.name}" for path, label in zip(self.test, self.test_y)]
        return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def folder(root: str) -> pathlib.Path:
    return pathlib.Path(root) / FOLDER


def required_files(root: str) -> list[pathlib.Path]:
    """What the reader needs under data.root: the class list, the two image folders and the
    validation labels."""
    base = folder(root)
    return [base / "wnids.txt", base / "train", base / "val" / "val_annotations.txt", base / "val" / "images"]


def check_files(root: str, download: bool = False) -> None:
    """A ConfigError naming the first of required_files that is absent and where to get it."""
    absent = next((path for path in required_files(root) if not path.exists()), None)
    if absent is None:
        return
    remedy = f"download {URL} and unzip it into {root}"
    if download:
        raise _one_line_error(f"data.download=true cannot fetch {NAME} ({absent} does not exist); {remedy}")
    raise _one_line_error(f"{NAME} files missing: {absent} does not exist; {remedy}")


def _missing(root: str) -> list[pathlib.Path]:
    """The official archive is beyond data.download's reach: its absence is the line saying where to get it."""
    check_files(root)
    return []


@register_dataset(NAME, input_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES, default_model="resnet20",
                  num_samples=NUM_SAMPLES, partitions=PARTITIONS, required_files=required_files,
                  missing_files=_missing)
def _tiny_imagenet(data, seed: int) -> Dataset:
    """Tiny-ImageNet (Le and Yang, 2015) from the official `tiny-imagenet-200/` folder under data.root."""
    check_files(data.root, data.download)
    base = folder(data.root)
    listing = _Listing(base)
    train_pixels, test_pixels = _pixels(base / CACHE, listing)
    return Dataset(NAME, _normalise(train_pixels), listing.train_y, _normalise(test_pixels), listing.test_y,
                   num_classes=NUM_CLASSES, input_shape=IMAGE_SHAPE)


def _wnids(path: pathlib.Path) -> list[str]:
    wnids = _read_text(path).split()
    odd = next((wnid for wnid in wnids if not WNID.fullmatch(wnid)), None)
    if odd is not None:
        raise _bad_file(path, f"lists {odd!r}, which is not a WordNet id (n and 8 digits)")
    repeated = next((wnid for wnid, times in collections.Counter(wnids).items() if times > 1), None)
    if repeated is not None:
        raise _bad_file(path, f"lists {repeated} twice")
    if len(wnids) != NUM_CLASSES:
        raise _bad_file(path, f"lists {len(wnids)} wnids, not the {NUM_CLASSES} classes of Tiny-ImageNet")
    return wnids


def _train_files(train: pathlib.Path, wnids: list[str]) -> tuple[list[pathlib.Path], np.ndarray]:
    paths, counts = [], []
    for wnid in wnids:
        images = train / wnid / "images"
        try:
            names = sorted(entry.name for entry in os.scandir(images) if entry.name.endswith(IMAGE_SUFFIX))
        except FileNotFoundError:
            raise _bad_file(images, f"does not exist (wnids.txt lists {wnid})") from None
        except OSError as exc:
            raise _bad_file(images, f"cannot be read ({_reason(exc)})") from exc
        if not names:
            raise _bad_file(images, f"holds no {IMAGE_SUFFIX} file")
        paths += [images / name for name in names]
        counts.append(len(names))
    return paths, np.repeat(np.arange(len(wnids), dtype=np.int64), counts)


def _val_files(val: pathlib.Path, wnids: list[str]) -> tuple[list[pathlib.Path], np.ndarray]:
    """The images val_annotations.txt lists, in its order; a line is the file name, its wnid and
    its bounding box, separated by tabs."""
    path = val / "val_annotations.txt"
    label_of = {wnid: label for label, wnid in enumerate(wnids)}
    paths, labels, seen = [], [], set()
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise _bad_file(path, f"line {number} is not a file name and a wnid separated by a tab")
        name, wnid = fields[0], fields[1]
        if "/" in name or not name.endswith(IMAGE_SUFFIX):
            raise _bad_file(path, f"line {number} names {name!r}, not a {IMAGE_SUFFIX} file in {val / 'images'}")
        if wnid not in label_of:
            raise _bad_file(path, f"line {number} gives {name} the wnid {wnid!r}, which wnids.txt does not list")
        if name in seen:
            raise _bad_file(path, f"line {number} lists {name} a second time")
        seen.add(name)
        paths.append(val / "images" / name)
        labels.append(label_of[wnid])
    if not paths:
        raise _bad_file(path, "lists no image")
    return paths, np.asarray(labels, dtype=np.int64)


def _read_text(path: pathlib.Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_TEXT_BYTES:
            raise _bad_file(path, f"is {size} bytes, far more than the official file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_file(path, f"is not a text file ({_reason(exc)})") from exc
    except OSError as exc:
        raise _bad_file(path, f"cannot be read ({_reason(exc)})") from exc


def _pixels(cache: pathlib.Path, listing: _Listing) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation images as (n, 3, 64, 64) uint8, from the cache when it was made
    from these files, else decoded from the JPEGs and cached."""
    fingerprint = listing.fingerprint()
    cached = _read_cache(cache, fingerprint, len(listing.train), len(listing.test))
    if cached is not None:
        return cached
    print(f"rayfed: {NAME}: decoding {len(listing.train) + len(listing.test):,} JPEGs into {cache}; "
          "later runs read that", file=sys.stderr)
    pixels = _decode_all(listing.train), _decode_all(listing.test)
    _write_cache(cache, fingerprint, *pixels)
    return pixels


def _read_cache(cache: pathlib.Path, fingerprint: str, num_train: int,
                num_test: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached pixels, or None where there is no cache, or one of other files, or a damaged one:
    the JPEGs are the data, the cache only spares decoding them, so any doubt means decoding them."""
    try:
        with np.load(cache, allow_pickle=False) as arrays:
            if str(arrays["fingerprint"]) != fingerprint:
                return None
            train, test = arrays["train_x"], arrays["test_x"]
    # What np.load and zipfile raise on a missing, truncated, corrupt (CRC) or foreign file.
    except (OSError, ValueError, KeyError, EOFError, MemoryError, zipfile.BadZipFile):
        return None
    for array, count in ((train, num_train), (test, num_test)):
        if array.dtype != np.uint8 or array.shape != (count, *IMAGE_SHAPE):
            return None
    return train, test


def _write_cache(cache: pathlib.Path, fingerprint: str, train: np.ndarray, test: np.ndarray) -> None:
    """Written under a name of its own, then renamed: a run killed mid-write, or runs writing at
    once, never leave a partial cache under the real name (one cut short by a crash before the
    data reached the disk fails _read_cache's CRC check, and is rebuilt)."""
    temporary = cache.with_name(f".{cache.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "xb") as file:
            np.savez(file, fingerprint=np.array(fingerprint), train_x=train, test_x=test)
        os.replace(temporary, cache)
    except OSError as exc:
        # A read-only data.root, or a full disk, costs only the next run's decoding.
        print(f"rayfed: {NAME}: could not write the cache {cache} ({_reason(exc)}); "
              "the next run decodes the JPEGs again", file=sys.stderr)
    finally:
        temporary.unlink(missing_ok=True)


def _decode_all(paths: list[pathlib.Path]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError     # only needed to build the cache

    pixels = np.empty((len(paths), *IMAGE_SHAPE), dtype=np.uint8)
    for index, path in enumerate(paths):
        try:
            with Image.open(path, formats=["JPEG"]) as image:
                # Checked before decoding: the header alone gives the size.
                if image.size == (IMAGE_SIDE, IMAGE_SIDE):
                    # Some Tiny-ImageNet images are grayscale: their one channel becomes all three.
                    pixels[index] = np.asarray(image.convert("RGB")).transpose(2, 0, 1)
                    continue
                width, height = image.size
        except FileNotFoundError:
            raise _bad_file(path, "does not exist") from None
        except UnidentifiedImageError:
            raise _bad_file(path, "is not a JPEG image") from None
        # What PIL raises on a damaged stream, or a header declaring a decompression bomb.
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise _bad_file(path, f"cannot be decoded as a JPEG ({_reason(exc)})") from exc
        raise _bad_file(path, f"is {width}x{height} pixels, not the {IMAGE_SIDE}x{IMAGE_SIDE} of every "
                              "Tiny-ImageNet image")
    return pixels


def _normalise(pixels: np.ndarray) -> np.ndarray:
    channel_shape = (1, len(MEAN), 1, 1)
    images = pixels.astype(np.float32)
    images /= 255.0
    images -= np.asarray(MEAN, dtype=np.float32).reshape(channel_shape)
    images /= np.asarray(STD, dtype=np.float32).reshape(channel_shape)
    return images


def _reason(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__)[:200]


def _bad_file(path: pathlib.Path, problem: str) -> ConfigError:
    return _one_line_error(f"{path} {problem}; {_RESTORE}")


def _one_line_error(message: str) -> ConfigError:
    # Paths and exception texts may hold line breaks, and the CLI promises one line.
    return ConfigError(" ".join(message.splitlines()))
