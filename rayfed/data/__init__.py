"""Datasets and their split among clients. Each module registers its datasets and partitioners
(rayfed.register_dataset, rayfed.register_partitioner); importing the package imports them all."""
from rayfed.data.base import Dataset, missing_files, register_dataset, required_files
from rayfed.data.load import load_dataset
from rayfed.data.partition import (Partition, PartitionRequest, class_histogram, make_partition, register_partitioner,
                                   write_histogram_csv)
from rayfed.registry import DATASETS, import_submodules

import_submodules(__name__, __path__)

__all__ = ["DATASETS", "Dataset", "Partition", "PartitionRequest", "class_histogram", "load_dataset", "make_partition",
           "missing_files", "register_dataset", "register_partitioner", "required_files", "write_histogram_csv"]
