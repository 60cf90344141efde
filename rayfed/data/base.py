"""What a dataset is to rayfed, and how one is registered and loaded by name.

A dataset module registers a loader `(data, seed) -> Dataset` with `register_dataset`, declaring
beside it what the config needs to know before loading anything: its input shape and classes, how
many samples it holds (for the memory check), the model its papers use (model.name=auto), whether
its clients are defined by the data itself (data.partition=natural), which partitions apply, and
which files it reads from data.root. A loader may return a LazyDataset instead (rayfed.data.lazy),
whose clients are made on demand: it registers with `lazy=True`."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from rayfed.data.partition import Partition
from rayfed.errors import ConfigError
from rayfed.registry import DATASETS, Entry


@dataclass
class Dataset:
    """What a dataset's loader returns (rayfed.register_dataset): the samples as arrays."""

    name: str
    """Its registered name."""
    train_x: np.ndarray
    """The training inputs, one row per sample of `input_shape`."""
    train_y: np.ndarray
    """The training labels, integers in [0, num_classes)."""
    test_x: np.ndarray
    """The test inputs."""
    test_y: np.ndarray
    """The test labels."""
    num_classes: int
    """The classes, as registered."""
    input_shape: tuple[int, ...]
    """One sample's shape, as registered (checked against the arrays before a run)."""
    natural_partition: Partition | None = None
    """The dataset's own clients (data.partition=natural): the training rows each owns, such as each
    generated client of synthetic or each speaking role of shakespeare; None where it has none."""


def register_dataset(name: str, *, input_shape: tuple[int, ...], num_classes: int, default_model: str,
                     num_samples: int | Callable[[Any], int], input_dtype: torch.dtype = torch.float32,
                     natural: bool = False, partitions: tuple[str, ...] | None = None,
                     required_files: Callable[[str], list[pathlib.Path]] | None = None,
                     missing_files: Callable[[str], list[pathlib.Path]] | None = None,
                     normalizable: bool = False, lazy: bool = False,
                     resident_samples: int | Callable[[Any], int] | None = None):
    """Registers a loader `(data, seed) -> Dataset` under `name` (rayfed.register_dataset); `data` is
    the config's data section. Declared with it:

    - `input_shape`, `num_classes`, `input_dtype`: one sample's shape, the classes, the inputs' dtype;
    - `default_model`: the model that model.name=auto picks;
    - `num_samples`: train + test samples, or a function of the data section giving them;
    - `natural`: the data defines its own clients (data.partition=natural, the default then);
    - `partitions`: the data.partition values that apply (None: every registered one);
    - `required_files(root)` and `missing_files(root)`: the files (or folders of files) it reads
      under data.root, and those absent (checked before anything starts, unless data.download);
    - `normalizable`: data.normalize applies (images with channel statistics);
    - `lazy`: the loader returns a rayfed.data.lazy.LazyDataset, whose clients are made when they
      train (its clients are its own: data.partition=natural only); `resident_samples`, a number or a
      function of the data section, is what it holds at once (its test set), for the memory check,
      which otherwise counts all `num_samples`."""
    if lazy and (not natural or partitions not in (None, ("natural",))):
        raise ConfigError(f"register_dataset({name!r}, lazy=True): an on-demand dataset defines its own clients; "
                          "declare natural=True and no partitions other than natural")
    options = dict(input_shape=tuple(input_shape), num_classes=num_classes, default_model=default_model,
                   num_samples=num_samples, input_dtype=input_dtype, natural=natural,
                   partitions=("natural",) if lazy else partitions, required_files=required_files,
                   missing_files=missing_files, normalizable=normalizable, lazy=lazy,
                   resident_samples=num_samples if resident_samples is None else resident_samples)

    def decorate(loader):
        if not callable(loader):
            raise ConfigError(f"register_dataset({name!r}) takes a function (data, seed) -> rayfed.Dataset")
        return DATASETS.register(name, **options)(loader)
    return decorate


def dataset_entry(name: str) -> Entry:
    return DATASETS.get(name)


def sample_count(name: str, data) -> int:
    """Train + test samples of the dataset as `data` (the data section) configures it."""
    num_samples = dataset_entry(name).num_samples
    return num_samples(data) if callable(num_samples) else num_samples


def resident_count(name: str, data) -> int:
    """The samples the dataset holds in memory at once: all of them, unless it makes clients on demand."""
    resident = dataset_entry(name).resident_samples
    return resident(data) if callable(resident) else resident


def required_files(name: str, root: str) -> list[pathlib.Path]:
    """The files the dataset's reader needs under `root`; [] for generated data."""
    declared = dataset_entry(name).required_files
    return declared(root) if declared is not None else []


def missing_files(name: str, root: str) -> list[pathlib.Path]:
    """The required files that are absent. Datasets whose files are beyond data.download's reach
    raise the ConfigError that says how to get them instead."""
    declared = dataset_entry(name).missing_files
    return declared(root) if declared is not None else []
