"""Loaded datasets kept for the next run in the same process. A sweep's trial processes run trial
after trial (rayfed.sweep.runner), most of them on the same data; loading it again would repeat the
same work. Off unless the process turns it on (`keep_datasets`): a plain run reads its data afresh.

A dataset is kept under everything that decides its arrays: the loader itself, the data section
with its defaults filled in, the seed, and the size and modification time of every file the
dataset declares it reads. Its arrays are made read-only (a run reads them, as the Ray engine's
object-store copies already are), and each run gets its own Dataset object, so that nothing a run
does to it reaches the next one."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections import OrderedDict
from typing import Callable

import numpy as np

from rayfed.data.base import Dataset
from rayfed.data.partition import Partition
from rayfed.registry import Entry

# A sweep's trials mostly share one dataset, or a few (one per seed where the loader draws from it).
MAX_KEPT = 4

_kept: OrderedDict | None = None
hits = 0


def keep_datasets() -> None:
    """From now on, this process keeps the datasets it loads for its later runs."""
    global _kept
    if _kept is None:
        _kept = OrderedDict()


def remembered(entry: Entry, data, seed: int, load: Callable[[], Dataset]) -> Dataset:
    """`load()`, or a copy of what it returned before for the same key while datasets are kept.
    On-demand datasets (rayfed.data.lazy) make their clients when they train and are not kept."""
    global hits
    if _kept is None or entry.options.get("lazy"):
        return load()
    key = (entry.target, _canonical(data.model_dump()), seed, _files_signature(entry, data.root))
    if key in _kept:
        _kept.move_to_end(key)
        hits += 1
        return dataclasses.replace(_kept[key])
    loaded = load()
    if isinstance(loaded, Dataset):
        _kept[key] = _read_only(loaded)
        if len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)
        return dataclasses.replace(loaded)
    return loaded


def _canonical(section: dict) -> str:
    return json.dumps(section, sort_keys=True, default=repr)


def _files_signature(entry: Entry, root: str) -> tuple:
    declared = entry.options.get("required_files")
    if declared is None:
        return ()
    files = []
    for path in declared(root):
        walked = sorted(pathlib.Path(folder, name) for folder, _, names in os.walk(path) for name in names)
        files += walked if pathlib.Path(path).is_dir() else [pathlib.Path(path)]
    return tuple((str(file), *_stat(file)) for file in files)


def _stat(file: pathlib.Path) -> tuple[int, int]:
    try:
        stat = file.stat()
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def _read_only(dataset: Dataset) -> Dataset:
    arrays = [dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y]
    if isinstance(dataset.natural_partition, Partition):
        arrays += [dataset.natural_partition.indices, dataset.natural_partition.offsets]
    for array in arrays:
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return dataset
