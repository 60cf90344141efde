"""Loading a registered dataset with the data section's keys: an eager Dataset, or an on-demand one
(rayfed.data.lazy) where its registration says so."""
from __future__ import annotations

from rayfed.config import DataConfig
from rayfed.data.base import Dataset, dataset_entry
from rayfed.data.cache import remembered
from rayfed.data.lazy import LazyDataset
from rayfed.errors import ConfigError


def load_dataset(name: str, *, seed: int = 0, **keys):
    """The dataset `name` loaded with the data section's defaults and `keys` (root, download,
    num_clients, partition, ...); what `rayfed.run` does with the config's data section. A Dataset,
    or for a dataset registered with lazy=True a rayfed.data.lazy.LazyDataset."""
    entry = dataset_entry(name)
    data = DataConfig.model_construct(**{**DataConfig().model_dump(), **keys, "dataset": name})
    loaded = remembered(entry, data, seed, lambda: entry.target(data, seed))
    expected = LazyDataset if entry.lazy else Dataset
    if not isinstance(loaded, expected):
        raise ConfigError(f"the loader of data.dataset={name} returned a {type(loaded).__name__}, not the "
                          f"{expected.__name__} its registration (lazy={entry.lazy}) declares")
    return loaded
