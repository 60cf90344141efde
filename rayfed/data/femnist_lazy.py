"""`femnist_lazy`: LEAF's FEMNIST digits by writer (rayfed.data.femnist), with each writer's samples
read from memory-mapped .npy files when the writer trains (rayfed.data.mapped), not held by the run.

The JSON files are converted once: every writer's digit samples go, in writer order, into .npy
arrays under data.root/femnist/rayfed_cache/<fingerprint>/, and later runs map them instead of
parsing the JSON again. The fingerprint is made of the JSON files' names, sizes and modification
times, so a changed file gives a new conversion. A run then holds its writers' test samples and
their row lists; each worker reads a writer's rows when it trains. Writers are drawn as `femnist`
draws them, and client k's samples are the same arrays, so a run gives `femnist`'s bits (natural
partition)."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import sys
import uuid

import numpy as np

from rayfed.data import femnist, leaf
from rayfed.data.base import register_dataset
from rayfed.data.lazy import LazyDataset
from rayfed.data.mapped import MappedClients
from rayfed.data.partition import Partition
from rayfed.errors import ConfigError, first_line
from rayfed.seeding import Purpose, numpy_rng

NAME = "femnist_lazy"
CACHE = "rayfed_cache"
# Part of the fingerprint: a change to what a conversion holds makes the old ones stale.
CACHE_VERSION = 1
INDEX = "writers.json"
_SPLITS = ("train", "test")


def cache_folder(root: str) -> pathlib.Path:
    """Where the conversion of the JSON files now under data.root goes."""
    files = [(split, path) for split, folder in femnist.folders(root).items() for path in leaf.json_files(folder)]
    lines = [f"rayfed femnist cache {CACHE_VERSION}"]
    for split, path in files:
        status = path.stat()
        lines.append(f"{split}/{path.name} {status.st_size} {status.st_mtime_ns}")
    fingerprint = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
    return pathlib.Path(root) / femnist.FOLDER / CACHE / fingerprint[:32]


class Converted:
    """A conversion: per split, every writer's digit samples as one run of rows of <split>_x.npy and
    <split>_y.npy, writers sorted (the index lists them), with `offsets[split]` the runs' bounds."""

    def __init__(self, folder: pathlib.Path):
        written = json.loads((folder / INDEX).read_text())
        index = written["index"]
        if written["sha256"] != _digest(index):
            raise ValueError(f"{INDEX} is not the one written with the arrays")
        self.folder = folder
        self.offsets = {split: np.asarray(index["offsets"][split], dtype=np.int64) for split in _SPLITS}
        num_writers = len(index["writers"])
        for split in _SPLITS:
            offsets = self.offsets[split]
            if offsets.shape != (num_writers + 1,) or offsets[0] != 0 or (np.diff(offsets) < 0).any():
                raise ValueError(f"{INDEX}: {split} offsets do not bound {num_writers} writers")
            inputs, labels = (np.load(self.path(split, part), mmap_mode="r") for part in ("x", "y"))
            if inputs.dtype != np.float32 or inputs.shape != (offsets[-1], *femnist.IMAGE_SHAPE):
                raise ValueError(f"{split}_x.npy is {inputs.dtype} {inputs.shape}")
            if labels.dtype != np.int64 or labels.shape != (offsets[-1],):
                raise ValueError(f"{split}_y.npy is {labels.dtype} {labels.shape}")

    def path(self, split: str, part: str) -> str:
        return str(self.folder / f"{split}_{part}.npy")

    def count(self, split: str) -> np.ndarray:
        return np.diff(self.offsets[split])

    def rows(self, split: str, chosen: np.ndarray) -> Partition:
        """The `chosen` writers' (positions among the sorted writers) rows of `split`, one client per writer."""
        starts, ends = self.offsets[split][chosen], self.offsets[split][chosen + 1]
        sizes = ends - starts
        indices = np.concatenate([np.arange(start, end, dtype=np.int64) for start, end in zip(starts, ends)]
                                 or [np.zeros(0, dtype=np.int64)])
        return Partition(indices, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


def converted(root: str) -> Converted:
    """The conversion of the JSON files under data.root, made now where there is none (or a damaged one)."""
    folder = cache_folder(root)
    try:
        return Converted(folder)
    # A missing, truncated or foreign conversion: the JSON files are the data, so any doubt means converting them.
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        pass
    print(f"rayfed: {NAME}: converting LEAF's JSON files into {folder}; later runs map that", file=sys.stderr)
    train, test = (femnist.read_split(path) for path in femnist.folders(root).values())
    writers = sorted(train)
    empty = (np.zeros((0, *femnist.IMAGE_SHAPE), dtype=np.float32), np.zeros(0, dtype=np.int64))
    building = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.tmp"
    try:
        building.mkdir(parents=True)
        index = {"writers": writers, "offsets": {}}
        for split, samples in (("train", train), ("test", test)):
            parts = [samples.get(writer, empty) for writer in writers]
            np.save(building / f"{split}_x.npy", np.concatenate([x for x, _ in parts]))
            np.save(building / f"{split}_y.npy", np.concatenate([y for _, y in parts]))
            index["offsets"][split] = np.concatenate([[0], np.cumsum([len(y) for _, y in parts])]).astype(int).tolist()
        (building / INDEX).write_text(json.dumps({"index": index, "sha256": _digest(index)}))
        _install(building, folder)
    except OSError as error:
        raise ConfigError(f"data.dataset={NAME} keeps its converted arrays under {folder.parent}, which it cannot "
                          f"write ({first_line(error)}); use data.dataset=femnist, which reads the JSON files "
                          "each run") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return Converted(folder)


def _digest(index: dict) -> str:
    return hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()


def _install(building: pathlib.Path, folder: pathlib.Path) -> None:
    """Renamed into place whole, so that a reader never maps half a conversion; where another run
    installed one meanwhile, or a damaged one is there, the new one takes its place."""
    if folder.exists():
        stale = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.stale"
        os.replace(folder, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.replace(building, folder)


def _missing(root: str) -> list[pathlib.Path]:
    """LEAF's files are beyond data.download's reach: their absence is the line saying how to make them."""
    femnist.check_files(root)
    return []


@register_dataset(NAME, input_shape=femnist.IMAGE_SHAPE, num_classes=femnist.NUM_CLASSES, default_model="relu_mlp",
                  natural=True, lazy=True, required_files=femnist.required_files, missing_files=_missing,
                  num_samples=lambda data: data.num_clients * femnist.SAMPLES_PER_WRITER,
                  resident_samples=lambda data: data.num_clients * femnist.SAMPLES_PER_WRITER // 5)
def _femnist_lazy(data, seed: int) -> LazyDataset:
    """LEAF's FEMNIST digits, one client per writer, read from memory-mapped files when it trains."""
    femnist.check_files(data.root, data.download)
    arrays = converted(data.root)
    train_counts, test_counts = arrays.count("train"), arrays.count("test")
    eligible = np.flatnonzero((train_counts > 0) & (test_counts > 0))
    if len(eligible) < data.num_clients:
        raise ConfigError(f"data.num_clients={data.num_clients} exceeds the {len(eligible)} FEMNIST writers with "
                          f"digits in both LEAF splits under {femnist.folders(data.root)['train'].parent}; "
                          "lower data.num_clients")
    # femnist's draw of writers, from the same stream.
    chosen = eligible[numpy_rng(seed, Purpose.FEMNIST_WRITERS).permutation(len(eligible))[:data.num_clients]]
    source = MappedClients(arrays.path("train", "x"), arrays.path("train", "y"), arrays.rows("train", chosen))
    test = arrays.rows("test", chosen)
    test_x = np.array(np.load(arrays.path("test", "x"), mmap_mode="r")[test.indices])
    test_y = np.array(np.load(arrays.path("test", "y"), mmap_mode="r")[test.indices])
    return LazyDataset(NAME, source, test_x, test_y, femnist.NUM_CLASSES, femnist.IMAGE_SHAPE)
